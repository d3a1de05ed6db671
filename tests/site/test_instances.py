"""Site instances (SCALE.md 2): the instance transactions on both backends
(register, heartbeat, end, the fencing check, suspects, reap and its D9
evidence), the leases, and the instance service's timing on ``task.Clock``.

The reaping of one live site by another, over two real lease sessions, is
tests/site/test_reaping.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
import pytest_twisted
from psycopg import conninfo as pg_conninfo
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.protocols import portforward

from tasknet.site.housekeeping import Housekeeping
from tasknet.site.instance_service import CHECK_TIMEOUT, INTERVAL, InstanceService
from tasknet.site.storage import create, instances, reaping
from tasknet.site.storage import usage as usage_weeks
from tasknet.site.storage.engine import file_lock as lock
from tasknet.site.storage.engine.database import Connection, connect, open_pool, run_read, run_write
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, SERIALIZABLE
from tasknet.site.storage.instances import LeaseLost
from tasknet.site.storage.lease import PRUNE_JOB, PostgresLease, SqliteLease, once, take_lease
from tests.backends import is_postgres
from tests.eventually import eventually
from tests.runtime import lease_runtime, site_runtime
from tests.site.helpers import add_user

WEEK = usage_weeks.iso_week()


def _reserved(conn: Connection, gid: int, user: int, instance: int | None) -> str:
    return run_write(conn, create.reserve, gid, user, "", "t", WEEK, instance)


def _submitting(conn: Connection, gid: int, user: int, instance: int | None) -> str:
    op = _reserved(conn, gid, user, instance)
    assert run_write(conn, create.begin_submit, gid, op, 1, "", WEEK, None, instance)
    return op


def _op(conn: Connection, gid: int) -> Any:
    return conn.execute(
        "SELECT state, step, error, instance_id, operation_id FROM task_operation WHERE gid = ?",
        (gid,),
    ).fetchone()


def test_register_heartbeat_end_and_the_fencing_check(db_target: str, conn: Connection) -> None:
    a = run_write(conn, instances.register, "site-a", "host", 11)
    b = run_write(conn, instances.register, "site-b", "host", 12, 4321)
    assert b > a
    row = run_read(conn, instances.instance, b)
    assert (row.name, row.host, row.pid, row.lease_pid, row.open) == (
        "site-b",
        "host",
        12,
        4321,
        True,
    )
    assert run_write(conn, instances.heartbeat, a)
    run_write(conn, instances.require_open, a)  # open: no refusal
    assert run_write(conn, instances.end, a)
    assert not run_write(conn, instances.end, a)  # once
    assert not run_write(conn, instances.heartbeat, a)  # the database says: stop
    with pytest.raises(LeaseLost, match="ended"):
        run_write(conn, instances.require_open, a)
    with pytest.raises(LeaseLost, match="not registered"):
        run_write(conn, instances.require_open, b + 100)
    assert [
        i.id for i in run_read(conn, lambda c: instances.list_instances(c, open_only=True))
    ] == [b]
    assert [i.id for i in run_read(conn, instances.list_instances)] == [a, b]


def test_an_instance_that_lost_its_lease_can_neither_reserve_nor_submit(
    db_target: str, conn: Connection
) -> None:
    user, _ = add_user(db_target, "alice")
    me = run_write(conn, instances.register, "site", "host", 1)
    other = run_write(conn, instances.register, "other", "host", 2)
    op = _reserved(conn, 5, user, me)
    assert _op(conn, 5)["instance_id"] == me
    run_write(conn, reaping.reap, me, other)  # judged gone: its RESERVED released
    with pytest.raises(LeaseLost, match=f"reaped by instance {other}"):
        _reserved(conn, 6, user, me)
    with pytest.raises(LeaseLost):
        run_write(conn, create.begin_submit, 5, op, 1, "", WEEK, None, me)
    # Nothing of either refused transaction was written.
    assert _op(conn, 5) is None and _op(conn, 6) is None
    assert conn.execute("SELECT COUNT(*) FROM gallery").fetchone()[0] == 0


def test_reap_settles_only_the_gone_instances_generations_with_evidence(
    db_target: str, conn: Connection
) -> None:
    user, _ = add_user(db_target, "alice")
    reaper = run_write(conn, instances.register, "a", "host", 1)
    gone = run_write(conn, instances.register, "b", "host", 2)
    op1 = _submitting(conn, 1, user, gone)
    op2 = _reserved(conn, 2, user, gone)
    _submitting(conn, 3, user, reaper)  # the reaper's own, in flight
    op4 = _reserved(conn, 4, user, None)  # written by no instance (a tool, a v3 site)
    assert run_read(conn, instances.suspects, reaper) == [gone]
    assert run_read(conn, lambda c: instances.suspects(c, reaper, unrecorded=True)) == [gone, None]

    reaped = run_write(conn, reaping.reap, gone, reaper)
    assert reaped.marked and reaped.instance_id == gone
    assert (reaped.who, reaped.nodes, reaped.claims) == ("b on host, pid 2", [], 0)
    assert (reaped.recovered.unknown, reaped.recovered.released) == ([1], [2])
    one = _op(conn, 1)
    assert (one["state"], one["step"], one["operation_id"]) == ("UNKNOWN", "recovery", op1)
    assert f"site instance {gone} stopped" in one["error"]
    assert f"settled by site instance {reaper}" in one["error"]
    assert _op(conn, 2) is None  # released, placeholder too
    assert conn.execute("SELECT COUNT(*) FROM gallery WHERE gid = 2").fetchone()[0] == 0
    assert _op(conn, 3)["state"] == "SUBMITTING"  # never another instance's
    assert _op(conn, 4)["state"] == "RESERVED"
    row = run_read(conn, instances.instance, gone)
    assert row.reaped_by == reaper and row.reaped_at is not None and not row.open
    records = run_read(conn, reaping.reap_records, gone)
    assert [(r.gid, r.operation_id, r.from_state, r.outcome, r.reaped_by) for r in records] == [
        (1, op1, "SUBMITTING", "UNKNOWN", reaper),
        (2, op2, "RESERVED", "released", reaper),
    ]
    assert all(r.instance_id == gone and r.reaped_at for r in records)

    # Again: nothing is settled twice, no evidence is added.
    again = run_write(conn, reaping.reap, gone, reaper)
    assert not again.marked and again.settled == 0
    assert run_read(conn, reaping.reap_records) == records
    assert run_read(conn, instances.suspects, reaper) == []

    # What no instance recorded is settled only when asked for (the start).
    unrecorded = run_write(conn, reaping.reap, None, reaper)
    assert unrecorded.recovered.released == [4] and not unrecorded.marked
    [record] = run_read(conn, reaping.reap_records, None)[-1:]
    assert (record.instance_id, record.gid, record.operation_id) == (None, 4, op4)


def test_an_ended_instance_that_left_a_generation_in_flight_is_a_suspect(
    db_target: str, conn: Connection
) -> None:
    user, _ = add_user(db_target, "alice")
    me = run_write(conn, instances.register, "a", "host", 1)
    ended = run_write(conn, instances.register, "b", "host", 2)
    _reserved(conn, 7, user, ended)  # a release its stop did not record
    run_write(conn, instances.end, ended)
    assert run_read(conn, instances.suspects, me) == [ended]
    reaped = run_write(conn, reaping.reap, ended, me)
    assert not reaped.marked and reaped.recovered.released == [7]


def test_recover_of_one_owner_and_of_every_instance(db_target: str, conn: Connection) -> None:
    user, _ = add_user(db_target, "alice")
    a = run_write(conn, instances.register, "a", "host", 1)
    b = run_write(conn, instances.register, "b", "host", 2)
    _submitting(conn, 1, user, a)
    _submitting(conn, 2, user, None)
    _reserved(conn, 3, user, b)
    assert run_write(conn, create.recover, a).unknown == [1]
    assert run_write(conn, create.recover, None).unknown == [2]
    # A site alone on its database settles everything, as before instances.
    everything = run_write(conn, create.recover)
    assert (everything.unknown, everything.released) == ([], [3])
    assert [(s.gid, s.from_state, s.outcome) for s in everything.operations] == [
        (3, "RESERVED", "released")
    ]


def test_once_is_true_on_sqlite_and_one_transaction_at_a_time_on_postgresql(
    db_target: str, conn: Connection
) -> None:
    assert run_write(conn, once, 1)
    if not is_postgres(db_target):
        return
    other = connect(db_target)
    try:
        holder = conn.cursor()
        holder.execute(BEGIN_WRITE[SERIALIZABLE])
        try:
            assert once(holder, 1)
            assert not run_write(other, once, 1)  # another site is doing it now
            assert run_write(other, once, 2)  # another job is free
        finally:
            holder.execute("ROLLBACK")
        assert run_write(other, once, 1)  # the lock ended with the transaction
    finally:
        other.close()


# -- leases ---------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_sqlite_lease_is_the_flock_and_judges_every_other_instance_gone(
    tmp_path: Any,
) -> None:
    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    flock = lock.acquire(path)
    lease = take_lease(path, "solo", flock=flock, **lease_runtime())
    assert isinstance(lease, SqliteLease) and not lease.shared
    assert await lease.judge(lease.instance_id + 1)
    assert not await lease.judge(lease.instance_id)
    await lease.check()
    lease.release()
    lease.release()  # idempotent
    assert not flock.held
    connection = connect(path)
    try:
        row = run_read(connection, instances.instance, lease.instance_id)
    finally:
        connection.close()
    assert row.name == "solo" and row.ended_at is not None and row.reaped_at is None
    lock.acquire(path).release()  # the flock went with it


def _terminate(url: str, pid: int) -> None:
    connection = connect(url)
    try:
        assert connection.execute("SELECT pg_terminate_backend(?)", (pid,)).fetchone()[0]
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_a_postgresql_lease_is_a_lock_only_its_session_holds(pg_url: str) -> None:
    a = take_lease(pg_url, "a", flock=None, **lease_runtime())
    b = take_lease(pg_url, "b", flock=None, **lease_runtime())
    try:
        assert isinstance(a, PostgresLease) and a.shared and b.instance_id > a.instance_id
        await a.check()
        assert not await a.judge(b.instance_id)  # b's session holds it: alive
        assert not await a.judge(a.instance_id)  # never ourselves
        _terminate(pg_url, b.lease_pid)
        with pytest.raises(LeaseLost):
            await b.check()
        assert b.lost is not None
        assert await a.judge(b.instance_id)  # gone: now a holds b's key
        await a.forget(b.instance_id)
        await a.check()
    finally:
        a.release()
        b.release()
    connection = connect(pg_url)
    try:
        rows = {i.id: i for i in run_read(connection, instances.list_instances)}
    finally:
        connection.close()
    assert rows[a.instance_id].ended_at is not None  # a clean end
    assert rows[b.instance_id].ended_at is None  # lost: no last write


# -- the service on task.Clock --------------------------------------------------


class _Passes:
    """A reaping pass that only counts (the real passes are test_reaping.py's)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> Any:
        self.count += 1
        return succeed([])


@pytest_twisted.ensureDeferred
async def test_on_sqlite_the_service_has_no_timer(tmp_path: Any) -> None:
    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    lease = take_lease(path, "solo", flock=lock.acquire(path), **lease_runtime())
    db = open_pool(path, **site_runtime())
    clock = Clock()
    passes = _Passes()
    service = InstanceService(lease, db, passes, clock=clock)
    try:
        assert list(service) == []
        service.startService()
        assert clock.getDelayedCalls() == [] and passes.count == 0
        await service.stopService()
    finally:
        db.close()
        lease.release()


@pytest_twisted.ensureDeferred
async def test_the_service_ticks_on_its_clock_and_fences_when_the_lease_session_ends(
    pg_url: str,
) -> None:
    clock = Clock()
    lease = take_lease(pg_url, "a", flock=None, **lease_runtime())
    db = open_pool(pg_url, **site_runtime())
    passes = _Passes()
    service = InstanceService(lease, db, passes, interval=INTERVAL, clock=clock)
    reasons: list[str] = []
    service.fenced.addCallback(reasons.append)
    try:
        service.startService()  # the first tick at once
        await eventually(lambda: service.ticks == 1)
        assert passes.count == 1
        clock.advance(INTERVAL - 0.1)
        assert service.ticks == 1  # not yet
        clock.advance(0.1)
        await eventually(lambda: service.ticks == 2)
        assert passes.count == 2
        connection = connect(pg_url)
        try:
            first = run_read(connection, instances.instance, lease.instance_id).heartbeat_at
        finally:
            connection.close()
        _terminate(pg_url, lease.lease_pid)
        clock.advance(INTERVAL)
        await eventually(lambda: bool(reasons))
        assert "lease" in reasons[0] and lease.lost
        assert passes.count == 2 and service.ticks == 2  # no reaping once fenced
        assert clock.getDelayedCalls() == []  # the timer stopped
        with pytest.raises(LeaseLost):
            lease.refuse_if_lost()
        assert first  # heartbeats were written while the lease held
    finally:
        await service.stopService()
        db.close()
        lease.release()


@pytest_twisted.ensureDeferred
async def test_the_lease_is_checked_on_time_while_a_tick_is_slow(pg_url: str) -> None:
    clock = Clock()
    lease = take_lease(pg_url, "a", flock=None, **lease_runtime())
    db = open_pool(pg_url, **site_runtime())
    held: Deferred[Any] = Deferred()
    passes: list[float] = []

    def reap() -> Deferred[Any]:
        passes.append(lease.confirmed_at)
        return held

    service = InstanceService(lease, db, reap, interval=INTERVAL, clock=clock)
    reasons: list[str] = []
    service.fenced.addCallback(reasons.append)
    try:
        service.startService()  # the first tick: its reaping pass hangs
        await eventually(lambda: bool(passes))
        first = passes[0]  # the tick's own check confirmed the lease before it
        clock.advance(INTERVAL)  # the next tick is skipped, its lease check is not
        await eventually(lambda: lease.confirmed_at > first)
        assert service.ticks == 0
        _terminate(pg_url, lease.lease_pid)
        clock.advance(INTERVAL)
        await eventually(lambda: bool(reasons))  # fenced while the pass still hangs
        assert "lease" in reasons[0] and lease.lost
    finally:
        held.callback([])
        await service.stopService()
        db.close()
        lease.release()


@pytest_twisted.ensureDeferred
async def test_the_service_fences_when_the_database_says_it_was_reaped(pg_url: str) -> None:
    clock = Clock()
    lease = take_lease(pg_url, "a", flock=None, **lease_runtime())
    other = take_lease(pg_url, "b", flock=None, **lease_runtime())
    db = open_pool(pg_url, **site_runtime())
    service = InstanceService(lease, db, _Passes(), clock=clock)
    reasons: list[str] = []
    service.fenced.addCallback(reasons.append)
    try:
        # Another instance recorded this one reaped (the lease session itself
        # still answers): the heartbeat is refused, and that fences.
        connection = connect(pg_url)
        try:
            run_write(connection, reaping.reap, lease.instance_id, other.instance_id)
        finally:
            connection.close()
        service.startService()
        await eventually(lambda: bool(reasons))
        assert "reaped" in reasons[0]
    finally:
        await service.stopService()
        db.close()
        lease.release()
        other.release()


class _Partition(portforward.ProxyServer):
    """One relayed connection of :class:`_Relay`: nothing goes to the server
    once the relay is partitioned (a black-holed network: no answer, no
    error)."""

    factory: _Relay  # type: ignore[assignment]

    def connectionMade(self) -> None:
        self.factory.relayed.append(self)
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        if not self.factory.partitioned:
            super().dataReceived(data)


class _Relay(portforward.ProxyFactory):
    """A loopback TCP relay to the PostgreSQL server that can be partitioned."""

    protocol = _Partition

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.partitioned = False
        self.relayed: list[_Partition] = []


@pytest_twisted.ensureDeferred
async def test_a_lease_check_that_does_not_answer_in_time_fences(pg_url: str) -> None:
    target = pg_conninfo.conninfo_to_dict(pg_url)
    relay = _Relay(target["host"], int(target["port"]))
    port = reactor.listenTCP(0, relay, interface="127.0.0.1")
    clock = Clock()
    # Taken in a thread: the relay runs on the reactor (a site takes it at build time).
    relayed_url = pg_conninfo.make_conninfo(pg_url, port=port.getHost().port)
    runtime = lease_runtime()
    lease = await deferToThread(lambda: take_lease(relayed_url, "a", flock=None, **runtime))
    db = open_pool(pg_url, **site_runtime())
    service = InstanceService(lease, db, _Passes(), check_timeout=CHECK_TIMEOUT, clock=clock)
    reasons: list[str] = []
    service.fenced.addCallback(reasons.append)
    try:
        service.startService()
        await eventually(lambda: service.ticks == 1)
        relay.partitioned = True
        clock.advance(INTERVAL)  # the check is asked, and never answered
        assert not reasons
        clock.advance(CHECK_TIMEOUT)
        assert reasons and f"did not answer within {CHECK_TIMEOUT} s" in reasons[0]
        assert lease.lost and clock.getDelayedCalls() == []
    finally:
        for relayed in relay.relayed:
            relayed.transport.abortConnection()  # the stuck check fails, its thread ends
        await service.stopService()
        lease.release()
        db.close()
        await port.stopListening()


# -- once-only periodic work (SCALE.md 7) ---------------------------------------------


def _old_audit_rows(url: str, n: int) -> None:
    connection = connect(url)
    try:
        for i in range(n):
            connection.execute(
                "INSERT INTO force_delete_audit (gid, operation_id, delete_operation_id, actor, "
                "note, forced_at) VALUES (?, ?, ?, 'admin', 'stuck', '2000-01-01T00:00:00.000Z')",
                (i, f"op-{i}", f"del-{i}"),
            )
    finally:
        connection.close()


def _audit_rows(url: str) -> int:
    connection = connect(url)
    try:
        return int(connection.execute("SELECT COUNT(*) FROM force_delete_audit").fetchone()[0])
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_sites_prune_one_at_a_time_and_two_racing_is_harmless(pg_url: str) -> None:
    _old_audit_rows(pg_url, 10)
    clock = Clock()
    clock.advance(time.time())
    pools = [open_pool(pg_url, **site_runtime()), open_pool(pg_url, **site_runtime())]
    a, b = (Housekeeping(db, clock=clock, batch=3) for db in pools)
    holder = connect(pg_url)
    try:
        # Another site's prune transaction is under way: this pass does nothing.
        cursor = holder.cursor()
        cursor.execute(BEGIN_WRITE[SERIALIZABLE])
        assert once(cursor, PRUNE_JOB)
        await a.prune()
        assert (a.yielded, a.runs, a.pruned["audit"], _audit_rows(pg_url)) == (1, 1, 0, 10)
        cursor.execute("ROLLBACK")
        # Both at once: each row deleted once, by one or the other.
        await gatherResults([Deferred.fromCoroutine(s.prune()) for s in (a, b)])
        assert _audit_rows(pg_url) == 0
        assert a.pruned["audit"] + b.pruned["audit"] == 10
    finally:
        holder.close()
        for db in pools:
            db.close()
