"""Reconciling ``UNKNOWN`` operations (LIFECYCLE.md): the list with its
stored evidence (:func:`unknown_operations`) and an operator's verdict
(:func:`resolve_unknown`), audited, metered exactly once, never a POST.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from tasknet.site.storage import outbox
from tasknet.site.storage.dialect import NOW_SQL
from tasknet.site.storage.errors import TaskError
from tasknet.site.storage.generation import change_state, remove_generation
from tasknet.site.storage.rows import gallery_row, operation_row
from tasknet.site.storage.usage import meter, week_of_timestamp
from tasknet.site.storage.views import gone_view, task_view
from tasknet.status import OperationState

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

    ``submitted``: ``UNKNOWN -> SUBMITTED``, metered exactly once (into the
    week its create's quota check counted it against, ``quota_week``; for a
    generation from before that column, the week it was created) with the
    stored cost (the POST's answer when it
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
        _require_same_settlement(cursor, gid, verdict, op)
        return task_view(cursor, gid) if verdict == "submitted" else None
    _audit(cursor, gid, op["operation_id"], verdict, actor, note, evidence)
    if verdict == "not_submitted":
        remove_generation(cursor, gid, op["operation_id"], OperationState.UNKNOWN)
        return None
    return _settle_submitted(cursor, gid, op, archive_url)


def _require_same_settlement(
    cursor: sqlite3.Cursor, gid: int, verdict: str, op: sqlite3.Row | None
) -> None:
    """Pass if ``verdict`` repeats the one that settled this generation
    (the caller answers as before); else ``not_found`` or ``conflict``."""
    last = _last_verdict(cursor, gid)
    same = last is not None and last["verdict"] == verdict
    if last is not None and same and verdict == "submitted" and op is not None:
        if op["operation_id"] == last["operation_id"]:
            return
    if same and verdict == "not_submitted" and op is None and gallery_row(cursor, gid) is None:
        return
    if op is None and gallery_row(cursor, gid) is None:
        raise TaskError("not_found", f"no task {gid}")
    state = op["state"] if op is not None else "legacy"
    raise TaskError("conflict", f"gid {gid} is {state}, not UNKNOWN: nothing to resolve")


def _audit(
    cursor: sqlite3.Cursor,
    gid: int,
    operation_id: str,
    verdict: str,
    actor: str,
    note: str,
    evidence: Mapping[str, Any] | None,
) -> None:
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


def _settle_submitted(
    cursor: sqlite3.Cursor, gid: int, op: sqlite3.Row, archive_url: str | None
) -> dict[str, Any] | None:
    """``UNKNOWN -> SUBMITTED``, metered once, and the task view."""
    operation_id = op["operation_id"]
    # The POST's own answer (stored by mark_unknown) is the better witness
    # than the audit's; without either the task is metered but never
    # dispatched (DISPATCHABLE_SQL needs a URL), and step says so.
    url = op["archive_url"] or archive_url or ""
    cost = int(op["cost"] or 0)
    week = op["metered_week"] or op["quota_week"] or week_of_timestamp(op["created_at"])
    metered = bool(op["metered"])
    change_state(
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
        meter(cursor, op["user_id"], week, cost)
    cursor.execute(
        "UPDATE gallery SET cost = ?, url = CASE WHEN ? <> '' THEN ? ELSE url END, "  # noqa: S608
        f"updated_at = {NOW_SQL} WHERE gid = ?",
        (cost, url, url, gid),
    )
    outbox.enqueue_task_change(cursor, gid)
    return task_view(cursor, gid)
