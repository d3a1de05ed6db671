"""Two sites writing one PostgreSQL database at once: node reports, deletes
and group commit (tasknet/site/storage/engine/transactions.py "Isolation", reports.py
"Several sites").

Reports run at READ COMMITTED and lock what they decide from (their nodes,
their tasks' rows) before they read it; everything else stays SERIALIZABLE.
So two sites applying reports for different nodes never conflict, however
close their gids lie (neighbouring nodes' rows share heap and index pages,
which is what made SERIALIZABLE reports conflict), while a report racing a
delete of the same task still comes out as one of the two serial orders.
A group-committed transaction that loses a conflict is run again write by
write, so one conflicting write takes no other down.

Real server (``pg_server``, tests/conftest.py), real sessions: each "site"
is a :class:`~tasknet.site.storage.engine.database.Database` of its own (its own writer
thread and connection) or a plain connection in a thread of its own.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import pytest_twisted
from twisted.internet.defer import DeferredList, gatherResults

from tasknet.protocol.messages import (
    ACK_APPLIED,
    DELETE_DELETED,
    DeletedEntry,
    TaskEntry,
    TaskReport,
)
from tasknet.site.storage import delete, reports
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine import transactions
from tasknet.site.storage.engine.errors import DatabaseBusy, TaskError
from tasknet.site.storage.reports import QueuedReport, apply_reports, apply_task_report
from tests.runtime import site_runtime
from tests.site.helpers import HeldWriter

_names = itertools.count(1)

PER_NODE = 20
NODE = "node-{:02d}"


def _gids(node: int) -> range:
    """Node ``node``'s tasks: consecutive gids, right after the previous
    node's (so neighbours share pages, as in the benchmarks)."""
    return range(1000 + node * PER_NODE, 1000 + (node + 1) * PER_NODE)


def _seed(url: str, nodes: int) -> int:
    """A user, ``nodes`` nodes of ``PER_NODE`` SUBMITTED tasks each (status
    1, progress 0), every gid's operationId ``op-<gid>``; the user's id."""

    def seed(cursor: Any) -> int:
        uid = int(
            cursor.execute(
                "INSERT INTO \"user\" (name, token_hash) VALUES ('alice', 'x') RETURNING id"
            ).fetchone()[0]
        )
        for node in range(nodes):
            first, last = _gids(node)[0], _gids(node)[-1]
            cursor.execute(
                "INSERT INTO gallery (gid, user_id, name, token, url, status, progress, node_id,"
                " cost) SELECT g, ?, 'g', 't', 'http://up/f', 1, 0, ?, 10"
                " FROM generate_series(CAST(? AS bigint), CAST(? AS bigint)) AS g",
                (uid, NODE.format(node), first, last),
            )
            cursor.execute(
                "INSERT INTO task_operation (gid, operation_id, state, user_id, cost, metered,"
                " dispatched) SELECT g, 'op-' || g, 'SUBMITTED', ?, 10, 1, 1"
                " FROM generate_series(CAST(? AS bigint), CAST(? AS bigint)) AS g",
                (uid, first, last),
            )
        cursor.execute("INSERT INTO weekly_usage (user_id, week, used) VALUES (?, 'w', 10)", (uid,))
        return uid

    connection = dbmod.connect(url)
    try:
        return dbmod.run_write(connection, seed)
    finally:
        connection.close()


def _report(node: int, round_: int, gids: range | None = None) -> TaskReport:
    """Node ``node``'s snapshot in round ``round_``: every task downloading,
    progress moving each round (every entry is a change to write)."""
    gids = _gids(node) if gids is None else gids
    return TaskReport(
        f"r-{node}-{round_}",
        100 + round_,
        tuple(TaskEntry(g, 2, (round_ + 1) / 100) for g in gids),
        {g: f"op-{g}" for g in gids},
    )


def _query(url: str, sql: str, *args: Any) -> list[Any]:
    connection = dbmod.connect(url)
    try:
        return connection.execute(sql, args).fetchall()
    finally:
        connection.close()


# -- the isolation each write declares --------------------------------------------------


def _level(cursor: Any) -> str:
    return str(cursor.execute("SHOW transaction_isolation").fetchone()[0])


@dbmod.read_committed
def _levels(cursor: Any, items: list[int]) -> list[str]:
    return [_level(cursor)] * len(items)


@pytest_twisted.ensureDeferred
async def test_each_write_runs_at_its_declared_isolation(pg_url: str) -> None:
    assert dbmod.isolation_of(apply_reports) == dbmod.READ_COMMITTED
    assert dbmod.isolation_of(apply_task_report) == dbmod.READ_COMMITTED
    assert dbmod.isolation_of(delete.request_delete) == dbmod.SERIALIZABLE
    db = dbmod.open_pool(pg_url, **site_runtime())

    def keyword_level(cursor: Any, *, unused: int) -> str:
        return _level(cursor)

    try:
        assert (await db.write_joined(_levels, 1)).value == "read committed"
        assert await db.write(_level) == "serializable"
        # Keywords wrap the function: its declaration goes with it.
        assert await db.write(dbmod.read_committed(keyword_level), unused=1) == "read committed"
        # A transaction shared with a SERIALIZABLE write is SERIALIZABLE.
        held = HeldWriter(db)
        await held.started()
        together = [db.write_joined(_levels, 2), db.write(_level)]
        held.release()
        await held.done
        first, second = await gatherResults(together)
        assert (first.value, second) == ("serializable", "serializable")
    finally:
        db.close()
    connection = dbmod.connect(pg_url)
    try:
        assert dbmod.run_write(connection, _levels, [1]) == ["read committed"]
    finally:
        connection.close()


# -- two sites, disjoint nodes ---------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_two_sites_applying_reports_for_disjoint_nodes_never_conflict(pg_url: str) -> None:
    nodes, rounds = 16, 12
    _seed(pg_url, nodes)
    # Site A holds the even nodes, site B the odd ones: every node's gids
    # sit next to the other site's.
    sites = [dbmod.open_pool(pg_url, **site_runtime()), dbmod.open_pool(pg_url, **site_runtime())]
    try:
        for round_ in range(rounds):
            queued = [
                sites[node % 2].write_joined(
                    apply_reports,
                    QueuedReport(NODE.format(node), _report(node, round_), round_ == 0),
                )
                for node in range(nodes)
            ]
            for committed in await gatherResults(queued):
                outcome = committed.value
                assert outcome.result == ACK_APPLIED
                assert len(outcome.changed) == PER_NODE, outcome
        assert [db.conflicts for db in sites] == [0, 0]
        assert sum(db.writes for db in sites) == nodes * rounds
        assert sum(db.transactions for db in sites) < nodes * rounds  # batches were formed
    finally:
        for db in sites:
            db.close()
    last = _query(
        pg_url,
        "SELECT COUNT(*) FROM gallery AS g JOIN task_operation AS o ON o.gid = g.gid"
        " WHERE g.status = 2 AND g.progress = ? AND o.last_revision = ?",
        rounds / 100,
        100 + rounds - 1,
    )
    assert last[0][0] == nodes * PER_NODE


# -- a report racing a delete of the same task -------------------------------------------


def _waiting_for_a_lock(url: str, pid: int, thread: threading.Thread) -> None:
    """Until session ``pid`` waits for a lock (or ``thread`` ended)."""
    watcher = dbmod.connect(url)
    try:
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?", (pid,)
            ).fetchone()
            if row is not None and row[0] == "Lock":
                return
            time.sleep(0.01)
        raise AssertionError("the second site never waited for the first one's locks")
    finally:
        watcher.close()


def _race(
    url: str, first: Callable[[Any], Any], second: Callable[[Any], Any], *, report_first: bool
) -> tuple[Any, Any, list[int]]:
    """``first(cursor)`` through site 1, held before its COMMIT until
    ``second`` -- run by site 2 as the database layer runs it
    (:func:`~tasknet.site.storage.engine.database.run_write`) -- waits for its locks;
    then site 1 commits.  The report (``first`` if ``report_first``, else
    ``second``) runs at READ COMMITTED, the other SERIALIZABLE, as the
    site runs them.  Both results, and each attempt of ``second``."""
    one, two = dbmod.connect(url), dbmod.connect(url)
    attempts: list[int] = []
    results: list[Any] = []

    def counted(cursor: Any) -> Any:
        attempts.append(1)
        return second(cursor)

    if not report_first:
        dbmod.read_committed(counted)
    begin = transactions.BEGIN_WRITE[
        transactions.READ_COMMITTED if report_first else transactions.SERIALIZABLE
    ]

    def run_second() -> None:
        try:
            results.append(dbmod.run_write(two, counted))
        except (TaskError, psycopg.Error) as e:
            results.append(e)

    try:
        cursor = one.cursor()
        cursor.execute(begin)
        held = first(cursor)
        thread = threading.Thread(target=run_second)
        thread.start()
        _waiting_for_a_lock(url, two.raw.info.backend_pid, thread)
        cursor.execute("COMMIT")
        thread.join(30)
        assert not thread.is_alive()
        return held, results[0], attempts
    finally:
        one.close()
        two.close()


def _task(url: str, gid: int) -> Any:
    rows = _query(
        url,
        "SELECT o.state, g.status, g.progress, o.last_revision FROM task_operation AS o"
        " LEFT JOIN gallery AS g ON g.gid = o.gid WHERE o.gid = ?",
        gid,
    )
    return rows[0]


def _last_view(url: str, gid: int) -> str:
    rows = _query(
        url, "SELECT payload FROM notification_outbox WHERE gid = ? ORDER BY id DESC LIMIT 1", gid
    )
    return str(rows[0][0])


def test_a_delete_committed_first_drops_the_racing_report(pg_url: str) -> None:
    _seed(pg_url, 1)
    gid = _gids(0)[0]
    report = _report(0, 5, range(gid, gid + 1))
    started, outcome, attempts = _race(
        pg_url,
        lambda c: delete.request_delete(c, gid, None),
        lambda c: apply_task_report(c, NODE.format(0), report),
        report_first=False,
    )
    assert not started.completed
    # The report waited for the delete's locks, then saw DELETE_PENDING.
    assert outcome.dropped == {gid: "DELETE_PENDING"} and not outcome.applied
    assert attempts == [1]
    state, status, progress, _ = _task(pg_url, gid)
    assert (state, status, progress) == ("DELETE_PENDING", 1, 0)


def test_a_report_committed_first_is_seen_by_the_racing_delete(pg_url: str) -> None:
    _seed(pg_url, 1)
    gid = _gids(0)[0]
    report = _report(0, 5, range(gid, gid + 1))
    outcome, started, attempts = _race(
        pg_url,
        lambda c: apply_task_report(c, NODE.format(0), report),
        lambda c: delete.request_delete(c, gid, None),
        report_first=True,
    )
    assert outcome.changed == [gid]
    # The delete waited for the report's row locks; the report had changed
    # the rows under the delete's snapshot, so the delete ran again and
    # started from the report's result: not lost, and announcing it.
    assert not isinstance(started, Exception) and not started.completed
    assert len(attempts) == 2
    state, status, progress, revision = _task(pg_url, gid)
    assert (state, status, progress, revision) == ("DELETE_PENDING", 2, 0.06, 105)
    view = _last_view(pg_url, gid)
    assert '"DELETE_PENDING"' in view and '"progress":0.06' in view


def _pending_delete(url: str, gid: int) -> str:
    connection = dbmod.connect(url)
    try:
        started = dbmod.run_write(connection, delete.request_delete, gid, None)
    finally:
        connection.close()
    return str(started.delete_operation_id)


def _confirmation(gid: int, delete_id: str) -> TaskReport:
    return TaskReport("r-confirm", 200, (), {}, (DeletedEntry(gid, delete_id, DELETE_DELETED, ""),))


def test_a_force_delete_committed_first_leaves_the_confirmation_nothing(pg_url: str) -> None:
    _seed(pg_url, 1)
    gid = _gids(0)[0]
    delete_id = _pending_delete(pg_url, gid)
    forced, outcome, _ = _race(
        pg_url,
        lambda c: delete.force_delete(c, gid, "admin", "node gone"),
        lambda c: apply_task_report(c, NODE.format(0), _confirmation(gid, delete_id)),
        report_first=False,
    )
    assert not forced.repeated
    assert outcome.ignored == {gid: reports.TOMBSTONE} and not outcome.deletes_completed
    assert _task(pg_url, gid)[0] == "DELETED"
    assert len(_query(pg_url, "SELECT * FROM force_delete_audit WHERE gid = ?", gid)) == 1


def test_a_confirmation_committed_first_leaves_the_force_delete_nothing(pg_url: str) -> None:
    _seed(pg_url, 1)
    gid = _gids(0)[0]
    delete_id = _pending_delete(pg_url, gid)
    outcome, forced, attempts = _race(
        pg_url,
        lambda c: apply_task_report(c, NODE.format(0), _confirmation(gid, delete_id)),
        lambda c: delete.force_delete(c, gid, "admin", "node gone"),
        report_first=True,
    )
    assert outcome.deletes_completed == [gid]
    # The force waited, lost to the confirmation's commit, ran again and
    # found the node's own tombstone: nothing to force, nothing audited.
    assert isinstance(forced, TaskError) and forced.code == "conflict", forced
    assert len(attempts) == 2
    assert _task(pg_url, gid)[0] == "DELETED"
    assert _query(pg_url, "SELECT * FROM force_delete_audit WHERE gid = ?", gid) == []


# -- a conflict in a group commit ------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_conflicting_write_in_a_batch_takes_no_report_down(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = 5
    uid = _seed(pg_url, nodes)
    monkeypatch.setattr(transactions, "CONFLICT_RETRIES", 2)
    attempts: list[int] = []

    def always_conflicting(cursor: Any) -> None:
        # Read a row, let another session change it, write it: a
        # serialization failure on every attempt (SERIALIZABLE).
        attempts.append(1)
        cursor.execute("SELECT used FROM weekly_usage WHERE user_id = ?", (uid,)).fetchone()
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("UPDATE weekly_usage SET used = used + 1 WHERE user_id = %s", (uid,))
        cursor.execute("UPDATE weekly_usage SET used = used + 1 WHERE user_id = ?", (uid,))

    db = dbmod.open_pool(pg_url, **site_runtime())
    try:
        held = HeldWriter(db)
        await held.started()
        queued = [
            db.write_joined(apply_reports, QueuedReport(NODE.format(n), _report(n, 0)))
            for n in range(nodes)
        ]
        conflicting = db.write(always_conflicting)
        held.release()
        await held.done
        results = await DeferredList([*queued, conflicting], consumeErrors=True)
    finally:
        db.close()
    *applied, (ok, failure) = results
    assert not ok and failure.check(DatabaseBusy)
    assert "serialization" in str(failure.value)
    # Together once, then each report alone (its own commit), and the
    # conflicting write alone on each of its 1 + 2 attempts.
    assert len(attempts) == 1 + 3
    assert db.conflicts == 1 + 3
    assert all(ok for ok, _ in applied)
    assert [c.value.result for _, c in applied] == [ACK_APPLIED] * nodes
    assert len({c.transaction for _, c in applied}) == nodes
    assert (db.writes, db.transactions) == (1 + nodes, 1 + nodes)
    assert _query(pg_url, "SELECT COUNT(*) FROM report_receipt")[0][0] == nodes
    assert _query(pg_url, "SELECT used FROM weekly_usage WHERE user_id = ?", uid)[0][0] == 10 + 4
