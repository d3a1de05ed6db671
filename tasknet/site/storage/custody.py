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

import sqlite3

from tasknet.site.storage import outbox
from tasknet.site.storage.engine.sql import sql
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
    cursor: sqlite3.Cursor, *, gid: int, operation_id: str, reason: str, node_id: str, now: str
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


def settle_cancel(cursor: sqlite3.Cursor, *, node_id: str, operation_id: str) -> bool:
    """``node_id`` confirmed the ``CANCEL`` of generation ``operation_id``
    the site owed it: forget the ``node_cancel`` row.  Returns whether
    there was one."""
    cursor.execute(_SETTLE_CANCEL_SQL, (node_id, operation_id))
    return cursor.rowcount == 1
