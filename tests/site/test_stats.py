"""Throughput samples, per-minute stats, weekly usage and node activity, on a
real SQLite file, with the site's clock given explicitly (no sleeping)."""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest

from tasknet.protocol.messages import TaskEntry, TaskReport
from tasknet.site.storage import node_sessions, reports, stats, throughput, views
from tasknet.site.storage.engine.database import connect, run_read, run_write
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.usage import meter
from tests.backends import NewTarget
from tests.site.helpers import node_panel
from tests.site_protocol.harness import add_task, add_user

SIZE = 1_000_000
T0 = 1_796_000_000.0  # the site's clock, in unix seconds
MINUTE0 = (int(T0) // 60) * 60.0  # the start of T0's minute bucket


def _task(conn: sqlite3.Connection, gid: int, user_id: int, node: str = "n1") -> None:
    add_task(conn, gid, user_id, node_id=node)
    run_write(conn, lambda c: c.execute("UPDATE gallery SET size = ? WHERE gid = ?", (SIZE, gid)))


_ROWS_BEFORE = (
    "SELECT gid, status, progress, user_id, size, speed, sampled_at, moved_at FROM gallery"
)
# What the report path writes for a changed task (storage/reports.py): its
# new status and progress, and the sample throughput.sample_reports answers.
_APPLY = "UPDATE gallery SET status = ?, progress = ? WHERE gid = ?"
_APPLY_SAMPLED = (
    "UPDATE gallery SET status = ?, progress = ?, speed = ?, sampled_at = ?, moved_at = ?,"
    " completed_at = COALESCE(completed_at, ?) WHERE gid = ?"
)


def _apply_sampled(
    c: sqlite3.Cursor,
    reports: list[tuple[str, list[int], dict[int, TaskEntry], dict[int, Any]]],
    now: float,
) -> None:
    """``reports`` through throughput.sample_reports, as reports.py runs it,
    then each entry applied with its sample."""
    rows = {gid: row for *_, before in reports for gid, row in before.items()}
    samples = throughput.sample_reports(c, reports, rows, now)
    for _, _, entries, _ in reports:
        for gid, entry in entries.items():
            if gid in samples:
                c.execute(_APPLY_SAMPLED, (entry.status, entry.progress, *samples[gid], gid))
            else:
                c.execute(_APPLY, (entry.status, entry.progress, gid))


def _sample(
    conn: sqlite3.Connection, node: str, gid: int, status: int, progress: float, now: float
) -> None:
    """One changed entry, sampled and applied as reports.py does."""

    def body(c: sqlite3.Cursor) -> None:
        before = {row["gid"]: row for row in c.execute(_ROWS_BEFORE + " WHERE gid = ?", (gid,))}
        _apply_sampled(c, [(node, [gid], {gid: TaskEntry(gid, status, progress)}, before)], now)

    run_write(conn, body)


def _row(conn: sqlite3.Connection, gid: int) -> Any:
    return conn.execute(
        "SELECT speed, sampled_at, moved_at, completed_at FROM gallery WHERE gid = ?", (gid,)
    ).fetchone()


def test_speed_is_a_time_weighted_moving_average(conn: sqlite3.Connection) -> None:
    uid, _ = add_user(conn, "alice")
    _task(conn, 1, uid)
    _sample(conn, "n1", 1, 1, 0.0, T0)  # the download starts: no rate yet
    assert _row(conn, 1)["speed"] is None
    _sample(conn, "n1", 1, 1, 0.1, T0 + 1)  # 100 kB in 1 s
    assert _row(conn, 1)["speed"] == pytest.approx(100_000)
    _sample(conn, "n1", 1, 1, 0.4, T0 + 2)  # 300 kB in 1 s
    weight = 1 - math.exp(-1 / throughput.SMOOTHING_SECONDS)
    expected = 100_000 + weight * (300_000 - 100_000)
    assert _row(conn, 1)["speed"] == pytest.approx(expected)
    # A longer gap weighs the new rate more: 100 kB over 10 s.
    _sample(conn, "n1", 1, 1, 0.5, T0 + 12)
    weight10 = 1 - math.exp(-10 / throughput.SMOOTHING_SECONDS)
    assert _row(conn, 1)["speed"] == pytest.approx(expected + weight10 * (10_000 - expected))


def test_view_shows_bytes_eta_and_null_speed_once_stalled(conn: sqlite3.Connection) -> None:
    uid, _ = add_user(conn, "alice")
    _task(conn, 1, uid)
    now = 1e10  # far in the future of the wall clock: everything below is "recent"
    _sample(conn, "n1", 1, 1, 0.0, now - 2)
    _sample(conn, "n1", 1, 1, 0.25, now - 1)
    row = conn.execute("SELECT status, speed, moved_at FROM gallery WHERE gid = 1").fetchone()
    assert throughput.visible_speed(row[0], row[1], row[2], now) == pytest.approx(250_000)
    stalled = now + throughput.STALL_SECONDS + 1
    assert throughput.visible_speed(row[0], row[1], row[2], stalled) is None
    assert throughput.bytes_done(1, 0.25, SIZE) == 250_000
    assert throughput.eta(SIZE, 250_000, 250_000.0) == 3
    assert throughput.eta(SIZE, 250_000, None) is None and throughput.eta(None, None, 5.0) is None
    # Past the download every byte is done, whatever the (compression) progress.
    assert throughput.bytes_done(3, 0.1, SIZE) == SIZE
    assert (
        throughput.bytes_done(None, 0.0, SIZE) == 0 and throughput.bytes_done(1, 0.5, None) is None
    )


def test_view_of_a_real_report_has_owner_size_bytes_speed_and_completion(
    conn: sqlite3.Connection,
) -> None:
    uid, _ = add_user(conn, "alice")
    _task(conn, 7, uid)
    # Its node is connected (a task of an offline node shows no speed).
    taken = run_write(conn, node_sessions.take, "n1", None, "site-a", 2, [], "2026-01-01T00:00:00Z")
    ids = {7: "op-7"}
    for rev, (status, progress) in enumerate([(1, 0.2), (1, 0.6)], 1):
        report = TaskReport(f"r{rev}", rev, (TaskEntry(7, status, progress),), ids, ())
        run_write(conn, reports.apply_task_report, "n1", report)
    view = run_read(conn, views.task_view, 7)
    assert view["owner"] == "alice" and view["size"] == SIZE
    assert view["bytesDone"] == 600_000
    assert view["speed"] is not None and view["speed"] > 0  # two samples, wall-clock apart
    assert view["eta"] == math.ceil(400_000 / view["speed"])
    assert view["completedAt"] is None
    assert view["nodeConnected"] is True and view["stalledSince"] is None
    # Its node goes: the row says so, and shows no speed or ETA.
    run_write(conn, node_sessions.release, taken.holding)
    view = run_read(conn, views.task_view, 7)
    assert view["nodeConnected"] is False and view["speed"] is None and view["eta"] is None
    report = TaskReport("r3", 3, (TaskEntry(7, 4, 1.0),), ids, ())
    run_write(conn, reports.apply_task_report, "n1", report)
    view = run_read(conn, views.task_view, 7)
    assert view["status"] == "COMPLETED" and view["completedAt"].endswith("Z")
    assert view["speed"] is None and view["eta"] is None and view["bytesDone"] == SIZE
    # Every byte counted once, to the reporting node.
    assert run_read(conn, throughput.node_byte_totals) == {"n1": SIZE}
    # A repeated COMPLETED (the next snapshot) counts nothing more.
    report = TaskReport("r4", 4, (TaskEntry(7, 4, 1.0),), ids, ())
    run_write(conn, reports.apply_task_report, "n1", report)
    assert run_read(conn, throughput.node_byte_totals) == {"n1": SIZE}
    completed = conn.execute("SELECT SUM(completed) FROM throughput_minute").fetchone()[0]
    assert completed == 1


def test_stats_buckets_by_minute_node_and_owner(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    _task(conn, 1, alice, "n1")
    _task(conn, 2, bob, "n2")
    _sample(conn, "n1", 1, 1, 0.1, MINUTE0 + 5)  # minute 0: 100 kB by n1 (alice)
    _sample(conn, "n2", 2, 1, 0.3, MINUTE0 + 65)  # minute 1: 300 kB by n2 (bob)
    _sample(conn, "n1", 1, 4, 1.0, MINUTE0 + 70)  # minute 1: 900 kB by n1, completed
    now = MINUTE0 + 125  # minute 2
    everyone = run_read(conn, stats.stats, alice, None, 300, now)
    assert everyone["window"] == 300 and everyone["bucketSeconds"] == 60
    assert everyone["nodes"] == ["n1", "n2"]
    buckets = everyone["buckets"]
    assert len(buckets) == 5
    assert buckets[-1]["start"] == datetime.fromtimestamp(MINUTE0 + 120, UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.000Z"
    )
    assert [b["bytes"] for b in buckets] == [0, 0, 100_000, 1_200_000, 0]
    assert [b["completed"] for b in buckets] == [0, 0, 0, 1, 0]
    assert buckets[3]["byNode"] == {"n1": 900_000, "n2": 300_000}
    assert buckets[0]["byNode"] == {"n1": 0, "n2": 0}
    # Alice's scope sees only her task's bytes.
    own = run_read(conn, stats.stats, alice, alice, 300, now)
    assert [b["bytes"] for b in own["buckets"]] == [0, 0, 100_000, 900_000, 0]
    assert own["nodes"] == ["n1"]
    # A window that is not a whole number of minutes rounds up.
    assert len(run_read(conn, stats.stats, alice, None, 61, now)["buckets"]) == 2


def test_usage_has_eight_weeks_with_zeros_and_the_quota(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    run_write(conn, meter, alice, "2026-W49", 30)
    run_write(conn, meter, alice, "2026-W45", 7)
    run_write(conn, meter, alice, "2026-W30", 99)  # outside the 8 weeks
    weeks = stats.last_weeks(now)
    assert weeks[0] == "2026-W42" and weeks[-1] == "2026-W49" and len(set(weeks)) == 8
    usage = run_read(conn, stats.weekly_usage, alice, weeks)
    assert usage["quota"] == 5000
    assert [w["used"] for w in usage["weeks"]] == [0, 0, 0, 7, 0, 0, 0, 30]


def test_node_panel_counts_open_tasks_and_keeps_recently_seen(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    add_task(conn, 1, alice, node_id="n1", status=4, progress=1.0)
    add_task(conn, 2, alice, node_id="n1", status=1, progress=0.5)
    add_task(conn, 3, alice, node_id="n1")
    now = 1_796_000_000.0
    run_write(conn, throughput.record_node_seen, "n1", 2, ["reliable-task-v2"], True, now - 5)
    run_write(conn, throughput.record_node_seen, "old", 2, [], False, now - 8 * 86400)
    run_write(conn, throughput.record_node_seen, "gone", 1, [], False, now - 3600)
    panel = node_panel(conn, now)
    assert list(panel) == ["gone", "n1"]  # "old" was last seen 8 days ago
    n1 = panel["n1"]
    assert n1["assigned"] == 3 and n1["activeTasks"] == 2 and n1["runningTasks"] == 1
    assert n1["connected"] is False and n1["site"] is None and n1["connectedAt"] is None
    assert n1["protocol"] == 2 and n1["features"] == ["reliable-task-v2"]
    assert n1["lastSeenAt"] == throughput.iso(now - 5) and n1["lastReportAt"] is None
    gone = panel["gone"]
    assert gone["lastSeenAt"] == throughput.iso(now - 3600) and gone["lastReportAt"] is None
    assert gone["assigned"] == 0 and gone["bytesPerSecond"] == 0.0
    assert gone["droppedEntries"] == {} and gone["lastRevision"] is None
    # Connected ids come first, listed whenever last seen, and when never
    # recorded; their protocol and features are the connection's.
    add_task(conn, 4, alice, node_id="never", status=1, progress=0.5)
    panel = node_panel(conn, now, ["n1", "old", "never"])
    assert list(panel) == ["n1", "never", "old", "gone"]
    assert [panel[n]["connected"] for n in panel] == [True, True, True, False]
    assert panel["n1"]["features"] == [] and panel["n1"]["site"] == "site"
    assert panel["old"]["lastSeenAt"] == throughput.iso(now)
    assert panel["old"]["connectedAt"] == throughput.iso(now)
    assert panel["never"]["assigned"] == 1 and panel["never"]["runningTasks"] == 1
    assert panel["never"]["lastReportAt"] is None


def test_counts_and_filters_follow_display_status(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    add_task(conn, 1, alice, status=1, progress=0.5)  # DOWNLOADING
    add_task(conn, 2, alice, status=4, progress=1.0)  # COMPLETED
    add_task(conn, 3, alice, "UNKNOWN")  # SUBMIT_UNKNOWN
    add_task(conn, 4, alice, None, status=4)  # legacy row, COMPLETED
    add_task(conn, 5, alice, "DELETE_PENDING", status=4)
    counts = run_read(conn, views.count_by_status, alice)
    assert counts == {
        "SUBMITTING": 0,
        "SUBMITTED": 0,
        "DOWNLOADING": 1,
        "WAITING_COMPRESSION": 0,
        "COMPRESSING": 0,
        "COMPLETED": 2,
        "SUBMIT_UNKNOWN": 1,
        "DELETE_PENDING": 1,
        "DELETE_FAILED": 0,
        "ARCHIVE_GONE": 0,
    }
    query = views.TaskQuery(alice, 50, views.Order.GID, frozenset({views.TaskStatus.COMPLETED}))
    tasks, _, _ = run_read(conn, views.list_tasks, query)
    assert [t["gid"] for t in tasks] == [2, 4]
    # Metrics see every state, zeros included.
    states = run_read(conn, views.count_by_state)
    assert states["RESERVED"] == 0 and states["LEGACY"] == 1 and states["SUBMITTED"] == 2


def test_minute_buckets_older_than_the_retention_are_pruned(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    _task(conn, 1, alice)
    _task(conn, 2, alice)
    _sample(conn, "n1", 1, 1, 0.1, MINUTE0)
    later = MINUTE0 + (throughput.KEEP_MINUTES + 2) * 60
    _sample(conn, "n1", 2, 1, 0.1, later)
    minutes = [row[0] for row in conn.execute("SELECT minute FROM throughput_minute")]
    assert minutes == [int(later // 60)]
    # The byte counters are never pruned.
    assert run_read(conn, throughput.node_byte_totals) == {"n1": 200_000}


def test_a_download_that_did_not_move_writes_no_sample(conn: sqlite3.Connection) -> None:
    # Write only what changed (BENCH B1): a snapshot repeats every queued and
    # stalled download; those entries write no throughput sample.
    uid, _ = add_user(conn, "alice")
    _task(conn, 1, uid)
    _task(conn, 2, uid)
    _sample(conn, "n1", 2, 1, 0.0, T0)  # queued: its status is new, so one sample
    queued = tuple(_row(conn, 2))
    _sample(conn, "n1", 2, 1, 0.0, T0 + 5)  # still queued: nothing written
    assert tuple(_row(conn, 2)) == queued
    _sample(conn, "n1", 1, 1, 0.0, T0)
    _sample(conn, "n1", 1, 1, 0.1, T0 + 1)  # 100 kB in 1 s
    moved = tuple(_row(conn, 1))
    assert moved[0] == pytest.approx(100_000) and moved[1] == T0 + 1
    _sample(conn, "n1", 1, 1, 0.1, T0 + 2)  # the next snapshot: it did not move
    assert tuple(_row(conn, 1)) == moved
    # Its next movement is averaged over the whole time since the last sample.
    _sample(conn, "n1", 1, 1, 0.2, T0 + 3)  # 100 kB over 2 s
    weight = 1 - math.exp(-2 / throughput.SMOOTHING_SECONDS)
    assert _row(conn, 1)["speed"] == pytest.approx(100_000 + weight * (50_000 - 100_000))
    assert _row(conn, 1)["sampled_at"] == T0 + 3


def test_recording_reports_together_equals_one_after_the_other(
    new_db_target: NewTarget,
) -> None:
    # Group commit records a run's throughput with one set of statements; the
    # tables must end as if each report had been recorded alone.
    def world(name: str) -> sqlite3.Connection:
        path = new_db_target(name)
        prepare_database(path)
        c = connect(path)
        alice, _ = add_user(c, "alice")
        bob, _ = add_user(c, "bob")
        for gid, owner, node in [
            (1, alice, "n1"),
            (2, bob, "n1"),
            (3, alice, "n2"),
            (4, bob, "n2"),
        ]:
            _task(c, gid, owner, node)
        return c

    steps = [  # (now, [(node, {gid: (status, progress)})])
        (T0, [("n1", {1: (1, 0.0), 2: (1, 0.0)}), ("n2", {3: (1, 0.0), 4: (1, 0.5)})]),
        (T0 + 2, [("n1", {1: (1, 0.3), 2: (1, 0.0)}), ("n2", {3: (1, 0.1), 4: (4, 1.0)})]),
        (T0 + 70, [("n1", {1: (4, 1.0), 2: (1, 0.2)}), ("n2", {3: (1, 0.1), 4: (4, 1.0)})]),
    ]
    together, alone = world("together"), world("alone")
    for now, batch in steps:
        run_write(together, _record_step, batch, now, True)
        run_write(alone, _record_step, batch, now, False)
    for query in (
        "SELECT gid, status, progress, speed, sampled_at, moved_at, completed_at FROM gallery",
        "SELECT minute, node_id, user_id, bytes, completed FROM throughput_minute",
        "SELECT node_id, bytes FROM node_bytes",
        "SELECT node_id, last_seen_at, last_report_at FROM node_seen",
    ):
        got = sorted(map(tuple, together.execute(query)))
        assert got == sorted(map(tuple, alone.execute(query))), query
        assert got, query  # the scenario writes every table
    together.close()
    alone.close()


def _record_step(
    c: sqlite3.Cursor,
    batch: list[tuple[str, dict[int, tuple[int, float]]]],
    now: float,
    at_once: bool,
) -> None:
    """One batch of reports sampled at once or report by report, then applied."""
    before = {r["gid"]: r for r in c.execute(_ROWS_BEFORE)}
    items = [
        (
            node,
            list(tasks),
            {g: TaskEntry(g, *v) for g, v in tasks.items()},
            {g: before[g] for g in tasks},
        )
        for node, tasks in batch
    ]
    if at_once:
        _apply_sampled(c, items, now)
    else:
        for item in items:
            _apply_sampled(c, [item], now)
