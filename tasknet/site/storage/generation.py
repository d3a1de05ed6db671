"""Writing a task's generation (``task_operation``), the primitives every
lifecycle transaction is made of: a fresh operationId, the guarded state
change, touching the task row, removing an unsubmitted generation, and
giving a legacy task row its one generation (:func:`backfill_legacy`).

Every state change is checked against :mod:`tasknet.site.transitions` before
it is written (the SQLite trigger checks it again).
"""

from __future__ import annotations

import functools

from tasknet.runtime import IEntropy
from tasknet.site import transitions
from tasknet.site.storage import outbox
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sources import entropy_of
from tasknet.site.storage.engine.sql import Sql, SqlValue, fragment, sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.views import gallery_row
from tasknet.status import OperationState

_TOUCH_SQL = sql("UPDATE gallery SET updated_at = {now} WHERE gid = ?")

# A state change: the new state, then the columns it sets (a fragment each),
# then the guard.
_CHANGE_STATE = fragment("UPDATE task_operation SET state = ?, updated_at = {now}")
_SET_COLUMN = {
    name: fragment(f", {name} = ?")
    for name in (
        "cost",
        "metered",
        "metered_week",
        "quota_week",
        "archive_url",
        "step",
        "error",
        "unknown_at",
        "instance_id",
        "delete_operation_id",
        "delete_result",
        "delete_reason",
    )
}
_IN_STATE = fragment(" WHERE gid = ? AND operation_id = ? AND state = ?")

_GENERATION_OWNER = sql(
    "SELECT user_id FROM task_operation WHERE gid = ? AND operation_id = ? AND state = ?"
)
_REMOVE_GENERATION = sql(
    "DELETE FROM task_operation WHERE gid = ? AND operation_id = ? AND state = ?"
)
_REMOVE_PLACEHOLDER = sql("DELETE FROM gallery WHERE gid = ? AND user_id IS NOT DISTINCT FROM ?")
_REMOVE_FAVORITES = sql("DELETE FROM favorite WHERE gid = ?")
_BACKFILL = sql(
    "INSERT INTO task_operation (gid, operation_id, state, user_id, cost, archive_url, "
    "legacy, step, dispatched, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, 1, 'backfill', ?, {now}, {now})"
)


@functools.lru_cache(maxsize=64)
def _change_state_sql(columns: tuple[str, ...]) -> Sql:
    """The state change setting ``columns`` too (composed once per set of them)."""
    statement = _CHANGE_STATE
    for name in columns:
        statement += _SET_COLUMN[name]
    return statement + _IN_STATE


def new_operation_id(entropy: IEntropy) -> str:
    """A fresh operationId (also used for delete ids): a random UUID of
    ``entropy`` (the site's; a transaction's is its cursor's,
    :func:`~tasknet.site.storage.engine.sources.entropy_of`), as hex."""
    return entropy.uuid4().hex


def change_state(
    cursor: Cursor,
    gid: int,
    operation_id: str,
    old: OperationState,
    new: OperationState,
    **columns: SqlValue,
) -> bool:
    """Move generation ``operation_id`` of ``gid`` from ``old`` to ``new``
    (checked against the transition table) and set ``columns``.  ``False``
    when the row is not in ``old`` under that operationId: nothing written."""
    transitions.check(old, new)
    cursor.execute(
        _change_state_sql(tuple(columns)),
        (new.value, *columns.values(), gid, operation_id, old.value),
    )
    return cursor.rowcount == 1


def touch(cursor: Cursor, gid: int) -> None:
    """Set the task row's ``updated_at`` to now (its view changed)."""
    cursor.execute(_TOUCH_SQL, (gid,))


def remove_generation(cursor: Cursor, gid: int, operation_id: str, old: OperationState) -> bool:
    """Remove generation ``operation_id`` of ``gid`` (state ``old``) and the
    task row created for it; favorites of the gid go with it, and the owner
    is told (unless it was only ``RESERVED``, which nobody was told of).
    Only that generation's rows: ``False`` and nothing touched when the gid
    has moved on."""
    transitions.check(old, None)
    row = cursor.execute(_GENERATION_OWNER, (gid, operation_id, old.value)).fetchone()
    if row is None:
        return False
    cursor.execute(_REMOVE_GENERATION, (gid, operation_id, old.value))
    # The gallery row of an unsubmitted generation is the placeholder that
    # reserve() wrote for it: same gid (unique), same owner.
    cursor.execute(_REMOVE_PLACEHOLDER, (gid, row["user_id"]))
    cursor.execute(_REMOVE_FAVORITES, (gid,))
    if old is not OperationState.RESERVED:  # a reservation was never announced
        outbox.enqueue_task_change(cursor, gid, user_id=row["user_id"])
    return True


def backfill_legacy(cursor: Cursor, gid: int, operation_id: str | None = None) -> str:
    """Give a legacy task row (no ``task_operation``) its one generation:
    ``(none) -> SUBMITTED``, ``legacy=1``, existing status untouched.

    ``dispatched`` is 1 when the row shows a node or a node status (the node
    may hold files).  ``metered`` stays 0: the old site charged it, outside
    this ledger.  Returns the operationId (``operation_id`` if given)."""
    row = gallery_row(cursor, gid)
    if row is None:
        raise TaskError("not_found", f"no task {gid}")
    operation_id = operation_id or new_operation_id(entropy_of(cursor))
    transitions.check(None, OperationState.SUBMITTED)
    dispatched = int(row["node_id"] is not None or row["status"] is not None)
    cursor.execute(
        _BACKFILL,
        (
            gid,
            operation_id,
            OperationState.SUBMITTED.value,
            row["user_id"],
            row["cost"],
            row["url"],
            dispatched,
        ),
    )
    return operation_id
