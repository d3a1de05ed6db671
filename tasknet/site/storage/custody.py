"""Custody: what the site knows each node holds (DELIVERY.md "Custody").

Release and gone (first): :func:`mark_archive_gone` is the one writer of
``gallery.archive_gone_*`` -- a node's ``released`` entry
(:mod:`~tasknet.site.storage.reports`), an inventory's ``MISSING``, a
retired node's ``NODE_RETIRED`` all go through it; :func:`settle_cancel`
forgets a ``CANCEL`` the site owed a node once the node confirms it.

Each function runs inside the caller's transaction (it never begins or
commits one).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from tasknet.site.storage import outbox
from tasknet.site.storage.engine.sql import per_backend, postgres_only, sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.status import NodeCode, OperationState

#: Why no node holds a generation's archive any more (``archive_gone_reason``,
#: the CHECK of schema v13): a node's release reasons, and a retired node.
GONE_REASONS = frozenset(
    {"EXPIRED", "DISK_BUDGET", "CORRUPT", "MISSING", "CANCELLED", "NODE_RETIRED"}
)

# Locked first (PostgreSQL), like every other writer of a reportable task:
# task_operation, then gallery (storage/reports.py, "Several sites").
_CURRENT_GENERATION_SQL = sql(
    "SELECT 1 FROM task_operation WHERE gid = ? AND operation_id = ? AND state = ? {for_update}"
)
_MARK_GONE_SQL = sql(
    "UPDATE gallery SET archive_gone_reason = ?, archive_gone_at = ?, archive_gone_node = ?,"
    " updated_at = {now}"
    " WHERE gid = ? AND status = ? AND node_id = ? AND archive_gone_reason IS NULL"
)
_SETTLE_CANCEL_SQL = sql("DELETE FROM node_cancel WHERE node_id = ? AND operation_id = ?")


def mark_archive_gone(
    cursor: Cursor, *, gid: int, operation_id: str, reason: str, node_id: str, now: str
) -> bool:
    """No node holds the archive of generation ``operation_id`` of ``gid``
    any more (``reason``, one of :data:`GONE_REASONS`; ``node_id``: the node
    that held it; ``now``: our timestamp text, ``timestamps.iso``).

    Changes the task only when ``operation_id`` is its current generation,
    ``SUBMITTED``, completed (status 4) on ``node_id`` (its assigned node)
    and not already gone; then the task shows ``ARCHIVE_GONE`` and its
    change goes to the outbox like every task change.  Returns whether it
    changed the task (``False``: nothing written).  ``ValueError`` for a
    reason that is not one.
    """
    if reason not in GONE_REASONS:
        raise ValueError(f"not an archive-gone reason: {reason!r}")
    current = cursor.execute(
        _CURRENT_GENERATION_SQL, (gid, operation_id, OperationState.SUBMITTED.value)
    ).fetchone()
    if current is None:
        return False
    cursor.execute(_MARK_GONE_SQL, (reason, now, node_id, gid, int(NodeCode.COMPLETED), node_id))
    if cursor.rowcount != 1:
        return False
    outbox.enqueue_task_changes(cursor, [gid])
    return True


def settle_cancel(cursor: Cursor, *, node_id: str, operation_id: str) -> bool:
    """``node_id`` confirmed the ``CANCEL`` of generation ``operation_id``
    the site owed it: forget the ``node_cancel`` row.  Returns whether
    there was one."""
    cursor.execute(_SETTLE_CANCEL_SQL, (node_id, operation_id))
    return cursor.rowcount == 1


# -- many at once (an inventory that finds a wiped node) ---------------------

_LOCK_GENERATIONS_SQL = postgres_only(
    "SELECT COUNT(*) FROM (SELECT gid FROM task_operation"
    " WHERE gid {in_array} ORDER BY gid {for_update}) AS locked",
    sqlite_answer="0",
)
# mark_archive_gone's rules for every (gid, operationId) pair of ?5 (a JSON
# array of [gid, operationId]) in one statement; updated_at is ?2 (now).
_MARK_MANY_GONE_SQL = per_backend(
    sqlite="UPDATE gallery SET archive_gone_reason = ?1, archive_gone_at = ?2,"
    " archive_gone_node = ?3, updated_at = ?2"
    " WHERE status = ?4 AND node_id = ?3 AND archive_gone_reason IS NULL AND gid IN ("
    "SELECT o.gid FROM json_each(?5) AS e JOIN task_operation AS o"
    " ON o.gid = json_extract(e.value, '$[0]') AND o.operation_id = json_extract(e.value, '$[1]')"
    " WHERE o.state = ?6) RETURNING gid",
    postgres="UPDATE gallery SET archive_gone_reason = ?1, archive_gone_at = ?2,"
    " archive_gone_node = ?3, updated_at = ?2"
    " WHERE status = ?4 AND node_id = ?3 AND archive_gone_reason IS NULL AND gid IN ("
    "SELECT o.gid FROM json_array_elements(CAST(?5 AS JSON)) AS e JOIN task_operation AS o"
    " ON o.gid = CAST(e ->> 0 AS BIGINT) AND o.operation_id = e ->> 1"
    " WHERE o.state = ?6) RETURNING gid",
)


def mark_archives_gone(
    cursor: Cursor,
    *,
    generations: Sequence[tuple[int, str]],
    reason: str,
    node_id: str,
    now: str,
) -> list[int]:
    """:func:`mark_archive_gone` for each ``(gid, operationId)`` of
    ``generations``, by the same rules, in a few statements whatever their
    number (an inventory of a wiped node: 25,000 one by one take minutes
    on PostgreSQL).  Returns the gids it changed, in gid order, each
    announced in the outbox."""
    if reason not in GONE_REASONS:
        raise ValueError(f"not an archive-gone reason: {reason!r}")
    if not generations:
        return []
    cursor.execute(_LOCK_GENERATIONS_SQL, (sorted({g for g, _ in generations}),)).fetchone()
    pairs = orjson.dumps([[g, op] for g, op in generations]).decode()
    rows = cursor.execute(
        _MARK_MANY_GONE_SQL,
        (reason, now, node_id, int(NodeCode.COMPLETED), pairs, OperationState.SUBMITTED.value),
    ).fetchall()
    changed = sorted(int(r[0]) for r in rows)
    outbox.enqueue_task_changes(cursor, changed)
    return changed
