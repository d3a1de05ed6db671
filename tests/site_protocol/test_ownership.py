"""Node ownership over real TCP (PROTOCOL.md "Ownership"): a node changes
only what the site sent it; legacy rows are claimed by the node that holds
them; a wiped node whose clock is behind starts a new revision epoch;
tombstones are ignored and ACKed."""

from __future__ import annotations

import json
import sqlite3

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from tasknet.protocol.messages import (
    DeleteGallery,
    DeleteResult,
    DownloadPost,
    StatusReport,
    TaskCommand,
    TaskEntry,
    TaskReport,
    TaskReportAck,
)
from tasknet.site import metrics
from tasknet.site.report_pipeline import DropLog
from tasknet.site.storage import reports
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import load_script, prepare_database, split_statements
from tasknet.site.web.admin_nodes import nodes_view
from tests.eventually import eventually
from tests.site_protocol.harness import ScriptedNode, Site, add_task, add_user, dropped_entries, row

FAR_FUTURE = 2**62


def _dropped(node: str, reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "tasknet_report_entries_dropped_total", {"node": node, "reason": reason}
    )
    return value or 0.0


def _persisted_drops(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
    return dropped_entries(conn.cursor())


def _snapshot(conn: sqlite3.Connection, *gids: int) -> list[object]:
    return [row(conn, gid) for gid in gids]


async def _owner_with_tasks(site: Site) -> tuple[sqlite3.Connection, ScriptedNode]:
    """n1 owns gid 1 (downloading, revision 1000) and gid 2 (being deleted)."""
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    add_task(conn, 2, uid, "DELETE_PENDING", node_id="n1", status=4, progress=1.0)
    owner = await site.connect("n1")
    assert (await owner.next(TaskCommand)).action == "DOWNLOAD"
    assert await owner.next(TaskCommand) == TaskCommand("del-2", "DELETE", 2, "gallery 2", "")
    owner.report("o1", 1000, [(1, 1, 0.2), (2, 4, 1.0)], {1: "op-1", 2: "op-2"})
    assert await owner.next(TaskReportAck) == TaskReportAck("o1", "APPLIED")
    return conn, owner


@pytest_twisted.ensureDeferred
async def test_a_node_forging_another_nodes_tasks_over_v2_changes_nothing(site: Site) -> None:
    conn, owner = await _owner_with_tasks(site)
    before = _snapshot(conn, 1, 2)
    assert before[0]["last_revision"] == 1000
    metric_before = _dropped("n2", reports.NOT_OWNER)
    hostile = await site.connect("n2")
    # Progress, completion and a delete confirmation, with the real
    # operationIds and delete id, and a far-future revision.
    hostile.report("h1", FAR_FUTURE, [(1, 2, 0.9)], {1: "op-1"})
    hostile.report(
        "h2",
        FAR_FUTURE + 1,
        [(1, 4, 1.0)],
        {1: "op-1"},
        deleted=[(2, "del-2", "DELETED", "")],
    )
    # ACKed (receipts recorded), so an honest misconfigured node is not stuck.
    assert await hostile.next(TaskReportAck) == TaskReportAck("h1", "APPLIED")
    assert await hostile.next(TaskReportAck) == TaskReportAck("h2", "APPLIED")
    assert _snapshot(conn, 1, 2) == before  # status, progress, revision, pending delete
    receipts = {r[0] for r in conn.execute("SELECT report_id FROM report_receipt")}
    assert {"h1", "h2"} <= receipts
    # Counted per node and reason: in the metric and in the database.
    assert _dropped("n2", reports.NOT_OWNER) - metric_before == 3
    assert _persisted_drops(conn)["n2"] == {reports.NOT_OWNER: 3}
    listed = {n["id"]: n for n in json.loads(await nodes_view(site.db, site.side.nodes, reactor))}
    assert listed["n2"]["droppedEntries"] == {reports.NOT_OWNER: 3}
    # (n1 listed gid 2 while it was being deleted: dropped too, by its state.)
    assert listed["n1"]["droppedEntries"] == {"DELETE_PENDING": 1}

    # The owner's next reports still apply, and its delete completes.
    owner.report("o2", 2000, [(1, 4, 1.0)], {1: "op-1"}, deleted=[(2, "del-2", "DELETED", "")])
    assert await owner.next(TaskReportAck) == TaskReportAck("o2", "APPLIED")
    r1 = row(conn, 1)
    assert (r1["status"], r1["progress"], r1["last_revision"]) == (4, 1.0, 2000)
    assert row(conn, 2)["state"] == "DELETED"
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_legacy_node_forging_another_nodes_tasks_changes_nothing(site: Site) -> None:
    conn, owner = await _owner_with_tasks(site)
    before = _snapshot(conn, 1, 2)
    hostile = await site.connect("old-2", v2=False)
    hostile.sendMessage(StatusReport((TaskEntry(1, 4, 1.0), TaskEntry(2, 4, 1.0))))
    hostile.sendMessage(DeleteResult(2, True, ""))
    await eventually(lambda: _persisted_drops(conn).get("old-2", {}).get("not_owner") == 3)
    assert _snapshot(conn, 1, 2) == before
    # The owner's next report still applies; its delete completes.
    owner.report("o2", 2000, [(1, 3, 0.95)], {1: "op-1"}, deleted=[(2, "del-2", "NOT_FOUND", "")])
    assert await owner.next(TaskReportAck) == TaskReportAck("o2", "APPLIED")
    assert (row(conn, 1)["status"], row(conn, 1)["last_revision"]) == (3, 2000)
    assert row(conn, 2)["state"] == "DELETED"
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_legacy_row_is_claimed_by_the_node_that_reports_it(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    # Pre-migration rows with a node status but no recorded node.
    add_task(conn, 5, uid, None, status=1, progress=0.3)
    add_task(conn, 6, uid, None, status=2, progress=0.6)
    add_task(conn, 7, uid)  # an ordinary unassigned task: assigned as usual
    n1 = await site.connect("n1")
    n2 = await site.connect("n2")
    await site.side.dispatcher.idle()
    # A report round trip on each connection: every command the site sent
    # before its ACK has arrived.
    for n, sync in ((n1, "sync-1"), (n2, "sync-2")):
        n.report(sync, 1)
        await n.next(TaskReportAck)
    # Not dispatched to the least loaded node (that would be a second download).
    sent = [m for n in (n1, n2) for m in n.messages if isinstance(m, TaskCommand)]
    assert [(m.action, m.gid) for m in sent] == [("DOWNLOAD", 7)]
    assert row(conn, 5)["node_id"] is None and row(conn, 6)["node_id"] is None

    # The legacy node that really holds gid 5 reports it: it claims it and the
    # entry applies (status and progress) in that same transaction.
    old = await site.connect("old", v2=False)
    old.sendMessage(StatusReport((TaskEntry(5, 2, 0.5),)))
    await eventually(lambda: row(conn, 5)["node_id"] == "old")
    r5 = row(conn, 5)
    assert (r5["status"], r5["progress"], r5["state"], r5["legacy"]) == (2, 0.5, "SUBMITTED", 1)
    # A v2 node claims gid 6 the same way (its report has no operationId: it
    # got the task as a legacy DownloadPost before the upgrade).
    n2.report("r1", 1000, [(6, 3, 0.8), (5, 4, 1.0)])
    assert await n2.next(TaskReportAck) == TaskReportAck("r1", "APPLIED")
    r6 = row(conn, 6)
    assert (r6["node_id"], r6["status"], r6["progress"], r6["last_revision"]) == (
        "n2",
        3,
        0.8,
        1000,
    )
    # gid 5 is old's now: n2's entry for it was dropped.
    assert (row(conn, 5)["status"], row(conn, 5)["node_id"]) == (2, "old")
    assert _persisted_drops(conn)["n2"] == {reports.NOT_OWNER: 1}
    # From now on they are their claimers' tasks like any other: resent on login.
    await old.disconnect()
    old = await site.connect("old", v2=False)
    download = await old.next(DownloadPost)
    assert download.gid == 5
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_wiped_node_whose_clock_is_behind_starts_a_new_epoch(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    add_task(conn, 2, uid, node_id="n1")
    add_task(conn, 3, uid, node_id="n2")
    node = await site.connect("n1")
    other = await site.connect("n2")
    node.report("a", 5_000_000, [(1, 3, 0.9), (2, 1, 0.5)], {1: "op-1", 2: "op-2"})
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    other.report("b", 9_000_000, [(3, 1, 0.4)], {3: "op-3"})
    assert (await other.next(TaskReportAck)).result == "APPLIED"
    # Within a session a revision that goes backwards is stale, as always.
    node.report("a2", 4_000_000, [(1, 1, 0.1)], {1: "op-1"})
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    assert (row(conn, 1)["status"], row(conn, 1)["last_revision"]) == (3, 5_000_000)

    # The node is wiped (no in-flight report, no stored revision) and comes
    # back with a clock behind: its fresh revisions are below the old ones.
    await node.disconnect()
    node = await site.connect("n1")
    node.report("fresh-1", 1_000_000, [(1, 1, 0.05)], {1: "op-1"})
    assert await node.next(TaskReportAck) == TaskReportAck("fresh-1", "APPLIED")
    r1 = row(conn, 1)
    assert (r1["status"], r1["progress"], r1["last_revision"]) == (1, 0.05, 1_000_000)
    # Every task assigned to it left the old epoch; other nodes' did not.
    assert row(conn, 2)["last_revision"] is None
    assert row(conn, 3)["last_revision"] == 9_000_000
    epoch = conn.execute(
        "SELECT epoch, high_revision FROM node_revision WHERE node_id = 'n1'"
    ).fetchone()
    assert tuple(epoch) == (1, 1_000_000)
    # And its next reports go on applying, not dropped as stale forever.
    node.report("fresh-2", 1_000_001, [(1, 4, 1.0), (2, 2, 0.7)], {1: "op-1", 2: "op-2"})
    assert await node.next(TaskReportAck) == TaskReportAck("fresh-2", "APPLIED")
    assert (row(conn, 1)["status"], row(conn, 2)["status"]) == (4, 2)
    assert site.side.nodes.last_revision("n1") == 1_000_001
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_revision_forged_onto_a_task_does_not_make_its_owner_stale(site: Site) -> None:
    """A database where a forged far-future revision was applied before
    ownership was checked: the owner's reports are judged by its own mark."""
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    node = await site.connect("n1")
    node.report("a", 1000, [(1, 1, 0.1)], {1: "op-1"})
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    conn.execute("UPDATE task_operation SET last_revision = ? WHERE gid = 1", (FAR_FUTURE,))
    # (Not COMPLETED: a completed task is never moved back, whoever wrote it.)
    conn.execute("UPDATE gallery SET status = 3, progress = 1.0 WHERE gid = 1")
    conn.commit()
    node.report("b", 2000, [(1, 1, 0.3)], {1: "op-1"})
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    r1 = row(conn, 1)
    assert (r1["status"], r1["progress"], r1["last_revision"]) == (1, 0.3, 2000)
    conn.close()


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "legacy"])
@pytest_twisted.ensureDeferred
async def test_an_entry_for_a_tombstone_with_a_leftover_row_is_ignored_and_acked(
    site: Site, v2: bool
) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 3, uid, "DELETED", node_id="n1")
    # A gallery row still exists for the tombstoned gid (left by an old site
    # or a hand edit).
    conn.execute(
        "INSERT INTO gallery (gid, user_id, name, url, status, progress, node_id)"
        " VALUES (3, ?, 'leftover', 'http://u/f', 1, 0.5, 'n1')",
        (uid,),
    )
    conn.commit()
    before = row(conn, 3)
    node = await site.connect("n1", v2=v2)
    if v2:
        node.report("t1", 1000, [(3, 4, 1.0)], {3: "op-3"}, deleted=[(3, "del-3", "DELETED", "")])
        assert await node.next(TaskReportAck) == TaskReportAck("t1", "APPLIED")
        # A second report goes through too: nothing is stuck behind it.
        node.report("t2", 1001, [(3, 4, 1.0)], {3: "op-3"})
        assert await node.next(TaskReportAck) == TaskReportAck("t2", "APPLIED")
    else:
        node.sendMessage(StatusReport((TaskEntry(3, 4, 1.0),)))
        node.sendMessage(DeleteResult(3, True, ""))
        await eventually(lambda: site.side.reports.reports_committed >= 2)
    assert row(conn, 3) == before
    assert conn.execute("SELECT COUNT(*) FROM notification_outbox").fetchone()[0] == 0
    assert not [m for m in node.messages if isinstance(m, DeleteGallery | DownloadPost)]
    conn.close()


def test_drops_are_logged_once_per_node_and_reason_per_minute() -> None:
    clock = Clock()
    drops = DropLog(clock, interval=60)
    with capturedLogs() as events:
        drops.note("n2", {"not_owner": 2})
        clock.advance(10)
        drops.note("n2", {"not_owner": 3, "stale": 1})
        drops.note("n3", {"not_owner": 1})
        clock.advance(49)
        drops.note("n2", {"not_owner": 1})
        clock.advance(1)
        drops.note("n2", {"not_owner": 4})
    lines = [
        (e["node"], e["reason"], e["count"], e["log_level"].name)
        for e in events
        if "dropped" in e.get("log_format", "")
    ]
    assert lines == [
        ("n2", "not_owner", 2, "warn"),
        ("n2", "stale", 1, "info"),
        ("n3", "not_owner", 1, "warn"),
        # 60 s after the first line: everything since, counted.
        ("n2", "not_owner", 3 + 1 + 4, "warn"),
    ]
    assert drops.lines == 4


def test_upgrading_a_v2_database_seeds_each_nodes_mark_from_its_receipts(tmp_path) -> None:
    """A v2 database where a forged far-future revision was applied to n1's
    task (before ownership was checked): after the automatic v3 upgrade the
    marks come from the receipts, so n1's next report applies and n4's
    forged mark stays n4's.  SQLite only: upgrades from v2 are SQLite's (a
    PostgreSQL database starts at the current schema)."""
    path = str(tmp_path / "v2.sqlite")
    conn = dbmod.connect(path)
    for name in ("schema_v1.sql", "migrate_task_operation_v2.sql"):
        for statement in split_statements(load_script(name)):
            conn.execute(statement)
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1", status=3, progress=1.0)
    conn.execute("UPDATE task_operation SET last_revision = ? WHERE gid = 1", (FAR_FUTURE,))
    conn.executemany(
        "INSERT INTO report_receipt (report_id, node_id, revision) VALUES (?, ?, ?)",
        [("a", "n1", 1000), ("b", "n1", 1500), ("h", "n4", FAR_FUTURE)],
    )
    conn.close()
    assert prepare_database(path) is False  # upgraded in place
    conn = dbmod.connect(path)
    marks = dict(conn.execute("SELECT node_id, high_revision FROM node_revision").fetchall())
    assert marks == {"n1": 1500, "n4": FAR_FUTURE}
    message = TaskReport("c", 2000, (TaskEntry(1, 1, 0.4),), {1: "op-1"}, ())
    out = dbmod.run_write(conn, reports.apply_report, "n1", message)
    assert out.applied == [1]
    r1 = row(conn, 1)
    assert (r1["status"], r1["progress"], r1["last_revision"]) == (1, 0.4, 2000)
    conn.close()
