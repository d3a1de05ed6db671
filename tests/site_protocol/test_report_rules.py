"""Every report rule of PROTOCOL.md, on a real database (either backend),
one real transaction per report (storage layer; the wire path is tested elsewhere)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import pytest
from twisted.python.failure import Failure

from tasknet.protocol.messages import (
    DeletedEntry,
    DeleteResult,
    StatusReport,
    TaskEntry,
    TaskReport,
)
from tasknet.site.storage import reports, stats, throughput
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import prepare_database
from tests.backends import add_failing_trigger
from tests.site_protocol.harness import add_task, add_user, dropped_entries, outbox_count, row


@pytest.fixture
def target(db_target: str) -> str:
    prepare_database(db_target)
    return db_target


@pytest.fixture
def conn(target: str) -> Iterator[sqlite3.Connection]:
    connection = dbmod.connect(target)
    yield connection
    connection.close()


@pytest.fixture
def uid(conn: sqlite3.Connection) -> int:
    return add_user(conn, "alice")[0]


def report(
    report_id: str,
    revision: int,
    tasks: list[tuple[int, int, float]],
    ops: dict[int, str] | None = None,
    deleted: list[tuple[int, str, str, str]] | None = None,
) -> TaskReport:
    return TaskReport(
        report_id,
        revision,
        tuple(TaskEntry(*t) for t in tasks),
        ops or {},
        tuple(DeletedEntry(*d) for d in deleted or []),
    )


def apply(conn: sqlite3.Connection, message: reports.NodeReport, node: str = "n1"):
    return dbmod.run_write(conn, reports.apply_report, node, message)


def test_applied_sets_status_progress_revision_and_one_notification(conn, uid):
    add_task(conn, 1, uid, node_id="n1")
    out = apply(conn, report("r1", 100, [(1, 1, 0.25)], {1: "op-1"}))
    assert out.result == "APPLIED" and out.applied == [1] and out.changed == [1]
    r = row(conn, 1)
    assert (r["status"], r["progress"], r["last_revision"]) == (1, 0.25, 100)
    assert outbox_count(conn, 1) == 1
    assert conn.execute("SELECT COUNT(*) FROM report_receipt").fetchone()[0] == 1


def test_unknown_gid_is_ignored_and_receipt_recorded(conn, uid):
    out = apply(conn, report("r1", 100, [(999, 4, 1.0)], {999: "op-x"}))
    assert out.result == "APPLIED" and out.ignored == {999: reports.UNKNOWN_GID}
    assert conn.execute("SELECT COUNT(*) FROM gallery").fetchone()[0] == 0
    assert conn.execute("SELECT report_id FROM report_receipt").fetchall()[0][0] == "r1"
    assert outbox_count(conn) == 0


def test_tombstone_ignores_even_its_own_operation_id(conn, uid):
    add_task(conn, 2, uid, "DELETED", node_id="n1")
    out = apply(conn, report("r1", 100, [(2, 4, 1.0)], {2: "op-2"}))
    assert out.ignored == {2: reports.TOMBSTONE}
    assert row(conn, 2)["state"] == "DELETED"
    assert conn.execute("SELECT COUNT(*) FROM gallery").fetchone()[0] == 0
    assert outbox_count(conn) == 0


@pytest.mark.parametrize("state", ["DELETE_PENDING", "RESERVED", "SUBMITTING", "UNKNOWN"])
def test_unsettled_states_drop_the_entry(conn, uid, state):
    add_task(conn, 3, uid, state, node_id="n1")
    before = row(conn, 3)
    out = apply(conn, report("r1", 100, [(3, 4, 1.0)], {3: "op-3"}))
    assert out.dropped == {3: state}
    assert row(conn, 3) == before
    assert outbox_count(conn) == 0


def test_missing_operation_id_for_a_v2_generation_is_dropped(conn, uid):
    add_task(conn, 4, uid, node_id="n1")
    out = apply(conn, report("r1", 100, [(4, 4, 1.0)]))
    assert out.dropped == {4: reports.MISSING_OPERATION}
    assert row(conn, 4)["status"] is None


def test_old_generation_is_dropped(conn, uid):
    add_task(conn, 5, uid, node_id="n1")
    out = apply(conn, report("r1", 100, [(5, 4, 1.0)], {5: "an-older-generation"}))
    assert out.dropped == {5: reports.OLD_GENERATION}
    assert row(conn, 5)["status"] is None


def test_stale_or_equal_revision_is_dropped(conn, uid):
    add_task(conn, 6, uid, node_id="n1")
    apply(conn, report("r1", 100, [(6, 3, 0.9)], {6: "op-6"}))
    equal = apply(conn, report("r2", 100, [(6, 1, 0.1)], {6: "op-6"}))
    older = apply(conn, report("r3", 99, [(6, 1, 0.1)], {6: "op-6"}))
    assert equal.dropped == {6: reports.STALE} and older.dropped == {6: reports.STALE}
    r = row(conn, 6)
    assert (r["status"], r["progress"], r["last_revision"]) == (3, 0.9, 100)
    assert outbox_count(conn, 6) == 1


def test_unchanged_entry_writes_nothing_and_the_node_mark_keeps_the_rule(conn, uid):
    add_task(conn, 7, uid, node_id="n1")
    apply(conn, report("r1", 100, [(7, 4, 1.0)], {7: "op-7"}))
    out = apply(conn, report("r2", 200, [(7, 4, 1.0)], {7: "op-7"}))
    assert out.applied == [7] and out.changed == []
    # Unchanged: its revision is not rewritten (issue 12: write only what changed) ...
    assert row(conn, 7)["last_revision"] == 100
    assert outbox_count(conn, 7) == 1
    # ... and the revision rule still holds: 150 is below the node's mark (200).
    older = apply(conn, report("r3", 150, [(7, 1, 0.1)], {7: "op-7"}))
    assert older.dropped == {7: reports.STALE}
    assert (row(conn, 7)["status"], row(conn, 7)["last_revision"]) == (4, 100)


def test_duplicate_report_changes_nothing(conn, uid):
    add_task(conn, 8, uid, node_id="n1")
    first = apply(conn, report("r1", 100, [(8, 1, 0.5)], {8: "op-8"}))
    second = apply(conn, report("r1", 100, [(8, 1, 0.5)], {8: "op-8"}))
    assert (first.result, second.result) == ("APPLIED", "DUPLICATE")
    assert second.applied == [] and second.notifications == 0
    assert outbox_count(conn, 8) == 1


def test_legacy_row_gets_one_generation_from_the_report(conn, uid):
    add_task(conn, 9, uid, None, node_id="n1", status=2, progress=0.5)
    out = apply(conn, report("r1", 100, [(9, 3, 0.7)], {9: "node-op-9"}))
    assert out.backfilled == [9] and out.applied == [9]
    r = row(conn, 9)
    assert (r["state"], r["operation_id"], r["legacy"]) == ("SUBMITTED", "node-op-9", 1)
    assert (r["status"], r["last_revision"]) == (3, 100)
    # Once only: the next report finds the generation and does not backfill.
    again = apply(conn, report("r2", 101, [(9, 4, 1.0)], {9: "node-op-9"}))
    assert again.backfilled == [] and again.applied == [9]
    assert row(conn, 9)["operation_id"] == "node-op-9"


def test_legacy_row_without_operation_id_gets_a_fresh_one_and_keeps_status(conn, uid):
    add_task(conn, 10, uid, None, node_id="n1", status=2, progress=0.5)
    # A report dropped as stale still leaves the backfill (status unchanged by it).
    dbmod.run_write(
        conn,
        lambda c: c.execute(
            "INSERT INTO report_receipt (report_id, node_id, revision) VALUES ('x', 'n1', 1)"
        ),
    )
    out = apply(conn, report("r1", 100, [(10, 2, 0.5)]))
    assert out.backfilled == [10] and out.applied == [10] and out.changed == []
    r = row(conn, 10)
    assert r["operation_id"] and r["legacy"] == 1
    assert (r["status"], r["progress"]) == (2, 0.5)
    # A backfilled (legacy) generation accepts entries without an operationId.
    later = apply(conn, report("r2", 101, [(10, 4, 1.0)]))
    assert later.applied == [10] and row(conn, 10)["status"] == 4


def test_status_report_applies_by_ownership_only(conn, uid):
    add_task(conn, 11, uid, node_id="legacy-1")
    add_task(conn, 12, uid, node_id="someone-else")
    add_task(conn, 13, uid, None, node_id="legacy-1", status=1)
    add_task(conn, 14, uid, "DELETE_PENDING", node_id="legacy-1")
    out = apply(
        conn,
        StatusReport(
            (
                TaskEntry(11, 2, 0.5),
                TaskEntry(12, 4, 1.0),
                TaskEntry(13, 4, 1.0),
                TaskEntry(14, 4, 1.0),
            )
        ),
        node="legacy-1",
    )
    assert out.result == reports.LEGACY
    assert out.applied == [11, 13]
    assert out.dropped == {12: reports.NOT_OWNER, 14: "DELETE_PENDING"}
    assert out.backfilled == [13]
    assert row(conn, 11)["status"] == 2 and row(conn, 12)["status"] is None
    assert row(conn, 13)["status"] == 4 and row(conn, 13)["legacy"] == 1
    assert row(conn, 11)["last_revision"] is None  # legacy reports carry no revision


def test_deleted_entry_completes_only_with_the_matching_delete_id(conn, uid):
    add_task(conn, 20, uid, "DELETE_PENDING", node_id="n1")
    conn.execute("INSERT INTO favorite (user_id, gid) VALUES (?, 20)", (uid,))
    wrong = apply(conn, report("r1", 100, [], deleted=[(20, "op-20", "DELETED", "")]))
    assert wrong.dropped == {20: reports.DELETE_ID_MISMATCH}
    assert row(conn, 20)["state"] == "DELETE_PENDING"
    done = apply(conn, report("r2", 101, [], deleted=[(20, "del-20", "DELETED", "")]))
    assert done.deletes_completed == [20]
    r = row(conn, 20)
    assert r["state"] == "DELETED" and r["status"] is None  # gallery row gone
    assert conn.execute("SELECT COUNT(*) FROM favorite WHERE gid = 20").fetchone()[0] == 0
    # The node repeats it (no ACK reached it): ignored, nothing written.
    count = outbox_count(conn, 20)
    repeat = apply(conn, report("r3", 102, [(20, 4, 1.0)], deleted=[(20, "del-20", "DELETED", "")]))
    assert repeat.ignored == {20: reports.TOMBSTONE}
    assert outbox_count(conn, 20) == count


def test_not_found_completes_and_failed_marks_delete_failed(conn, uid):
    add_task(conn, 21, uid, "DELETE_PENDING", node_id="n1")
    add_task(conn, 22, uid, "DELETE_PENDING", node_id="n1")
    out = apply(
        conn,
        report(
            "r1",
            100,
            [],
            deleted=[(21, "del-21", "NOT_FOUND", ""), (22, "del-22", "FAILED", "disk busy")],
        ),
    )
    assert out.deletes_completed == [21] and out.deletes_failed == [22]
    assert row(conn, 21)["state"] == "DELETED"
    r = row(conn, 22)
    assert (r["state"], r["delete_result"], r["delete_operation_id"]) == (
        "DELETE_PENDING",
        "FAILED",
        "del-22",
    )
    view = conn.execute(
        "SELECT payload FROM notification_outbox WHERE gid = 22 ORDER BY id DESC"
    ).fetchone()[0]
    assert "删除失败" in view


def test_legacy_delete_result_uses_the_current_delete_id_from_the_owner(conn, uid):
    add_task(conn, 30, uid, "DELETE_PENDING", node_id="legacy-1")
    add_task(conn, 31, uid, "DELETE_PENDING", node_id="legacy-1")
    stranger = apply(conn, DeleteResult(30, True, ""), node="legacy-2")
    assert stranger.dropped == {30: reports.NOT_OWNER}
    assert row(conn, 30)["state"] == "DELETE_PENDING"
    assert apply(conn, DeleteResult(30, True, ""), node="legacy-1").deletes_completed == [30]
    assert row(conn, 30)["state"] == "DELETED"
    failed = apply(conn, DeleteResult(31, False, "permission denied"), node="legacy-1")
    assert failed.deletes_failed == [31] and row(conn, 31)["delete_result"] == "FAILED"


def test_delete_of_a_task_with_no_node_waits_for_the_claim(conn, uid):
    # A pre-migration row whose node is unknown: no node's confirmation
    # completes (or fails) its delete until one claims the row.
    add_task(conn, 32, uid, "DELETE_PENDING", status=2)
    conn.execute("UPDATE task_operation SET legacy = 1 WHERE gid = 32")
    before = row(conn, 32)
    assert before["node_id"] is None
    failed = apply(conn, DeleteResult(32, False, "busy"), node="legacy-7")
    done = apply(conn, DeleteResult(32, True, ""), node="legacy-9")
    v2 = apply(conn, report("r1", 100, [], deleted=[(32, "del-32", "DELETED", "")]), node="n1")
    for out in (failed, done, v2):
        assert out.dropped == {32: reports.NOT_OWNER}
    assert row(conn, 32) == before
    # The node that holds it reports it: it claims the row (the entry itself
    # is dropped: the task is being deleted) ...
    claim = apply(conn, StatusReport((TaskEntry(32, 4, 1.0),)), node="legacy-9")
    assert claim.claimed == [32] and claim.dropped == {32: "DELETE_PENDING"}
    assert row(conn, 32)["node_id"] == "legacy-9"
    # ... and from then on only its confirmation completes the delete.
    assert apply(conn, DeleteResult(32, True, ""), node="legacy-7").dropped == {
        32: reports.NOT_OWNER
    }
    assert apply(conn, DeleteResult(32, True, ""), node="legacy-9").deletes_completed == [32]
    assert row(conn, 32)["state"] == "DELETED"
    # Once complete, any node's repeat is ignored (the tombstone).
    again = apply(conn, DeleteResult(32, False, "gone"), node="legacy-1")
    assert again.ignored == {32: reports.TOMBSTONE} and row(conn, 32)["state"] == "DELETED"


def test_a_failing_report_in_a_batch_does_not_lose_the_others(target, conn, uid):
    add_task(conn, 40, uid, node_id="n1")
    add_task(conn, 41, uid, node_id="n1")
    add_task(conn, 42, uid, node_id="n1")
    # A real database failure inside the second report, after its receipt
    # was written: a test-only trigger refuses one particular progress value.
    add_failing_trigger(
        target,
        "refuse_0123",
        "gallery",
        "injected failure",
        event="UPDATE",
        when="NEW.progress = 0.123",
    )
    bad = report("bad", 101, [(42, 1, 0.123)], {42: "op-42"})
    batch = [
        ("n1", report("a", 100, [(40, 1, 0.1)], {40: "op-40"})),
        ("n1", bad),
        ("n1", report("b", 102, [(41, 1, 0.1)], {41: "op-41"})),
    ]
    queued = [reports.QueuedReport(node, m) for node, m in batch]
    results = dbmod.run_coalesced(conn, reports.apply_reports, queued)
    assert isinstance(results[1], Failure)
    assert [type(r) for r in (results[0], results[2])] == [reports.ReportOutcome] * 2
    receipts = {r[0] for r in conn.execute("SELECT report_id FROM report_receipt")}
    assert receipts == {"a", "b"}  # the failed one rolled back to its savepoint
    assert "injected failure" in results[1].getErrorMessage()
    assert row(conn, 40)["status"] == 1 and row(conn, 41)["status"] == 1
    assert row(conn, 42)["status"] is None and outbox_count(conn, 42) == 0


def test_backfill_never_takes_an_operation_id_another_gid_has(conn, uid):
    add_task(conn, 50, uid, node_id="n1")
    add_task(conn, 51, uid, None, node_id="n1", status=1)
    out = apply(conn, report("r1", 100, [(51, 2, 0.5)], {51: "op-50"}))
    assert out.backfilled == [51]
    assert out.dropped == {51: reports.OLD_GENERATION}
    r = row(conn, 51)
    assert r["operation_id"] not in (None, "op-50") and r["status"] == 1


# -- one completion per generation (PROTOCOL.md "Bounds", last bullet) -------------------

SIZE = 1_000_000


def _with_size(conn: sqlite3.Connection, gid: int) -> None:
    dbmod.run_write(
        conn, lambda c: c.execute("UPDATE gallery SET size = ? WHERE gid = ?", (SIZE, gid))
    )


def _completed_at(conn: sqlite3.Connection, gid: int) -> str | None:
    return conn.execute("SELECT completed_at FROM gallery WHERE gid = ?", (gid,)).fetchone()[0]


def _counted(conn: sqlite3.Connection, node: str = "n1") -> dict[str, int]:
    """What the site counted: ``/api/stats``'s completions and bytes (the
    last hour, every user), the node's byte counter and its regressed drops."""
    answer = dbmod.run_read(conn, stats.stats, 0, None, 3600, time.time())
    drops = dbmod.run_read(conn, dropped_entries).get(node, {})
    return {
        "completed": sum(b["completed"] for b in answer["buckets"]),
        "bytes": sum(b["bytes"] for b in answer["buckets"]),
        "nodeBytes": dbmod.run_read(conn, throughput.node_byte_totals).get(node, 0),
        "regressed": drops.get(reports.REGRESSED, 0),
    }


def test_rolling_a_completed_task_back_counts_its_completion_once(conn, uid):
    add_task(conn, 60, uid, node_id="n1")
    _with_size(conn, 60)
    apply(conn, report("r0", 100, [(60, 1, 0.5)], {60: "op-60"}))
    done = apply(conn, report("r1", 101, [(60, 4, 1.0)], {60: "op-60"}))
    assert done.changed == [60]
    first = row(conn, 60)
    completed_at = _completed_at(conn, 60)
    assert completed_at is not None
    notified = outbox_count(conn, 60)
    revision = 102
    for n in range(5):
        back = apply(conn, report(f"back-{n}", revision, [(60, 1, 0.1)], {60: "op-60"}))
        again = apply(conn, report(f"again-{n}", revision + 1, [(60, 4, 1.0)], {60: "op-60"}))
        revision += 2
        # Dropped and ACKed like not_owner: the report is recorded, the task is not changed.
        assert back.result == "APPLIED" and back.dropped == {60: reports.REGRESSED}
        assert back.changed == [] and back.notifications == 0
        assert again.applied == [60] and again.changed == []
    after = row(conn, 60)
    assert (after["status"], after["progress"]) == (4, 1.0)
    assert _completed_at(conn, 60) == completed_at
    assert after["last_revision"] == first["last_revision"] == 101
    assert outbox_count(conn, 60) == notified
    assert _counted(conn) == {"completed": 1, "bytes": SIZE, "nodeBytes": SIZE, "regressed": 5}
    receipts = conn.execute("SELECT COUNT(*) FROM report_receipt").fetchone()[0]
    assert receipts == 12


def test_a_legacy_status_report_cannot_roll_a_completed_task_back(conn, uid):
    add_task(conn, 61, uid, node_id="legacy-1", status=1, progress=0.5)
    _with_size(conn, 61)
    apply(conn, StatusReport((TaskEntry(61, 4, 1.0),)), node="legacy-1")
    for _ in range(3):
        back = apply(conn, StatusReport((TaskEntry(61, 2, 0.0),)), node="legacy-1")
        assert back.dropped == {61: reports.REGRESSED}
        apply(conn, StatusReport((TaskEntry(61, 4, 1.0),)), node="legacy-1")
    assert row(conn, 61)["status"] == 4
    counted = _counted(conn, "legacy-1")
    assert counted["completed"] == 1 and counted["regressed"] == 3
    # Bytes from where the seeded row was (half) to the end, once.
    assert counted["bytes"] == counted["nodeBytes"] == SIZE // 2


def test_another_generations_entry_is_old_generation_not_regressed(conn, uid):
    """The rule is per generation: an entry naming another operationId is
    judged by the generation rule first (old_generation)."""
    add_task(conn, 62, uid, node_id="n1")
    apply(conn, report("r1", 100, [(62, 4, 1.0)], {62: "op-62"}))
    old = apply(conn, report("r2", 101, [(62, 1, 0.2)], {62: "op-older"}))
    stale = apply(conn, report("r3", 100, [(62, 1, 0.2)], {62: "op-62"}))
    assert old.dropped == {62: reports.OLD_GENERATION}
    assert stale.dropped == {62: reports.STALE}
    assert row(conn, 62)["status"] == 4


def test_regressed_entries_in_one_group_commit_equal_one_per_transaction(target, uid):
    """The batch path (``apply_reports``, one run of independent reports)
    drops the same entries as one transaction per report."""

    def seeded(path: str) -> None:
        c = dbmod.connect(path)
        try:
            for gid, node in ((70, "n1"), (71, "n2"), (72, "n3")):
                add_task(c, gid, uid, node_id=node, status=4, progress=1.0)
                _with_size(c, gid)
        finally:
            c.close()

    seeded(target)
    batch = [
        ("n1", report("a", 100, [(70, 1, 0.3)], {70: "op-70"})),
        ("n2", report("b", 100, [(71, 4, 1.0)], {71: "op-71"})),
        ("n3", StatusReport((TaskEntry(72, 3, 0.9),))),
        ("n1", report("c", 101, [(70, 2, 0.0)], {70: "op-70"})),
    ]
    conn = dbmod.connect(target)
    try:
        got = dbmod.run_coalesced(
            conn, reports.apply_reports, [reports.QueuedReport(n, m) for n, m in batch]
        )
        assert [o.dropped for o in got] == [
            {70: reports.REGRESSED},
            {},
            {72: reports.REGRESSED},
            {70: reports.REGRESSED},
        ]
        assert got[1].applied == [71] and got[1].changed == []
        assert [row(conn, g)["status"] for g in (70, 71, 72)] == [4, 4, 4]
        drops = dbmod.run_read(conn, dropped_entries)
        assert drops == {"n1": {reports.REGRESSED: 2}, "n3": {reports.REGRESSED: 1}}
        assert dbmod.run_read(conn, throughput.node_byte_totals) == {}
    finally:
        conn.close()
