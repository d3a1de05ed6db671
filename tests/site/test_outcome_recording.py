"""Recording a create's outcome while the database is locked by another
process (drill S6), and what a "submitted" verdict takes from it.

The lock is real, held by a second connection to the same database
(``tests.backends.WriteLock``: SQLite's ``BEGIN EXCLUSIVE``, PostgreSQL's
``LOCK TABLE … IN EXCLUSIVE MODE``); the site's writer waits its (short)
busy timeout and fails, exactly as past the real 5 s one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import globalLogPublisher

from tasknet.runtime import SystemEntropy
from tasknet.site.lifecycle import NO_ARCHIVE_URL, Lifecycle
from tasknet.site.storage import create, eligibility, reconcile, usage
from tasknet.site.storage.engine.database import Database, open_pool, run_write
from tasknet.site.storage.engine.errors import TaskError
from tests.backends import FailingCommits, WriteLock
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import Env, fault, lifecycle_env, one, raw

GID = 777
AUDIT = "/api/galleries/*/archive"


def op_row(path: str, gid: int = GID) -> sqlite3.Row:
    return one(path, "SELECT * FROM task_operation WHERE gid = ?", gid)


@asynccontextmanager
async def locked_env(target: str, *, record_retry_for: float) -> AsyncIterator[Env]:
    """A lifecycle whose writer gives up on a lock after 50 ms, with quick
    retries; stopped (background retries cancelled) at the end."""
    async with lifecycle_env(target, timeout=3.0) as env:
        db = Database(env.path, **site_runtime(), busy_timeout_ms=50)
        env.lifecycle = Lifecycle(
            db,
            env.client,
            upstream_timeout=3.0,
            record_retry_for=record_retry_for,
            retry_initial=0.05,
            retry_max=0.2,
            settle_interval=0.1,
            clock=reactor,
            entropy=SystemEntropy(),
        )
        try:
            yield env
        finally:
            env.lifecycle.stop()
            db.close()


class Logged:
    """Log events whose format contains ``text``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Logged:
        globalLogPublisher.addObserver(self.events.append)
        return self

    def __exit__(self, *_: object) -> None:
        globalLogPublisher.removeObserver(self.events.append)

    def has(self, text: str) -> bool:
        return any(text in str(e.get("log_format", "")) for e in self.events)


async def _lock_during_persist(env: Env) -> tuple[Any, WriteLock]:
    """Start a create whose POST the upstream holds; lock the database once
    SUBMITTING is committed, so the persist of the POST's answer fails."""
    env.upstream.set_faults([fault("latency", ms=300)])
    created = env.lifecycle.create(env.user_id, GID, "tok", "")
    await eventually(lambda: env.upstream.app.journal.post_attempts[GID] == 1)
    assert op_row(env.path)["state"] == "SUBMITTING"
    return created, WriteLock(env.path).acquire()


@pytest_twisted.ensureDeferred
async def test_lock_past_busy_timeout_during_persist_answers_202_unknown(db_target):
    async with locked_env(db_target, record_retry_for=10.0) as env:
        with Logged() as logged:
            created, lock = await _lock_during_persist(env)
            try:
                # The persist failed and recording UNKNOWN failed too, at least once.
                await eventually(lambda: logged.has("retrying in"), timeout=5)
            finally:
                lock.release()
        answer = await created
        assert answer.status == 202 and answer.task["state"] == "UNKNOWN"
        op = op_row(env.path)
        assert (op["state"], op["step"], op["metered"]) == ("UNKNOWN", "persist", 0)
        # What the POST answered is kept in its columns (item: resolve uses it).
        journal = env.upstream.journal()["entries"]
        assert [e["gid"] for e in journal] == [GID]
        assert op["cost"] == journal[0]["cost"]
        assert op["archive_url"] == env.upstream.file_url(GID)
        assert env.posts(GID) == 1
        assert env.lifecycle.settling == 0


@pytest_twisted.ensureDeferred
async def test_lock_outlasting_the_retries_answers_202_unknown_and_records_it_later(db_target):
    async with locked_env(db_target, record_retry_for=0.3) as env:
        created, lock = await _lock_during_persist(env)
        try:
            # Never a 500: the outcome is unknown, and UNKNOWN is what it will be.
            answer = await created
            assert answer.status == 202
            assert (answer.task["state"], answer.task["status"]) == ("UNKNOWN", "SUBMIT_UNKNOWN")
            assert op_row(env.path)["state"] == "SUBMITTING"  # not yet
            assert env.lifecycle.settling == 1
        finally:
            lock.release()
        await eventually(lambda: env.lifecycle.settling == 0)
        op = op_row(env.path)
        assert (op["state"], op["step"]) == ("UNKNOWN", "persist")
        assert op["archive_url"] == env.upstream.file_url(GID)
        assert env.posts(GID) == 1  # never resent


@pytest_twisted.ensureDeferred
async def test_lock_before_submitting_posts_nothing_and_releases_the_gid(db_target):
    async with locked_env(db_target, record_retry_for=0.3) as env:
        env.upstream.set_faults([fault("latency", "GET", f"/api/galleries/{GID}", ms=300)])
        created = env.lifecycle.create(env.user_id, GID, "tok", "")
        await eventually(lambda: env.upstream.app.journal.requests >= 1)  # prepare pending
        lock = WriteLock(env.path).acquire()
        try:
            with pytest.raises(TaskError) as refused:
                await created
            assert refused.value.code == "unavailable"  # 503, Retry-After: try again
            assert "nothing was submitted" in refused.value.message
            assert env.lifecycle.settling == 1  # the release, not the SUBMITTING
        finally:
            lock.release()
        await eventually(lambda: env.lifecycle.settling == 0)
        assert op_row(env.path) is None
        assert one(env.path, "SELECT COUNT(*) FROM gallery")[0] == 0
        assert env.upstream.stats()["postAttempts"] == {}


@pytest_twisted.ensureDeferred
async def test_stop_leaves_an_unrecorded_outcome_to_recovery(db_target):
    async with locked_env(db_target, record_retry_for=0.3) as env:
        created, lock = await _lock_during_persist(env)
        try:
            assert (await created).status == 202
            env.lifecycle.stop()
            assert env.lifecycle.settling == 0
        finally:
            lock.release()
        assert op_row(env.path)["state"] == "SUBMITTING"
        recovered = await env.lifecycle.recover()
        assert recovered.unknown == [GID]


def _unknown_with_answer(path: str, user_id: int, url: str | None, cost: int | None) -> None:
    """gid GID UNKNOWN: prepare said cost 5; the POST (if it answered) said ``cost``."""
    connection = raw(path)
    try:
        week = usage.iso_week()
        op = run_write(connection, create.reserve, GID, user_id, "", "tok", week)
        run_write(connection, create.begin_submit, GID, op, 5, "title", week)
        run_write(connection, create.mark_unknown, GID, op, "persist", "disk", url, cost)
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_resolve_submitted_meters_and_dispatches_what_the_post_answered(db_target):
    async with lifecycle_env(db_target) as env:
        _unknown_with_answer(env.path, env.user_id, "http://up/files/777-1.bin", 7)
        # The audit names another file: the POST's own answer wins.
        env.upstream.set_faults([fault("error", "GET", AUDIT, status=503, charged=False)])
        listed = await env.lifecycle.unknown_with_evidence()
        evidence = listed[0]["evidence"]
        assert evidence["archiveUrl"] == "http://up/files/777-1.bin"
        assert evidence["archiveUrlSource"] == "submit" and "warning" not in evidence
        view = await env.lifecycle.resolve(GID, "submitted", "ops", "")
        assert view is not None and view["state"] == "SUBMITTED" and view["cost"] == 7
        assert "warning" not in view
        row = one(
            env.path,
            "SELECT g.url, g.cost, o.archive_url FROM gallery AS g "
            "JOIN task_operation AS o ON o.gid = g.gid WHERE g.gid = ?",
            GID,
        )
        assert tuple(row) == ("http://up/files/777-1.bin", 7, "http://up/files/777-1.bin")
        assert one(env.path, "SELECT SUM(used) FROM weekly_usage")[0] == 7
        dispatchable = one(
            env.path,
            "SELECT COUNT(*) FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid "
            f"WHERE {eligibility.DISPATCHABLE_SQL}",
        )[0]
        assert dispatchable == 1


@pytest_twisted.ensureDeferred
async def test_resolve_submitted_takes_the_audit_url_when_the_post_never_answered(db_target):
    async with lifecycle_env(db_target) as env:
        env.upstream.set_faults([fault("commit_then_drop")])
        created = await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert created.status == 202
        assert op_row(env.path)["archive_url"] is None
        view = await env.lifecycle.resolve(GID, "submitted", "ops", "")
        assert view is not None and "warning" not in view
        assert op_row(env.path)["archive_url"] == env.upstream.file_url(GID)


@pytest_twisted.ensureDeferred
async def test_resolve_submitted_without_any_url_says_so_and_is_not_dispatchable(db_target):
    async with lifecycle_env(db_target) as env:
        _unknown_with_answer(env.path, env.user_id, None, None)
        env.upstream.set_faults([fault("error", "GET", AUDIT, status=503, charged=False)])
        listed = await env.lifecycle.unknown_with_evidence()
        assert listed[0]["evidence"]["archiveUrl"] is None
        assert listed[0]["evidence"]["warning"] == NO_ARCHIVE_URL
        # No readable audit and no stored answer: the verdict needs a note (issue 38).
        view = await env.lifecycle.resolve(GID, "submitted", "ops", "invoice shows it")
        assert view is not None and view["state"] == "SUBMITTED"
        assert view["warning"] == NO_ARCHIVE_URL
        op = op_row(env.path)
        assert (op["step"], op["archive_url"], op["metered"]) == (
            reconcile.RESOLVED_WITHOUT_URL,
            None,
            1,
        )
        assert one(env.path, "SELECT SUM(used) FROM weekly_usage")[0] == 5  # prepare's cost
        dispatchable = one(
            env.path,
            "SELECT COUNT(*) FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid "
            f"WHERE {eligibility.DISPATCHABLE_SQL}",
        )[0]
        assert dispatchable == 0


@pytest_twisted.ensureDeferred
async def test_a_failed_submitting_write_posts_nothing_and_releases_the_gid(db_target):
    """Simulator seed 1491: the disk was full at SUBMITTING's commit and at
    the release's; the create answered 500 with the RESERVED row left for
    good (no retry, no release).  Now nothing is POSTed, the answer says
    so, and the release lands in the background."""
    async with lifecycle_env(db_target) as env:
        faults = FailingCommits(db_target, disk_full=True)
        db = open_pool(env.path, storage_faults=faults, **site_runtime())
        env.lifecycle = Lifecycle(
            db,
            env.client,
            upstream_timeout=3.0,
            settle_interval=0.1,
            clock=reactor,
            entropy=SystemEntropy(),
        )
        try:
            env.upstream.set_faults([fault("latency", "GET", f"/api/galleries/{GID}", ms=300)])
            created = env.lifecycle.create(env.user_id, GID, "tok", "")
            await eventually(lambda: env.upstream.app.journal.requests >= 1)  # prepare pending
            faults.left = 2  # SUBMITTING's commit, then the release's first
            with pytest.raises(TaskError) as refused:
                await created
            assert refused.value.code == "unavailable"
            assert "nothing was submitted" in refused.value.message
            assert "the database failed (logged)" in refused.value.message
            assert env.lifecycle.settling == 1  # the release, in the background
            await eventually(lambda: env.lifecycle.settling == 0)
            assert op_row(env.path) is None
            assert one(env.path, "SELECT COUNT(*) FROM gallery")[0] == 0
            assert env.upstream.stats()["postAttempts"] == {}
        finally:
            env.lifecycle.stop()
            db.close()


@pytest_twisted.ensureDeferred
async def test_a_pause_right_after_submitting_commits_stops_the_post(db_target):
    """Simulator seed 670: the site stopped right after SUBMITTING's COMMIT,
    before it heard of it, for longer than the upstream timeout; the POST
    gate measured from when it heard, so the POST still went out 22 s late.
    It now measures from before the write: nothing is sent, the gid is
    released, and the answer says to try again."""
    elapsed = [0.0]

    def paused_after_submitting(point: str, connection: Any, functions: tuple[str, ...]) -> None:
        if point == "committed" and "begin_submit" in functions:
            elapsed[0] += 10.0  # stopped for 10 s before the reactor hears of it

    async with lifecycle_env(db_target) as env:
        db = open_pool(env.path, storage_faults=paused_after_submitting, **site_runtime())
        env.lifecycle = Lifecycle(
            db,
            env.client,
            upstream_timeout=3.0,
            clock=reactor,
            entropy=SystemEntropy(),
            monotonic=lambda: elapsed[0],
        )
        try:
            with pytest.raises(TaskError) as refused:
                await env.lifecycle.create(env.user_id, GID, "tok", "")
            assert refused.value.code == "unavailable"
            assert "nothing was submitted" in refused.value.message
            assert env.upstream.stats()["postAttempts"] == {}
            await eventually(lambda: env.lifecycle.settling == 0)
            assert op_row(env.path) is None  # released
        finally:
            env.lifecycle.stop()
            db.close()
