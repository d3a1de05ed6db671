"""The task object of INTERFACES.md (API, WebSocket, webhook), built from
the rows by one function, and the read-only queries that return it:
:func:`task_view`, :func:`task_views_and_owners`, :func:`gone_view`,
:func:`visible_task`, :func:`list_tasks`, :func:`views_in_order` and
:func:`count_by_state` (metrics).

Nothing here writes, and nothing here imports the outbox: the outbox builds
its payloads from these views.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from tasknet.site.storage.rows import visible_gallery
from tasknet.status import OperationState, display_status

# One statement builds the view rows of any set of gids: the task row (joined
# with its generation, if any) or, when the task row is gone, the bare
# ``task_operation`` row (a tombstone).  ``owner`` is the user id of the
# gallery row, else of the operation row.  ``{match}`` is "= ?1" for one gid
# or a json_each over a JSON array for many: the same columns, the same
# row→dict code.
_VIEWS_SQL = """
SELECT g.gid, g.name, g.user_id AS owner, g.status AS node_code, g.progress, g.node_id,
       COALESCE(o.cost, g.cost) AS cost, g.created_at, g.updated_at,
       o.state, o.operation_id, o.delete_operation_id, o.delete_result, 1 AS has_row
FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid
WHERE g.gid {match}
UNION ALL
SELECT o.gid, '', o.user_id, NULL, 0, NULL,
       o.cost, o.created_at, o.updated_at,
       o.state, o.operation_id, o.delete_operation_id, o.delete_result, 0
FROM task_operation AS o
WHERE o.gid {match} AND NOT EXISTS (SELECT 1 FROM gallery AS g WHERE g.gid = o.gid)
"""
_VIEW_ONE_SQL = _VIEWS_SQL.format(match="= ?1")
_VIEW_MANY_SQL = _VIEWS_SQL.format(match="IN (SELECT value FROM json_each(?1))")


def gone_view(gid: int, state: str | None = None, **known: Any) -> dict[str, Any]:
    """The view of a task that no longer exists (released, resolved
    "not submitted", or deleted: ``state="DELETED"``).  ``status`` is null,
    which tells clients to drop it."""
    view: dict[str, Any] = {
        "gid": gid,
        "name": "",
        "state": state,
        "status": None,
        "statusText": None,
        "progress": 0.0,
        "operationId": None,
        "deleteOperationId": None,
        "node": None,
        "cost": None,
        "createdAt": None,
        "updatedAt": None,
    }
    view.update(known)
    return view


# A view is built for every task change a report applies: the display key of
# a (state, node code, delete failed) triple is a pure function, computed once.
_display_status = functools.lru_cache(maxsize=256)(display_status)


def _view_of_row(row: sqlite3.Row) -> dict[str, Any] | None:
    """The one definition of the task object, from a row of ``_VIEWS_SQL``."""
    if not row["has_row"]:
        # No task row left: a DELETED tombstone is shown as gone; any other
        # bare generation has no view.
        if row["state"] != OperationState.DELETED.value:
            return None
        return gone_view(
            row["gid"],
            "DELETED",
            operationId=row["operation_id"],
            deleteOperationId=row["delete_operation_id"],
            cost=row["cost"],
            createdAt=row["created_at"],
            updatedAt=row["updated_at"],
        )
    status = _display_status(row["state"], row["node_code"], row["delete_result"] == "FAILED")
    return {
        "gid": row["gid"],
        "name": row["name"],
        "state": row["state"],
        "status": status.value,
        "statusText": status.zh,
        "progress": float(row["progress"]),
        "operationId": row["operation_id"],
        "deleteOperationId": row["delete_operation_id"],
        "node": row["node_id"],
        "cost": row["cost"],
        "createdAt": row["created_at"],
        "updatedAt": row["updated_at"],
    }


def task_view(cursor: sqlite3.Cursor, gid: int) -> dict[str, Any] | None:
    """The task object of INTERFACES.md for ``gid`` (API, WebSocket, webhook).

    A ``DELETED`` tombstone gives :func:`gone_view` with ``state="DELETED"``;
    a gid the site knows nothing about gives ``None``.
    """
    row = cursor.execute(_VIEW_ONE_SQL, (gid,)).fetchone()
    return None if row is None else _view_of_row(row)


def task_views_and_owners(
    cursor: sqlite3.Cursor, gids: Iterable[int]
) -> dict[int, tuple[dict[str, Any] | None, int | None]]:
    """``{gid: (task_view(gid), owner)}`` for every gid of ``gids`` the site
    has a row of, in one query (a gid it knows nothing about is absent).
    ``owner`` is the user id of the task row, else of its operation row.
    For the outbox rows of many changes in one transaction."""
    wanted = list(gids)
    if len(wanted) == 1:
        rows = cursor.execute(_VIEW_ONE_SQL, (wanted[0],))
    else:
        rows = cursor.execute(_VIEW_MANY_SQL, (json.dumps(wanted),))
    return {row["gid"]: (_view_of_row(row), row["owner"]) for row in rows}


def views_in_order(cursor: sqlite3.Cursor, gids: Iterable[int]) -> list[dict[str, Any]]:
    """The views of ``gids`` in that order, in one query; a gid without a
    view is left out."""
    wanted = list(gids)
    found = task_views_and_owners(cursor, wanted)
    views = (found.get(gid, (None, None))[0] for gid in wanted)
    return [view for view in views if view is not None]


def visible_task(cursor: sqlite3.Cursor, gid: int, user_id: int | None) -> dict[str, Any]:
    """The view of ``gid`` if ``user_id`` may see it (None: admin), else
    ``not_found`` (another user's task looks exactly like a missing one)."""
    visible_gallery(cursor, gid, user_id)
    view = task_view(cursor, gid)
    assert view is not None
    return view


def list_tasks(
    cursor: sqlite3.Cursor, user_id: int | None, limit: int, after: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Tasks with ``gid > after`` in gid order, at most ``limit``; the second
    item is the ``after`` of the next page (None on the last page).
    ``user_id`` None lists everyone's (admin)."""
    if user_id is None:
        rows = cursor.execute(
            "SELECT gid FROM gallery WHERE gid > ? ORDER BY gid LIMIT ?", (after, limit + 1)
        ).fetchall()
    else:
        rows = cursor.execute(
            "SELECT gid FROM gallery WHERE user_id = ? AND gid > ? ORDER BY gid LIMIT ?",
            (user_id, after, limit + 1),
        ).fetchall()
    gids = [row[0] for row in rows]
    more = len(gids) > limit
    gids = gids[:limit]
    return views_in_order(cursor, gids), (gids[-1] if more and gids else None)


def count_by_state(cursor: sqlite3.Cursor) -> dict[str, int]:
    """Task counts by ``task_operation.state`` (``LEGACY``: a row without one), for metrics."""
    counts: dict[str, int] = {}
    for row in cursor.execute(
        "SELECT COALESCE(o.state, 'LEGACY'), COUNT(*) FROM gallery AS g "
        "LEFT JOIN task_operation AS o ON o.gid = g.gid GROUP BY 1"
    ).fetchall():
        counts[row[0]] = int(row[1])
    row = cursor.execute("SELECT COUNT(*) FROM task_operation WHERE state = 'DELETED'").fetchone()
    counts["DELETED"] = int(row[0])
    return counts
