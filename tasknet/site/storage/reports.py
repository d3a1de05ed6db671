"""Applying node reports (PROTOCOL.md "Reliable reports", LIFECYCLE.md 5–7).

Each ``apply_*`` function is the body of (a piece of) one write transaction:
the receipt, every task change, every delete completion and the outbox rows
announcing them are written together or not at all.  :func:`apply_batch` runs
several reports in one transaction (group commit) with a savepoint each, so
one failing report rolls back alone and the others still commit.

Rules for a ``galleryTasks`` entry, in order (the first that matches wins):

========================================  =========================================
the site has …                            outcome
========================================  =========================================
no row for the gid                        ``ignored`` (``unknown``)
a ``DELETED`` tombstone                   ``ignored`` (``tombstone``), forever
``DELETE_PENDING`` / ``RESERVED`` /       ``dropped`` (the state's name)
``SUBMITTING`` / ``UNKNOWN``
a v2 generation, no operationId sent      ``dropped`` (``missing_operation``)
another operationId than the current      ``dropped`` (``old_generation``)
``revision`` ≤ the task's last revision   ``dropped`` (``stale``)
otherwise                                 ``applied`` (status, progress, revision)
========================================  =========================================

A gallery row without ``task_operation`` (a pre-migration row) first gets one
generation (:func:`tasks.backfill_legacy`): the report's operationId when it
carries one, else a fresh one.  Its status is not changed by the backfill;
the entry is then judged by the rules above.  A backfilled generation is
marked ``legacy = 1`` and, unlike a v2 generation, accepts entries without an
operationId (its node may have received it as a legacy ``DownloadPost``).

A legacy ``StatusReport`` has no reportId, revision or operationIds: an entry
applies when the reporting node is the task's assigned node and the task is
``SUBMITTED`` (or a legacy row, backfilled as above).  A legacy
``DeleteResult`` cannot carry a delete id: it stands for the task's *current*
delete id, and only the assigned node may give it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tasknet.protocol.messages import (
    ACK_APPLIED,
    ACK_DUPLICATE,
    DELETE_FAILED,
    DeleteResult,
    StatusReport,
    TaskEntry,
    TaskReport,
)
from tasknet.site.storage import outbox, tasks
from tasknet.status import OperationState

# Why an entry was dropped; the values appear in logs and tests.
UNKNOWN_GID = "unknown"
TOMBSTONE = "tombstone"
MISSING_OPERATION = "missing_operation"
OLD_GENERATION = "old_generation"
STALE = "stale"
NOT_OWNER = "not_owner"
DELETE_ID_MISMATCH = "delete_id_mismatch"
NOT_DELETE_PENDING = "not_delete_pending"

_NOT_REPORTABLE = frozenset(
    {
        OperationState.DELETE_PENDING.value,
        OperationState.RESERVED.value,
        OperationState.SUBMITTING.value,
        OperationState.UNKNOWN.value,
    }
)

NodeReport = TaskReport | StatusReport | DeleteResult


@dataclass
class ReportOutcome:
    """What one report did, for the ACK, the logs, metrics and tests.

    ``result`` is the ACK result for a v2 report (``APPLIED``/``DUPLICATE``)
    and ``LEGACY`` for a legacy message (which is never ACKed).
    """

    result: str
    revision: int | None = None
    applied: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    ignored: dict[int, str] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    backfilled: list[int] = field(default_factory=list)
    deletes_completed: list[int] = field(default_factory=list)
    deletes_failed: list[int] = field(default_factory=list)
    notifications: int = 0


LEGACY = "LEGACY"


def _json_ids(gids: Iterable[int]) -> str:
    # One JSON array parameter instead of one "?" per gid: no variable limit,
    # one statement whatever the snapshot size.
    return json.dumps(list(gids))


_ROWS_SQL = """
SELECT g.gid, g.user_id, g.status, g.progress, g.node_id, g.cost, g.url,
       o.operation_id, o.state, o.last_revision, o.legacy
FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid
WHERE g.gid IN (SELECT value FROM json_each(?))
"""


def _task_rows(cursor: sqlite3.Cursor, gids: Iterable[int]) -> dict[int, sqlite3.Row]:
    return {row["gid"]: row for row in cursor.execute(_ROWS_SQL, (_json_ids(gids),))}


def _tombstones(cursor: sqlite3.Cursor, gids: Iterable[int]) -> set[int]:
    rows = cursor.execute(
        "SELECT gid FROM task_operation WHERE state = 'DELETED'"
        " AND gid IN (SELECT value FROM json_each(?))",
        (_json_ids(gids),),
    )
    return {row[0] for row in rows}


def _unused_id(cursor: sqlite3.Cursor, operation_id: str | None) -> str | None:
    """``operation_id`` unless another gid already uses it (operationIds are
    unique): a confused node must not make its report fail forever."""
    if operation_id is None:
        return None
    taken = cursor.execute(
        "SELECT 1 FROM task_operation WHERE operation_id = ?", (operation_id,)
    ).fetchone()
    return None if taken else operation_id


def _record_receipt(cursor: sqlite3.Cursor, node_id: str, report: TaskReport) -> bool:
    """Record the reportId; ``False`` when it was already recorded."""
    cursor.execute(
        "INSERT OR IGNORE INTO report_receipt (report_id, node_id, revision) VALUES (?, ?, ?)",
        (report.report_id, node_id, report.revision),
    )
    return cursor.rowcount == 1


def _write_changes(
    cursor: sqlite3.Cursor,
    outcome: ReportOutcome,
    node_id: str,
    entries: dict[int, TaskEntry],
    rows: dict[int, sqlite3.Row],
    revision: int | None,
) -> None:
    """Write the applied entries of ``outcome.applied`` and announce the
    visible changes."""
    if not outcome.applied:
        return
    changed = [
        g
        for g in outcome.applied
        if rows[g]["status"] != entries[g].status
        or float(rows[g]["progress"]) != entries[g].progress
    ]
    cursor.executemany(
        "UPDATE gallery SET status = ?, progress = ?,"
        " node_id = COALESCE(node_id, ?),"
        " updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?",
        [(entries[g].status, entries[g].progress, node_id, g) for g in changed],
    )
    if revision is not None:
        cursor.execute(
            "UPDATE task_operation SET last_revision = ?,"
            " updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
            " WHERE gid IN (SELECT value FROM json_each(?))",
            (revision, _json_ids(outcome.applied)),
        )
    for gid in changed:
        outbox.enqueue_task_change(cursor, gid)
    outcome.changed.extend(changed)
    outcome.notifications += len(changed)


def apply_task_report(cursor: sqlite3.Cursor, node_id: str, report: TaskReport) -> ReportOutcome:
    """Apply one v2 ``TaskReport`` from ``node_id`` (see the module rules)."""
    if not _record_receipt(cursor, node_id, report):
        return ReportOutcome(ACK_DUPLICATE, report.revision)
    outcome = ReportOutcome(ACK_APPLIED, report.revision)
    # A snapshot lists a gid once; should it repeat one, the last entry wins.
    entries = {e.gid: e for e in report.gallery_tasks}
    gids = set(entries) | {d.gid for d in report.deleted}
    rows = _task_rows(cursor, gids)
    tombstones = _tombstones(cursor, gids - rows.keys()) if len(rows) < len(gids) else set()
    for gid in entries:
        row = rows.get(gid)
        if row is None:
            outcome.ignored[gid] = TOMBSTONE if gid in tombstones else UNKNOWN_GID
            continue
        sent = report.operation_ids.get(gid)
        state = row["state"]
        current = row["operation_id"]
        legacy = bool(row["legacy"])
        if state is None:
            current = tasks.backfill_legacy(cursor, gid, _unused_id(cursor, sent))
            state, legacy = OperationState.SUBMITTED.value, True
            outcome.backfilled.append(gid)
        if state == OperationState.DELETED.value:
            outcome.ignored[gid] = TOMBSTONE
        elif state in _NOT_REPORTABLE:
            outcome.dropped[gid] = state
        elif sent is None and not legacy:
            outcome.dropped[gid] = MISSING_OPERATION
        elif sent is not None and sent != current:
            outcome.dropped[gid] = OLD_GENERATION
        elif row["last_revision"] is not None and report.revision <= row["last_revision"]:
            outcome.dropped[gid] = STALE
        else:
            outcome.applied.append(gid)
    _write_changes(cursor, outcome, node_id, entries, rows, report.revision)
    for deleted in report.deleted:
        _apply_delete(
            cursor,
            outcome,
            deleted.gid,
            deleted.operation_id,
            failed=deleted.result == DELETE_FAILED,
            reason=deleted.reason,
            gid_is_tombstone=deleted.gid in tombstones,
        )
    return outcome


def apply_status_report(
    cursor: sqlite3.Cursor, node_id: str, report: StatusReport
) -> ReportOutcome:
    """Apply a legacy ``StatusReport`` by node ownership."""
    outcome = ReportOutcome(LEGACY)
    entries = {e.gid: e for e in report.gallery_tasks}
    rows = _task_rows(cursor, entries)
    for gid in entries:
        row = rows.get(gid)
        if row is None:
            outcome.ignored[gid] = UNKNOWN_GID
            continue
        if row["node_id"] != node_id:
            outcome.dropped[gid] = NOT_OWNER
            continue
        state = row["state"]
        if state is None:
            tasks.backfill_legacy(cursor, gid)
            outcome.backfilled.append(gid)
            state = OperationState.SUBMITTED.value
        if state == OperationState.SUBMITTED.value:
            outcome.applied.append(gid)
        else:
            outcome.dropped[gid] = state
    _write_changes(cursor, outcome, node_id, entries, rows, None)
    return outcome


def apply_delete_result(
    cursor: sqlite3.Cursor, node_id: str, result: DeleteResult
) -> ReportOutcome:
    """Apply a legacy ``DeleteResult``: it confirms (or fails) the task's
    current delete id, and only from the assigned node."""
    outcome = ReportOutcome(LEGACY)
    row = cursor.execute(
        "SELECT o.state, o.delete_operation_id, g.node_id FROM task_operation AS o"
        " LEFT JOIN gallery AS g ON g.gid = o.gid WHERE o.gid = ?",
        (result.gid,),
    ).fetchone()
    if row is None:
        outcome.ignored[result.gid] = UNKNOWN_GID
        return outcome
    if row["state"] == OperationState.DELETED.value:
        outcome.ignored[result.gid] = TOMBSTONE
        return outcome
    if row["node_id"] != node_id:
        outcome.dropped[result.gid] = NOT_OWNER
        return outcome
    _apply_delete(
        cursor,
        outcome,
        result.gid,
        row["delete_operation_id"] or "",
        failed=not result.success,
        reason=result.reason,
        gid_is_tombstone=False,
    )
    return outcome


def _apply_delete(
    cursor: sqlite3.Cursor,
    outcome: ReportOutcome,
    gid: int,
    delete_operation_id: str,
    *,
    failed: bool,
    reason: str,
    gid_is_tombstone: bool,
) -> None:
    """One delete confirmation: complete (``DELETED``/``NOT_FOUND``) or mark
    failed (``FAILED``), only with the task's own delete id."""
    row = cursor.execute(
        "SELECT state, delete_operation_id FROM task_operation WHERE gid = ?", (gid,)
    ).fetchone()
    if row is None:
        outcome.ignored[gid] = UNKNOWN_GID
        return
    if row["state"] == OperationState.DELETED.value or gid_is_tombstone:
        # Already complete: the node's repeat is answered by the ACK alone.
        outcome.ignored[gid] = TOMBSTONE
        return
    if row["state"] != OperationState.DELETE_PENDING.value:
        outcome.dropped[gid] = NOT_DELETE_PENDING
        return
    if not delete_operation_id or row["delete_operation_id"] != delete_operation_id:
        outcome.dropped[gid] = DELETE_ID_MISMATCH
        return
    # The lifecycle functions enqueue their own notification when they act.
    if failed:
        if tasks.mark_delete_failed(cursor, gid, delete_operation_id, reason):
            outcome.deletes_failed.append(gid)
            outcome.notifications += 1
        else:
            outcome.dropped[gid] = DELETE_ID_MISMATCH
    elif tasks.complete_delete(cursor, gid, delete_operation_id):
        outcome.deletes_completed.append(gid)
        outcome.notifications += 1
    else:
        outcome.dropped[gid] = DELETE_ID_MISMATCH


def apply_report(cursor: sqlite3.Cursor, node_id: str, message: NodeReport) -> ReportOutcome:
    """Apply any node report message (v2 or legacy)."""
    if isinstance(message, TaskReport):
        return apply_task_report(cursor, node_id, message)
    if isinstance(message, StatusReport):
        return apply_status_report(cursor, node_id, message)
    if isinstance(message, DeleteResult):
        return apply_delete_result(cursor, node_id, message)
    raise TypeError(f"not a node report: {message!r}")


@dataclass(frozen=True)
class ReportFailure:
    """A report of a batch that was rolled back to its savepoint."""

    error: str


def apply_batch(
    cursor: sqlite3.Cursor, reports: Sequence[tuple[str, NodeReport]]
) -> list[ReportOutcome | ReportFailure]:
    """Apply several ``(node_id, report)`` in this one transaction (group
    commit).  Each runs under its own savepoint: a report that raises is
    rolled back alone and comes back as a :class:`ReportFailure` (its node
    gets no ACK and redelivers), the others commit with the transaction."""
    results: list[ReportOutcome | ReportFailure] = []
    for node_id, message in reports:
        cursor.execute("SAVEPOINT report")
        try:
            results.append(apply_report(cursor, node_id, message))
        except Exception as e:
            cursor.execute("ROLLBACK TO SAVEPOINT report")
            results.append(ReportFailure(f"{type(e).__name__}: {e}"))
        cursor.execute("RELEASE SAVEPOINT report")
    return results


def receipt_count(cursor: sqlite3.Cursor) -> int:
    row = cursor.execute("SELECT COUNT(*) FROM report_receipt").fetchone()
    return int(row[0])
