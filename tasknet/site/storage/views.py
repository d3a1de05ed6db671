"""The task object of INTERFACES.md (API, WebSocket, webhook), built from
the rows by one function, and the read-only queries that return it:
:func:`task_view`, :func:`task_views_and_owners`, :func:`gone_view`,
:func:`visible_task`, :func:`list_tasks` (filter, search, keyset pages:
:class:`TaskQuery`), :func:`views_in_order`, :func:`count_by_status` (the
counts of ``/api/tasks/counts`` and metrics) and :func:`count_by_state`
(metrics).  The throughput fields (``bytesDone``, ``speed``, ``eta``) are
computed by :mod:`tasknet.site.storage.throughput` from the row.

Nothing here writes, and nothing here imports the outbox: the outbox builds
its payloads from these views.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tasknet.site.storage import throughput
from tasknet.site.storage.dialect import IN_ARRAY_SQL, array
from tasknet.site.storage.rows import visible_gallery
from tasknet.status import NodeCode, OperationState, TaskStatus, display_status

# One statement builds the view rows of any set of gids: the task row (joined
# with its generation, if any) or, when the task row is gone, the bare
# ``task_operation`` row (a tombstone).  ``owner`` is the user id of the
# gallery row, else of the operation row.  ``{match}`` is "= ?1" for one gid
# or a json_each over a JSON array for many: the same columns, the same
# row→dict code.
_VIEWS_SQL = """
SELECT g.gid, g.name, g.user_id AS owner, g.status AS node_code, g.progress, g.node_id,
       COALESCE(o.cost, g.cost) AS cost, g.created_at, g.updated_at,
       o.state, o.operation_id, o.delete_operation_id, o.delete_result, 1 AS has_row,
       u.name AS owner_name, g.size, g.completed_at, g.speed, g.moved_at
FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid
     LEFT JOIN "user" AS u ON u.id = g.user_id
WHERE g.gid {match}
UNION ALL
SELECT o.gid, '', o.user_id, NULL, 0, NULL,
       o.cost, o.created_at, o.updated_at,
       o.state, o.operation_id, o.delete_operation_id, o.delete_result, 0,
       (SELECT name FROM "user" WHERE id = o.user_id), NULL, NULL, NULL, NULL
FROM task_operation AS o
WHERE o.gid {match} AND NOT EXISTS (SELECT 1 FROM gallery AS g WHERE g.gid = o.gid)
"""
_VIEW_ONE_SQL = _VIEWS_SQL.format(match="= ?1")
_VIEW_MANY_SQL = _VIEWS_SQL.format(match=IN_ARRAY_SQL.replace("?", "?1"))


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
        "owner": None,
        "size": None,
        "bytesDone": None,
        "speed": None,
        "eta": None,
        "completedAt": None,
    }
    view.update(known)
    return view


# A view is built for every task change a report applies: the display key of
# a (state, node code, delete failed) triple is a pure function, computed once.
_display_status = functools.lru_cache(maxsize=256)(display_status)


def _view_of_row(row: sqlite3.Row) -> dict[str, Any] | None:
    """The one definition of the task object, from a row of ``_VIEWS_SQL``."""
    # Unpacked by position, in the order of _VIEWS_SQL: a view is built for
    # every change a report applies, and a name lookup on a sqlite3.Row
    # scans its columns.
    gid, name, _owner, node_code, progress, node_id, cost, created_at = row[:8]
    updated_at, state, operation_id, delete_operation_id, delete_result, has_row = row[8:14]
    owner_name, size, completed_at, speed, moved_at = row[14:]
    if not has_row:
        # No task row left: a DELETED tombstone is shown as gone; any other
        # bare generation has no view.
        if state != OperationState.DELETED.value:
            return None
        return gone_view(
            gid,
            "DELETED",
            operationId=operation_id,
            deleteOperationId=delete_operation_id,
            cost=cost,
            createdAt=created_at,
            updatedAt=updated_at,
            owner=owner_name,
        )
    status = _display_status(state, node_code, delete_result == "FAILED")
    progress = float(progress)
    done = throughput.bytes_done(node_code, progress, size)
    speed = throughput.visible_speed(node_code, speed, moved_at, time.time())
    return {
        "gid": gid,
        "name": name,
        "state": state,
        "status": status.value,
        "statusText": status.zh,
        "progress": progress,
        "operationId": operation_id,
        "deleteOperationId": delete_operation_id,
        "node": node_id,
        "cost": cost,
        "createdAt": created_at,
        "updatedAt": updated_at,
        "owner": owner_name,
        "size": size,
        "bytesDone": done,
        "speed": speed,
        "eta": throughput.eta(size, done, speed),
        "completedAt": completed_at,
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
        rows = cursor.execute(_VIEW_MANY_SQL, (array(wanted),))
    return {row[0]: (_view_of_row(row), row[2]) for row in rows}


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


class Order(StrEnum):
    """Orders of ``GET /api/tasks`` (``newest`` is the default)."""

    NEWEST = "newest"
    OLDEST = "oldest"
    GID = "gid"


# The key of a row's (state, node code, delete failed) triple, in SQL and in
# Python alike, so a display-status filter is "key IN (the keys of the wanted
# statuses)": the keys come from display_status itself, not a second mapping.
_FAILED_SQL = "(CASE WHEN o.delete_result = 'FAILED' THEN 1 ELSE 0 END)"
_STATUS_KEY_SQL = f"(COALESCE(o.state, '') || '|' || COALESCE(g.status, 0) || '|' || {_FAILED_SQL})"


def _status_key(state: str | None, node_code: int | None, failed: bool) -> str:
    return f"{state or ''}|{node_code or 0}|{int(failed)}"


def _status_keys() -> dict[TaskStatus, list[str]]:
    keys: dict[TaskStatus, list[str]] = {status: [] for status in TaskStatus}
    states = [None, *(s.value for s in OperationState if s is not OperationState.DELETED)]
    for state in states:
        for code in (None, *(int(c) for c in NodeCode)):
            for failed in (False, True):
                status = display_status(state, code, failed)
                keys[status].append(_status_key(state, code, failed))
    return keys


STATUS_KEYS = _status_keys()

# ``createdAt~gid``.  The time is taken as stored (rows from before v2 may
# spell it their own way): it is only ever a parameter, compared as text.
_CURSOR = re.compile(r"([^~\x00-\x1f]{1,64})~([0-9]{1,10})")


@dataclass(frozen=True)
class TaskQuery:
    """One page request of ``GET /api/tasks``.

    ``statuses`` empty means every status; ``text`` empty means no search:
    else a task matches when its name contains it (ASCII case-insensitive)
    or its gid in decimal starts with it.  ``after`` is the ``next`` of the
    previous page: for ``newest``/``oldest`` the text ``createdAt~gid`` of
    its last task (keyset pagination, so tasks created meanwhile do not shift
    later pages), for ``gid`` the last gid.
    """

    user_id: int | None
    limit: int
    order: Order = Order.NEWEST
    statuses: frozenset[TaskStatus] = frozenset()
    text: str = ""
    after: str | int | None = None


def parse_cursor(order: Order, text: str) -> str | int:
    """The ``after`` of ``order`` from its query text; ``ValueError`` if malformed."""
    if order is Order.GID:
        if not re.fullmatch(r"[0-9]{1,10}", text):
            raise ValueError("for order=gid, 'after' is a gid")
        return int(text)
    if _CURSOR.fullmatch(text) is None:
        raise ValueError("'after' must be the 'next' of the previous page")
    return text


def _filters(
    query_user: int | None, statuses: frozenset[TaskStatus], text: str
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if query_user is not None:
        where.append("g.user_id = ?")
        params.append(query_user)
    if statuses:
        keys = [key for status in statuses for key in STATUS_KEYS[status]]
        where.append(f"{_STATUS_KEY_SQL} {IN_ARRAY_SQL}")  # noqa: S608
        params.append(array(keys))
    if text:
        pattern = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append("(g.name LIKE ? ESCAPE '\\' OR CAST(g.gid AS TEXT) LIKE ? ESCAPE '\\')")
        params += [f"%{pattern}%", f"{pattern}%"]
    return where, params


def list_tasks(
    cursor: sqlite3.Cursor, query: TaskQuery
) -> tuple[list[dict[str, Any]], str | int | None]:
    """One page of tasks of ``query``; the second item is the ``after`` of
    the next page (None on the last page).  ``user_id`` None lists
    everyone's (admin)."""
    where, params = _filters(query.user_id, query.statuses, query.text)
    if query.order is Order.GID:
        if query.after is not None:
            where.append("g.gid > ?")
            params.append(query.after)
        order = "g.gid"
    else:
        descending = query.order is Order.NEWEST
        if query.after is not None:
            created, _, gid = str(query.after).rpartition("~")
            where.append(f"(g.created_at, g.gid) {'<' if descending else '>'} (?, ?)")
            params += [created, int(gid)]
        order = "g.created_at DESC, g.gid DESC" if descending else "g.created_at, g.gid"
    sql = (
        "SELECT g.gid, g.created_at FROM gallery AS g"  # noqa: S608 (constant text, parameters)
        " LEFT JOIN task_operation AS o ON o.gid = g.gid"
        f"{' WHERE ' + ' AND '.join(where) if where else ''}"
        f" ORDER BY {order} LIMIT ?"
    )
    rows = cursor.execute(sql, (*params, query.limit + 1)).fetchall()
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    following: str | int | None = None
    if more and rows:
        last = rows[-1]
        following = last["gid"] if query.order is Order.GID else f"{last[1]}~{last[0]}"
    return views_in_order(cursor, [row[0] for row in rows]), following


def count_by_status(cursor: sqlite3.Cursor, user_id: int | None, text: str = "") -> dict[str, int]:
    """Tasks by display status, every key present (zeros included); ``user_id``
    None counts everyone's, ``text`` as the search of :class:`TaskQuery`."""
    where, params = _filters(user_id, frozenset(), text)
    counts = {status.value: 0 for status in TaskStatus}
    for row in cursor.execute(
        f"SELECT o.state, g.status, {_FAILED_SQL}, COUNT(*)"  # noqa: S608
        " FROM gallery AS g"
        " LEFT JOIN task_operation AS o ON o.gid = g.gid"
        f"{' WHERE ' + ' AND '.join(where) if where else ''}"
        " GROUP BY 1, 2, 3",
        params,
    ).fetchall():
        status = _display_status(row[0], row[1], bool(row[2]))
        counts[status.value] += int(row[3])
    return counts


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
    for state in ("LEGACY", *(s.value for s in OperationState)):
        counts.setdefault(state, 0)
    return counts
