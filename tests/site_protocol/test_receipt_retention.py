"""Pruning report receipts and audit rows (docs/operations.md "Retention and
limits"): old receipts go, each node's newest stays whatever its age, so a
node's redelivery of its in-flight report is still answered ``DUPLICATE``;
the prune runs on the site's clock (``task.Clock`` here) in batches.

A real database (either backend), the real node listener and a scripted node over TCP.
"""

from __future__ import annotations

import time

import pytest_twisted
from twisted.internet.task import Clock

from tasknet.protocol.messages import TaskReportAck
from tasknet.site.housekeeping import Housekeeping, stored_timestamp
from tasknet.site.storage.engine.database import connect
from tests.eventually import eventually
from tests.site.helpers import running_site, site_options
from tests.site_protocol.harness import Site, add_task, add_user

DAY = 86400.0


def age_receipts(conn, report_ids: list[str], days: float) -> None:
    conn.executemany(
        "UPDATE report_receipt SET received_at = ? WHERE report_id = ?",
        [(stored_timestamp(time.time() - days * DAY), rid) for rid in report_ids],
    )


def receipts(conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT report_id FROM report_receipt ORDER BY report_id")]


@pytest_twisted.ensureDeferred
async def test_old_receipts_go_each_nodes_newest_stays_and_redelivery_is_duplicate(site: Site):
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    add_task(conn, 2, uid, node_id="n2")
    n1 = await site.connect("n1")
    n2 = await site.connect("n2")
    for i in range(5):
        n1.report(f"a{i}", 1000 + i, [(1, 1, i / 10)], {1: "op-1"})
        assert (await n1.next(TaskReportAck)).result == "APPLIED"
    for i in range(3):
        n2.report(f"b{i}", 1000 + i, [(2, 1, i / 10)], {2: "op-2"})
        assert (await n2.next(TaskReportAck)).result == "APPLIED"
    n1.report("a5", 2000, [(1, 1, 0.9)], {1: "op-1"})
    assert (await n1.next(TaskReportAck)).result == "APPLIED"
    # n1: a0-a4 old, a5 young.  n2 went quiet 30 days ago (b2 its newest).
    age_receipts(conn, [f"a{i}" for i in range(5)], 8)
    age_receipts(conn, ["b0", "b1", "b2"], 30)
    clock = Clock()
    clock.advance(time.time())
    housekeeping = Housekeeping(site.db, clock=clock, batch=2)
    try:
        housekeeping.startService()  # runs once at start
        await eventually(lambda: housekeeping.pruned["report_receipt"] == 6)
        # a4 is n1's newest old receipt: kept while a5 is young (so at most
        # one receipt per node outlives the retention).
        assert receipts(conn) == ["a4", "a5", "b2"]
        # n2 comes back and redelivers its in-flight report: still DUPLICATE.
        n2.report("b2", 1002, [(2, 1, 0.2)], {2: "op-2"})
        assert (await n2.next(TaskReportAck)).result == "DUPLICATE"
        # An hour later (the site's clock) the next round finds nothing new.
        clock.advance(3600)
        await eventually(lambda: housekeeping.runs == 2)
        assert receipts(conn) == ["a4", "a5", "b2"]
        # Once a5 is old too, a4 goes; a5 (n1's newest) stays.
        clock.advance(8 * DAY)
        await eventually(lambda: housekeeping.pruned["report_receipt"] == 7)
        assert receipts(conn) == ["a5", "b2"]
        n1.report("a5", 2000, [(1, 1, 0.9)], {1: "op-1"})
        assert (await n1.next(TaskReportAck)).result == "DUPLICATE"
    finally:
        await housekeeping.stopService()
    assert not clock.getDelayedCalls()
    conn.close()


@pytest_twisted.ensureDeferred
async def test_audit_rows_older_than_a_year_are_pruned_a_batch_at_a_time(site: Site):
    conn = site.sql()
    conn.executemany(
        "INSERT INTO force_delete_audit (gid, operation_id, delete_operation_id, actor,"
        " note, forced_at) VALUES (?, ?, ?, 'root', 'node gone', ?)",
        [
            (gid, f"op-{gid}", f"del-{gid}", stored_timestamp(time.time() - days * DAY))
            for gid, days in ((5, 500), (6, 10))
        ],
    )
    conn.executemany(
        "INSERT INTO reconciliation_audit (gid, operation_id, verdict, actor, resolved_at)"
        " VALUES (?, ?, 'submitted', 'root', ?)",
        [
            (gid, f"op-{gid}", stored_timestamp(time.time() - days * DAY))
            for gid, days in ((1, 400), (2, 366), (3, 300), (4, 0))
        ],
    )
    clock = Clock()
    clock.advance(time.time())
    housekeeping = Housekeeping(site.db, clock=clock, batch=1)
    try:
        housekeeping.startService()
        await eventually(lambda: housekeeping.pruned["audit"] == 3)
        left = [r[0] for r in conn.execute("SELECT gid FROM reconciliation_audit ORDER BY gid")]
        assert left == [3, 4]
        assert [r[0] for r in conn.execute("SELECT gid FROM force_delete_audit")] == [6]
    finally:
        await housekeeping.stopService()
    conn.close()


@pytest_twisted.ensureDeferred
async def test_the_site_prunes_receipts_on_its_own_schedule(db_target):
    path = db_target
    async with running_site(site_options(path, "http://127.0.0.1:1")):
        pass  # a fresh database with the schema
    conn = connect(path)
    conn.executemany(
        "INSERT INTO report_receipt (report_id, node_id, revision, received_at)"
        " VALUES (?, 'n1', ?, ?)",
        [(f"r{i}", i, stored_timestamp(time.time() - 10 * DAY)) for i in range(50)],
    )
    async with running_site(site_options(path, "http://127.0.0.1:1")):
        await eventually(lambda: receipts(conn) == ["r49"])
    conn.close()
