"""Bulk task views and bulk outbox rows equal the one-at-a-time ones, for
every kind of task row (v2 states, tombstones, legacy rows, gone gids)."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from tasknet.site.storage import outbox, views
from tasknet.site.storage.engine import database as dbmod
from tests.site_protocol.harness import add_task, add_user

UNKNOWN_GID = 999


def _views(cursor: sqlite3.Cursor, gids: list[int]) -> dict[int, dict[str, Any]]:
    """The bulk views of ``gids`` that have one."""
    found = views.task_views_and_owners(cursor, gids)
    return {gid: view for gid, (view, _) in found.items() if view is not None}


def _owner(cursor: sqlite3.Cursor, gid: int) -> int | None:
    """The owner of ``gid``, one row at a time: its task row, else its operation row."""
    for table in ("gallery", "task_operation"):
        row = cursor.execute(f"SELECT user_id FROM {table} WHERE gid = ?", (gid,)).fetchone()
        if row is not None:
            return int(row[0])
    return None


@pytest.fixture
def gids(conn: sqlite3.Connection) -> list[int]:
    """One task of each kind; returns every gid plus one the site never knew."""
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    add_task(conn, 1, alice, node_id="n1", status=2, progress=0.25)
    add_task(conn, 2, bob, "DELETE_PENDING", node_id="n1", status=4, progress=1.0)
    add_task(conn, 3, alice, "DELETED")
    add_task(conn, 4, alice, "RESERVED")
    add_task(conn, 5, bob, "SUBMITTING")
    add_task(conn, 6, alice, "UNKNOWN")
    add_task(conn, 7, bob, None, node_id="old-1", status=3, progress=0.5)  # legacy
    add_task(conn, 8, alice, None)  # legacy, never reported
    add_task(conn, 9, bob, "SUBMITTED", node_id="n2", status=1, progress=0.30000000000000004)
    add_task(conn, 10, alice, "SUBMITTED")
    dbmod.run_write(
        conn,
        lambda c: c.execute(
            "UPDATE task_operation SET delete_result = 'FAILED', delete_reason = 'busy'"
            " WHERE gid = 2"
        ),
    )
    # A generation whose task row is gone without being a tombstone: no view,
    # but an owner (the operation row's user).
    dbmod.run_write(conn, lambda c: c.execute("DELETE FROM gallery WHERE gid = 10"))
    return [*range(1, 11), UNKNOWN_GID]


def test_bulk_views_equal_single_views(conn: sqlite3.Connection, gids: list[int]) -> None:
    cursor = conn.cursor()
    single = {gid: views.task_view(cursor, gid) for gid in gids}
    bulk = _views(cursor, gids)
    assert bulk == {gid: view for gid, view in single.items() if view is not None}
    # The mix really covers the kinds: a failed delete, a tombstone, legacy rows.
    assert bulk[2]["status"] == "DELETE_FAILED"
    assert bulk[3]["state"] == "DELETED" and bulk[3]["status"] is None
    assert bulk[7]["state"] is None and bulk[7]["status"] == "COMPRESSING"
    assert bulk[8]["state"] is None and bulk[8]["status"] == "SUBMITTED"
    assert bulk[9]["progress"] == 0.30000000000000004
    assert 10 not in bulk and UNKNOWN_GID not in bulk


def test_bulk_owners_equal_task_owner(conn: sqlite3.Connection, gids: list[int]) -> None:
    cursor = conn.cursor()
    found = views.task_views_and_owners(cursor, gids)
    for gid in gids:
        owner = _owner(cursor, gid)
        if owner is None:
            assert gid not in found
        else:
            assert found[gid] == (views.task_view(cursor, gid), owner)
    assert found[10][0] is None and found[10][1] is not None


def test_bulk_views_of_nothing_and_of_repeated_gids(
    conn: sqlite3.Connection, gids: list[int]
) -> None:
    cursor = conn.cursor()
    assert _views(cursor, []) == {}
    assert _views(cursor, [1, 1, 7]) == _views(cursor, [7, 1])
    # In the order asked, repeats kept, gids without a view left out.
    in_order = views.views_in_order(cursor, [7, UNKNOWN_GID, 1, 10, 4, 1])
    assert [view["gid"] for view in in_order] == [7, 1, 4, 1]  # not 10: no task row
    assert in_order[0] == views.task_view(cursor, 7)
    assert views.views_in_order(cursor, []) == []


def _outbox_rows(conn: sqlite3.Connection, after: int) -> list[tuple[int, int | None, str]]:
    rows = conn.execute(
        "SELECT gid, user_id, payload FROM notification_outbox WHERE id > ? ORDER BY id",
        (after,),
    )
    return [tuple(r) for r in rows]


def test_bulk_outbox_rows_equal_single_ones(conn: sqlite3.Connection, gids: list[int]) -> None:
    def last_id() -> int:
        return int(
            conn.execute("SELECT COALESCE(MAX(id), 0) FROM notification_outbox").fetchone()[0]
        )

    start = last_id()
    dbmod.run_write(conn, lambda c: [outbox.enqueue_task_change(c, g) for g in gids])
    middle = last_id()
    written = dbmod.run_write(conn, outbox.enqueue_task_changes, gids)
    assert written == len(gids)
    single = _outbox_rows(conn, start)[: len(gids)]
    bulk = _outbox_rows(conn, middle)
    assert bulk == single
    # A gid the site knows nothing about is announced as gone, to nobody.
    assert bulk[-1][:2] == (UNKNOWN_GID, None) and '"status":null' in bulk[-1][2]
    assert dbmod.run_write(conn, outbox.enqueue_task_changes, []) == 0
    assert last_id() == middle + len(gids)
