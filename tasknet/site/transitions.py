"""The allowed ``task_operation`` transitions (LIFECYCLE.md), as one table.

The storage layer checks every state change against :data:`ALLOWED` before it
writes, and the migration's trigger refuses the same set in SQLite, so a bug
in either place cannot write an illegal transition.  ``None`` stands for "no
row": creation and row removal.
"""

from __future__ import annotations

from tasknet.status import OperationState as S

ALLOWED: frozenset[tuple[S | None, S | None]] = frozenset(
    {
        (None, S.RESERVED),  # create
        (S.DELETED, S.RESERVED),  # create again after a delete (new operationId)
        (S.SUBMITTED, S.RESERVED),  # create again after its archive is gone (confirmCharge)
        (None, S.SUBMITTED),  # backfill: a legacy row's one generation
        (S.RESERVED, S.SUBMITTING),  # prepare ok
        (S.RESERVED, None),  # prepare failed / quota / recovery: released
        (S.SUBMITTING, S.SUBMITTED),  # POST ok + persist
        (S.SUBMITTING, S.UNKNOWN),  # ambiguous / persist failed / recovery
        (S.SUBMITTING, None),  # definite upstream refusal
        (S.UNKNOWN, S.SUBMITTED),  # resolve "submitted" (metered once)
        (S.UNKNOWN, None),  # resolve "not submitted"
        (S.SUBMITTED, S.DELETE_PENDING),  # delete
        (S.DELETE_PENDING, S.DELETED),  # node confirms
    }
)


class IllegalTransition(Exception):
    def __init__(self, old: S | None, new: S | None) -> None:
        super().__init__(f"illegal task_operation transition {old} -> {new}")
        self.old = old
        self.new = new


def check(old: S | str | None, new: S | str | None) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in the table."""
    o = S(old) if old is not None else None
    n = S(new) if new is not None else None
    if (o, n) not in ALLOWED:
        raise IllegalTransition(o, n)
