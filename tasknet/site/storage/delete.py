"""Deleting a task (LIFECYCLE.md invariant 5), each step one transaction:
``request_delete`` (``SUBMITTED -> DELETE_PENDING`` with a stable delete id,
or done at once for a task no node ever got), then the node's answer:
``complete_delete`` (the ``DELETED`` tombstone) or ``mark_delete_failed``
(删除失败, retried with the same id).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from tasknet.site.storage import outbox
from tasknet.site.storage.errors import TaskError
from tasknet.site.storage.generation import backfill_legacy, change_state, new_operation_id, touch
from tasknet.site.storage.rows import operation_row, visible_gallery
from tasknet.status import OperationState


@dataclass(frozen=True)
class DeleteStarted:
    """What :func:`request_delete` did: ``completed`` (never dispatched, so
    deleted at once) or pending with the stable ``delete_operation_id`` the
    node must confirm; ``node`` is the node holding it, if any."""

    gid: int
    delete_operation_id: str
    completed: bool
    node: str | None


def request_delete(cursor: sqlite3.Cursor, gid: int, user_id: int | None) -> DeleteStarted:
    """Start (or retry) deleting ``gid`` on behalf of ``user_id`` (None: admin).

    ``SUBMITTED -> DELETE_PENDING`` with a fresh stable delete id; a retry of
    a pending or failed delete reuses it (and clears the 删除失败 mark).  A
    task never dispatched to any node completes at once.  ``RESERVED``,
    ``SUBMITTING`` and ``UNKNOWN`` answer ``conflict``."""
    gallery = visible_gallery(cursor, gid, user_id)
    op = operation_row(cursor, gid)
    if op is None:
        backfill_legacy(cursor, gid)
        op = operation_row(cursor, gid)
        assert op is not None
    state = OperationState(op["state"])
    if state is OperationState.DELETE_PENDING:
        delete_id = op["delete_operation_id"]
        cursor.execute(
            "UPDATE task_operation SET delete_result = NULL, delete_reason = NULL, "
            "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?",
            (gid,),
        )
    elif state is OperationState.SUBMITTED:
        delete_id = new_operation_id()
        change_state(
            cursor,
            gid,
            op["operation_id"],
            OperationState.SUBMITTED,
            OperationState.DELETE_PENDING,
            delete_operation_id=delete_id,
            delete_result=None,
            delete_reason=None,
        )
    else:
        raise TaskError(
            "conflict", f"gid {gid} is {state.value}: it cannot be deleted until it settles"
        )
    if not op["dispatched"] and gallery["node_id"] is None:
        # No node ever got a command for it: no file can exist anywhere.
        complete_delete(cursor, gid, delete_id)
        return DeleteStarted(gid, delete_id, True, None)
    touch(cursor, gid)
    outbox.enqueue_task_change(cursor, gid)
    return DeleteStarted(gid, delete_id, False, gallery["node_id"])


def complete_delete(cursor: sqlite3.Cursor, gid: int, delete_operation_id: str) -> bool:
    """The node confirmed the delete (deleted, or the file was absent).

    Only when ``delete_operation_id`` is the task's pending delete id: the
    favorites of the gid are cleared, the task row deleted and the intent
    becomes the ``DELETED`` tombstone, in this one transaction.  Any other id
    (or state) changes nothing and returns ``False``."""
    op = cursor.execute(
        "SELECT operation_id FROM task_operation WHERE gid = ? AND state = ? "
        "AND delete_operation_id = ?",
        (gid, OperationState.DELETE_PENDING.value, delete_operation_id),
    ).fetchone()
    if op is None:
        return False
    change_state(
        cursor,
        gid,
        op["operation_id"],
        OperationState.DELETE_PENDING,
        OperationState.DELETED,
        delete_result=None,
        delete_reason=None,
        step="deleted",
    )
    cursor.execute("DELETE FROM favorite WHERE gid = ?", (gid,))
    cursor.execute("DELETE FROM gallery WHERE gid = ?", (gid,))
    outbox.enqueue_task_change(cursor, gid)
    return True


def mark_delete_failed(
    cursor: sqlite3.Cursor, gid: int, delete_operation_id: str, reason: str
) -> bool:
    """The node could not delete: show 删除失败, keep row, intent and delete
    id (a retry reuses it).  ``False`` if the id does not match."""
    cursor.execute(
        "UPDATE task_operation SET delete_result = 'FAILED', delete_reason = ?, "
        "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
        "WHERE gid = ? AND state = ? AND delete_operation_id = ?",
        (reason[:2000], gid, OperationState.DELETE_PENDING.value, delete_operation_id),
    )
    if cursor.rowcount != 1:
        return False
    touch(cursor, gid)
    outbox.enqueue_task_change(cursor, gid)
    return True
