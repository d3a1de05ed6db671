"""The create steps of a task, each one transaction (LIFECYCLE.md
invariants 1–4), and the recovery at start (invariant 10):

``reserve`` (``reserve_again`` over a gone archive) -> (prepare) ->
``begin_submit`` -> (POST) -> ``persist_submitted`` / ``mark_unknown`` /
``release_refused``; ``release`` gives a reservation back; ``recover``
settles what a stopped site left in flight.  Each step the lifecycle runs
declares beside it how (:func:`~tasknet.site.storage.write_policy.write_policy`).

``reserve`` and ``begin_submit`` record the site instance that holds the
submission (``task_operation.instance_id``) and first check that it still
holds its lease (:func:`tasknet.site.storage.instances.require_open`):
recovery settles only what gone instances left (SCALE.md 2).

Every user-visible change enqueues its notification in the same transaction
(:func:`tasknet.site.storage.outbox.enqueue_task_change`).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Literal

from tasknet.site import transitions
from tasknet.site.storage import instances, outbox, views
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sources import entropy_of, now_of
from tasknet.site.storage.engine.sql import Sql, SqlValue, sql
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.generation import change_state, new_operation_id, remove_generation, touch
from tasknet.site.storage.usage import in_flight_cost, meter, usage
from tasknet.site.storage.views import operation_row
from tasknet.site.storage.write_policy import write_policy
from tasknet.status import NodeCode, OperationState

_NEW_GENERATION = sql(
    "INSERT INTO task_operation (gid, operation_id, state, user_id, step, instance_id, "
    "created_at, updated_at) VALUES (?, ?, ?, ?, 'reserve', ?, {now}, {now})"
)
# Invariant 6: only an explicit CREATE starts a new generation over a
# tombstone; every per-generation column starts afresh.
_OVER_TOMBSTONE = sql(
    "UPDATE task_operation SET operation_id = ?, state = ?, user_id = ?, instance_id = ?, "
    "cost = NULL, "
    "metered = 0, metered_week = NULL, quota_week = NULL, archive_url = NULL, legacy = 0, "
    "step = 'reserve', error = NULL, unknown_at = NULL, verdict_not_before = NULL, "
    "last_revision = NULL, "
    "dispatched = 0, delete_operation_id = NULL, delete_result = NULL, "
    "delete_reason = NULL, created_at = {now}, "
    "updated_at = {now} "
    "WHERE gid = ? AND state = ?"
)
# Getting an archive again (DELIVERY.md "Custody"): the gone generation's
# task row starts afresh as a placeholder would (its id, gid and owner kept),
# after its generation left SUBMITTED (the trigger allows SUBMITTED ->
# RESERVED only while archive_gone_reason is still set).
_RESET_GONE_ROW = sql(
    "UPDATE gallery SET name = CASE WHEN ? = '' THEN name ELSE ? END, token = ?, url = '',"
    " status = NULL, progress = 0, node_id = NULL, cost = 0, size = NULL, completed_at = NULL,"
    " speed = NULL, sampled_at = NULL, moved_at = NULL, queued = 0, detail = NULL,"
    " archive_size = NULL, archive_sha256 = NULL, archive_gone_reason = NULL,"
    " archive_gone_at = NULL, archive_gone_node = NULL, created_at = {now}, updated_at = {now}"
    " WHERE gid = ? AND user_id = ? AND archive_gone_reason IS NOT NULL"
)
#: ``task_operation.step`` of a reservation made over a gone generation: its
#: task row was visible before, so giving it back is announced.
RECREATE_STEP = "recreate"
_RECREATE_STEP_SQL = sql("UPDATE task_operation SET step = ? WHERE gid = ? AND operation_id = ?")
_RESERVATION_STEP = sql(
    "SELECT step, user_id FROM task_operation WHERE gid = ? AND operation_id = ? AND state = ?"
)
# ON CONFLICT, not a caught IntegrityError: on PostgreSQL a failed
# statement would abort the whole transaction.
_PLACEHOLDER = sql(
    "INSERT INTO gallery (gid, user_id, name, token, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, {now}, {now}) ON CONFLICT DO NOTHING"
)
_SUBMITTING_ROW = sql(
    "UPDATE gallery SET name = CASE WHEN name = '' THEN ? ELSE name END, size = ?, "
    "updated_at = {now} WHERE gid = ?"
)
_SUBMITTING = sql(
    "SELECT user_id, metered FROM task_operation WHERE gid = ? AND operation_id = ? AND state = ?"
)
_SUBMITTED_ROW = sql("UPDATE gallery SET url = ?, cost = ?, updated_at = {now} WHERE gid = ?")


@write_policy(create_step=True)  # the placeholder is not announced
def reserve(
    cursor: Cursor,
    gid: int,
    user_id: int,
    name: str,
    token: str,
    week: str,
    instance_id: int | None = None,
    operation_id: str | None = None,
    confirm_charge: bool = False,
) -> str:
    """Invariant 1: write the CREATE intent (``RESERVED``, fresh operationId)
    and the placeholder task row; return the operationId.

    ``operation_id`` (the caller's fresh id) makes a repeat a no-op: if that
    generation is already ``RESERVED`` (the first run committed, but its
    connection died during the ``COMMIT``), it is answered again.

    A gid with a live generation or a task row is a :class:`TaskError`
    ``conflict`` (the unique index on ``gallery(gid)`` is the backstop); a
    ``DELETED`` tombstone is replaced by the new generation.  The quota is
    not checked here: the cost is known only after ``prepare``
    (:func:`begin_submit` checks ``used + in-flight + cost > quota``), and a
    conflict answers 409 whatever the quota.  ``instance_id``: the site
    instance creating it (None: one that records none, tools and tests).

    The caller's own ``ARCHIVE_GONE`` task (DELIVERY.md "Getting it again")
    is a new generation and a new charge: without ``confirm_charge`` it is
    ``charge_confirmation_required`` with the last generation's ``cost``;
    with it, ``quota_exceeded`` when that cost would not fit this week (so
    the gone task is kept), else the generation goes ``SUBMITTED ->
    RESERVED`` with a fresh operationId and the task row starts afresh.  The
    caller's ``COMPLETED`` task whose archive is held is
    ``already_completed`` (nothing to fetch again)."""
    if instance_id is not None:
        instances.require_open(cursor, instance_id)
    op = operation_row(cursor, gid)
    if (
        op is not None
        and operation_id is not None
        and op["operation_id"] == operation_id
        and op["state"] == OperationState.RESERVED.value
    ):
        return operation_id  # this very reservation committed already
    if op is not None and op["state"] == OperationState.SUBMITTED.value:
        if _may_create_again(cursor, gid, user_id, op, week, confirm_charge):
            return _reserve_over_gone(cursor, gid, user_id, name, token, instance_id, operation_id)
    if op is not None and op["state"] != OperationState.DELETED.value:
        raise TaskError("conflict", f"gid {gid} already has a task ({op['state']})")
    operation_id = operation_id or new_operation_id(entropy_of(cursor))
    if op is None:
        transitions.check(None, OperationState.RESERVED)
        cursor.execute(
            _NEW_GENERATION,
            (gid, operation_id, OperationState.RESERVED.value, user_id, instance_id),
        )
    else:
        transitions.check(OperationState.DELETED, OperationState.RESERVED)
        cursor.execute(
            _OVER_TOMBSTONE,
            (
                operation_id,
                OperationState.RESERVED.value,
                user_id,
                instance_id,
                gid,
                OperationState.DELETED.value,
            ),
        )
    cursor.execute(_PLACEHOLDER, (gid, user_id, name, token))
    if cursor.rowcount != 1:
        raise TaskError("conflict", f"gid {gid} already has a task")
    # The placeholder is not announced: its creator is waiting on the HTTP
    # answer, and a create refused before SUBMITTING (quota, prepare, a
    # retry loop) must leave no notification behind (INTERFACES.md, growth).
    # Others first hear of the task at SUBMITTING.
    return operation_id


@write_policy(wakes_outbox=True, create_step=True)
def reserve_again(
    cursor: Cursor,
    gid: int,
    user_id: int,
    name: str,
    token: str,
    week: str,
    instance_id: int | None = None,
    operation_id: str | None = None,
) -> str:
    """:func:`reserve` with the new charge confirmed (``confirm_charge``):
    a generation over the caller's gone one is announced (its task row was
    visible), so the outbox is woken after it."""
    return reserve(
        cursor, gid, user_id, name, token, week, instance_id, operation_id, confirm_charge=True
    )


def _may_create_again(
    cursor: Cursor,
    gid: int,
    user_id: int,
    op: sqlite3.Row,
    week: str,
    confirm_charge: bool,
) -> bool:
    """For ``reserve`` over a ``SUBMITTED`` generation: whether
    ``user_id``'s task is ``ARCHIVE_GONE`` and may be created again now;
    ``False`` when it is not the caller's or not finished (the caller
    answers ``conflict``, as for any live task).  Raises the refusals of
    :func:`reserve`'s doc."""
    row = views.gallery_row(cursor, gid)
    if row is None or row["user_id"] != user_id:
        return False
    last_cost = int(op["cost"] if op["cost"] is not None else row["cost"] or 0)
    if row["archive_gone_reason"] is None:
        if row["status"] == _COMPLETED:
            raise TaskError(
                "already_completed",
                f"gid {gid} is completed and its archive is held: fetch it"
                f" (GET /api/tasks/{gid}/archive); nothing is charged",
            )
        return False
    if not confirm_charge:
        raise TaskError(
            "charge_confirmation_required",
            f"gid {gid}'s archive is gone ({row['archive_gone_reason']}): fetching it again is"
            f' a new charge (last time {last_cost}); send "confirmCharge": true to accept it',
            cost=last_cost,
        )
    current = usage(cursor, user_id, week)
    if current["used"] + in_flight_cost(cursor, user_id) + last_cost > current["quota"]:
        raise TaskError(
            "quota_exceeded",
            f"gid {gid} cost {last_cost} last time: that would exceed this week's quota",
            cost=last_cost,
        )
    return True


def _reserve_over_gone(
    cursor: Cursor,
    gid: int,
    user_id: int,
    name: str,
    token: str,
    instance_id: int | None,
    operation_id: str | None,
) -> str:
    """:func:`reserve` of a new generation over the caller's gone one."""
    operation_id = operation_id or new_operation_id(entropy_of(cursor))
    transitions.check(OperationState.SUBMITTED, OperationState.RESERVED)
    # The generation first, while the row still says gone (the trigger's rule).
    cursor.execute(
        _OVER_TOMBSTONE,
        (
            operation_id,
            OperationState.RESERVED.value,
            user_id,
            instance_id,
            gid,
            OperationState.SUBMITTED.value,
        ),
    )
    if cursor.rowcount != 1:
        raise TaskError("conflict", f"gid {gid} changed while it was being created")
    cursor.execute(_RECREATE_STEP_SQL, (RECREATE_STEP, gid, operation_id))
    cursor.execute(_RESET_GONE_ROW, (name, name, token, gid, user_id))
    if cursor.rowcount != 1:
        raise TaskError("conflict", f"gid {gid} changed while it was being created")
    # Unlike a placeholder, this row was visible (ARCHIVE_GONE): its owner's
    # other pages learn it is being submitted again.
    outbox.enqueue_task_change(cursor, gid)
    return operation_id


_COMPLETED = int(NodeCode.COMPLETED)


@write_policy(wakes_outbox=True, settles="release", keeps_trying=True, create_step=True)
def release(cursor: Cursor, gid: int, operation_id: str) -> bool:
    """Release a ``RESERVED`` generation (prepare failed, quota, recovery):
    its intent and its placeholder row, nothing of any other generation.
    A reservation made over a gone generation had a visible row: its end is
    announced."""
    reservation = cursor.execute(
        _RESERVATION_STEP, (gid, operation_id, OperationState.RESERVED.value)
    ).fetchone()
    released = remove_generation(cursor, gid, operation_id, OperationState.RESERVED)
    if released and reservation is not None and reservation["step"] == RECREATE_STEP:
        outbox.enqueue_task_change(cursor, gid, user_id=reservation["user_id"])
    return released


# Not kept trying: later, nobody would POST; the lifecycle releases it instead.
@write_policy(wakes_outbox=True, settles="SUBMITTING", create_step=True)
def begin_submit(
    cursor: Cursor,
    gid: int,
    operation_id: str,
    cost: int,
    title: str,
    week: str,
    size: int | None = None,
    instance_id: int | None = None,
) -> bool:
    """After a successful ``prepare``: the quota check with the now known
    cost, then ``RESERVED -> SUBMITTING`` (committed before the POST).

    Returns ``False`` when ``used + in-flight + cost > quota`` (in-flight: see
    :func:`~tasknet.site.storage.usage.in_flight_cost`, which counts every
    unmetered ``UNKNOWN``): the generation is released in this same
    transaction and nothing is POSTed.  ``week`` is stored as the
    generation's ``quota_week``: whenever it is metered (persist, or a
    "submitted" verdict), it is metered into that week.  Raises
    ``conflict`` if the generation is no longer ``RESERVED``, and
    ``LeaseLost`` if ``instance_id`` (the instance about to POST, recorded
    on the generation) no longer holds its lease."""
    if instance_id is not None:
        instances.require_open(cursor, instance_id)
    op = operation_row(cursor, gid)
    if op is None or op["operation_id"] != operation_id:
        raise TaskError("conflict", f"gid {gid}: the reservation is gone")
    if op["state"] == OperationState.SUBMITTING.value and op["instance_id"] == instance_id:
        return True  # a repeat after a COMMIT whose answer was lost: already done
    current = usage(cursor, op["user_id"], week)
    if current["used"] + in_flight_cost(cursor, op["user_id"]) + cost > current["quota"]:
        release(cursor, gid, operation_id)
        return False
    if not change_state(
        cursor,
        gid,
        operation_id,
        OperationState.RESERVED,
        OperationState.SUBMITTING,
        cost=cost,
        quota_week=week,
        step="submit",
        **({} if instance_id is None else {"instance_id": instance_id}),
    ):
        raise TaskError("conflict", f"gid {gid} is {op['state']}, not RESERVED")
    # ``size`` (bytes, from prepare) gives the task view its bytes and ETA.
    cursor.execute(_SUBMITTING_ROW, (title, size, gid))
    outbox.enqueue_task_change(cursor, gid)
    return True


def persist_submitted(
    cursor: Cursor, gid: int, operation_id: str, archive_url: str, cost: int, week: str
) -> bool:
    """Invariant 4: the POST succeeded; in one transaction the intent becomes
    ``SUBMITTED`` (``metered=1``), the task row gets URL and cost, and
    ``weekly_usage`` grows by the cost.

    Guarded by the expected operationId *and* state ``SUBMITTING``: a gid that
    was deleted, resolved or regenerated meanwhile is left alone (never
    resurrected), and a repeated persist meters nothing (``False``)."""
    op = cursor.execute(
        _SUBMITTING, (gid, operation_id, OperationState.SUBMITTING.value)
    ).fetchone()
    if op is None or op["metered"]:
        return False
    change_state(
        cursor,
        gid,
        operation_id,
        OperationState.SUBMITTING,
        OperationState.SUBMITTED,
        cost=cost,
        archive_url=archive_url,
        metered=1,
        metered_week=week,
        step="persist",
    )
    cursor.execute(_SUBMITTED_ROW, (archive_url, cost, gid))
    meter(cursor, op["user_id"], week, cost)
    outbox.enqueue_task_change(cursor, gid)
    return True


@write_policy(wakes_outbox=True, settles="UNKNOWN", keeps_trying=True, create_step=True)
def mark_unknown(
    cursor: Cursor,
    gid: int,
    operation_id: str,
    step: str,
    error: str,
    archive_url: str | None = None,
    cost: int | None = None,
) -> bool:
    """Invariant 3: ``SUBMITTING -> UNKNOWN`` (display 提交未知), keeping the
    operationId, with the step reached and the error as reconciliation
    evidence.  ``False`` if that generation is not ``SUBMITTING``.

    When the POST did answer (its persist failed), ``archive_url`` and
    ``cost`` are what it answered: they are kept in their columns, so a
    "submitted" verdict meters what the upstream charged and dispatches that
    URL.  Nothing is metered here."""
    known: dict[str, SqlValue] = {}
    if archive_url:
        known["archive_url"] = archive_url
    if cost is not None:
        known["cost"] = int(cost)
    changed = change_state(
        cursor,
        gid,
        operation_id,
        OperationState.SUBMITTING,
        OperationState.UNKNOWN,
        step=step,
        error=error[:2000],
        unknown_at=iso(now_of(cursor)),
        **known,
    )
    if changed:
        touch(cursor, gid)
        outbox.enqueue_task_change(cursor, gid)
    return changed


@write_policy(
    wakes_outbox=True, settles="release (POST refused)", keeps_trying=True, create_step=True
)
def release_refused(cursor: Cursor, gid: int, operation_id: str) -> bool:
    """The upstream definitely refused the POST (nothing charged):
    ``SUBMITTING -> (removed)``, gid free again."""
    return remove_generation(cursor, gid, operation_id, OperationState.SUBMITTING)


@write_policy(
    wakes_outbox=True, settles="release (nothing sent)", keeps_trying=True, create_step=True
)
def release_unsent(cursor: Cursor, gid: int, operation_id: str) -> bool:
    """This site knows it sent no POST for the generation (its SUBMITTING
    could not be confirmed, or its POST gate closed before the first byte):
    release it from ``RESERVED`` or ``SUBMITTING``, gid free again.  Called
    only by the instance holding it, through the write fence, so a
    generation another site already reaped (now ``UNKNOWN``) is never
    touched."""
    return release(cursor, gid, operation_id) or remove_generation(
        cursor, gid, operation_id, OperationState.SUBMITTING
    )


# Recovery at start (invariant 10)

RECOVERY_ERROR = (
    "the site stopped while this submission was in flight; the POST may or may "
    "not have reached the upstream"
)


@dataclass(frozen=True)
class Settled:
    """One generation recovery settled: left ``from_state``
    (``SUBMITTING``/``RESERVED``), now ``outcome`` (``UNKNOWN``/``released``)."""

    gid: int
    operation_id: str
    from_state: str
    outcome: str


@dataclass(frozen=True)
class Recovered:
    unknown: list[int]
    released: list[int]
    operations: list[Settled] = field(default_factory=list)


#: ``recover``'s owner meaning whoever wrote them: a site alone on its
#: database (SQLite's flock proves every earlier run gone).
EVERY_INSTANCE: Literal["every"] = "every"

Owner = int | None | Literal["every"]

_IN_FLIGHT = "SELECT gid, operation_id, state FROM task_operation WHERE state IN (?, ?)"
#: The generations in flight of an owner (``recover``'s): every instance's,
#: those no instance recorded, or one instance's.
_IN_FLIGHT_OF: dict[str, Sql] = {
    "every": sql(f"{_IN_FLIGHT} ORDER BY gid"),
    "none": sql(f"{_IN_FLIGHT} AND instance_id IS NULL ORDER BY gid"),
    "one": sql(f"{_IN_FLIGHT} AND instance_id = ? ORDER BY gid"),
}
_VERDICT_NOT_BEFORE = sql(
    "UPDATE task_operation SET verdict_not_before = ? WHERE gid = ? AND operation_id = ?"
)


@write_policy(wakes_outbox=True)
def recover(
    cursor: Cursor,
    owner: Owner = EVERY_INSTANCE,
    *,
    error: str = RECOVERY_ERROR,
    verdict_not_before: str | None = None,
) -> Recovered:
    """Every interrupted ``SUBMITTING`` becomes ``UNKNOWN`` (operationId
    kept, nothing resent, step ``recovery``, ``error`` as its evidence);
    every ``RESERVED`` generation is released (its own intent and
    placeholder only).

    Only the generations of ``owner``: a site instance whose lease is known
    to be gone (:mod:`tasknet.site.storage.instances`), ``None`` for those
    no instance recorded, :data:`EVERY_INSTANCE` for all of them.  Never
    call it for an instance that may be alive.

    ``verdict_not_before`` (ISO 8601 UTC): each ``UNKNOWN`` made here may be
    resolved "not submitted" only from then on (SCALE.md "Fencing" 2: the
    instance may have been paused, not dead, with its POST still to come)."""
    unknown: list[int] = []
    released: list[int] = []
    settled: list[Settled] = []
    in_flight = _IN_FLIGHT_OF["every"]
    params: tuple[int, ...] = ()
    if owner is None:
        in_flight = _IN_FLIGHT_OF["none"]
    elif isinstance(owner, int):
        in_flight, params = _IN_FLIGHT_OF["one"], (owner,)
    for row in cursor.execute(
        in_flight, (OperationState.SUBMITTING.value, OperationState.RESERVED.value, *params)
    ).fetchall():
        gid, operation_id = row["gid"], row["operation_id"]
        if row["state"] == OperationState.SUBMITTING.value:
            if mark_unknown(cursor, gid, operation_id, "recovery", error):
                if verdict_not_before is not None:
                    cursor.execute(_VERDICT_NOT_BEFORE, (verdict_not_before, gid, operation_id))
                unknown.append(gid)
                settled.append(Settled(gid, operation_id, row["state"], "UNKNOWN"))
        elif release(cursor, gid, operation_id):
            released.append(gid)
            settled.append(Settled(gid, operation_id, row["state"], "released"))
    return Recovered(unknown, released, settled)


@write_policy(wakes_outbox=True, create_step=True)
def persist_and_view(
    cursor: Cursor, gid: int, operation_id: str, archive_url: str, cost: int, week: str
) -> views.TaskView | None:
    """:func:`persist_submitted` and the task view it leaves, in one
    transaction: the answer of a create needs no read after the commit."""
    persist_submitted(cursor, gid, operation_id, archive_url, cost, week)
    return views.task_view(cursor, gid)
