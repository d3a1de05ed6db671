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

Reading one task's rows (shared by every task module): the gid range,
the ``gallery`` and ``task_operation`` row of a gid, and the owner check
that makes another user's task look missing.

A page of the task list is composed of fragments rendered at import
(:func:`~tasknet.site.storage.engine.sql.fragment`): its filters, and per
order its sort key, keyset condition and ``ORDER BY``.  The name search
ignores ASCII case only, alike on both engines (``{ilike}``).

Schema v6 makes them index lookups: the status tabs and the counts read the
stored display-status key (``gallery.status_key``, kept by triggers:
:func:`stored_key`), one index range per key; a search of three characters
or more takes its candidates from a trigram index (SQLite FTS5, PostgreSQL
pg_trgm) and the same ``LIKE`` decides, so it answers what the scan did.
Schema v9 keeps the counts per user and key (``task_count``, by triggers):
``/api/tasks/counts`` without a search, and the total of a page filtered
by owner and status only, read those rows, not the tasks.
"""

from __future__ import annotations

import functools
import math
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypedDict, Unpack, cast

from tasknet.failures import cannot_reach
from tasknet.site.storage import throughput
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sources import now_of
from tasknet.site.storage.engine.sql import EMPTY, Sql, SqlValue, fragment, sql
from tasknet.site.storage.engine.timestamps import iso, unix
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.status import NodeCode, OperationState, TaskStatus, display_status

_DOWNLOADING = int(NodeCode.DOWNLOADING)

# One statement builds the view rows of any set of gids: the task row (joined
# with its generation, if any) or, when the task row is gone, the bare
# ``task_operation`` row (a tombstone).  ``owner`` is the user id of the
# gallery row, else of the operation row.  ``{match}`` is "= ?1" for one gid
# or ``{in_array:?1}`` for a list of them: the same columns, the same
# row→dict code.
#
# ``node_connected`` is 1 while a live site holds the task's node
# (``node_session``, across the sites of the database: the rule of
# ``node_sessions.holders``), 0 when not, NULL for a task without a node.
_VIEWS_SQL = """
SELECT g.gid, g.name, g.user_id AS owner, g.status AS node_code, g.progress, g.node_id,
       COALESCE(o.cost, g.cost) AS cost, g.created_at, g.updated_at,
       o.state, o.operation_id, o.delete_operation_id, o.delete_result, 1 AS has_row,
       u.name AS owner_name, g.size, g.completed_at, g.speed, g.moved_at,
       g.queued, g.detail, g.sampled_at, g.archive_size, g.archive_sha256,
       g.archive_gone_reason, g.archive_gone_at, g.archive_gone_node,
       CASE WHEN g.node_id IS NULL THEN NULL
       WHEN EXISTS (SELECT 1 FROM node_session AS s WHERE s.node_id = g.node_id
                    AND s.connected_at IS NOT NULL AND (s.instance_id IS NULL OR s.instance_id IN
                    (SELECT id FROM site_instance WHERE ended_at IS NULL AND reaped_at IS NULL)))
       THEN 1 ELSE 0 END AS node_connected
FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid
     LEFT JOIN "user" AS u ON u.id = g.user_id
WHERE g.gid {match}
UNION ALL
SELECT o.gid, '', o.user_id, NULL, 0, NULL,
       o.cost, o.created_at, o.updated_at,
       o.state, o.operation_id, o.delete_operation_id, o.delete_result, 0,
       (SELECT name FROM "user" WHERE id = o.user_id), NULL, NULL, NULL, NULL,
       0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM task_operation AS o
WHERE o.gid {match} AND NOT EXISTS (SELECT 1 FROM gallery AS g WHERE g.gid = o.gid)
"""
_VIEW_ONE_SQL = sql(_VIEWS_SQL.format(match="= ?1"))
_VIEW_MANY_SQL = sql(_VIEWS_SQL.format(match="{in_array:?1}"))


class ArchiveGone(TypedDict):
    """``archiveGone`` of a view: why and when no node holds the archive."""

    reason: str
    at: str | None
    node: str | None


class TaskView(TypedDict):
    """The task object of INTERFACES.md (API, WebSocket, webhook), built
    only here (:func:`_view_of_row`, :func:`gone_view`)."""

    gid: int
    name: str
    state: str | None
    status: str | None
    statusText: str | None
    progress: float
    operationId: str | None
    deleteOperationId: str | None
    node: str | None
    cost: int | None
    createdAt: str | None
    updatedAt: str | None
    owner: str | None
    size: int | None
    bytesDone: int | None
    speed: float | None
    eta: int | None
    completedAt: str | None
    archiveSize: int | None
    archiveSha256: str | None
    archiveGone: ArchiveGone | None
    queued: bool
    detail: str | None
    nodeConnected: bool | None
    stalledSince: str | None


class GoneKnown(TypedDict, total=False):
    """What a :func:`gone_view` still knows of the task (the rest is null)."""

    operationId: str | None
    deleteOperationId: str | None
    cost: int | None
    createdAt: str | None
    updatedAt: str | None
    owner: str | None


def gone_view(gid: int, state: str | None = None, **known: Unpack[GoneKnown]) -> TaskView:
    """The view of a task that no longer exists (released, resolved
    "not submitted", or deleted: ``state="DELETED"``).  ``status`` is null,
    which tells clients to drop it."""
    view: TaskView = {
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
        "archiveSize": None,
        "archiveSha256": None,
        "archiveGone": None,
        "queued": False,
        "detail": None,
        "nodeConnected": None,
        "stalledSince": None,
    }
    view.update(known)
    return view


# A view is built for every task change a report applies: the display key of
# a (state, node code, delete failed) triple is a pure function, computed once.
_display_status = functools.lru_cache(maxsize=512)(display_status)

#: A DOWNLOADING/COMPRESSING task whose progress has not moved for this long
#: is stalled: its view gives ``stalledSince`` (when it last moved) and no
#: speed or ETA.
STALL_AFTER_SECONDS = 60.0
_MOVING = frozenset({TaskStatus.DOWNLOADING, TaskStatus.COMPRESSING})


def _last_moved(
    status: TaskStatus, moved_at: float | None, sampled_at: float | None, updated_at: str | None
) -> float | None:
    """When a moving task's progress last moved: a download's last gain (or
    its start), else the last change of its row (status or progress)."""
    if status is TaskStatus.DOWNLOADING:
        for moment in (moved_at, sampled_at):
            if moment is not None:
                return float(moment)
    return unix(updated_at)


def stalled_since(
    status: TaskStatus,
    moved_at: float | None,
    sampled_at: float | None,
    updated_at: str | None,
    now: float,
) -> str | None:
    """``stalledSince`` of a view: ISO 8601 UTC of the last movement of a
    DOWNLOADING/COMPRESSING task that has not moved for
    :data:`STALL_AFTER_SECONDS`, else ``None``."""
    if status not in _MOVING:
        return None
    last = _last_moved(status, moved_at, sampled_at, updated_at)
    if last is None or now - last < STALL_AFTER_SECONDS:
        return None
    return iso(last)


def _view_of_row(row: sqlite3.Row, now: float) -> TaskView | None:
    """The one definition of the task object, from a row of ``_VIEWS_SQL``,
    at ``now`` (the wall clock of the transaction: stalled or not, speed)."""
    # Unpacked by position, in the order of _VIEWS_SQL: a view is built for
    # every change a report applies, and a name lookup on a sqlite3.Row
    # scans its columns.
    gid, name, _owner, node_code, progress, node_id, cost, created_at = row[:8]
    updated_at, state, operation_id, delete_operation_id, delete_result, has_row = row[8:14]
    owner_name, size, completed_at, speed, moved_at = row[14:19]
    queued_flag, detail, sampled_at, archive_size, archive_sha256 = row[19:24]
    gone_reason, gone_at, gone_node, node_connected = row[24:]
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
    status = _display_status(
        state, node_code, delete_result == "FAILED", bool(queued_flag), gone_reason is not None
    )
    queued = bool(queued_flag) and status is TaskStatus.SUBMITTED and node_code == _DOWNLOADING
    progress = float(progress)
    done = throughput.bytes_done(node_code, progress, size)
    connected = None if node_connected is None else bool(node_connected)
    stalled = stalled_since(status, moved_at, sampled_at, updated_at, now)
    if connected is False or stalled is not None or queued:
        speed = None
    else:
        speed = throughput.visible_speed(node_code, speed, moved_at, now)
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
        "archiveSize": archive_size,
        "archiveSha256": archive_sha256,
        # No node holds this generation's archive any more (DELIVERY.md "Custody").
        "archiveGone": (
            None
            if gone_reason is None
            else {"reason": gone_reason, "at": gone_at, "node": gone_node}
        ),
        "queued": queued,
        "detail": detail or None,
        "nodeConnected": connected,
        "stalledSince": stalled,
    }


def task_view(cursor: Cursor, gid: int) -> TaskView | None:
    """The task object of INTERFACES.md for ``gid`` (API, WebSocket, webhook).

    A ``DELETED`` tombstone gives :func:`gone_view` with ``state="DELETED"``;
    a gid the site knows nothing about gives ``None``.
    """
    row = cursor.execute(_VIEW_ONE_SQL, (gid,)).fetchone()
    return None if row is None else _view_of_row(row, now_of(cursor))


def task_views_and_owners(
    cursor: Cursor, gids: Iterable[int]
) -> dict[int, tuple[TaskView | None, int | None]]:
    """``{gid: (task_view(gid), owner)}`` for every gid of ``gids`` the site
    has a row of, in one query (a gid it knows nothing about is absent).
    ``owner`` is the user id of the task row, else of its operation row.
    For the outbox rows of many changes in one transaction."""
    wanted = list(gids)
    if len(wanted) == 1:
        rows = cursor.execute(_VIEW_ONE_SQL, (wanted[0],))
    else:
        rows = cursor.execute(_VIEW_MANY_SQL, (wanted,))
    now = now_of(cursor)
    return {row[0]: (_view_of_row(row, now), row[2]) for row in rows}


def views_in_order(cursor: Cursor, gids: Iterable[int]) -> list[TaskView]:
    """The views of ``gids`` in that order, in one query; a gid without a
    view is left out."""
    wanted = list(gids)
    found = task_views_and_owners(cursor, wanted)
    views = (found.get(gid, (None, None))[0] for gid in wanted)
    return [view for view in views if view is not None]


def visible_task(cursor: Cursor, gid: int, user_id: int | None) -> TaskView:
    """The view of ``gid`` if ``user_id`` may see it (None: admin), else
    ``not_found`` (another user's task looks exactly like a missing one)."""
    visible_gallery(cursor, gid, user_id)
    view = task_view(cursor, gid)
    assert view is not None
    return view


class Order(StrEnum):
    """Orders of ``GET /api/tasks`` (``newest`` is the default).

    Each is a total order on ``(key, gid)``, so its keyset cursor (``after``)
    names one place in it and tasks created meanwhile never shift a later
    page: ``newest``/``oldest`` by ``createdAt`` then gid, ``gid`` ascending,
    ``size`` largest first (unknown sizes last), ``progress`` furthest first,
    ``status`` in lifecycle order (:data:`STATUS_ORDER`); the last three
    break ties by gid, highest (newest) first.
    """

    NEWEST = "newest"
    OLDEST = "oldest"
    GID = "gid"
    SIZE = "size"
    PROGRESS = "progress"
    STATUS = "status"


#: The filter key of a SUBMITTED task its node holds but has not started:
#: ``?status=QUEUED`` and the ``QUEUED`` count (a part of ``SUBMITTED``).
QUEUED = "QUEUED"
#: The filter key of the rest of SUBMITTED (sent, not known to be queued):
#: with it a list of the tasks being worked on leaves the queue out (issue
#: 36, item 1); ``?status=SUBMITTED`` still means both parts.
SUBMITTED_NOT_QUEUED = "SUBMITTED_NOT_QUEUED"

#: ``order=status``: the lifecycle order of the display statuses.
STATUS_ORDER = [
    TaskStatus.SUBMITTING,
    TaskStatus.SUBMIT_UNKNOWN,
    TaskStatus.SUBMITTED,
    TaskStatus.DOWNLOADING,
    TaskStatus.WAITING_COMPRESSION,
    TaskStatus.COMPRESSING,
    TaskStatus.COMPLETED,
    TaskStatus.ARCHIVE_GONE,
    TaskStatus.DELETE_PENDING,
    TaskStatus.DELETE_FAILED,
]


# The stored display-status key (``gallery.status_key``, schema v6): the
# TaskStatus value of the row's display status, except that a SUBMITTED
# task queued on its node is QUEUED, so every filter key is one or two
# stored keys and a tab is one index range (``gallery_user_status``,
# ``gallery_status``).  The database's triggers keep it (migrate_v6*.sql);
# :func:`stored_key` is the same function in Python (a test compares them).
def stored_key(
    state: str | None,
    node_code: int | None,
    failed: bool,
    queued: bool,
    archive_gone: bool = False,
) -> str:
    """``gallery.status_key`` of a row (``DELETED`` for a tombstone's)."""
    if state == OperationState.DELETED.value:
        return OperationState.DELETED.value
    status = display_status(state, node_code, failed, queued, archive_gone)
    if queued and status is TaskStatus.SUBMITTED and node_code == _DOWNLOADING:
        return QUEUED
    return status.value


def _status_keys() -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {status.value: [status.value] for status in TaskStatus}
    keys[TaskStatus.SUBMITTED.value].append(QUEUED)
    keys[QUEUED] = [QUEUED]
    keys[SUBMITTED_NOT_QUEUED] = [TaskStatus.SUBMITTED.value]
    return keys


#: The stored keys of each filter key (every display status, QUEUED and
#: SUBMITTED_NOT_QUEUED).
STATUS_KEYS = _status_keys()
FILTER_KEYS = [*(status.value for status in TaskStatus), QUEUED, SUBMITTED_NOT_QUEUED]
#: The display status of each stored key.
_KEY_STATUS = {
    **{status.value: status for status in TaskStatus},
    QUEUED: TaskStatus.SUBMITTED,
}

# ``order=status``'s key: the rank of the row's display status (constant
# text: the keys are made of enum values, nothing from a request).
_STATUS_RANK_SQL = (
    "(CASE g.status_key "
    + " ".join(
        f"WHEN '{key}' THEN {rank}"
        for rank, status in enumerate(STATUS_ORDER)
        for key in STATUS_KEYS[status.value]
    )
    + f" ELSE {len(STATUS_ORDER)} END)"
)

# (key expression, key descending, gid descending) of the keyed orders.
_KEYED: dict[Order, tuple[str, bool, bool]] = {
    Order.SIZE: ("COALESCE(g.size, -1)", True, True),
    Order.PROGRESS: ("g.progress", True, True),
    Order.STATUS: (_STATUS_RANK_SQL, False, True),
}

# Every filter is on the task row itself (the stored key): no join.
_TASKS = "FROM gallery AS g"


@dataclass(frozen=True)
class _Page:
    """The fragments of one order's page: the select (its sort key), the
    keyset condition after the previous page's last task, and the tail;
    ``matches_tail`` is the tail of a page made of a search index's
    matches (:data:`MATCHES_FIRST_UP_TO`): the same order, which SQLite
    must not take from an index (the unary ``+``), so that it looks each
    match up by the filters' index (the owner's ``(user_id, gid)``) rather
    than walk the owner's tasks in order testing each."""

    select: Sql
    after: Sql
    tail: Sql
    matches_tail: Sql
    #: The keyset condition and the tail on the rows of :data:`_COUNTED_OPEN`
    #: (``m.gid``, ``m.sort_key``).
    counted_after: Sql
    counted_tail: Sql


def _page(key: str, after: str, terms: list[str]) -> _Page:
    order, unindexed = ", ".join(terms), ", ".join(f"+{term}" for term in terms)

    def counted(text: str) -> str:
        return text.replace(key, "m.sort_key").replace("g.gid", "m.gid")

    return _Page(
        fragment(f"SELECT g.gid, {key} AS sort_key {_TASKS}"),  # noqa: S608 (constant text)
        fragment(after),
        fragment(f" ORDER BY {order} LIMIT ?"),
        _per_backend_fragment(
            sqlite=f" ORDER BY {unindexed} LIMIT ?", postgres=f" ORDER BY {order} LIMIT ?"
        ),
        fragment(" WHERE " + counted(after)),
        fragment(f" ORDER BY {counted(order)} LIMIT ?"),
    )


def _keyed_page(key: str, key_desc: bool, gid_desc: bool) -> _Page:
    than, gid_than = "<" if key_desc else ">", "<" if gid_desc else ">"
    return _page(
        key,
        f"({key} {than} ? OR ({key} = ? AND g.gid {gid_than} ?))",
        [f"{key} {'DESC' if key_desc else 'ASC'}", f"g.gid {'DESC' if gid_desc else 'ASC'}"],
    )


# The filters, each a condition of its own.
_OWNED_BY = fragment("g.user_id = ?")
# One stored key is one index range, in the page's order; several are a set.
_STATUS_IS = fragment("g.status_key = ?")
_STATUS_IN = fragment("g.status_key {in_array}")
# The name ignoring ASCII case, the gid in decimal (digits: no case to ignore).
_TEXT_IN = fragment("(g.name {ilike} ? ESCAPE '\\' OR CAST(g.gid AS TEXT) LIKE ? ESCAPE '\\')")


def _per_backend_fragment(sqlite: str, postgres: str) -> Sql:
    """A condition with a text of its own on each engine, taking the same
    parameters (composes as any fragment)."""
    lite, pg = fragment(sqlite), fragment(postgres)
    if lite.placeholders != pg.placeholders:
        raise ValueError("the two texts take different parameters")
    return Sql(str(lite), pg.postgres, placeholders=lite.placeholders)


#: A search text this long or longer is looked up by index (trigrams);
#: a shorter one has no trigram and is matched by the scan of :data:`_TEXT_IN`.
TRIGRAM = 3
# The same condition, by index.  SQLite: schema v10's FTS5 trigram table
# (rowid the gid) holds each name with its ASCII letters lowered and
# compares case-sensitively, so the phrase of the lowered text
# (:func:`trigram_query`, the third parameter) matches exactly the rows the
# LIKE would: no row is read back to test (the two patterns are bound, not
# read).  Asked as ``gid IN (…)``, a set the planner looks each row up in.
# PostgreSQL's pg_trgm indexes serve the LIKE itself, so there the third
# parameter is only bound.
_TEXT_INDEXED_POSTGRES = (
    "(g.name {ilike} ? ESCAPE '\\' OR CAST(g.gid AS TEXT) LIKE ? ESCAPE '\\')"
    " AND CAST(? AS TEXT) IS NOT NULL"
)
_TEXT_INDEXED = _per_backend_fragment(
    sqlite=(
        "? IS NOT NULL AND ? IS NOT NULL"
        " AND g.gid IN (SELECT rowid FROM gallery_text WHERE gallery_text MATCH ?)"
    ),
    postgres=_TEXT_INDEXED_POSTGRES,
)
# The count of a search with no other filter (an admin's): on SQLite the
# trigram table's own, one row per task (B9, 'phoenix' over a million
# tasks: 0.8 ms, where looking up its 5,016 gids took 4.3); the parameters
# of :data:`_TEXT_INDEXED`.
_COUNT_MATCHES = _per_backend_fragment(
    sqlite=(
        "SELECT COUNT(*) FROM gallery_text"
        " WHERE ? IS NOT NULL AND ? IS NOT NULL AND gallery_text MATCH ?"
    ),
    postgres=f"SELECT COUNT(*) {_TASKS} WHERE {_TEXT_INDEXED_POSTGRES}",  # noqa: S608 (constant)
)
# The owner of a search's few matches (``matches``): ``likely()`` tells
# SQLite's planner the owner alone narrows little, so it looks each match
# up by ``(user_id, gid)`` rather than walk the owner's tasks by time
# testing each (B9's heavy user, 100,000 tasks: 3.7 ms, not 12.4).
_OWNED_BY_AMONG_MATCHES = _per_backend_fragment(
    sqlite="likely(g.user_id = ?)", postgres="g.user_id = ?"
)
_PAGES: dict[Order, _Page] = {
    Order.NEWEST: _page(
        "g.created_at", "(g.created_at, g.gid) < (?, ?)", ["g.created_at DESC", "g.gid DESC"]
    ),
    Order.OLDEST: _page(
        "g.created_at", "(g.created_at, g.gid) > (?, ?)", ["g.created_at", "g.gid"]
    ),
    Order.GID: _page("g.created_at", "g.gid > ?", ["g.gid"]),
    **{order: _keyed_page(*keyed) for order, keyed in _KEYED.items()},
}
#: A search of at most this many matches reads them first and sorts them;
#: one of more walks the page's order (a frequent word: the page fills
#: soon), matching each row by the scan's condition.
MATCHES_FIRST_UP_TO = 5_000
# A search's page and its total from one reading of its matches (at most
# MATCHES_FIRST_UP_TO + 1 of them: the first ?): every match is looked up
# once, where a count and then the page looked each up twice (B9's heavy
# user, 'phoenix': 5,016 lookups each time).  Then the keyset condition and
# the page's order on those rows (_Page.counted_after, .counted_tail).
_COUNTED_OPEN = fragment(
    "SELECT gid, sort_key, total FROM (SELECT gid, sort_key, COUNT(*) OVER () AS total FROM ("
)
_COUNTED_CLOSE = fragment(" LIMIT ?) AS c) AS m")
_FAVORITE_OF = fragment(
    "EXISTS (SELECT 1 FROM favorite AS f WHERE f.user_id = ? AND f.gid = g.gid)"
)
_ON_NODE = fragment("g.node_id = ?")
_OFFSET = fragment(" OFFSET ?")
_WHERE = fragment(" WHERE ")
_AND = fragment(" AND ")
_COUNT = fragment(f"SELECT COUNT(*) {_TASKS}")  # noqa: S608 (constant text)
_COUNT_BY_STATUS = fragment(f"SELECT g.status_key, COUNT(*) {_TASKS}")  # noqa: S608
_BY_STATUS = fragment(" GROUP BY g.status_key")


# A page of several stored keys merged from one page per key (each its own
# index range, in order): SELECT … FROM (SELECT * FROM (page of key 1) AS k0
# UNION ALL SELECT * FROM (page of key 2) AS k1 …) AS u ORDER BY … LIMIT ?.
_MERGE_OPEN = fragment("SELECT gid, sort_key FROM (")
_PART_OPEN = fragment("SELECT * FROM (")
_PART_CLOSE = [fragment(f") AS k{number}") for number in range(len(_KEY_STATUS))]
_UNION_ALL = fragment(" UNION ALL ")
_MERGED: dict[Order, Sql] = {
    Order.NEWEST: fragment(") AS u ORDER BY sort_key DESC, gid DESC LIMIT ?"),
    Order.OLDEST: fragment(") AS u ORDER BY sort_key, gid LIMIT ?"),
}


def _stored_keys(statuses: frozenset[str]) -> list[str]:
    """The stored keys of the filter keys ``statuses``, sorted."""
    return sorted({key for status in statuses for key in STATUS_KEYS[status]})


def _where(conditions: list[Sql]) -> Sql:
    return _WHERE + _AND.join(conditions) if conditions else EMPTY


# ``createdAt~gid``.  The time is taken as stored (rows from before v2 may
# spell it their own way): it is only ever a parameter, compared as text.
_CURSOR = re.compile(r"([^~\x00-\x1f]{1,64})~([0-9]{1,10})")
# ``key~gid`` of the keyed orders: an integer (size, status) or a number.
_KEY_CURSOR = re.compile(r"(-?[0-9]{1,20}(?:\.[0-9]{1,20})?(?:[eE]-?[0-9]{1,3})?)~([0-9]{1,10})")

#: The bounds of an integer key in ``after`` (``order=size``/``status``):
#: a signed 64-bit integer, what both engines store and bind.
CURSOR_KEY_MIN = -(2**63)
CURSOR_KEY_MAX = 2**63 - 1

#: The ``after`` of a page request, parsed (:func:`parse_cursor`): where the
#: previous page of its order ended (not a database cursor).
PageCursor = str | int | tuple[float, int] | tuple[int, int]


@dataclass(frozen=True)
class TaskQuery:
    """One page request of ``GET /api/tasks``.

    ``statuses`` empty means every status (else filter keys:
    :data:`FILTER_KEYS`); ``text`` empty means no search: else a task
    matches when its name contains it (ASCII case-insensitive) or its gid in
    decimal does.  ``favorite_of``: only that user's favourites; ``node``:
    only the tasks assigned to that node.  ``after`` is the ``next`` of the
    previous page (:func:`parse_cursor`): for ``newest``/``oldest`` the
    text ``createdAt~gid`` of its last task (keyset pagination, so tasks
    created meanwhile do not shift later pages), for ``gid`` the last gid,
    for ``size``/``progress``/``status`` ``(key, gid)`` of its last task.
    """

    user_id: int | None
    limit: int
    order: Order = Order.NEWEST
    statuses: frozenset[str] = frozenset()
    text: str = ""
    after: PageCursor | None = None
    favorite_of: int | None = None
    node: str | None = None
    #: Rows of the order skipped before the page (a page asked for by its
    #: number, ``GET /api/tasks?page=P``): the same statement, ``OFFSET``
    #: after its ``LIMIT``; never with ``after``.  The page still answers
    #: its keyset ``next``, so the page after it is read by the cursor.
    offset: int = 0


def parse_cursor(order: Order, text: str) -> PageCursor:
    """The ``after`` of ``order`` from its query text; ``ValueError`` if malformed."""
    if order is Order.GID:
        if not re.fullmatch(r"[0-9]{1,10}", text):
            raise ValueError("for order=gid, 'after' is a gid")
        return int(text)
    if order in _KEYED:
        found = _KEY_CURSOR.fullmatch(text)
        key = float(found.group(1)) if found is not None else math.nan
        if found is None or not math.isfinite(key):
            raise ValueError("'after' must be the 'next' of the previous page")
        if order is not Order.PROGRESS:  # size, status: integer keys
            if not re.fullmatch(r"-?[0-9]{1,20}", found.group(1)):
                raise ValueError("'after' must be the 'next' of the previous page")
            whole = int(found.group(1))
            # SQLite binds only signed 64-bit integers (a wider one is an
            # OverflowError, a 500); no stored key is outside them anyway.
            if not CURSOR_KEY_MIN <= whole <= CURSOR_KEY_MAX:
                raise ValueError(
                    f"for order={order.value}, the key of 'after' must be between"
                    f" {CURSOR_KEY_MIN} and {CURSOR_KEY_MAX}"
                )
            return (whole, int(found.group(2)))
        return (key, int(found.group(2)))
    if _CURSOR.fullmatch(text) is None:
        raise ValueError("'after' must be the 'next' of the previous page")
    return text


def _filters(
    query_user: int | None,
    statuses: frozenset[str],
    text: str,
    favorite_of: int | None = None,
    node: str | None = None,
    search: str = "index",
) -> tuple[list[Sql], list[SqlValue]]:
    """The conditions of the filters and their parameters.  ``search``: how
    a text of :data:`TRIGRAM` characters or more is matched: ``index`` (the
    planner's choice), ``matches`` (the index's matches first, then sorted:
    few of them) or ``scan`` (the page's order, each row matched: many)."""
    where: list[Sql] = []
    params: list[SqlValue] = []
    indexed = len(text) >= TRIGRAM
    if query_user is not None:
        among_matches = indexed and search == "matches"
        where.append(_OWNED_BY_AMONG_MATCHES if among_matches else _OWNED_BY)
        params.append(query_user)
    if statuses:
        keys = _stored_keys(statuses)
        if len(keys) == 1:
            where.append(_STATUS_IS)
            params.append(keys[0])
        else:
            where.append(_STATUS_IN)
            params.append(keys)
    if text:
        pattern = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        if indexed and search != "scan":
            where.append(_TEXT_INDEXED)
            params += [f"%{pattern}%", f"%{pattern}%", trigram_query(text)]
        else:
            where.append(_TEXT_IN)
            params += [f"%{pattern}%", f"%{pattern}%"]
    if favorite_of is not None:
        where.append(_FAVORITE_OF)
        params.append(favorite_of)
    if node is not None:
        where.append(_ON_NODE)
        params.append(node)
    return where, params


# A-Z to a-z and nothing else: what SQLite's lower() does to the names the
# trigram table holds (schema v10), and what LIKE ignores.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def trigram_query(text: str) -> str:
    """The FTS5 query of ``text`` as one phrase: its trigrams in a row, its
    ASCII letters lowered as the table's names are (a double quote
    doubled)."""
    return '"' + text.translate(_ASCII_LOWER).replace('"', '""') + '"'


def _number(value: float | str) -> str:
    """A keyed order's key as its cursor text (an integer without ``.0``)."""
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def _text_only(query: TaskQuery) -> bool:
    """Whether ``query`` is a search by index and nothing else (everyone's
    tasks, every status): its count is the index's (:data:`_COUNT_MATCHES`)."""
    return (
        len(query.text) >= TRIGRAM
        and query.user_id is None
        and not query.statuses
        and query.favorite_of is None
        and query.node is None
    )


def list_tasks(cursor: Cursor, query: TaskQuery) -> tuple[list[TaskView], str | int | None, int]:
    """One page of tasks of ``query``; the second item is the ``after`` of
    the next page (None on the last page), the third how many tasks match
    the filters (the cursor aside).  ``user_id`` None lists everyone's
    (admin)."""
    page = _PAGES[query.order]
    after = _after_parameters(query)
    keys = _stored_keys(query.statuses)
    merged = len(keys) > 1 and query.order in _MERGED
    if len(query.text) >= TRIGRAM and not merged and not _text_only(query):
        counted = _counted_matches(cursor, query, page, after)
        if counted is not None:
            return _answer(cursor, query, *counted)
    where, params = _filters(
        query.user_id, query.statuses, query.text, query.favorite_of, query.node
    )
    total = count_matching(cursor, query)
    search = "matches" if total <= MATCHES_FIRST_UP_TO else "scan"
    if len(query.text) >= TRIGRAM:
        where, params = _filters(
            query.user_id, query.statuses, query.text, query.favorite_of, query.node, search
        )
    tail = page.matches_tail if len(query.text) >= TRIGRAM and search == "matches" else page.tail
    if merged:
        # Several stored keys (the SUBMITTED tab: SUBMITTED and QUEUED),
        # newest or oldest first: each key's page from its own index range,
        # in order, then merged; a set of keys would be read whole and sorted.
        base, base_params = _filters(
            query.user_id, frozenset(), query.text, query.favorite_of, query.node, search
        )
        parts: list[Sql] = []
        params = []
        for number, key in enumerate(keys):
            conditions = [*base, _STATUS_IS, *([page.after] if after else [])]
            parts.append(_PART_OPEN + page.select + _where(conditions) + tail + _PART_CLOSE[number])
            # Each key's part holds every row up to the page's end.
            params += [*base_params, key, *after, query.offset + query.limit + 1]
        statement = _MERGE_OPEN + _UNION_ALL.join(parts) + _MERGED[query.order]
    else:
        if after:
            where.append(page.after)
            params += after
        statement = page.select + _where(where) + tail
    skip = _skip(query)
    statement += skip[0]
    rows = cursor.execute(statement, (*params, query.limit + 1, *skip[1])).fetchall()
    return _answer(cursor, query, rows, total)


def _skip(query: TaskQuery) -> tuple[Sql, list[int]]:
    """The ``OFFSET`` after a page's ``LIMIT`` and its parameter (nothing on
    a page without one)."""
    return (_OFFSET, [query.offset]) if query.offset else (EMPTY, [])


def count_matching(cursor: Cursor, query: TaskQuery) -> int:
    """How many tasks match the filters of ``query`` (its cursor, limit
    and offset aside): the ``total`` of its pages."""
    where, params = _filters(
        query.user_id, query.statuses, query.text, query.favorite_of, query.node
    )
    if _text_only(query):
        return int(cursor.execute(_COUNT_MATCHES, params).fetchone()[0])
    if query.text or query.favorite_of is not None or query.node is not None:
        return int(cursor.execute(_COUNT + _where(where), params).fetchone()[0])
    # Owner and status only: what task_count keeps.
    kept = _kept_counts(cursor, query.user_id)
    wanted = _stored_keys(query.statuses) if query.statuses else kept
    return sum(kept.get(key, 0) for key in wanted)


_MATCHING_TASKS = fragment(f"SELECT g.gid, g.status_key {_TASKS}")  # noqa: S608 (constant text)
_BY_GID = fragment(" ORDER BY g.gid LIMIT ?")


def matching_tasks(
    cursor: Cursor, query: TaskQuery, bound: int
) -> tuple[int, list[tuple[int, str]]]:
    """How many tasks match the filters of ``query`` (as
    :func:`count_matching`) and, when that is at most ``bound``, each one's
    gid and stored status key, by gid (``POST /api/tasks/bulk`` with a
    ``filter``); none when it is more: the caller refuses."""
    total = count_matching(cursor, query)
    if total > bound:
        return total, []
    where, params = _filters(
        query.user_id, query.statuses, query.text, query.favorite_of, query.node
    )
    rows = cursor.execute(_MATCHING_TASKS + _where(where) + _BY_GID, (*params, bound + 1))
    return total, [(int(row[0]), str(row[1])) for row in rows.fetchall()]


def _after_parameters(query: TaskQuery) -> list[SqlValue]:
    """The parameters of the page's keyset condition (none on the first page)."""
    if query.after is None:
        return []
    if query.order is Order.GID:
        return [cast("int | str", query.after)]
    if query.order in _KEYED:
        assert isinstance(query.after, tuple)
        after_key, after_gid = query.after
        return [after_key, after_key, after_gid]
    created, _, gid = str(query.after).rpartition("~")
    return [created, int(gid)]


def _counted_matches(
    cursor: Cursor, query: TaskQuery, page: _Page, after: list[SqlValue]
) -> tuple[list[Any], int] | None:
    """The page of a search by index and its total in one statement
    (:data:`_COUNTED_OPEN`), when it has at most :data:`MATCHES_FIRST_UP_TO`
    matches and the page has a task; None otherwise (the caller counts,
    then reads the page as the total decides)."""
    where, params = _filters(
        query.user_id, query.statuses, query.text, query.favorite_of, query.node, "matches"
    )
    statement = (
        _COUNTED_OPEN
        + page.select
        + _where(where)
        + _COUNTED_CLOSE
        + (page.counted_after if after else EMPTY)
        + page.counted_tail
        + _skip(query)[0]
    )
    rows = cursor.execute(
        statement,
        (*params, MATCHES_FIRST_UP_TO + 1, *after, query.limit + 1, *_skip(query)[1]),
    ).fetchall()
    if not rows or int(rows[0][2]) > MATCHES_FIRST_UP_TO:
        return None
    return rows, int(rows[0][2])


def _answer(
    cursor: Cursor, query: TaskQuery, rows: list[Any], total: int
) -> tuple[list[TaskView], str | int | None, int]:
    """:func:`list_tasks`'s answer from the page's rows (``gid``,
    ``sort_key``, ...; one past the limit when there is a next page)."""
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    following: str | int | None = None
    if more and rows:
        last = rows[-1]
        if query.order is Order.GID:
            following = last[0]
        elif query.order in _KEYED:
            following = f"{_number(last[1])}~{last[0]}"
        else:
            following = f"{last[1]}~{last[0]}"
    return views_in_order(cursor, [row[0] for row in rows]), following, total


# The task rows per stored key, as schema v9's triggers keep them
# (migrate_v9.sql): one row per user and key, whatever the number of tasks.
_KEPT_COUNTS_OF_USER = sql("SELECT status_key, n FROM task_count WHERE user_id = ?")
_KEPT_COUNTS = sql("SELECT status_key, SUM(n) FROM task_count GROUP BY status_key")


def _kept_counts(cursor: Cursor, user_id: int | None) -> dict[str, int]:
    """The task rows of ``user_id`` (None: everyone's) per stored key, from
    ``task_count``: what ``COUNT(*) … GROUP BY status_key`` would count."""
    if user_id is None:
        rows = cursor.execute(_KEPT_COUNTS).fetchall()
    else:
        rows = cursor.execute(_KEPT_COUNTS_OF_USER, (user_id,)).fetchall()
    return {str(key): int(n) for key, n in rows}


def count_by_status(
    cursor: Cursor, user_id: int | None, text: str = "", with_queued: bool = False
) -> dict[str, int]:
    """Tasks by display status, every key present (zeros included); ``user_id``
    None counts everyone's, ``text`` as the search of :class:`TaskQuery`.
    ``with_queued`` adds :data:`QUEUED` (the SUBMITTED tasks queued on a
    node, also counted in ``SUBMITTED``)."""
    by_key: Iterable[tuple[str, int]]
    if text:
        where, params = _filters(user_id, frozenset(), text)
        by_key = cursor.execute(_COUNT_BY_STATUS + _where(where) + _BY_STATUS, params)
    else:
        by_key = _kept_counts(cursor, user_id).items()
    counts = {status.value: 0 for status in TaskStatus}
    queued_count = 0
    for key, n in by_key:
        status = _KEY_STATUS.get(key)
        if status is None:
            continue  # a DELETED row on its way out: no display status
        counts[status.value] += int(n)
        if key == QUEUED:
            queued_count += int(n)
    if with_queued:
        counts[QUEUED] = queued_count
    return counts


_COUNT_BY_STATE = sql(
    "SELECT COALESCE(o.state, 'LEGACY'), COUNT(*) FROM gallery AS g "
    "LEFT JOIN task_operation AS o ON o.gid = g.gid GROUP BY 1"
)
_COUNT_TOMBSTONES = sql("SELECT COUNT(*) FROM task_operation WHERE state = 'DELETED'")


def count_by_state(cursor: Cursor) -> dict[str, int]:
    """Task counts by ``task_operation.state`` (``LEGACY``: a row without one), for metrics."""
    counts: dict[str, int] = {}
    for row in cursor.execute(_COUNT_BY_STATE).fetchall():
        counts[row[0]] = int(row[1])
    row = cursor.execute(_COUNT_TOMBSTONES).fetchone()
    counts["DELETED"] = int(row[0])
    for state in ("LEGACY", *(s.value for s in OperationState)):
        counts.setdefault(state, 0)
    return counts


# -- Reading one task's rows (shared by every task module) --------------------


#: The gids a task may have (INTERFACES.md).
GID_MIN = 1
GID_MAX = 2**31 - 1  # the wire bound (PROTOCOL.md "Bounds"): every task must be dispatchable


_OPERATION_ROW = sql("SELECT * FROM task_operation WHERE gid = ?")
_GALLERY_ROW = sql("SELECT * FROM gallery WHERE gid = ?")


def operation_row(cursor: Cursor, gid: int) -> sqlite3.Row | None:
    """The ``task_operation`` row of ``gid`` (current generation or tombstone)."""
    row: sqlite3.Row | None = cursor.execute(_OPERATION_ROW, (gid,)).fetchone()
    return row


def gallery_row(cursor: Cursor, gid: int) -> sqlite3.Row | None:
    """The task (``gallery``) row of ``gid``."""
    row: sqlite3.Row | None = cursor.execute(_GALLERY_ROW, (gid,)).fetchone()
    return row


def visible_gallery(cursor: Cursor, gid: int, user_id: int | None) -> sqlite3.Row:
    """The task row of ``gid`` if ``user_id`` may see it (None: an admin),
    else ``not_found``: another user's task answers exactly like a missing
    one, so existence is not leaked."""
    row = gallery_row(cursor, gid)
    if row is None or (user_id is not None and row["user_id"] != user_id):
        raise TaskError("not_found", f"no task {gid}")
    return row


# The node's last word on a download that waits for its next attempt
# (``retrying in 8 s: WHY``, tasknet/node/worker.py).
_RETRYING_SQL = (
    "SELECT detail FROM gallery WHERE status_key = 'DOWNLOADING' AND detail LIKE 'retrying in %'"
)
_RETRYING_ALL = sql(_RETRYING_SQL)
_RETRYING_OF_USER = sql(_RETRYING_SQL + " AND user_id = ?")


def downloads_not_reaching(cursor: Cursor, user_id: int | None) -> int:
    """How many of ``user_id``'s downloads (everyone's: ``None``) wait to
    try again because their node could not reach the upstream (a refused
    connection, a timeout, no route, an unknown host: its last ``detail``)."""
    if user_id is None:
        rows = cursor.execute(_RETRYING_ALL).fetchall()
    else:
        rows = cursor.execute(_RETRYING_OF_USER, (user_id,)).fetchall()
    return sum(1 for (detail,) in rows if cannot_reach(str(detail)))
