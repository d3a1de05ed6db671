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
generation (:func:`~tasknet.site.storage.generation.backfill_legacy`): the
report's operationId when it carries one, else a fresh one.  Its status is
not changed by the backfill; the entry is then judged by the rules above.
A backfilled generation is marked ``legacy = 1`` and, unlike a v2
generation, accepts entries without an operationId (its node may have
received it as a legacy ``DownloadPost``).

A legacy ``StatusReport`` has no reportId, revision or operationIds: an entry
applies when the reporting node is the task's assigned node and the task is
``SUBMITTED`` (or a legacy row, backfilled as above).  A legacy
``DeleteResult`` cannot carry a delete id: it stands for the task's *current*
delete id, and only the assigned node may give it; a task with no recorded
node (a pre-migration row: its DELETE went to every connected node) takes
the first matching confirmation from any node.
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
from tasknet.site.storage import outbox
from tasknet.site.storage.delete import complete_delete, mark_delete_failed
from tasknet.site.storage.generation import backfill_legacy
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

# Plain strings: an enum member's ``.value`` costs a descriptor call, and the
# rules below compare every entry of every report.
_SUBMITTED = OperationState.SUBMITTED.value
_DELETED = OperationState.DELETED.value
_DELETE_PENDING = OperationState.DELETE_PENDING.value

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
SELECT g.gid, g.status, g.progress, g.node_id,
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


_RECORDED_SQL = (
    "SELECT report_id FROM report_receipt WHERE report_id IN (SELECT value FROM json_each(?))"
)
_RECEIPT_SQL = "INSERT INTO report_receipt (report_id, node_id, revision) VALUES (?, ?, ?)"
_UPDATE_TASK_SQL = (
    "UPDATE gallery SET status = ?, progress = ?,"
    " updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?"
)
# A task without a node yet is claimed by the node reporting it.  Separate
# from the statement above: naming node_id in SET costs an index update
# (gallery_node) on every row, even when the value stays.
_UPDATE_UNCLAIMED_TASK_SQL = (
    "UPDATE gallery SET status = ?, progress = ?, node_id = COALESCE(node_id, ?),"
    " updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE gid = ?"
)
# One row per report: its revision and its applied gids as a JSON array.
_UPDATE_REVISION_SQL = (
    "UPDATE task_operation SET last_revision = ?,"
    " updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    " WHERE gid IN (SELECT value FROM json_each(?))"
)


def _recorded(cursor: sqlite3.Cursor, report_ids: Sequence[str]) -> set[str]:
    """Which of ``report_ids`` are already recorded (their reports are duplicates)."""
    return {row[0] for row in cursor.execute(_RECORDED_SQL, (json.dumps(list(report_ids)),))}


class _Changes:
    """The task writes of one or more reports, gathered so that each kind is
    written with one statement (``executemany``) and all their outbox rows
    with one view query."""

    def __init__(self) -> None:
        self.tasks: list[tuple[int, float, int]] = []
        self.unclaimed: list[tuple[int, float, str, int]] = []
        self.revisions: list[tuple[int, str]] = []
        self.announce: list[int] = []

    def add(
        self,
        outcome: ReportOutcome,
        node_id: str,
        entries: dict[int, TaskEntry],
        rows: dict[int, sqlite3.Row],
        revision: int | None,
    ) -> None:
        """Gather the applied entries of ``outcome.applied``; the visible
        changes among them will be announced."""
        if not outcome.applied:
            return
        changed = [
            g
            for g in outcome.applied
            if rows[g]["status"] != entries[g].status
            or float(rows[g]["progress"]) != entries[g].progress
        ]
        for g in changed:
            entry = entries[g]
            if rows[g]["node_id"] is None:
                self.unclaimed.append((entry.status, entry.progress, node_id, g))
            else:
                self.tasks.append((entry.status, entry.progress, g))
        if revision is not None:
            self.revisions.append((revision, _json_ids(outcome.applied)))
        self.announce.extend(changed)
        outcome.changed.extend(changed)
        outcome.notifications += len(changed)

    def write(self, cursor: sqlite3.Cursor) -> None:
        if self.tasks:
            cursor.executemany(_UPDATE_TASK_SQL, self.tasks)
        if self.unclaimed:
            cursor.executemany(_UPDATE_UNCLAIMED_TASK_SQL, self.unclaimed)
        if self.revisions:
            cursor.executemany(_UPDATE_REVISION_SQL, self.revisions)
        outbox.enqueue_task_changes(cursor, self.announce)


def _judge_entries(
    cursor: sqlite3.Cursor,
    outcome: ReportOutcome,
    report: TaskReport,
    entries: dict[int, TaskEntry],
    rows: dict[int, sqlite3.Row],
    tombstones: set[int],
) -> None:
    """Sort the ``galleryTasks`` entries of one v2 report by the module rules
    into ``outcome`` (backfilling a legacy row's generation on the way)."""
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
            current = backfill_legacy(cursor, gid, _unused_id(cursor, sent))
            state, legacy = _SUBMITTED, True
            outcome.backfilled.append(gid)
        if state == _DELETED:
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


def _report_gids(report: TaskReport) -> set[int]:
    return {e.gid for e in report.gallery_tasks} | {d.gid for d in report.deleted}


def _apply_task_reports(
    cursor: sqlite3.Cursor, reports: Sequence[tuple[str, TaskReport]]
) -> list[ReportOutcome]:
    """Apply v2 reports with a few set-at-a-time statements for all of them,
    with exactly the effect of applying them one after the other.

    That holds because the caller passes reports with distinct reportIds
    that share no gid: no report can see another's receipt or task change,
    so reading every row first and writing every change last is the same as
    taking them in turn.  The outbox rows keep report order.
    """
    recorded = _recorded(cursor, [report.report_id for _, report in reports])
    fresh = [(node_id, r) for node_id, r in reports if r.report_id not in recorded]
    if fresh:
        cursor.executemany(_RECEIPT_SQL, [(r.report_id, n, r.revision) for n, r in fresh])
    # A snapshot lists a gid once; should it repeat one, the last entry wins.
    entries = [{e.gid: e for e in r.gallery_tasks} for _, r in fresh]
    gids: set[int] = set()
    for (_, report), mine in zip(fresh, entries, strict=True):
        gids.update(mine)
        gids.update(d.gid for d in report.deleted)
    rows = _task_rows(cursor, gids)
    tombstones = _tombstones(cursor, gids - rows.keys()) if len(rows) < len(gids) else set()
    changes = _Changes()
    applied: dict[str, ReportOutcome] = {}
    for (node_id, report), mine in zip(fresh, entries, strict=True):
        outcome = ReportOutcome(ACK_APPLIED, report.revision)
        _judge_entries(cursor, outcome, report, mine, rows, tombstones)
        changes.add(outcome, node_id, mine, rows, report.revision)
        applied[report.report_id] = outcome
    changes.write(cursor)
    for _, report in fresh:
        for deleted in report.deleted:
            _apply_delete(
                cursor,
                applied[report.report_id],
                deleted.gid,
                deleted.operation_id,
                failed=deleted.result == DELETE_FAILED,
                reason=deleted.reason,
                gid_is_tombstone=deleted.gid in tombstones,
            )
    return [
        applied.get(report.report_id) or ReportOutcome(ACK_DUPLICATE, report.revision)
        for _, report in reports
    ]


def apply_task_report(cursor: sqlite3.Cursor, node_id: str, report: TaskReport) -> ReportOutcome:
    """Apply one v2 ``TaskReport`` from ``node_id`` (see the module rules)."""
    return _apply_task_reports(cursor, [(node_id, report)])[0]


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
            backfill_legacy(cursor, gid)
            outcome.backfilled.append(gid)
            state = _SUBMITTED
        if state == _SUBMITTED:
            outcome.applied.append(gid)
        else:
            outcome.dropped[gid] = state
    changes = _Changes()
    changes.add(outcome, node_id, entries, rows, None)
    changes.write(cursor)
    return outcome


def apply_delete_result(
    cursor: sqlite3.Cursor, node_id: str, result: DeleteResult
) -> ReportOutcome:
    """Apply a legacy ``DeleteResult``: it confirms (or fails) the task's
    current delete id, from the assigned node, or from any node when the
    task has no recorded node (``gallery.node_id IS NULL``)."""
    outcome = ReportOutcome(LEGACY)
    row = cursor.execute(
        "SELECT o.delete_operation_id, g.node_id FROM task_operation AS o"
        " LEFT JOIN gallery AS g ON g.gid = o.gid WHERE o.gid = ?",
        (result.gid,),
    ).fetchone()
    if row is not None and row["node_id"] is not None and row["node_id"] != node_id:
        outcome.dropped[result.gid] = NOT_OWNER
        return outcome
    # Unknown gids and tombstones are judged by _apply_delete, as for v2.
    _apply_delete(
        cursor,
        outcome,
        result.gid,
        (row["delete_operation_id"] if row is not None else None) or "",
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
    if row["state"] == _DELETED or gid_is_tombstone:
        # Already complete: the node's repeat is answered by the ACK alone.
        outcome.ignored[gid] = TOMBSTONE
        return
    if row["state"] != _DELETE_PENDING:
        outcome.dropped[gid] = NOT_DELETE_PENDING
        return
    if not delete_operation_id or row["delete_operation_id"] != delete_operation_id:
        outcome.dropped[gid] = DELETE_ID_MISMATCH
        return
    # The lifecycle functions enqueue their own notification when they act.
    if failed:
        if mark_delete_failed(cursor, gid, delete_operation_id, reason):
            outcome.deletes_failed.append(gid)
            outcome.notifications += 1
        else:
            outcome.dropped[gid] = DELETE_ID_MISMATCH
    elif complete_delete(cursor, gid, delete_operation_id):
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
    commit), with the effect of applying them in order, each alone.

    A report that raises is rolled back alone and comes back as a
    :class:`ReportFailure` (its node gets no ACK and redelivers); the others
    commit with the transaction.  Runs of v2 reports that share no gid and no
    reportId (the usual batch: one report per node) are applied together,
    with one statement per kind of write for the whole run
    (:func:`_apply_task_reports`) under one savepoint; should the run fail,
    it is rolled back and its reports applied one by one under a savepoint
    each, so only the failing one is lost.
    """
    results: list[ReportOutcome | ReportFailure] = []
    start = 0
    while start < len(reports):
        run = _independent_run(reports, start)
        if len(run) > 1:
            results.extend(_apply_run(cursor, run))
            start += len(run)
        else:
            results.append(_apply_one(cursor, *reports[start]))
            start += 1
    return results


def _independent_run(
    reports: Sequence[tuple[str, NodeReport]], start: int
) -> list[tuple[str, TaskReport]]:
    """The longest run of ``TaskReport`` s from ``start`` with distinct
    reportIds and no gid in two of them."""
    run: list[tuple[str, TaskReport]] = []
    report_ids: set[str] = set()
    gids: set[int] = set()
    for node_id, message in reports[start:]:
        if not isinstance(message, TaskReport) or message.report_id in report_ids:
            break
        mine = _report_gids(message)
        if not gids.isdisjoint(mine):
            break
        report_ids.add(message.report_id)
        gids |= mine
        run.append((node_id, message))
    return run


def _apply_run(
    cursor: sqlite3.Cursor, run: Sequence[tuple[str, TaskReport]]
) -> list[ReportOutcome | ReportFailure]:
    cursor.execute("SAVEPOINT reports")
    try:
        outcomes: list[ReportOutcome | ReportFailure] = list(_apply_task_reports(cursor, run))
    except Exception:
        cursor.execute("ROLLBACK TO SAVEPOINT reports")
        cursor.execute("RELEASE SAVEPOINT reports")
        return [_apply_one(cursor, node_id, message) for node_id, message in run]
    cursor.execute("RELEASE SAVEPOINT reports")
    return outcomes


def _apply_one(
    cursor: sqlite3.Cursor, node_id: str, message: NodeReport
) -> ReportOutcome | ReportFailure:
    """One report under its own savepoint: on error it alone is rolled back."""
    cursor.execute("SAVEPOINT report")
    try:
        result: ReportOutcome | ReportFailure = apply_report(cursor, node_id, message)
    except Exception as e:
        cursor.execute("ROLLBACK TO SAVEPOINT report")
        result = ReportFailure(f"{type(e).__name__}: {e}")
    cursor.execute("RELEASE SAVEPOINT report")
    return result
