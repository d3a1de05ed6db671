"""Two sites on one PostgreSQL database (SCALE.md 2, DRILLS.md D9): each a
real lease session (:class:`~tasknet.site.storage.lease.PostgresLease`), a
real pool, a lifecycle, its reaper and its instance service on ``task.Clock``.

* a live site's ``SUBMITTING``/``RESERVED`` are never settled by another,
  however often the other reaps or recovers;
* once a site's lease session ends (its backend terminated, or its socket
  closed as a SIGKILL closes it) the other reaps it on its next tick: its
  ``SUBMITTING`` becomes ``UNKNOWN``, its ``RESERVED`` is released, and the
  evidence (who reaped whose which operations, when) is in
  ``instance_reap``; a restart of the dead site changes nothing of that;
* two reapers never both settle one instance;
* a reap and a reservation by the reaped instance cannot both commit
  (SERIALIZABLE);
* fencing: a site whose lease session is terminated stops, and a write it
  attempts afterwards is refused.

PostgreSQL only, by nature (on SQLite one site holds the file's flock).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.internet.utils import getProcessOutputAndValue
from twisted.logger import formatEvent, globalLogPublisher

from tasknet.runtime import SystemEntropy
from tasknet.site.instance_service import INTERVAL, InstanceService
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.reaper import Reaper
from tasknet.site.storage import create, instances, reaping
from tasknet.site.storage import usage as usage_weeks
from tasknet.site.storage.engine.database import Database, connect, open_pool, run_read, run_write
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, SERIALIZABLE
from tasknet.site.storage.instances import LeaseLost
from tasknet.site.storage.lease import PostgresLease, take_lease
from tasknet.site.upstream_client import UpstreamClient
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.eventually import eventually
from tests.runtime import lease_runtime, site_runtime
from tests.site.helpers import add_user, lease_timeout_passed

WEEK = usage_weeks.iso_week()
TWISTD = str(Path(sys.executable).with_name("twistd"))
REPO = str(Path(__file__).resolve().parents[2])


@pytest_twisted.async_yield_fixture
async def upstream() -> AsyncIterator[RunningUpstream]:
    running = await start_upstream()
    try:
        yield running
    finally:
        await running.stop()


@dataclass
class Site:
    """What one site process holds for this: its lease, pool, lifecycle,
    reaper and instance service, on a clock of its own."""

    name: str
    lease: PostgresLease
    db: Database
    client: UpstreamClient
    lifecycle: Lifecycle
    reaper: Reaper
    service: InstanceService
    clock: Clock
    fenced: list[str]

    @property
    def id(self) -> int:
        return self.lease.instance_id

    async def tick(self) -> None:
        """Advance this site's clock to its next tick and wait for that tick."""
        ticks = self.service.ticks
        self.clock.advance(INTERVAL)
        await eventually(lambda: self.service.ticks > ticks or bool(self.fenced))


@asynccontextmanager
async def running(url: str, name: str, upstream_url: str) -> AsyncIterator[Site]:
    """A site's instance, started (its first tick done)."""
    lease = take_lease(url, name, flock=None, **lease_runtime())
    assert isinstance(lease, PostgresLease)
    db = open_pool(url, **site_runtime())
    client = UpstreamClient(upstream_url, reactor=reactor, persistent=False)
    clock = Clock()
    reaper = Reaper(db, lease, upstream_timeout=2.0)
    lifecycle = Lifecycle(
        db,
        client,
        upstream_timeout=2.0,
        lease=lease,
        reaper=reaper,
        clock=clock,
        entropy=SystemEntropy(),
    )
    service = InstanceService(lease, db, reaper.reap_gone, clock=clock)
    site = Site(name, lease, db, client, lifecycle, reaper, service, clock, [])
    service.fenced.addCallback(site.fenced.append)
    try:
        await lifecycle.recover()
        service.startService()
        await eventually(lambda: service.ticks == 1 or bool(site.fenced))
        yield site
    finally:
        await service.stopService()
        lifecycle.stop()
        await client.close()
        db.close()
        lease.release()


def _in_flight(url: str, instance_id: int, user: int, submitting: int, reserved: int) -> None:
    """Instance ``instance_id``'s create of gid ``submitting`` interrupted after
    SUBMITTING (its POST not answered), and of gid ``reserved`` after RESERVED:
    the real transactions its lifecycle runs."""
    connection = connect(url)
    try:
        op = run_write(connection, create.reserve, submitting, user, "", "t", WEEK, instance_id)
        assert run_write(
            connection, create.begin_submit, submitting, op, 1, "", WEEK, None, instance_id
        )
        run_write(connection, create.reserve, reserved, user, "", "t", WEEK, instance_id)
    finally:
        connection.close()


def _rows(url: str, sql: str, *params: Any) -> list[Any]:
    connection = connect(url)
    try:
        return list(connection.execute(sql, params).fetchall())
    finally:
        connection.close()


def _states(url: str) -> dict[int, str]:
    return {r["gid"]: r["state"] for r in _rows(url, "SELECT gid, state FROM task_operation")}


def _records(url: str) -> list[reaping.ReapRecord]:
    connection = connect(url)
    try:
        return run_read(connection, reaping.reap_records)
    finally:
        connection.close()


def _instance(url: str, instance_id: int) -> instances.Instance:
    connection = connect(url)
    try:
        found = run_read(connection, instances.instance, instance_id)
    finally:
        connection.close()
    assert found is not None
    return found


def _terminate(url: str, pid: int) -> None:
    """End session ``pid`` and return once it is gone, its locks let go
    (without the wait, a loaded machine's server may still hold them when
    the reaper judges: the test would depend on the machine's speed)."""
    assert _rows(url, "SELECT pg_terminate_backend(?, 30000)", pid)[0][0]


async def _session_gone(url: str, pid: int) -> None:
    """Wait until the server has seen session ``pid`` end (a closed socket
    is noticed when the server next reads it), so that what follows judges
    a gone session whatever the machine's speed."""
    await eventually(
        lambda: not _rows(url, "SELECT 1 FROM pg_stat_activity WHERE pid = ?", pid),
        what=f"session {pid} gone",
    )


@pytest_twisted.ensureDeferred
async def test_a_live_sites_submissions_are_never_settled_by_another(
    pg_url: str, upstream: RunningUpstream
) -> None:
    user, _ = add_user(pg_url, "alice")
    async with running(pg_url, "b", upstream.base_url) as b:
        _in_flight(pg_url, b.id, user, submitting=1, reserved=2)
        async with running(pg_url, "a", upstream.base_url) as a:  # its recovery ran
            for _ in range(5):
                await a.tick()
                await b.tick()
            assert (await a.lifecycle.recover()).operations == []  # a restart's recovery too
            assert await a.reaper.reap_gone() == []
            assert _states(pg_url) == {1: "SUBMITTING", 2: "RESERVED"}
            assert _records(pg_url) == []
            assert _instance(pg_url, b.id).open and _instance(pg_url, a.id).open
            assert not a.fenced and not b.fenced


@pytest.mark.parametrize("death", ["terminated", "socket closed"])
@pytest_twisted.ensureDeferred
async def test_a_gone_site_is_reaped_on_the_next_tick_with_evidence_and_a_restart_changes_nothing(
    pg_url: str, upstream: RunningUpstream, death: str
) -> None:
    user, _ = add_user(pg_url, "alice")
    async with running(pg_url, "a", upstream.base_url) as a:
        lease_b = take_lease(pg_url, "b", flock=None, **lease_runtime())
        assert isinstance(lease_b, PostgresLease)
        b = lease_b.instance_id
        _in_flight(pg_url, b, user, submitting=1, reserved=2)
        ops = {r["gid"]: r["operation_id"] for r in _rows(pg_url, "SELECT * FROM task_operation")}
        _in_flight(pg_url, a.id, user, submitting=3, reserved=4)  # a's own, in flight
        await a.tick()
        assert _states(pg_url) == {1: "SUBMITTING", 2: "RESERVED", 3: "SUBMITTING", 4: "RESERVED"}

        if death == "terminated":
            _terminate(pg_url, lease_b.lease_pid)  # an operator, or a lost host's keepalives
        else:
            lease_b._connection.close()  # what a SIGKILL does to the lease socket
        await _session_gone(pg_url, lease_b.lease_pid)
        lease_timeout_passed(pg_url, b)
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        try:
            await a.tick()  # within one interval of the session's end
        finally:
            globalLogPublisher.removeObserver(events.append)
        said = [formatEvent(e) for e in events]
        assert any(
            f"site instance {a.id} (a) reaped site instance {b} (b on " in line
            and "1 submission(s) now UNKNOWN [1], 1 reservation(s) released [2]" in line
            for line in said
        ), said

        assert _states(pg_url) == {1: "UNKNOWN", 3: "SUBMITTING", 4: "RESERVED"}
        [unknown] = _rows(pg_url, "SELECT * FROM task_operation WHERE gid = 1")
        assert (unknown["operation_id"], unknown["step"]) == (ops[1], "recovery")
        assert f"site instance {b} stopped" in unknown["error"]
        assert _rows(pg_url, "SELECT gid FROM gallery ORDER BY gid") == [(1,), (3,), (4,)]
        gone = _instance(pg_url, b)
        assert gone.reaped_by == a.id and gone.reaped_at is not None and gone.ended_at is None
        evidence = [
            (r.instance_id, r.reaped_by, r.gid, r.operation_id, r.from_state, r.outcome)
            for r in _records(pg_url)
        ]
        assert evidence == [
            (b, a.id, 1, ops[1], "SUBMITTING", "UNKNOWN"),
            (b, a.id, 2, ops[2], "RESERVED", "released"),
        ]
        assert all(r.reaped_at >= gone.started_at for r in _records(pg_url))
        # The reaped instance can start nothing more, however late it learns it.
        with pytest.raises(LeaseLost, match=f"reaped by instance {a.id}"):
            connection = connect(pg_url)
            try:
                run_write(connection, create.reserve, 9, user, "", "t", WEEK, b)
            finally:
                connection.close()
        lease_b.release()

        # Its restart (a new instance of the same site): nothing changes.
        before = (_states(pg_url), _records(pg_url))
        async with running(pg_url, "b", upstream.base_url) as restarted:
            assert restarted.id > b
            await restarted.tick()
            await a.tick()
            assert (_states(pg_url), _records(pg_url)) == before
            assert _instance(pg_url, a.id).open and _instance(pg_url, restarted.id).open
        assert upstream.stats()["posts"] == {}  # nothing was resent


@pytest_twisted.ensureDeferred
async def test_two_reapers_never_both_settle_one_instance(
    pg_url: str, upstream: RunningUpstream
) -> None:
    user, _ = add_user(pg_url, "alice")
    async with running(pg_url, "a", upstream.base_url) as a:
        async with running(pg_url, "c", upstream.base_url) as c:
            lease_b = take_lease(pg_url, "b", flock=None, **lease_runtime())
            b = lease_b.instance_id
            _in_flight(pg_url, b, user, submitting=1, reserved=2)
            lease_b._connection.close()
            # The server ends b's session a moment after the client closed
            # it: until then b is (rightly) not judged gone.
            deadline = reactor.seconds() + 10
            while not await a.lease.judge(b):
                assert reactor.seconds() < deadline, "b's session never ended"
                await deferLater(reactor, 0.05, lambda: None)
            lease_timeout_passed(pg_url, b)
            # a has judged b gone and holds b's key: c cannot take it, so c
            # leaves b alone, whatever it would have decided.
            assert await c.reaper.reap_gone() == []
            assert _states(pg_url) == {1: "SUBMITTING", 2: "RESERVED"}
            await a.lease.forget(b)
            await a.tick()
            await c.tick()  # b's key is free again: c reaps, and finds it done
            assert [r.reaped_by for r in _records(pg_url)] == [a.id, a.id]
            assert _instance(pg_url, b).reaped_by == a.id
            lease_b.release()


@pytest_twisted.ensureDeferred
async def test_a_reap_and_a_reservation_of_the_reaped_instance_cannot_both_commit(
    pg_url: str,
) -> None:
    user, _ = add_user(pg_url, "alice")
    setup = connect(pg_url)
    reaper = run_write(setup, instances.register, "a", "host", 1)
    gone = run_write(setup, instances.register, "b", "host", 2)
    setup.close()
    late = connect(pg_url)  # the reaped site, not knowing yet
    reaper_connection = connect(pg_url)
    try:
        cursor = late.cursor()
        cursor.execute(BEGIN_WRITE[SERIALIZABLE])  # SERIALIZABLE
        create.reserve(cursor, 5, user, "", "t", WEEK, gone)  # saw its row open
        reaped = run_write(reaper_connection, reaping.reap, gone, reaper)  # commits first
        assert reaped.marked and reaped.settled == 0  # the reservation was not visible
        with pytest.raises(psycopg.errors.SerializationFailure):
            cursor.execute("COMMIT")
        assert not late.in_transaction
        # Run again (as the database layer does): refused, nothing written.
        with pytest.raises(LeaseLost):
            run_write(late, create.reserve, 5, user, "", "t", WEEK, gone)
        assert _states(pg_url) == {}
    finally:
        late.close()
        reaper_connection.close()


@pytest_twisted.ensureDeferred
async def test_a_site_whose_lease_session_ends_is_fenced_and_writes_nothing_more(
    pg_url: str, upstream: RunningUpstream
) -> None:
    user, _ = add_user(pg_url, "alice")
    async with running(pg_url, "a", upstream.base_url) as a:
        created = await a.lifecycle.create(user, 1, "t")  # a write while the lease holds
        assert created.status == 201
        _terminate(pg_url, a.lease.lease_pid)
        await a.tick()
        assert a.fenced and "lease" in a.fenced[0]
        assert a.lease.lost and not a.service._timer.running  # type: ignore[union-attr]
        requests = dict(upstream.stats())
        with pytest.raises(LeaseLost, match="lost its lease"):
            await a.lifecycle.create(user, 2, "t")
        with pytest.raises(LeaseLost):
            await a.lifecycle.delete(user, 1)
        assert dict(upstream.stats()) == requests  # nothing asked upstream either
        assert _states(pg_url) == {1: "SUBMITTED"}


@pytest_twisted.ensureDeferred
async def test_twistd_site_exits_non_zero_when_its_lease_session_ends(
    pg_url: str, upstream: RunningUpstream, tmp_path: Any
) -> None:
    log = tmp_path / "site.log"
    argv = [
        "-n",
        "--pidfile=",
        f"--logfile={log}",
        "tasknet-site",
        "--db",
        pg_url,
        "--name",
        "doomed",
        "--http",
        "tcp:0:interface=127.0.0.1",
        "--nodes",
        "tcp:0:interface=127.0.0.1",
        "--upstream",
        upstream.base_url,
    ]
    ended = getProcessOutputAndValue(
        TWISTD, argv, env={**os.environ, "PYTHONPATH": REPO}, path=REPO, reactor=reactor
    ).addTimeout(90, reactor)
    try:
        await eventually(lambda: log.exists() and "HTTP on" in log.read_text(), timeout=60)
        [row] = _rows(pg_url, "SELECT id, lease_pid FROM site_instance WHERE name = 'doomed'")
        _terminate(pg_url, row["lease_pid"])
    finally:
        out, err, code = await ended
    text = log.read_text()
    assert code == 1, err.decode() + text
    assert f"LEASE LOST for site instance {row['id']} (doomed)" in text
    assert _instance(pg_url, row["id"]).ended_at is None  # no last write once fenced


@pytest_twisted.ensureDeferred
async def test_a_reaper_ends_only_its_own_database_s_sessions(pg_server: Any) -> None:
    """Two deployments on one PostgreSQL server, each with an instance 1
    (the simulator's workers share a server so): a reaper ending its own
    database's instance 1 left the other database's instance 1 leaseless."""
    from tasknet.site.storage.engine.schema import prepare_database

    urls = []
    for name in ("reap_here", "reap_elsewhere"):
        pg_server.drop_database(name)
        urls.append(pg_server.create_database(name))
        prepare_database(urls[-1])
    here, elsewhere = urls
    leases = []
    try:
        other = take_lease(elsewhere, "other-deployment", flock=None, **lease_runtime())
        leases.append(other)
        gone = take_lease(here, "a", flock=None, **lease_runtime())
        leases.append(gone)
        reaper = take_lease(here, "b", flock=None, **lease_runtime())
        leases.append(reaper)
        assert isinstance(other, PostgresLease) and isinstance(reaper, PostgresLease)
        assert other.instance_id == gone.instance_id == 1 and reaper.instance_id == 2
        ended = await reaper.end_sessions_of(1)
        assert ended == 1  # this database's instance 1: its lease session
        alive = connect(elsewhere)
        try:
            found = alive.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ?", (other.lease_pid,)
            ).fetchone()
        finally:
            alive.close()
        assert found[0] == 1, "the other database's instance 1 kept its session"
    finally:
        for lease in reversed(leases):
            lease.release()
        for name in ("reap_here", "reap_elsewhere"):
            pg_server.drop_database(name)
