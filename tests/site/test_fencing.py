"""Fencing (SCALE.md "Fencing" 1-4) on a real PostgreSQL, with real lease
sessions, pools, the real mock upstream and each site's monotonic clock on
``task.Clock`` (a pause is a clock jump at the worst instant):

* a lease goes stale on the site's own clock: no write transaction starts
  (``LeaseStale``) until a check confirms it again;
* the POST gate: a site paused between its ``SUBMITTING`` commit and the
  POST's first byte (the lifecycle's ``before_post_gate`` pause, right where
  the drill's fault point SIGSTOPs a real site) sends nothing, whether its
  lease went stale or its ``SUBMITTING`` grew older than the upstream
  timeout; the generation is given back and the gid is free;
* a reap records the verdict's wait (``verdict_not_before``) and when the
  gone instance can last have confirmed its lease;
* the write gate: a site frozen inside a write transaction does not hold its
  reap up (the reaper ends its sessions), and nothing of that transaction
  commits;
* a dead pool connection is replaced and the transaction retried whole: a
  writer session ended on the server before each step of a create
  (reserve, begin_submit, persist, mark_unknown) still takes the task to
  its right state with one POST; ``/healthz`` is 503 while the database
  does not answer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import formatEvent, globalLogPublisher

from tasknet.runtime import SystemEntropy
from tasknet.site.instance_service import INTERVAL, InstanceService
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.reaper import Reaper
from tasknet.site.storage import create, reaping
from tasknet.site.storage import usage as usage_weeks
from tasknet.site.storage.engine.database import Database, connect, open_pool, run_write
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.instances import LeaseLost, LeaseStale
from tasknet.site.storage.lease import LEASE_TIMEOUT, PostgresLease, application_name, take_lease
from tasknet.site.upstream_client import Outcome, UpstreamClient
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.eventually import eventually
from tests.runtime import lease_runtime, site_runtime
from tests.site.helpers import add_user, fault, lease_timeout_passed, site_options

WEEK = usage_weeks.iso_week()
UPSTREAM_TIMEOUT = 2.0


@pytest_twisted.async_yield_fixture
async def upstream() -> AsyncIterator[RunningUpstream]:
    running = await start_upstream()
    try:
        yield running
    finally:
        await running.stop()


def posts(upstream: RunningUpstream, gid: int) -> int:
    return int(upstream.app.journal.posts.get(gid, 0))


@dataclass
class Site:
    """One site instance: its lease (judged on ``clock``), its fenced pool,
    lifecycle and instance service."""

    lease: PostgresLease
    db: Database
    lifecycle: Lifecycle
    service: InstanceService
    clock: Clock
    fenced: list[str]

    @property
    def id(self) -> int:
        return self.lease.instance_id

    async def tick(self) -> None:
        ticks = self.service.ticks
        self.clock.advance(INTERVAL)
        await eventually(lambda: self.service.ticks > ticks or bool(self.fenced))


@asynccontextmanager
async def running(
    url: str,
    name: str,
    upstream_url: str,
    *,
    before_post_gate: Callable[[], object] | None = None,
    upstream_timeout: float = UPSTREAM_TIMEOUT,
) -> AsyncIterator[Site]:
    """A site instance as the composition root builds one (the pool behind
    the lease's fence, sessions named after the instance), started."""
    clock = Clock()
    lease = take_lease(
        url,
        name,
        flock=None,
        upstream_timeout=upstream_timeout,
        **(lease_runtime() | {"monotonic": clock.seconds}),
    )
    assert isinstance(lease, PostgresLease)
    db = open_pool(
        url,
        **site_runtime(),
        fence=lease,
        application_name=application_name(lease.instance_id, "writer"),
        reader_application_name=application_name(lease.instance_id, "reader"),
    )
    client = UpstreamClient(upstream_url, reactor=reactor, persistent=False)
    reaper = Reaper(db, lease, upstream_timeout=upstream_timeout)
    lifecycle = Lifecycle(
        db,
        client,
        upstream_timeout=upstream_timeout,
        lease=lease,
        reaper=reaper,
        clock=clock,
        entropy=SystemEntropy(),
        retry_initial=0.05,
        retry_max=0.1,
        before_post_gate=before_post_gate,
    )
    service = InstanceService(lease, db, reaper.reap_gone, clock=clock)
    site = Site(lease, db, lifecycle, service, clock, [])
    service.fenced.addCallback(site.fenced.append)
    try:
        service.startService()
        await eventually(lambda: service.ticks == 1 or bool(site.fenced))
        await lifecycle.recover()
        yield site
    finally:
        await service.stopService()
        lifecycle.stop()
        await client.close()
        db.close()
        lease.release()


def sql(url: str, statement: str, *params: Any) -> list[Any]:
    connection = connect(url)
    try:
        return list(connection.execute(statement, params).fetchall())
    finally:
        connection.close()


def end_sessions(url: str, name: str, *, via: str | None = None) -> int:
    """End, on the server, every session whose application_name is ``name``
    (what an operator, a pooler or ``idle_session_timeout`` does), from
    ``url`` (or ``via``, another database of the same server)."""
    rows = sql(
        via or url,
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = ?",
        name,
    )
    return len(rows)


def state_of(url: str, gid: int) -> str | None:
    rows = sql(url, "SELECT state FROM task_operation WHERE gid = ?", gid)
    return rows[0]["state"] if rows else None


# -- freshness -----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_lease_goes_stale_on_its_own_clock_and_then_nothing_is_written(
    pg_url: str, upstream: RunningUpstream
) -> None:
    async with running(pg_url, "a", upstream.base_url) as a:
        assert a.lease.stale_for() is None
        # A pause: the clock moves on and no check runs meanwhile.  With the
        # timer left running, the advance itself started a check, whose
        # confirmation (dated after the advance) raced the write below: on a
        # loaded machine it landed first and nothing was refused.
        await a.service.stopService()
        a.clock.advance(LEASE_TIMEOUT)
        assert a.lease.stale_for() == pytest.approx(LEASE_TIMEOUT, abs=INTERVAL)
        with pytest.raises(LeaseStale):
            await a.db.write(
                lambda cursor: cursor.execute(
                    "INSERT INTO site_setting (name, value) VALUES ('stale', 'x')"
                )
            )
        assert sql(pg_url, "SELECT * FROM site_setting WHERE name = 'stale'") == []
        await a.service.tick()  # a check confirms the lease again
        assert a.lease.stale_for() is None
        await a.db.write(
            lambda cursor: cursor.execute(
                "INSERT INTO site_setting (name, value) VALUES ('fresh', 'x')"
            )
        )
        assert len(sql(pg_url, "SELECT * FROM site_setting WHERE name = 'fresh'")) == 1


# -- the POST gate --------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_gate_that_refuses_sends_not_one_byte(upstream: RunningUpstream) -> None:
    client = UpstreamClient(upstream.base_url, reactor=reactor, persistent=False)
    asked: list[int] = []

    def gate() -> str:
        asked.append(upstream.stats()["requests"])
        return "lease stale"

    try:
        result = await client.submit(7001, "t", 2.0, gate=gate)
    finally:
        await client.close()
    assert result.outcome is Outcome.NOT_SENT
    assert result.error == "lease stale"
    assert len(asked) == 1  # asked once, with the connection up
    assert posts(upstream, 7001) == 0
    assert upstream.stats()["requests"] == asked[0]  # nothing arrived after the check


@pytest_twisted.ensureDeferred
async def test_a_site_paused_before_its_post_sends_nothing_once_its_lease_is_stale(
    pg_url: str, upstream: RunningUpstream
) -> None:
    clock_holder: list[Clock] = []
    user, _ = add_user(pg_url, "alice")

    def pause() -> None:  # the SIGSTOP of S23, as a jump of the site's clock
        clock_holder[0].advance(LEASE_TIMEOUT + 1)

    async with running(pg_url, "a", upstream.base_url, before_post_gate=pause) as a:
        clock_holder.append(a.clock)
        # The jump also runs the instance's next tick: the lease is confirmed
        # again soon after, so the release can be written.
        with pytest.raises(TaskError) as refused:
            await a.lifecycle.create(user, 7101, "t")
        assert refused.value.code == "unavailable"
        assert "nothing was submitted" in refused.value.message
        assert posts(upstream, 7101) == 0
        assert state_of(pg_url, 7101) is None  # released: the gid is free
        assert not a.fenced


@pytest_twisted.ensureDeferred
async def test_a_lease_lost_before_the_post_leaves_the_submission_for_the_reaper_and_says_so(
    pg_url: str, upstream: RunningUpstream
) -> None:
    sites: list[Site] = []
    user, _ = add_user(pg_url, "alice")
    events: list[dict[str, Any]] = []

    def lose() -> None:  # found lost by a tick just before the POST's gate
        sites[0].service.fence("the lease check failed: ended by the test")

    async with running(pg_url, "a", upstream.base_url, before_post_gate=lose) as a:
        sites.append(a)
        globalLogPublisher.addObserver(events.append)
        try:
            with pytest.raises(TaskError) as refused:
                await a.lifecycle.create(user, 7151, "t")
        finally:
            globalLogPublisher.removeObserver(events.append)
        assert refused.value.code == "unavailable"
        assert posts(upstream, 7151) == 0
        # Nothing more is written: the SUBMITTING generation stays for a reap.
        assert state_of(pg_url, 7151) == "SUBMITTING"
        left = [formatEvent(e) for e in events if "left for the reaper" in str(e.get("log_format"))]
        assert left and "7151" in left[0], [formatEvent(e) for e in events]


@pytest_twisted.ensureDeferred
async def test_a_post_later_than_the_upstream_timeout_after_submitting_is_not_sent(
    pg_url: str, upstream: RunningUpstream
) -> None:
    clock_holder: list[Clock] = []
    user, _ = add_user(pg_url, "alice")

    def pause() -> None:  # shorter than the lease timeout, longer than the upstream's
        clock_holder[0].advance(UPSTREAM_TIMEOUT + 0.5)

    async with running(pg_url, "a", upstream.base_url, before_post_gate=pause) as a:
        clock_holder.append(a.clock)
        with pytest.raises(TaskError) as refused:
            await a.lifecycle.create(user, 7102, "t")
        assert refused.value.code == "unavailable"
        assert "since SUBMITTING" in refused.value.message
        assert posts(upstream, 7102) == 0
        assert state_of(pg_url, 7102) is None


# -- the reap's evidence and the verdict's wait -------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_reaped_submission_records_when_its_verdict_may_come(
    pg_url: str, upstream: RunningUpstream
) -> None:
    user, _ = add_user(pg_url, "alice")
    async with running(pg_url, "b", upstream.base_url) as b:
        async with running(pg_url, "a", upstream.base_url, upstream_timeout=30.0) as a:
            connection = connect(pg_url)
            try:
                op = run_write(connection, create.reserve, 7201, user, "", "t", WEEK, a.id)
                assert run_write(connection, create.begin_submit, 7201, op, 1, "", WEEK, None, a.id)
            finally:
                connection.close()
            end_sessions(pg_url, application_name(a.id, "lease"))
            lease_timeout_passed(pg_url, a.id)
            await eventually(
                lambda: not sql(pg_url, "SELECT 1 FROM pg_locks WHERE objid = ?", a.id)
            )
            await b.tick()
            row = sql(
                pg_url,
                "SELECT state, verdict_not_before FROM task_operation WHERE gid = 7201",
            )[0]
            reap = sql(pg_url, "SELECT reaped_at, lease_confirmed_at FROM instance_reap")[0]
    assert row["state"] == "UNKNOWN"
    confirmed = _moment(reap["lease_confirmed_at"])
    # Its last confirmation, which the reap waited a lease timeout past.
    assert _moment(reap["reaped_at"]) - confirmed >= timedelta(seconds=LEASE_TIMEOUT)
    # From it: A's own lease timeout plus its own upstream timeout.
    wait = _moment(row["verdict_not_before"]) - confirmed
    assert wait == pytest.approx(
        timedelta(seconds=LEASE_TIMEOUT + 30.0), abs=timedelta(seconds=0.01)
    )


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest_twisted.ensureDeferred
async def test_a_sqlite_recovery_sets_no_verdict_wait(tmp_path: Any) -> None:
    # One site per SQLite file: a reaped instance is dead, not paused.
    from tasknet.site.storage.engine.schema import prepare_database

    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    user, _ = add_user(path, "alice")
    connection = connect(path)
    try:
        op = run_write(connection, create.reserve, 7301, user, "", "t", WEEK, None)
        run_write(connection, create.begin_submit, 7301, op, 1, "", WEEK, None, None)
        run_write(connection, reaping.reap, None, 1)
        row = connection.execute(
            "SELECT state, verdict_not_before FROM task_operation WHERE gid = 7301"
        ).fetchone()
    finally:
        connection.close()
    assert row["state"] == "UNKNOWN" and row["verdict_not_before"] is None


# -- the write gate ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_site_frozen_inside_a_write_does_not_hold_its_reap_and_commits_nothing(
    pg_url: str, upstream: RunningUpstream
) -> None:
    frozen, thawed = threading.Event(), threading.Event()

    def frozen_write(cursor: Any) -> None:
        cursor.execute("INSERT INTO site_setting (name, value) VALUES ('frozen', 'a')")
        if not thawed.is_set():
            frozen.set()
            thawed.wait(30)  # SIGSTOP, as far as the database can tell
        cursor.execute("SELECT 1")

    async with running(pg_url, "b", upstream.base_url) as b:
        async with running(pg_url, "a", upstream.base_url) as a:
            writing = a.db.write(frozen_write)
            await deferToThread(frozen.wait, 10)
            end_sessions(pg_url, application_name(a.id, "lease"))
            lease_timeout_passed(pg_url, a.id)  # the hand fence
            started = reactor.seconds()
            await eventually(
                lambda: not sql(pg_url, "SELECT 1 FROM pg_locks WHERE objid = ?", a.id)
            )
            await b.tick()
            reaped = sql(pg_url, "SELECT reaped_by FROM site_instance WHERE id = ?", a.id)
            reap_took = reactor.seconds() - started
            thawed.set()
            with pytest.raises(LeaseLost):
                await writing
    assert reaped[0]["reaped_by"] == b.id
    assert reap_took < 10  # not a lock timeout per attempt for as long as A stays frozen
    assert sql(pg_url, "SELECT * FROM site_setting WHERE name = 'frozen'") == []


@pytest_twisted.ensureDeferred
async def test_after_its_reap_a_site_that_still_thinks_its_lease_fresh_writes_nothing(
    pg_url: str, upstream: RunningUpstream
) -> None:
    async with running(pg_url, "b", upstream.base_url) as b:
        async with running(pg_url, "a", upstream.base_url) as a:
            end_sessions(pg_url, application_name(a.id, "lease"))
            lease_timeout_passed(pg_url, a.id)
            await eventually(
                lambda: not sql(pg_url, "SELECT 1 FROM pg_locks WHERE objid = ?", a.id)
            )
            await b.tick()
            assert a.lease.stale_for() is None  # A has not looked yet
            with pytest.raises(LeaseLost):
                await a.db.write(
                    lambda cursor: cursor.execute(
                        "INSERT INTO site_setting (name, value) VALUES ('late', 'a')"
                    )
                )
    assert sql(pg_url, "SELECT * FROM site_setting WHERE name = 'late'") == []


# -- dead pool connections -------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_dead_writer_or_reader_connection_is_replaced_and_the_work_done(
    pg_url: str,
) -> None:
    db = open_pool(
        pg_url, **site_runtime(), application_name="t-writer", reader_application_name="t-reader"
    )
    try:
        await db.write(lambda cursor: cursor.execute("SELECT 1"))
        await db.read(lambda cursor: cursor.execute("SELECT 1").fetchone())
        assert end_sessions(pg_url, "t-writer") == 1
        assert end_sessions(pg_url, "t-reader") == 1
        await db.write(
            lambda cursor: cursor.execute(
                "INSERT INTO site_setting (name, value) VALUES ('w', '1')"
            )
        )
        assert db.reconnects == 1
        row = await db.read(
            lambda cursor: cursor.execute(
                "SELECT value FROM site_setting WHERE name = 'w'"
            ).fetchone()
        )
        assert row[0] == "1"
    finally:
        db.close()


async def _during(d: Deferred[Any], when: Callable[[], bool], action: Callable[[], Any]) -> None:
    """Run ``action`` in a thread once ``when()`` holds, while ``d`` is under way."""
    await eventually(when, timeout=5.0)
    assert not d.called
    await deferToThread(action)


@pytest.mark.parametrize(
    ("step", "rules", "expected"),
    [
        ("reserve", [], "SUBMITTED"),
        (
            "begin_submit",
            [fault("latency", method="GET", path="/api/galleries/*", ms=400)],
            "SUBMITTED",
        ),
        ("persist", [fault("latency", ms=400)], "SUBMITTED"),
        ("mark_unknown", [fault("timeout")], "UNKNOWN"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_writer_session_ended_before_each_create_step_still_ends_right_with_one_post(
    pg_url: str, upstream: RunningUpstream, step: str, rules: list[Any], expected: str
) -> None:
    user, _ = add_user(pg_url, "alice")
    gid = 7400 + len(step)
    upstream.set_faults(rules)
    async with running(pg_url, "a", upstream.base_url, upstream_timeout=1.0) as a:
        writer = application_name(a.id, "writer")
        if step == "reserve":
            end_sessions(pg_url, writer)
            created = a.lifecycle.create(user, gid, "t")
        else:
            created = a.lifecycle.create(user, gid, "t")
            in_step = {
                "begin_submit": lambda: upstream.stats()["requests"] >= 1,
                "persist": lambda: upstream.stats()["requests"] >= 2,  # the POST arrived
                "mark_unknown": lambda: posts(upstream, gid) == 1,
            }[step]
            await _during(created, in_step, lambda: end_sessions(pg_url, writer))
        answer = await created
        await deferLater(reactor, 0, lambda: None)
        assert answer.task["state"] == expected
        assert state_of(pg_url, gid) == expected
        assert posts(upstream, gid) == 1
        assert a.db.reconnects >= 1


@pytest_twisted.ensureDeferred
async def test_healthz_is_503_while_the_database_does_not_answer(
    pg_url: str, upstream: RunningUpstream
) -> None:
    from tests.site.helpers import running_site

    database = pg_url.rsplit("/", 1)[1].split("?")[0]
    # ALTER DATABASE from another database of the same server.
    admin_url = pg_url.replace(f"/{database}", "/postgres", 1)
    async with running_site(site_options(pg_url, upstream.base_url)) as site:
        status, body = await site.request("GET", "/healthz")
        assert status == 200 and body["database"] == "ok"
        instance = site.site.instance.instance_id
        sql(admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            end_sessions(pg_url, application_name(instance, "reader"), via=admin_url)
            status, body = await site.request("GET", "/healthz")
            assert status == 503
            assert body["database"].startswith("failing since ")
        finally:
            sql(admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        status, body = await site.request("GET", "/healthz")
        assert status == 200 and body["database"] == "ok"


def test_reserve_and_begin_submit_repeated_after_a_lost_commit_answer_change_nothing(
    pg_url: str,
) -> None:
    # A COMMIT whose answer was lost (CommitUnknown) is repeated only where
    # the guards make the repeat a no-op (SCALE.md "Fencing" 4).
    user, _ = add_user(pg_url, "alice")
    connection = connect(pg_url)
    try:
        op = run_write(connection, create.reserve, 7501, user, "", "t", WEEK, None, "op-7501")
        again = run_write(connection, create.reserve, 7501, user, "", "t", WEEK, None, "op-7501")
        assert op == again == "op-7501"
        with pytest.raises(TaskError):  # another operationId is another create: refused
            run_write(connection, create.reserve, 7501, user, "", "t", WEEK, None, "op-other")
        assert run_write(connection, create.begin_submit, 7501, op, 3, "", WEEK, None, None)
        assert run_write(connection, create.begin_submit, 7501, op, 3, "", WEEK, None, None)
        rows = connection.execute(
            "SELECT state, cost FROM task_operation WHERE gid = 7501"
        ).fetchall()
        assert [(r["state"], r["cost"]) for r in rows] == [("SUBMITTING", 3)]
        assert run_write(connection, create.release_unsent, 7501, op)
        assert connection.execute("SELECT 1 FROM task_operation WHERE gid = 7501").fetchall() == []
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_a_gone_site_is_reaped_only_once_its_own_clock_must_call_its_lease_stale(
    pg_url: str, upstream: RunningUpstream
) -> None:
    # Its lock is free the moment its session ends, but a paused site would
    # still call its lease fresh for up to a lease timeout after its last
    # confirmation: reaped before that, it could resume and POST after its reap.
    user, _ = add_user(pg_url, "alice")
    async with running(pg_url, "b", upstream.base_url) as b:
        async with running(pg_url, "a", upstream.base_url) as a:
            connection = connect(pg_url)
            try:
                op = run_write(connection, create.reserve, 7601, user, "", "t", WEEK, a.id)
                run_write(connection, create.begin_submit, 7601, op, 1, "", WEEK, None, a.id)
            finally:
                connection.close()
            end_sessions(pg_url, application_name(a.id, "lease"))
            await eventually(
                lambda: not sql(pg_url, "SELECT 1 FROM pg_locks WHERE objid = ?", a.id)
            )
            await b.tick()
            assert state_of(pg_url, 7601) == "SUBMITTING"  # gone, but not yet a lease timeout
            assert (
                sql(pg_url, "SELECT reaped_by FROM site_instance WHERE id = ?", a.id)[0][0] is None
            )
            lease_timeout_passed(pg_url, a.id, seconds=LEASE_TIMEOUT)
            await b.tick()
            assert state_of(pg_url, 7601) == "UNKNOWN"
            assert (
                sql(pg_url, "SELECT reaped_by FROM site_instance WHERE id = ?", a.id)[0][0] == b.id
            )


def test_a_process_is_dead_here_only_when_its_pid_is_gone_in_this_very_pid_space() -> None:
    import subprocess
    import sys

    from tasknet.runtime import OSProcesses
    from tasknet.site.storage.instances import Instance
    from tasknet.site.storage.lease import dead_here

    finished = subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert finished.returncode == 0
    probe = subprocess.Popen([sys.executable, "-c", "pass"])
    probe.wait()  # reaped: its pid is gone (until the kernel reuses it)

    def instance(pid: int, space: str | None) -> Instance:
        return Instance(1, "a", "h", pid, None, "", "", None, None, None, process_space=space)

    kernel = OSProcesses()
    here = kernel.this()
    assert here.space is not None and here.pid == os.getpid()
    assert dead_here(instance(probe.pid, here.space), kernel)
    assert not dead_here(instance(os.getpid(), here.space), kernel)  # alive (a paused one too)
    assert not dead_here(instance(probe.pid, "another kernel or pid namespace"), kernel)
    assert not dead_here(instance(probe.pid, None), kernel)  # an instance of an older release
