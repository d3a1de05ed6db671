"""Deleting a task (LIFECYCLE.md invariant 5), each step one transaction:
``request_delete`` (``SUBMITTED -> DELETE_PENDING`` with a stable delete id,
or done at once for a task no node ever got), then the node's answer:
``complete_delete`` (the ``DELETED`` tombstone) or ``mark_delete_failed``
(删除失败, retried with the same id).  An operator may end a pending delete
whose node is gone for good: ``force_delete`` (audited, idempotent).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from tasknet.site.storage import outbox
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sources import entropy_of
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.generation import backfill_legacy, change_state, new_operation_id, touch
from tasknet.site.storage.views import operation_row, visible_gallery
from tasknet.site.storage.write_policy import write_policy
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


_RETRY_DELETE = sql(
    "UPDATE task_operation SET delete_result = NULL, delete_reason = NULL, "
    "updated_at = {now} WHERE gid = ?"
)
_PENDING_DELETE = sql(
    "SELECT operation_id FROM task_operation WHERE gid = ? AND state = ? "
    "AND delete_operation_id = ?"
)
_REMOVE_FAVORITES = sql("DELETE FROM favorite WHERE gid = ?")
_REMOVE_TASK = sql("DELETE FROM gallery WHERE gid = ?")
_DELETE_FAILED = sql(
    "UPDATE task_operation SET delete_result = 'FAILED', delete_reason = ?, "
    "updated_at = {now} "
    "WHERE gid = ? AND state = ? AND delete_operation_id = ?"
)
_LAST_FORCED = sql(
    "SELECT * FROM force_delete_audit WHERE gid = ? AND operation_id = ? ORDER BY id DESC LIMIT 1"
)
_HAS_TASK = sql("SELECT 1 FROM gallery WHERE gid = ?")
_TASK_NODE = sql("SELECT node_id FROM gallery WHERE gid = ?")
_AUDIT_FORCED = sql(
    "INSERT INTO force_delete_audit "
    "(gid, operation_id, delete_operation_id, node_id, actor, note, forced_at)"
    " VALUES (?, ?, ?, ?, ?, ?, {now})"
)


@write_policy(wakes_outbox=True)
def request_delete(cursor: Cursor, gid: int, user_id: int | None) -> DeleteStarted:
    """Start (or retry) deleting ``gid`` on behalf of ``user_id`` (None: admin).

    ``SUBMITTED -> DELETE_PENDING`` with a fresh stable delete id; a retry of
    a pending or failed delete reuses it (and clears the 删除失败 mark).  A
    task never dispatched to any node completes at once.  A legacy row that
    shows a node status but no recorded node stays pending (``node`` None):
    its DELETE waits until a node claims the row by reporting it (PROTOCOL.md
    "Ownership"), or for an operator.  ``RESERVED``, ``SUBMITTING`` and
    ``UNKNOWN`` answer ``conflict``."""
    gallery = visible_gallery(cursor, gid, user_id)
    op = operation_row(cursor, gid)
    if op is None:
        backfill_legacy(cursor, gid)
        op = operation_row(cursor, gid)
        assert op is not None
    state = OperationState(op["state"])
    # A retry of a pending delete changes what the user sees only when it
    # clears a 删除失败 mark; otherwise it writes nothing and announces
    # nothing (a second identical notification is a duplicate, D7).
    changed = True
    if state is OperationState.DELETE_PENDING:
        delete_id = op["delete_operation_id"]
        changed = op["delete_result"] is not None or op["delete_reason"] is not None
        if changed:
            cursor.execute(_RETRY_DELETE, (gid,))
    elif state is OperationState.SUBMITTED:
        delete_id = new_operation_id(entropy_of(cursor))
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
    if changed:
        touch(cursor, gid)
        outbox.enqueue_task_change(cursor, gid)
    return DeleteStarted(gid, delete_id, False, gallery["node_id"])


def complete_delete(cursor: Cursor, gid: int, delete_operation_id: str) -> bool:
    """The node confirmed the delete (deleted, or the file was absent).

    Only when ``delete_operation_id`` is the task's pending delete id: the
    favorites of the gid are cleared, the task row deleted and the intent
    becomes the ``DELETED`` tombstone, in this one transaction.  Any other id
    (or state) changes nothing and returns ``False``."""
    op = cursor.execute(
        _PENDING_DELETE, (gid, OperationState.DELETE_PENDING.value, delete_operation_id)
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
    cursor.execute(_REMOVE_FAVORITES, (gid,))
    cursor.execute(_REMOVE_TASK, (gid,))
    outbox.enqueue_task_change(cursor, gid)
    return True


def mark_delete_failed(cursor: Cursor, gid: int, delete_operation_id: str, reason: str) -> bool:
    """The node could not delete: show 删除失败, keep row, intent and delete
    id (a retry reuses it).  ``False`` if the id does not match."""
    cursor.execute(
        _DELETE_FAILED,
        (reason[:2000], gid, OperationState.DELETE_PENDING.value, delete_operation_id),
    )
    if cursor.rowcount != 1:
        return False
    touch(cursor, gid)
    outbox.enqueue_task_change(cursor, gid)
    return True


@dataclass(frozen=True)
class ForcedDelete:
    """What :func:`force_delete` recorded (``repeated``: this call found the
    tombstone an earlier force left and changed nothing)."""

    gid: int
    operation_id: str
    delete_operation_id: str
    node: str | None
    actor: str
    note: str
    forced_at: str
    repeated: bool

    def view(self) -> dict[str, object]:
        return {
            "gid": self.gid,
            "state": OperationState.DELETED.value,
            "forced": {
                "actor": self.actor,
                "note": self.note,
                "at": self.forced_at,
                "node": self.node,
                "deleteOperationId": self.delete_operation_id,
            },
        }


def _forced(cursor: Cursor, gid: int, operation_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = cursor.execute(_LAST_FORCED, (gid, operation_id)).fetchone()
    return row


def force_delete(cursor: Cursor, gid: int, actor: str, note: str) -> ForcedDelete:
    """Complete a stuck ``DELETE_PENDING`` whose node is gone for good, on an
    operator's word: an audit row (actor, note, the node and the delete id
    it never confirmed), then the ``DELETED`` tombstone exactly as a
    confirmation makes it (:func:`complete_delete`), so a late confirmation
    or report from that node is ignored like any for a tombstone.

    Idempotent: on the tombstone a force left, the same result again
    (``repeated``), nothing changed.  A tombstone the node's own
    confirmation made, or any other state, is a ``conflict``; an unknown gid
    ``not_found``."""
    op = operation_row(cursor, gid)
    if op is None:
        if cursor.execute(_HAS_TASK, (gid,)).fetchone() is None:
            raise TaskError("not_found", f"no task {gid}")
        raise TaskError("conflict", f"gid {gid} is not DELETE_PENDING: nothing to force")
    state = OperationState(op["state"])
    if state is OperationState.DELETED:
        earlier = _forced(cursor, gid, op["operation_id"])
        if earlier is None:
            raise TaskError(
                "conflict", f"gid {gid} is already deleted (its node confirmed): nothing to force"
            )
        return ForcedDelete(
            gid,
            earlier["operation_id"],
            earlier["delete_operation_id"],
            earlier["node_id"],
            earlier["actor"],
            earlier["note"],
            earlier["forced_at"],
            repeated=True,
        )
    if state is not OperationState.DELETE_PENDING:
        raise TaskError(
            "conflict", f"gid {gid} is {state.value}, not DELETE_PENDING: nothing to force"
        )
    gallery = cursor.execute(_TASK_NODE, (gid,)).fetchone()
    node = gallery["node_id"] if gallery is not None else None
    cursor.execute(
        _AUDIT_FORCED, (gid, op["operation_id"], op["delete_operation_id"], node, actor, note)
    )
    completed = complete_delete(cursor, gid, op["delete_operation_id"])
    assert completed, "a DELETE_PENDING row always completes with its own delete id"
    row = _forced(cursor, gid, op["operation_id"])
    assert row is not None
    return ForcedDelete(
        gid,
        op["operation_id"],
        op["delete_operation_id"],
        node,
        actor,
        note,
        row["forced_at"],
        repeated=False,
    )
