"""Issue 21, server side, in the storage layer on both backends: queued work
(``queued``/``detail`` of v2 entries, ``SUBMITTED`` not ``DOWNLOADING``,
the ``QUEUED`` count and filter, the node's running/queued counts), failure
on the row (``nodeConnected``, ``stalledSince``, no speed), one speed
(``bytesPerSecond`` from the same buckets as ``/api/stats``) and the list's
orders, filters and ``total``."""

from __future__ import annotations

import sqlite3

import pytest

from tasknet.protocol.messages import TaskEntry, TaskReport
from tasknet.site.storage import node_sessions, reports, stats, throughput, views
from tasknet.site.storage.engine.database import run_read, run_write
from tests.site.helpers import node_panel
from tests.site_protocol.harness import add_task, add_user

T0 = 1_796_000_000.0


def _report(conn: sqlite3.Connection, rev: int, *entries: TaskEntry, node: str = "n1") -> None:
    ids = {e.gid: f"op-{e.gid}" for e in entries}
    run_write(conn, reports.apply_task_report, node, TaskReport(f"r{rev}", rev, entries, ids, ()))


def _take(conn: sqlite3.Connection, node: str = "n1") -> node_sessions.Holding:
    taken = run_write(conn, node_sessions.take, node, None, "site-a", 2, [], "2026-01-01T00:00:00Z")
    return taken.holding


def test_queued_is_submitted_with_its_detail_counted_apart(conn: sqlite3.Connection) -> None:
    uid, _ = add_user(conn, "alice")
    for gid in (1, 2, 3, 4):
        add_task(conn, gid, uid, node_id="n1")
    _take(conn)
    _report(
        conn,
        1,  # gid 4: sent, not reported yet
        TaskEntry(1, 1, 0.0, True, "waiting for a download slot"),
        TaskEntry(2, 1, 0.25),
        TaskEntry(3, 1, 0.0, True),
    )
    one = run_read(conn, views.task_view, 1)
    assert one["status"] == "SUBMITTED" and one["statusText"] == "已提交"
    assert one["queued"] is True and one["detail"] == "waiting for a download slot"
    assert one["speed"] is None and one["stalledSince"] is None
    two = run_read(conn, views.task_view, 2)
    assert two["status"] == "DOWNLOADING" and two["queued"] is False and two["detail"] is None
    counts = run_read(conn, views.count_by_status, uid, "", True)
    assert counts["QUEUED"] == 2 and counts["SUBMITTED"] == 3 and counts["DOWNLOADING"] == 1
    assert "QUEUED" not in run_read(conn, views.count_by_status, uid)  # metrics: display keys
    assert views.SUBMITTED_NOT_QUEUED not in counts  # SUBMITTED minus QUEUED
    query = views.TaskQuery(uid, 50, views.Order.GID, frozenset({views.QUEUED}))
    assert [t["gid"] for t in run_read(conn, views.list_tasks, query)[0]] == [1, 3]
    query = views.TaskQuery(uid, 50, views.Order.GID, frozenset({"SUBMITTED"}))
    assert [t["gid"] for t in run_read(conn, views.list_tasks, query)[0]] == [1, 3, 4]
    # "In progress" without the queue, in the merged (newest) and the scanned order.
    working = frozenset({"SUBMITTING", views.SUBMITTED_NOT_QUEUED, "DOWNLOADING", "COMPRESSING"})
    for order, gids in ((views.Order.NEWEST, [4, 2]), (views.Order.GID, [2, 4])):
        tasks, _, total = run_read(conn, views.list_tasks, views.TaskQuery(uid, 50, order, working))
        assert ([t["gid"] for t in tasks], total) == (gids, 2)
    query = views.TaskQuery(uid, 50, views.Order.GID, frozenset({"DOWNLOADING"}))
    assert [t["gid"] for t in run_read(conn, views.list_tasks, query)[0]] == [2]
    activity = node_panel(conn, T0, ["n1"])["n1"]
    assert activity["queuedTasks"] == 2 and activity["runningTasks"] == 1
    assert activity["activeTasks"] == 4

    # The download starts; the node's detail changes alone (still a change).
    _report(conn, 2, TaskEntry(1, 1, 0.0, False, "retrying: upstream unreachable"))
    one = run_read(conn, views.task_view, 1)
    assert one["status"] == "DOWNLOADING" and one["queued"] is False
    assert one["detail"] == "retrying: upstream unreachable"
    _report(conn, 3, TaskEntry(1, 1, 0.0))
    assert run_read(conn, views.task_view, 1)["detail"] is None
    # Only gid 3 is still queued.
    counts = run_read(conn, views.count_by_status, None, "", True)
    assert counts["QUEUED"] == 1


def test_offline_node_and_stalled_task_show_no_speed(conn: sqlite3.Connection) -> None:
    uid, _ = add_user(conn, "alice")
    add_task(conn, 5, uid, node_id="n1")
    add_task(conn, 6, uid)  # no node
    holding = _take(conn)
    _report(conn, 1, TaskEntry(5, 1, 0.1))
    _report(conn, 2, TaskEntry(5, 1, 0.2))
    view = run_read(conn, views.task_view, 5)
    assert view["nodeConnected"] is True and view["stalledSince"] is None
    assert run_read(conn, views.task_view, 6)["nodeConnected"] is None
    # Not moved for a minute: stalled since its last movement, no speed.
    moved = 1_000_000_000.0
    run_write(
        conn,
        lambda c: c.execute(
            "UPDATE gallery SET moved_at = ?, sampled_at = ?, speed = 5.0 WHERE gid = 5",
            (moved, moved),
        ),
    )
    view = run_read(conn, views.task_view, 5)
    assert view["stalledSince"] == throughput.iso(moved)
    assert view["speed"] is None and view["eta"] is None
    assert views.stalled_since(views.TaskStatus.DOWNLOADING, moved, moved, None, moved + 59) is None
    assert (
        views.stalled_since(
            views.TaskStatus.COMPRESSING, None, None, "2026-01-01T00:00:00.000Z", T0
        )
        == "2026-01-01T00:00:00.000Z"
    )
    assert views.stalled_since(views.TaskStatus.COMPLETED, moved, moved, None, T0) is None
    run_write(conn, node_sessions.release, holding)
    view = run_read(conn, views.task_view, 5)
    assert view["nodeConnected"] is False and view["speed"] is None


def test_node_speed_is_the_bytes_of_the_stats_buckets(conn: sqlite3.Connection) -> None:
    """A known series: both answers come from the same minute buckets."""
    uid, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    minute = int(T0 // 60)
    series = [
        (minute - 2, "n1", uid, 60_000),
        (minute - 1, "n1", uid, 30_000),
        (minute - 1, "n1", bob, 6_000),  # every user's bytes count for the node
        (minute - 1, "n2", uid, 1_200),
        (minute, "n1", uid, 999_999),  # the current, partial minute: not yet
    ]

    def write(c: sqlite3.Cursor) -> None:
        for row in series:
            c.execute(
                "INSERT INTO throughput_minute (minute, node_id, user_id, bytes, completed)"
                " VALUES (?, ?, ?, ?, 0)",
                row,
            )

    run_write(conn, write)
    activity = node_panel(conn, T0, ["n1", "n2", "n3"])
    rates = {node: activity[node]["bytesPerSecond"] for node in activity}
    assert rates == {"n1": 600.0, "n2": 20.0, "n3": 0.0}
    charts = run_read(conn, stats.stats, uid, None, 180, T0)
    last_full = charts["buckets"][-2]["byNode"]
    for node in ("n1", "n2"):
        assert rates[node] == last_full[node] / charts["bucketSeconds"]


def _pages(conn: sqlite3.Connection, query: views.TaskQuery) -> list[int]:
    """Every page from ``query.after`` on, each cursor read back from its text."""
    gids: list[int] = []
    after = query.after
    while True:
        page, following, _ = run_read(
            conn, views.list_tasks, views.TaskQuery(**{**query.__dict__, "after": after})
        )
        gids += [t["gid"] for t in page]
        if following is None:
            return gids
        after = views.parse_cursor(query.order, str(following))


def test_every_order_pages_with_a_stable_cursor(conn: sqlite3.Connection) -> None:
    uid, _ = add_user(conn, "alice")
    sizes = {11: 500, 12: None, 13: 900, 14: 500, 15: 10}
    progress = {11: 0.5, 12: 0.0, 13: 0.9, 14: 0.5, 15: 0.1}
    for gid, size in sizes.items():
        add_task(conn, gid, uid, node_id="n1", status=1, progress=progress[gid])
        run_write(
            conn,
            lambda c, g=gid, s=size: c.execute("UPDATE gallery SET size = ? WHERE gid = ?", (s, g)),
        )
    run_write(conn, lambda c: c.execute("UPDATE gallery SET status = 4 WHERE gid = 15"))
    expected = {
        views.Order.SIZE: [13, 14, 11, 15, 12],
        views.Order.PROGRESS: [13, 14, 11, 15, 12],
        views.Order.STATUS: [14, 13, 12, 11, 15],  # DOWNLOADING, then COMPLETED
    }
    for order, gids in expected.items():
        assert _pages(conn, views.TaskQuery(uid, 2, order, node="n1")) == gids, order
        # A page, then tasks added: the rest continues where it was.
        first, after, total = run_read(
            conn, views.list_tasks, views.TaskQuery(uid, 2, order, node="n1")
        )
        assert total == 5 and after is not None
        add_task(conn, 100 + len(order), uid, node_id="n3", status=1, progress=0.7)
        rest = _pages(
            conn,
            views.TaskQuery(uid, 2, order, after=views.parse_cursor(order, str(after)), node="n1"),
        )
        assert [t["gid"] for t in first] + rest == gids, order
    # Filters: node, favourite, gid substring; total ignores the cursor.
    add_task(conn, 101777, uid, node_id="n2")
    query = views.TaskQuery(uid, 1, views.Order.GID, text="1777")
    page, after, total = run_read(conn, views.list_tasks, query)
    assert [t["gid"] for t in page] == [101777] and total == 1 and after is None
    page, _, total = run_read(conn, views.list_tasks, views.TaskQuery(uid, 50, node="n2"))
    assert [t["gid"] for t in page] == [101777] and total == 1
    run_write(
        conn, lambda c: c.execute("INSERT INTO favorite (user_id, gid) VALUES (?, 13)", (uid,))
    )
    page, _, total = run_read(conn, views.list_tasks, views.TaskQuery(None, 50, favorite_of=uid))
    assert [t["gid"] for t in page] == [13] and total == 1
    for order, text in [
        (views.Order.SIZE, "0.5~3"),
        (views.Order.STATUS, "x~3"),
        (views.Order.PROGRESS, "nan~3"),
        (views.Order.PROGRESS, "1e999~3"),
        (views.Order.SIZE, "2026-01-01T00:00:00Z~3"),
    ]:
        with pytest.raises(ValueError):
            views.parse_cursor(order, text)
