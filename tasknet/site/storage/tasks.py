"""Task transactions: views, the create/delete lifecycle steps, recovery,
eligibility, reconciliation, favorites and weekly usage.

Every public function that takes a ``cursor`` is one transaction's body (or a
piece of one), run by :class:`tasknet.site.storage.db.Database`; none commits.
Every state change is checked against :mod:`tasknet.site.transitions` before
it is written (the SQLite trigger checks it again), and every user-visible
change enqueues a notification in the same transaction
(:func:`tasknet.site.storage.outbox.enqueue_task_change`).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tasknet.site import transitions
from tasknet.site.storage import outbox
from tasknet.status import OperationState, display_status

# One statement builds the view rows of any set of gids: the task row (joined
# with its generation, if any) or, when the task row is gone, the bare
# ``task_operation`` row (a tombstone).  ``owner`` is the user id
# :func:`task_owner` gives.  ``{match}`` is "= ?1" for one gid or a json_each
# over a JSON array for many: the same columns, the same row→dict code.
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
    """``{gid: (task_view(gid), task_owner(gid))}`` for every gid of ``gids``
    the site has a row of, in one query (a gid it knows nothing about is
    absent).  For the outbox rows of many changes in one transaction."""
    wanted = list(gids)
    if len(wanted) == 1:
        rows = cursor.execute(_VIEW_ONE_SQL, (wanted[0],))
    else:
        rows = cursor.execute(_VIEW_MANY_SQL, (json.dumps(wanted),))
    return {row["gid"]: (_view_of_row(row), row["owner"]) for row in rows}


def task_views(cursor: sqlite3.Cursor, gids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """``{gid: task_view(gid)}`` for the gids of ``gids`` that have a view,
    in one query."""
    return {
        gid: view
        for gid, (view, _) in task_views_and_owners(cursor, gids).items()
        if view is not None
    }


def task_owner(cursor: sqlite3.Cursor, gid: int) -> int | None:
    """The user id owning ``gid`` (gallery row, else its operation row)."""
    row = cursor.execute("SELECT user_id FROM gallery WHERE gid = ?", (gid,)).fetchone()
    if row is None:
        row = cursor.execute("SELECT user_id FROM task_operation WHERE gid = ?", (gid,)).fetchone()
    return None if row is None else row[0]


# --------------------------------------------------------------------------
# Errors, time, small helpers
# --------------------------------------------------------------------------

GID_MIN = 1
GID_MAX = 2**31

NOW_SQL = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"


class TaskError(Exception):
    """A business refusal, with the INTERFACES.md error code it answers as
    (``conflict``, ``not_found``, ``quota_exceeded``, ``upstream_rejected``,
    ``upstream_unavailable``, ``invalid_request``, ``forbidden``).  Raised
    inside a transaction it rolls the transaction back: nothing changes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def iso_week(moment: datetime | None = None) -> str:
    """The ISO week of ``moment`` (default: now, UTC), e.g. ``2026-W49``."""
    moment = moment or datetime.now(UTC)
    year, week, _ = moment.isocalendar()
    return f"{year}-W{week:02d}"


def week_of_timestamp(timestamp: str | None) -> str:
    """The ISO week of one of our stored UTC timestamps (now if unparsable)."""
    if timestamp:
        try:
            return iso_week(datetime.fromisoformat(timestamp.replace("Z", "+00:00")))
        except ValueError:
            pass
    return iso_week()


def new_operation_id() -> str:
    return uuid.uuid4().hex


def operation_row(cursor: sqlite3.Cursor, gid: int) -> sqlite3.Row | None:
    """The ``task_operation`` row of ``gid`` (current generation or tombstone)."""
    row: sqlite3.Row | None = cursor.execute(
        "SELECT * FROM task_operation WHERE gid = ?", (gid,)
    ).fetchone()
    return row


def gallery_row(cursor: sqlite3.Cursor, gid: int) -> sqlite3.Row | None:
    row: sqlite3.Row | None = cursor.execute(
        "SELECT * FROM gallery WHERE gid = ?", (gid,)
    ).fetchone()
    return row


def _change_state(
    cursor: sqlite3.Cursor,
    gid: int,
    operation_id: str,
    old: OperationState,
    new: OperationState,
    **columns: Any,
) -> bool:
    """Move generation ``operation_id`` of ``gid`` from ``old`` to ``new``
    (checked against the transition table) and set ``columns``.  ``False``
    when the row is not in ``old`` under that operationId: nothing written."""
    transitions.check(old, new)
    assignments = "".join(f", {name} = ?" for name in columns)  # names are ours, not input
    cursor.execute(
        f"UPDATE task_operation SET state = ?, updated_at = {NOW_SQL}{assignments} "  # noqa: S608
        "WHERE gid = ? AND operation_id = ? AND state = ?",
        (new.value, *columns.values(), gid, operation_id, old.value),
    )
    return cursor.rowcount == 1


def _touch(cursor: sqlite3.Cursor, gid: int) -> None:
    cursor.execute(
        "UPDATE gallery SET updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?",
        (gid,),
    )


def _remove_generation(
    cursor: sqlite3.Cursor, gid: int, operation_id: str, old: OperationState
) -> bool:
    """Remove generation ``operation_id`` of ``gid`` (state ``old``) and the
    task row created for it; favorites of the gid go with it.  Only that
    generation's rows: ``False`` and nothing touched when the gid has moved on."""
    transitions.check(old, None)
    row = cursor.execute(
        "SELECT user_id FROM task_operation WHERE gid = ? AND operation_id = ? AND state = ?",
        (gid, operation_id, old.value),
    ).fetchone()
    if row is None:
        return False
    cursor.execute(
        "DELETE FROM task_operation WHERE gid = ? AND operation_id = ? AND state = ?",
        (gid, operation_id, old.value),
    )
    # The gallery row of an unsubmitted generation is the placeholder that
    # reserve() wrote for it: same gid (unique), same owner.
    cursor.execute("DELETE FROM gallery WHERE gid = ? AND user_id IS ?", (gid, row["user_id"]))
    cursor.execute("DELETE FROM favorite WHERE gid = ?", (gid,))
    outbox.enqueue_task_change(cursor, gid, user_id=row["user_id"])
    return True


# --------------------------------------------------------------------------
# Weekly usage and quota
# --------------------------------------------------------------------------


def usage(cursor: sqlite3.Cursor, user_id: int, week: str | None = None) -> dict[str, Any]:
    """``{"week", "used", "quota"}`` of ``user_id`` for ``week`` (default: this week)."""
    week = week or iso_week()
    row = cursor.execute(
        "SELECT u.quota, COALESCE(w.used, 0) AS used FROM user AS u "
        "LEFT JOIN weekly_usage AS w ON w.user_id = u.id AND w.week = ? WHERE u.id = ?",
        (week, user_id),
    ).fetchone()
    if row is None:
        raise TaskError("not_found", f"no user {user_id}")
    return {"week": week, "used": int(row["used"]), "quota": int(row["quota"])}


def _in_flight_cost(cursor: sqlite3.Cursor, user_id: int) -> int:
    # Costs of this user's submissions that passed the quota check and are
    # being POSTed right now: counted so two concurrent creates cannot both
    # squeeze under the quota.
    row = cursor.execute(
        "SELECT COALESCE(SUM(cost), 0) FROM task_operation WHERE user_id = ? AND state = ?",
        (user_id, OperationState.SUBMITTING.value),
    ).fetchone()
    return int(row[0])


def _meter(cursor: sqlite3.Cursor, user_id: int, week: str, cost: int) -> None:
    cursor.execute(
        "INSERT INTO weekly_usage (user_id, week, used) VALUES (?, ?, ?) "
        "ON CONFLICT (user_id, week) DO UPDATE SET used = used + excluded.used",
        (user_id, week, cost),
    )


# --------------------------------------------------------------------------
# Create: reserve -> (prepare) -> begin_submit -> (submit) -> persist / unknown / release
# --------------------------------------------------------------------------


def reserve(
    cursor: sqlite3.Cursor, gid: int, user_id: int, name: str, token: str, week: str
) -> str:
    """Invariant 1: write the CREATE intent (``RESERVED``, fresh operationId)
    and the visible placeholder task row; return the operationId.

    A gid with a live generation or a task row is a :class:`TaskError`
    ``conflict`` (the unique index on ``gallery(gid)`` is the backstop); a
    ``DELETED`` tombstone is replaced by the new generation.  The quota is
    not checked here: the cost is known only after ``prepare``
    (:func:`begin_submit` checks ``used + in-flight + cost > quota``), and a
    conflict answers 409 whatever the quota."""
    op = operation_row(cursor, gid)
    if op is not None and op["state"] != OperationState.DELETED.value:
        raise TaskError("conflict", f"gid {gid} already has a task ({op['state']})")
    operation_id = new_operation_id()
    if op is None:
        transitions.check(None, OperationState.RESERVED)
        cursor.execute(
            "INSERT INTO task_operation (gid, operation_id, state, user_id, step) "
            "VALUES (?, ?, ?, ?, 'reserve')",
            (gid, operation_id, OperationState.RESERVED.value, user_id),
        )
    else:
        # Invariant 6: only an explicit CREATE starts a new generation over a
        # tombstone; every per-generation column starts afresh.
        transitions.check(OperationState.DELETED, OperationState.RESERVED)
        cursor.execute(
            "UPDATE task_operation SET operation_id = ?, state = ?, user_id = ?, cost = NULL, "
            "metered = 0, metered_week = NULL, archive_url = NULL, legacy = 0, "
            "step = 'reserve', error = NULL, unknown_at = NULL, last_revision = NULL, "
            "dispatched = 0, delete_operation_id = NULL, delete_result = NULL, "
            "delete_reason = NULL, created_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), "
            "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
            "WHERE gid = ? AND state = ?",
            (
                operation_id,
                OperationState.RESERVED.value,
                user_id,
                gid,
                OperationState.DELETED.value,
            ),
        )
    try:
        cursor.execute(
            "INSERT INTO gallery (gid, user_id, name, token) VALUES (?, ?, ?, ?)",
            (gid, user_id, name, token),
        )
    except sqlite3.IntegrityError as e:
        raise TaskError("conflict", f"gid {gid} already has a task") from e
    outbox.enqueue_task_change(cursor, gid)
    return operation_id


def release(cursor: sqlite3.Cursor, gid: int, operation_id: str) -> bool:
    """Release a ``RESERVED`` generation (prepare failed, quota, recovery):
    its intent and its placeholder row, nothing of any other generation."""
    return _remove_generation(cursor, gid, operation_id, OperationState.RESERVED)


def begin_submit(
    cursor: sqlite3.Cursor, gid: int, operation_id: str, cost: int, title: str, week: str
) -> bool:
    """After a successful ``prepare``: the quota check with the now known
    cost, then ``RESERVED -> SUBMITTING`` (committed before the POST).

    Returns ``False`` when ``used + in-flight + cost > quota``: the generation
    is released in this same transaction and nothing is POSTed.  Raises
    ``conflict`` if the generation is no longer ``RESERVED``."""
    op = operation_row(cursor, gid)
    if op is None or op["operation_id"] != operation_id:
        raise TaskError("conflict", f"gid {gid}: the reservation is gone")
    current = usage(cursor, op["user_id"], week)
    if current["used"] + _in_flight_cost(cursor, op["user_id"]) + cost > current["quota"]:
        release(cursor, gid, operation_id)
        return False
    if not _change_state(
        cursor,
        gid,
        operation_id,
        OperationState.RESERVED,
        OperationState.SUBMITTING,
        cost=cost,
        step="submit",
    ):
        raise TaskError("conflict", f"gid {gid} is {op['state']}, not RESERVED")
    cursor.execute(
        "UPDATE gallery SET name = CASE WHEN name = '' THEN ? ELSE name END, "
        "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?",
        (title, gid),
    )
    outbox.enqueue_task_change(cursor, gid)
    return True


def persist_submitted(
    cursor: sqlite3.Cursor, gid: int, operation_id: str, archive_url: str, cost: int, week: str
) -> bool:
    """Invariant 4: the POST succeeded; in one transaction the intent becomes
    ``SUBMITTED`` (``metered=1``), the task row gets URL and cost, and
    ``weekly_usage`` grows by the cost.

    Guarded by the expected operationId *and* state ``SUBMITTING``: a gid that
    was deleted, resolved or regenerated meanwhile is left alone (never
    resurrected), and a repeated persist meters nothing (``False``)."""
    op = cursor.execute(
        "SELECT user_id, metered FROM task_operation WHERE gid = ? AND operation_id = ? "
        "AND state = ?",
        (gid, operation_id, OperationState.SUBMITTING.value),
    ).fetchone()
    if op is None or op["metered"]:
        return False
    _change_state(
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
    cursor.execute(
        "UPDATE gallery SET url = ?, cost = ?, "
        "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?",
        (archive_url, cost, gid),
    )
    _meter(cursor, op["user_id"], week, cost)
    outbox.enqueue_task_change(cursor, gid)
    return True


def mark_unknown(
    cursor: sqlite3.Cursor,
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
    known: dict[str, Any] = {}
    if archive_url:
        known["archive_url"] = archive_url
    if cost is not None:
        known["cost"] = int(cost)
    changed = _change_state(
        cursor,
        gid,
        operation_id,
        OperationState.SUBMITTING,
        OperationState.UNKNOWN,
        step=step,
        error=error[:2000],
        unknown_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        **known,
    )
    if changed:
        _touch(cursor, gid)
        outbox.enqueue_task_change(cursor, gid)
    return changed


def release_refused(cursor: sqlite3.Cursor, gid: int, operation_id: str) -> bool:
    """The upstream definitely refused the POST (nothing charged):
    ``SUBMITTING -> (removed)``, gid free again."""
    return _remove_generation(cursor, gid, operation_id, OperationState.SUBMITTING)


# --------------------------------------------------------------------------
# Delete (invariant 5)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DeleteStarted:
    """What :func:`request_delete` did: ``completed`` (never dispatched, so
    deleted at once) or pending with the stable ``delete_operation_id`` the
    node must confirm; ``node`` is the node holding it, if any."""

    gid: int
    delete_operation_id: str
    completed: bool
    node: str | None


def _visible_gallery(cursor: sqlite3.Cursor, gid: int, user_id: int | None) -> sqlite3.Row:
    row = gallery_row(cursor, gid)
    # Another user's task answers exactly like a missing one: existence is
    # not leaked.  user_id None means an admin.
    if row is None or (user_id is not None and row["user_id"] != user_id):
        raise TaskError("not_found", f"no task {gid}")
    return row


def backfill_legacy(cursor: sqlite3.Cursor, gid: int, operation_id: str | None = None) -> str:
    """Give a legacy task row (no ``task_operation``) its one generation:
    ``(none) -> SUBMITTED``, ``legacy=1``, existing status untouched.

    ``dispatched`` is 1 when the row shows a node or a node status (the node
    may hold files).  ``metered`` stays 0: the old site charged it, outside
    this ledger.  Returns the operationId (``operation_id`` if given)."""
    row = gallery_row(cursor, gid)
    if row is None:
        raise TaskError("not_found", f"no task {gid}")
    operation_id = operation_id or new_operation_id()
    transitions.check(None, OperationState.SUBMITTED)
    dispatched = int(row["node_id"] is not None or row["status"] is not None)
    cursor.execute(
        "INSERT INTO task_operation (gid, operation_id, state, user_id, cost, archive_url, "
        "legacy, step, dispatched) VALUES (?, ?, ?, ?, ?, ?, 1, 'backfill', ?)",
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


def request_delete(cursor: sqlite3.Cursor, gid: int, user_id: int | None) -> DeleteStarted:
    """Start (or retry) deleting ``gid`` on behalf of ``user_id`` (None: admin).

    ``SUBMITTED -> DELETE_PENDING`` with a fresh stable delete id; a retry of
    a pending or failed delete reuses it (and clears the 删除失败 mark).  A
    task never dispatched to any node completes at once.  ``RESERVED``,
    ``SUBMITTING`` and ``UNKNOWN`` answer ``conflict``."""
    gallery = _visible_gallery(cursor, gid, user_id)
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
        _change_state(
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
    _touch(cursor, gid)
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
    _change_state(
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
    _touch(cursor, gid)
    outbox.enqueue_task_change(cursor, gid)
    return True


# --------------------------------------------------------------------------
# Recovery at start (invariant 10)
# --------------------------------------------------------------------------

RECOVERY_ERROR = (
    "the site stopped while this submission was in flight; the POST may or may "
    "not have reached the upstream"
)


@dataclass(frozen=True)
class Recovered:
    unknown: list[int]
    released: list[int]


def recover(cursor: sqlite3.Cursor) -> Recovered:
    """Every interrupted ``SUBMITTING`` becomes ``UNKNOWN`` (operationId
    kept, nothing resent, step ``recovery``); every ``RESERVED`` generation
    is released (its own intent and placeholder only)."""
    unknown: list[int] = []
    released: list[int] = []
    for row in cursor.execute(
        "SELECT gid, operation_id, state FROM task_operation WHERE state IN (?, ?) ORDER BY gid",
        (OperationState.SUBMITTING.value, OperationState.RESERVED.value),
    ).fetchall():
        if row["state"] == OperationState.SUBMITTING.value:
            if mark_unknown(cursor, row["gid"], row["operation_id"], "recovery", RECOVERY_ERROR):
                unknown.append(row["gid"])
        elif release(cursor, row["gid"], row["operation_id"]):
            released.append(row["gid"])
    return Recovered(unknown, released)


# --------------------------------------------------------------------------
# Dispatch eligibility (invariant 9) and the legacy verdict resolver
# --------------------------------------------------------------------------

# The same rule as is_dispatchable(), as a SQL condition over
# ``gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid``, for
# streamed queries.
# A confirmed submission without an archive URL (resolved "submitted" when
# the upstream's audit named no file) has nothing a node could download: it
# waits, shown 已提交, rather than being sent as a command no node can act on.
# (For a legacy row, a URL is also what legacy_truly_submitted accepts.)
DISPATCHABLE_SQL = "(g.url <> '' AND (o.state = 'SUBMITTED' OR o.gid IS NULL))"


def legacy_truly_submitted(row: Mapping[str, Any] | sqlite3.Row) -> bool:
    """The verdict resolver for a legacy task row (no ``task_operation``).

    The old site wrote ``url`` only from the upstream's answer to the archive
    POST, and a node status only arrives for a task a node received; either
    proves the POST happened.  A row with neither (cost alone proves
    nothing) may be the trace of a failed POST: never dispatched."""
    return bool(row["url"]) or row["status"] is not None


def is_dispatchable(row: Mapping[str, Any] | sqlite3.Row) -> bool:
    """Invariant 9, for one row with the keys ``state`` (``task_operation.state``
    or None when there is no operation row), ``url`` and ``status`` (of
    ``gallery``).  Only ``SUBMITTED``, or a legacy row the resolver judges
    truly submitted.  Any other state (``UNKNOWN``, ``RESERVED``,
    ``SUBMITTING``, ``DELETE_PENDING``, ``DELETED``) is never sent, not even
    as a legacy command without an operationId."""
    if not row["url"]:
        return False  # nothing to download (see DISPATCHABLE_SQL)
    state = row["state"]
    if state is not None:
        return bool(state == OperationState.SUBMITTED.value)
    return legacy_truly_submitted(row)


def dispatch_row(cursor: sqlite3.Cursor, gid: int) -> sqlite3.Row | None:
    """One joined row with every column :func:`is_dispatchable` reads (and
    what a command needs: ``gid``, ``name``, ``token``, ``url``, ``node_id``,
    ``operation_id``, ``legacy``)."""
    row: sqlite3.Row | None = cursor.execute(
        "SELECT g.gid, g.name, g.token, g.url, g.status, g.node_id, g.user_id, "
        "o.state, o.operation_id, o.legacy, o.dispatched "
        "FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid WHERE g.gid = ?",
        (gid,),
    ).fetchone()
    return row


# --------------------------------------------------------------------------
# Reconciliation of UNKNOWN
# --------------------------------------------------------------------------

VERDICTS = ("submitted", "not_submitted")

#: ``task_operation.step`` of a task resolved "submitted" with no archive URL
#: known: metered, shown 已提交, never dispatched (nothing to download).
RESOLVED_WITHOUT_URL = "resolved_without_url"


def unknown_operations(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    """Every ``UNKNOWN`` task view with its stored evidence (``step``,
    ``unknownAt``, ``error``, ``operationId``, ``archiveUrl``)."""
    result = []
    for row in cursor.execute(
        "SELECT gid, operation_id, step, error, unknown_at, archive_url FROM task_operation "
        "WHERE state = ? ORDER BY gid",
        (OperationState.UNKNOWN.value,),
    ).fetchall():
        view = task_view(cursor, row["gid"]) or gone_view(row["gid"], "UNKNOWN")
        view["evidence"] = {
            "operationId": row["operation_id"],
            "step": row["step"],
            "unknownAt": row["unknown_at"],
            "error": row["error"],
            # Known when the POST answered but recording its result failed.
            "archiveUrl": row["archive_url"] or None,
        }
        result.append(view)
    return result


def _last_verdict(cursor: sqlite3.Cursor, gid: int) -> sqlite3.Row | None:
    row: sqlite3.Row | None = cursor.execute(
        "SELECT operation_id, verdict FROM reconciliation_audit WHERE gid = ? "
        "ORDER BY id DESC LIMIT 1",
        (gid,),
    ).fetchone()
    return row


def resolve_unknown(
    cursor: sqlite3.Cursor,
    gid: int,
    verdict: str,
    actor: str,
    note: str,
    evidence: Mapping[str, Any] | None = None,
    archive_url: str | None = None,
) -> dict[str, Any] | None:
    """Reconcile an ``UNKNOWN`` operation; never POSTs.

    ``submitted``: ``UNKNOWN -> SUBMITTED``, metered exactly once (in the
    week it went UNKNOWN) with the stored cost (the POST's answer when it
    was known), dispatchable from now on if an archive URL is known (the
    stored one, else ``archive_url`` from the upstream's audit); returns the
    task view.
    ``not_submitted``: intent and task row removed, gid free; returns None.
    Either way an audit row records actor, note and evidence.  The same
    verdict again on the generation it settled answers the same result,
    changing nothing; anything else on a task that is not ``UNKNOWN`` is a
    ``conflict``."""
    if verdict not in VERDICTS:
        raise TaskError("invalid_request", f"verdict must be one of {VERDICTS}")
    op = operation_row(cursor, gid)
    if op is None or op["state"] != OperationState.UNKNOWN.value:
        last = _last_verdict(cursor, gid)
        same = last is not None and last["verdict"] == verdict
        if last is not None and same and verdict == "submitted" and op is not None:
            if op["operation_id"] == last["operation_id"]:
                return task_view(cursor, gid)
        if same and verdict == "not_submitted" and op is None and gallery_row(cursor, gid) is None:
            return None
        if op is None and gallery_row(cursor, gid) is None:
            raise TaskError("not_found", f"no task {gid}")
        state = op["state"] if op is not None else "legacy"
        raise TaskError("conflict", f"gid {gid} is {state}, not UNKNOWN: nothing to resolve")
    operation_id = op["operation_id"]
    cursor.execute(
        "INSERT INTO reconciliation_audit (gid, operation_id, verdict, actor, note, evidence) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            gid,
            operation_id,
            verdict,
            actor,
            note,
            json.dumps(evidence, ensure_ascii=False) if evidence is not None else None,
        ),
    )
    if verdict == "not_submitted":
        _remove_generation(cursor, gid, operation_id, OperationState.UNKNOWN)
        return None
    # The POST's own answer (stored by mark_unknown) is the better witness
    # than the audit's; without either the task is metered but never
    # dispatched (DISPATCHABLE_SQL needs a URL), and step says so.
    url = op["archive_url"] or archive_url or ""
    cost = int(op["cost"] or 0)
    week = op["metered_week"] or week_of_timestamp(op["unknown_at"])
    metered = bool(op["metered"])
    _change_state(
        cursor,
        gid,
        operation_id,
        OperationState.UNKNOWN,
        OperationState.SUBMITTED,
        metered=1,
        metered_week=week,
        step="resolved" if url else RESOLVED_WITHOUT_URL,
        archive_url=url or None,
    )
    if not metered:
        _meter(cursor, op["user_id"], week, cost)
    cursor.execute(
        "UPDATE gallery SET cost = ?, url = CASE WHEN ? <> '' THEN ? ELSE url END, "
        "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?",
        (cost, url, url, gid),
    )
    outbox.enqueue_task_change(cursor, gid)
    return task_view(cursor, gid)


# --------------------------------------------------------------------------
# Listing and favorites
# --------------------------------------------------------------------------


def visible_task(cursor: sqlite3.Cursor, gid: int, user_id: int | None) -> dict[str, Any]:
    """The view of ``gid`` if ``user_id`` may see it (None: admin), else
    ``not_found`` (another user's task looks exactly like a missing one)."""
    _visible_gallery(cursor, gid, user_id)
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
    views = [view for view in (task_view(cursor, gid) for gid in gids) if view is not None]
    return views, (gids[-1] if more and gids else None)


def add_favorite(cursor: sqlite3.Cursor, user_id: int, gid: int, admin: bool = False) -> None:
    """Mark ``gid`` a favorite of ``user_id`` (idempotent).  Only a task the
    user may see (an admin sees all); otherwise ``not_found``."""
    _visible_gallery(cursor, gid, None if admin else user_id)
    cursor.execute("INSERT OR IGNORE INTO favorite (user_id, gid) VALUES (?, ?)", (user_id, gid))


def remove_favorite(cursor: sqlite3.Cursor, user_id: int, gid: int, admin: bool = False) -> None:
    """Unmark (idempotent); ``not_found`` for a task the user may not see."""
    if gallery_row(cursor, gid) is not None:
        _visible_gallery(cursor, gid, None if admin else user_id)
    else:
        existing = cursor.execute(
            "SELECT 1 FROM favorite WHERE user_id = ? AND gid = ?", (user_id, gid)
        ).fetchone()
        if existing is None:
            raise TaskError("not_found", f"no task {gid}")
    cursor.execute("DELETE FROM favorite WHERE user_id = ? AND gid = ?", (user_id, gid))


def list_favorites(cursor: sqlite3.Cursor, user_id: int) -> list[dict[str, Any]]:
    """The views of ``user_id``'s favorite tasks, in gid order."""
    rows = cursor.execute(
        "SELECT f.gid FROM favorite AS f JOIN gallery AS g ON g.gid = f.gid "
        "WHERE f.user_id = ? ORDER BY f.gid",
        (user_id,),
    ).fetchall()
    return [view for view in (task_view(cursor, row[0]) for row in rows) if view is not None]


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
