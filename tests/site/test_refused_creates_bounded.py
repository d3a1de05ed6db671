"""A user who keeps retrying a refused create does not grow the database
(INTERFACES.md "Growth"): with no ``--webhook``, an outbox row is deleted
once it is fanned out, so a refused create (429 quota, 422 upstream refusal)
leaves nothing behind.

A real database, the real lifecycle against the real mock upstream on
loopback, the real outbox executor wired as the site wires it.
"""

from __future__ import annotations

import os

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList

from tasknet.site.outbox import OutboxExecutor
from tasknet.site.storage.engine.errors import TaskError
from tests.eventually import eventually
from tests.site.helpers import add_user, fault, lifecycle_env, one

BATCH = 16  # creates in flight at once, like a few impatient clients
#: The upstream client's deadline: far above a loaded machine's slowest
#: answer, so every refusal is the quota's or the upstream's, never a timeout.
UPSTREAM_TIMEOUT = 10.0


def files_size(path: str) -> tuple[int, int]:
    wal = path + "-wal"
    return os.path.getsize(path), os.path.getsize(wal) if os.path.exists(wal) else 0


def traces(path: str) -> int:
    counts = [
        one(path, f"SELECT COUNT(*) FROM {table}")[0]  # noqa: S608
        for table in ("notification_outbox", "gallery", "task_operation")
    ]
    return sum(counts)


async def refuse(env, user_id: int, gids: range) -> dict[str, int]:
    codes: dict[str, int] = {}

    async def one_create(gid: int) -> None:
        try:
            await env.lifecycle.create(user_id, gid, "tok", "")
            codes["created"] = codes.get("created", 0) + 1
        except TaskError as e:
            codes[e.code] = codes.get(e.code, 0) + 1

    todo = list(gids)
    for start in range(0, len(todo), BATCH):
        await DeferredList(
            [Deferred.fromCoroutine(one_create(g)) for g in todo[start : start + BATCH]],
            fireOnOneErrback=True,
        )
    return codes


@pytest.mark.slow  # 10,000 creates: left out of scripts/test --fast
@pytest_twisted.ensureDeferred
async def test_10000_refused_creates_leave_the_database_within_a_bounded_size(tmp_path):
    # SQLite only: the bound is on the database file and its WAL (freed pages
    # reused, automatic checkpoints); PostgreSQL gets the space of deleted
    # rows back by autovacuum, on its own schedule.
    async with lifecycle_env(
        str(tmp_path / "site.sqlite"), timeout=UPSTREAM_TIMEOUT, quota=0
    ) as env:
        bob, _ = add_user(env.path, "bob", quota=10**9)
        executor = OutboxExecutor(
            env.db, None, None, poll_interval=None, prune_interval=None, clock=reactor
        )
        env.lifecycle.on_commit = executor.wake
        executor.startService()
        await executor.wake()
        # bob's POSTs are refused by the upstream (422, nothing charged);
        # alice has no quota left (429).
        env.upstream.set_faults([fault("reject")])
        try:
            first = await refuse(env, env.user_id, range(1, 501))
            first_bob = await refuse(env, bob, range(20_001, 20_501))
            assert first == {"quota_exceeded": 500} and first_bob == {"upstream_rejected": 500}
            await eventually(lambda: traces(env.path) == 0, timeout=10)
            after_1000 = files_size(env.path)
            rest = await refuse(env, env.user_id, range(501, 5001))
            rest_bob = await refuse(env, bob, range(20_501, 25_001))
            assert rest == {"quota_exceeded": 4500} and rest_bob == {"upstream_rejected": 4500}
            # Every row was announced and then went: nothing of 10,000 creates is left.
            await eventually(lambda: traces(env.path) == 0, timeout=10)
            after_10000 = files_size(env.path)
        finally:
            await executor.stopService()
        print(f"database (main, wal) after 1,000: {after_1000}, after 10,000: {after_10000}")
        # The main file is about as large after 10,000 as after 1,000: freed
        # pages are reused; what it holds at most is the rows of one marking
        # interval.  Keeping the ~20,000 rows the creates wrote would take
        # more than 8 MB (~440 bytes each, as the soak measured).
        assert after_10000[0] <= after_1000[0] + 256 * 1024
        assert after_10000[0] < 1024 * 1024
        # The WAL is bounded by SQLite's automatic checkpoint (at 1,000 pages
        # of 4 KiB plus a 24-byte frame header; twice that if a reader held
        # a checkpoint back), not by the number of creates.
        assert after_10000[1] <= 2 * 1000 * (4096 + 24)
        assert env.upstream.stats()["charged"] == 0


@pytest_twisted.ensureDeferred
async def test_a_create_refused_before_submitting_writes_no_notification(db_target):
    """With a webhook, delivered rows stay for the outbox's retention, so a
    quota refusal must not write any: the reservation is never announced.
    No executor runs here, so whatever was written would still be there."""
    async with lifecycle_env(db_target, timeout=UPSTREAM_TIMEOUT, quota=0) as env:
        codes = await refuse(env, env.user_id, range(1, 1001))
        assert codes == {"quota_exceeded": 1000}
        assert traces(env.path) == 0
