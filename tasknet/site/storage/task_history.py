"""One task's details (issue 36, item 5): ``GET /api/tasks/{gid}/details``.

What the site recorded of the task's current generation, read in one
transaction: the task view, its operation row (ids, cost and metering, the
step reached and why it became ``UNKNOWN``), the upstream's evidence the last
verdict was taken on, and its history, oldest first, merged from

* the task's own rows (created, when and why it became ``UNKNOWN``,
  completed, archive gone, a delete asked: they stay as long as the task),
* the notification outbox while it keeps the rows (each row is the task's
  view at a change: a new entry whenever its status, node or detail changed;
  consecutive rows saying the same are one entry, at the first one's time;
  a site without ``--webhook`` deletes its rows once pushed, so there the
  finer steps are seen only while the push is pending),
* the reconciliation audit (each verdict: who, when, the note) and
* the force-delete audit (who, when, the note).

Only rows of the current generation (its ``operationId``) are read: a gid
deleted and created again by someone else never shows the earlier owner's
history.  Finished outbox rows are pruned after the outbox retention;
``historyFrom`` is the first outbox entry kept.
"""

from __future__ import annotations

import json
import sqlite3
from typing import NotRequired, TypedDict, Unpack

from tasknet.json_types import JsonObject, JsonValue
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.views import ArchiveGone, TaskView, visible_task
from tasknet.status import OperationState, TaskStatus

#: At most this many outbox rows of one task are read (newest first): a
#: task reported on for days must not make its details page slow.
MAX_OUTBOX_ROWS = 2000

_OPERATION_SQL = sql(
    "SELECT operation_id, state, cost, metered, metered_week, step, error, unknown_at,"
    " archive_url, legacy, delete_operation_id, delete_result, delete_reason,"
    " created_at, updated_at FROM task_operation WHERE gid = ?"
)
_OUTBOX_SQL = sql(
    "SELECT id, created_at, payload FROM notification_outbox WHERE gid = ? ORDER BY id DESC LIMIT ?"
)
_VERDICTS_SQL = sql(
    "SELECT verdict, actor, note, evidence, resolved_at FROM reconciliation_audit"
    " WHERE gid = ? AND operation_id = ? ORDER BY id"
)
_FORCED_SQL = sql(
    "SELECT node_id, actor, note, forced_at FROM force_delete_audit"
    " WHERE gid = ? AND operation_id = ? ORDER BY id"
)


class HistoryEntry(TypedDict):
    """One entry of a task's history: ``at`` and ``kind`` (``created``,
    ``status``, ``verdict`` or ``forceDelete``), the rest by kind (docs/api.md).
    A ``status`` entry read from the outbox says what its payload said."""

    at: str | None
    kind: str
    source: NotRequired[str]
    status: NotRequired[JsonValue]
    state: NotRequired[JsonValue]
    node: NotRequired[JsonValue]
    detail: NotRequired[JsonValue]
    archiveGone: NotRequired[JsonValue | ArchiveGone]
    cost: NotRequired[int | None]
    verdict: NotRequired[str]
    actor: NotRequired[str | None]
    note: NotRequired[str | None]


class _StatusMore(TypedDict, total=False):
    """What a recorded ``status`` entry adds to its ``at`` and status."""

    state: str
    node: str | None
    archiveGone: ArchiveGone
    detail: str | None


class OperationDetails(TypedDict):
    """The task's operation row, as the details show it."""

    operationId: str
    state: str
    cost: int
    metered: bool
    meteredWeek: str | None
    step: str | None
    error: str | None
    unknownAt: str | None
    archiveUrl: str | None
    legacy: bool
    deleteOperationId: str | None
    deleteResult: str | None
    deleteReason: str | None
    createdAt: str
    updatedAt: str


class TaskDetails(TypedDict):
    """What :func:`task_details` answers (``GET /api/tasks/{gid}/details``)."""

    task: TaskView
    operation: OperationDetails | None
    evidence: JsonObject | None
    history: list[HistoryEntry]
    historyFrom: str | None
    historyTruncated: bool


def _json(text: str | None) -> JsonValue:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _state_entries(cursor: Cursor, gid: int, operation_id: str) -> tuple[list[HistoryEntry], bool]:
    rows = cursor.execute(_OUTBOX_SQL, (gid, MAX_OUTBOX_ROWS)).fetchall()
    entries: list[HistoryEntry] = []
    last: tuple[JsonValue, ...] | None = None
    for row in reversed(rows):
        payload = _json(row["payload"])
        task = payload.get("task") if isinstance(payload, dict) else None
        if not isinstance(task, dict) or task.get("operationId") != operation_id:
            continue
        said = (task.get("status"), task.get("node"), task.get("detail"), task.get("archiveGone"))
        if said == last:
            continue
        last = said
        entries.append(
            {
                "at": row["created_at"],
                "kind": "status",
                "status": task.get("status"),
                "state": task.get("state"),
                "node": task.get("node"),
                "detail": task.get("detail"),
                "archiveGone": task.get("archiveGone"),
            }
        )
    return entries, len(rows) >= MAX_OUTBOX_ROWS


def _add_recorded(history: list[HistoryEntry], op: sqlite3.Row, view: TaskView) -> None:
    """The milestones the task's own rows keep (the outbox is emptied once
    its rows are pushed on a site without a webhook): created, unknown
    (when and why), completed, archive gone, a delete asked; each only when
    no outbox entry already says that status."""
    said = {entry["status"] for entry in history}
    history.insert(
        0, {"at": op["created_at"], "kind": "created", "cost": op["cost"], "source": "record"}
    )

    def add(at: str | None, status: TaskStatus, **more: Unpack[_StatusMore]) -> None:
        if at and status.value not in said:
            history.append(
                {"at": at, "kind": "status", "status": status.value, "source": "record", **more}
            )

    add(op["unknown_at"], TaskStatus.SUBMIT_UNKNOWN, state=OperationState.UNKNOWN.value)
    add(view.get("completedAt"), TaskStatus.COMPLETED, node=view.get("node"))
    gone = view.get("archiveGone")
    if isinstance(gone, dict):
        add(gone.get("at"), TaskStatus.ARCHIVE_GONE, node=gone.get("node"), archiveGone=gone)
    if op["state"] == OperationState.DELETE_PENDING.value:
        shown = view["status"]
        status = TaskStatus(shown) if shown else TaskStatus.DELETE_PENDING
        add(op["updated_at"], status, node=view.get("node"), detail=op["delete_reason"])


def task_details(cursor: Cursor, gid: int, user_id: int | None) -> TaskDetails:
    """The details of ``gid`` if ``user_id`` may see it (None: an admin),
    else ``not_found`` (another user's task answers like a missing one).

    ``{"task": <view>, "operation": {...}, "evidence": {...} | None,
    "history": [...], "historyFrom": <time> | None, "historyTruncated": bool}``;
    each history entry has ``at`` and ``kind`` (``created``, ``status``,
    ``verdict`` or ``forceDelete``), see docs/api.md."""
    view = visible_task(cursor, gid, user_id)
    op = cursor.execute(_OPERATION_SQL, (gid,)).fetchone()
    if op is None:
        # A legacy row without an operation: the view is all there is.
        return {
            "task": view,
            "operation": None,
            "evidence": None,
            "history": [],
            "historyFrom": None,
            "historyTruncated": False,
        }
    operation_id = op["operation_id"]
    history, truncated = _state_entries(cursor, gid, operation_id)
    history_from = history[0]["at"] if history else None
    for entry in history:
        entry["source"] = "outbox"
    _add_recorded(history, op, view)
    evidence = None
    for row in cursor.execute(_VERDICTS_SQL, (gid, operation_id)).fetchall():
        evidence = _json(row["evidence"])
        history.append(
            {
                "at": row["resolved_at"],
                "kind": "verdict",
                "verdict": row["verdict"],
                "actor": row["actor"],
                "note": row["note"],
            }
        )
    for row in cursor.execute(_FORCED_SQL, (gid, operation_id)).fetchall():
        history.append(
            {
                "at": row["forced_at"],
                "kind": "forceDelete",
                "node": row["node_id"],
                "actor": row["actor"],
                "note": row["note"],
            }
        )
    # ISO-8601 UTC texts of one format sort as times; an admin's action comes
    # before the change it made when both were written in one transaction.
    history.sort(key=lambda entry: (str(entry["at"]), entry["kind"] == "status"))
    return {
        "task": view,
        "operation": {
            "operationId": operation_id,
            "state": op["state"],
            "cost": op["cost"],
            "metered": bool(op["metered"]),
            "meteredWeek": op["metered_week"],
            "step": op["step"],
            "error": op["error"],
            "unknownAt": op["unknown_at"],
            "archiveUrl": op["archive_url"] or None,
            "legacy": bool(op["legacy"]),
            "deleteOperationId": op["delete_operation_id"],
            "deleteResult": op["delete_result"],
            "deleteReason": op["delete_reason"],
            "createdAt": op["created_at"],
            "updatedAt": op["updated_at"],
        },
        "evidence": evidence if isinstance(evidence, dict) else None,
        "history": history,
        "historyFrom": history_from,
        "historyTruncated": truncated,
    }
