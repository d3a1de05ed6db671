"""Applying node reports (PROTOCOL.md "Reliable reports", LIFECYCLE.md 5–7).

Each ``apply_*`` function is the body of (a piece of) one write transaction:
the receipt, every task change, every delete completion and the outbox rows
announcing them are written together or not at all.  :func:`apply_reports` applies
several reports in one transaction (group commit, run by the database layer,
which isolates a failing report under a savepoint of its own).

Rules for a ``galleryTasks`` entry, in order (the first that matches wins):

========================================  =========================================
the site has …                            outcome
========================================  =========================================
no row for the gid                        ``ignored`` (``unknown``)
a ``DELETED`` tombstone (with or          ``ignored`` (``tombstone``), forever
without a leftover gallery row)
another node assigned (``node_id``), or   ``dropped`` (``not_owner``): nothing
no node and not a claimable legacy row    written, not even a backfill
``DELETE_PENDING`` / ``RESERVED`` /       ``dropped`` (the state's name)
``SUBMITTING`` / ``UNKNOWN``
a v2 generation, no operationId sent      ``dropped`` (``missing_operation``)
another operationId than the current      ``dropped`` (``old_generation``)
``revision`` ≤ the task's last revision   ``dropped`` (``stale``)
a ``COMPLETED`` task (status 4) and an    ``dropped`` (``regressed``)
entry with a lower status
otherwise                                 ``applied`` (status, progress, revision)
========================================  =========================================

One completion per generation (PROTOCOL.md "Bounds"): once a generation is
``COMPLETED`` at the site, its completion, bytes and speed have been counted
(:mod:`~tasknet.site.storage.throughput`), and nothing its node reports
afterwards may move it backwards -- were a roll-back to 下载中 applied, the
next completion would count the task and its bytes again.  Only a new
generation (a new operationId, which starts from no status) downloads it
again.  The rule holds for legacy ``StatusReport`` entries too.

The archive's digest (DELIVERY.md "Integrity"): an applied status-4 entry
that carries ``size`` and ``sha256`` writes them to ``gallery.archive_size``
and ``archive_sha256`` in the same statement as its status (a differing
digest is a change of the task, announced like one); an entry without them
(a legacy node, an older v2 node) writes neither, so they stay NULL.  A
dropped entry writes nothing, and a new generation starts from a new task
row (``storage/create.py``), with neither.

Releases (DELIVERY.md "Custody"): a ``released`` entry ``{gid, operationId,
reason}`` says the node no longer holds that generation's archive.  Judged
after the report's ``galleryTasks`` and ``deleted``, in the same
transaction, in order (the first that matches wins):

========================================  =========================================
the entry / the site has …                outcome
========================================  =========================================
``CANCELLED`` and a ``node_cancel`` row   the row is settled (the CANCEL the site
of that node and operationId              owed a node a task moved away from);
                                          no task changes
no row for the gid / a tombstone          ``ignored`` (``unknown`` / ``tombstone``)
another node assigned (or none)           ``dropped`` (``not_owner``)
another operationId than the current,    ``dropped`` (``old_generation``)
or a row without a generation
not ``SUBMITTED`` (a delete, a re-create) ``dropped`` (the state's name)
a task not ``COMPLETED`` (status 4)       ``dropped`` (``not_completed``)
its archive already gone                  ``ignored`` (``already_gone``)
otherwise                                 ``ARCHIVE_GONE`` (``custody.mark_archive_gone``)
========================================  =========================================

A release has no revision rule: it only ever takes a generation's archive
away, so a repeat (the node keeps it in its snapshots until an ACK) or a
late one changes nothing more.  A release never claims a legacy row.

Ownership (PROTOCOL.md "Ownership"): a node may change only tasks assigned
to it (``gallery.node_id``).  A legacy row with a node status but no recorded
node (*claimable*: no generation or a backfilled one, ``status`` set,
``node_id`` NULL) is claimed by the first node that reports it, in the same
transaction, whatever then happens to the entry.  Every drop is counted per
node and reason in ``node_dropped_entry`` (same transaction).

Revision epochs: ``node_revision`` keeps, per node, the highest revision of a
fresh report recorded from it.  A fresh v2 report at or below it means the
node's revisions went backwards (wiped data, clock behind): it starts a new
epoch, in which the tasks assigned to that node forget their
``last_revision`` before its entries are judged.  A task's ``last_revision``
above its owner's high-water mark was not written by its owner (a forged
report applied before ownership was checked) and never makes the owner's
entry stale.  Only a changed entry writes its revision (an unchanged one
needs none: the owner's revisions only grow within an epoch).

A gallery row without ``task_operation`` (a pre-migration row) first gets one
generation (:func:`~tasknet.site.storage.generation.backfill_legacy`): the
report's operationId when it carries one, else a fresh one.  Its status is
not changed by the backfill; the entry is then judged by the rules above.
A backfilled generation is marked ``legacy = 1`` and, unlike a v2
generation, accepts entries without an operationId (its node may have
received it as a legacy ``DownloadPost``).

A legacy ``StatusReport`` has no reportId, revision or operationIds: an entry
applies when the reporting node owns the task (or claims it, as above) and
the task is ``SUBMITTED`` (or a legacy row, backfilled as above).  A
``deleted`` entry or a legacy ``DeleteResult`` is taken only from the task's
assigned node; a legacy ``DeleteResult`` cannot carry a delete id and stands
for the task's *current* one.  A pending delete of a row with no recorded
node waits for a claim (or an operator).

Several sites (PostgreSQL).  Every ``apply_*`` function runs at ``READ
COMMITTED`` (``tasknet.site.storage.engine.transactions``, "Isolation"), so two sites
applying reports for different nodes never conflict.  Before it reads
anything it locks, in this order: each reporting node (a
transaction-level advisory lock, :data:`REPORT_NODE_CLASS`: receipts,
revision marks, epochs and drop counts are per node, and one node's
reports apply one at a time at whichever sites they arrive), then the
``task_operation`` rows of every gid it names (``FOR UPDATE``, by gid),
and the ``gallery`` rows of those that have none (legacy rows; unknown
gids lock nothing).  Its reads then see every transaction that committed
before its locks, and none that commits before it does may have changed
them.  That holds because every other writer of a reportable task (the
rest of the lifecycle is ``SERIALIZABLE``) writes its ``task_operation``
row first and its ``gallery`` row too: ``request_delete`` (state, then
``touch``), ``complete_delete`` and ``force_delete`` (state, then the
gallery row deleted), ``mark_delete_failed`` (the row, then ``touch``),
reconciliation of ``UNKNOWN`` (state and gallery), dispatch's assignment
(``node_id``, then ``dispatched``; only unassigned rows, which a report
does not write); reaping and creating touch ``RESERVED``/``SUBMITTING``
generations, which a report drops, or a tombstone, which it ignores.  So
such a writer either committed before the report's locks (the report sees
it), or waits for them; a report that changed the task (status, progress,
claim, revision, a delete's end or failure) changed its ``gallery`` row, so the
writer then fails with a serialization failure and runs again on the
report's result, and one that changed nothing left it nothing stale to
read.  A report after a delete request is therefore never applied to the
task, a delete is never lost, and a force delete and the node's own
confirmation never both complete.  (A legacy row's first generation is
the one exception: a report and a lifecycle write that both backfill it
at once meet on ``task_operation``'s key: one of them fails (a unique
violation) or runs again (a deadlock), changing nothing; a failed report
is resent by its node.)  On SQLite the locks are not taken (one writer
holds the whole database): each lock statement is one only PostgreSQL has
(``postgres_only``), a neutral ``SELECT`` there, so the code that runs them
is the same on both and never asks which backend it is on.

Which connection may report (SCALE.md 5).  A report the pipeline queues
with the :class:`~tasknet.site.storage.node_sessions.Holding` of its
connection's take (:class:`QueuedReport`) is judged against the node's
``node_session`` row once, in its own transaction, right after the locks
and before any task is read: a connection that no longer holds
its node (another login took it, here or at another site) has its report
refused (:data:`NOT_HELD`): nothing written, not even its receipt, and no
ACK; its node sends it again on its newer connection.  The same on both
backends.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

from tasknet.protocol.messages import (
    ACK_APPLIED,
    ACK_DUPLICATE,
    DELETE_FAILED,
    DeleteResult,
    ReleasedEntry,
    StatusReport,
    TaskEntry,
    TaskReport,
)
from tasknet.site.storage import outbox, throughput
from tasknet.site.storage.custody import mark_archive_gone, settle_cancel
from tasknet.site.storage.delete import complete_delete, mark_delete_failed
from tasknet.site.storage.eligibility import awaits_claim
from tasknet.site.storage.engine.sql import postgres_only, sql
from tasknet.site.storage.engine.transactions import Cursor, read_committed
from tasknet.site.storage.generation import backfill_legacy
from tasknet.site.storage.node_sessions import Holding, still_held
from tasknet.status import NodeCode, OperationState

# Why an entry was dropped; the values appear in logs and tests.
UNKNOWN_GID = "unknown"
TOMBSTONE = "tombstone"
MISSING_OPERATION = "missing_operation"
OLD_GENERATION = "old_generation"
STALE = "stale"
NOT_OWNER = "not_owner"
DELETE_ID_MISMATCH = "delete_id_mismatch"
NOT_DELETE_PENDING = "not_delete_pending"
REGRESSED = "regressed"
#: A release of a generation that is not complete (nothing the site sent
#: asks a node to cancel its own unfinished task).
NOT_COMPLETED = "not_completed"
#: A release of an archive the site already knows is gone (not a drop).
ALREADY_GONE = "already_gone"

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
_COMPLETED = int(NodeCode.COMPLETED)
_DOWNLOADING = int(NodeCode.DOWNLOADING)

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
    #: Every drop by reason (an entry and a deletion of one gid count twice).
    drop_counts: Counter[str] = field(default_factory=Counter)
    backfilled: list[int] = field(default_factory=list)
    #: Legacy rows this report claimed for its node.
    claimed: list[int] = field(default_factory=list)
    #: This report started a new revision epoch for its node.
    new_epoch: bool = False
    deletes_completed: list[int] = field(default_factory=list)
    deletes_failed: list[int] = field(default_factory=list)
    #: Tasks a ``released`` entry made ``ARCHIVE_GONE``.
    released: list[int] = field(default_factory=list)
    #: Gids whose ``node_cancel`` row a ``CANCELLED`` release settled.
    cancels_settled: list[int] = field(default_factory=list)
    notifications: int = 0

    def drop(self, gid: int, reason: str) -> None:
        self.dropped[gid] = reason
        self.drop_counts[reason] += 1


LEGACY = "LEGACY"
#: The result of a report whose connection no longer holds its node: not
#: applied, not ACKed (see the module doc).
NOT_HELD = "NOT_HELD"


def _ids(gids: Iterable[int]) -> list[int]:
    # One array parameter instead of one "?" per gid: no variable limit,
    # one statement whatever the snapshot size.
    return list(gids)


_ROWS_SQL = sql("""
SELECT g.gid, g.status, g.progress, g.node_id,
       o.operation_id, o.state, o.last_revision, o.legacy,
       g.user_id, g.size, g.speed, g.sampled_at, g.moved_at, g.queued, g.detail,
       g.archive_size, g.archive_sha256
FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid
WHERE g.gid {in_array}
""")
# Where the judging reads a row of _ROWS_SQL by position: every entry of every
# report is judged, and a name lookup on a sqlite3.Row scans its columns.
_STATUS, _PROGRESS, _NODE_ID, _OPERATION_ID, _STATE, _LAST_REVISION, _LEGACY = range(1, 8)
_QUEUED, _DETAIL, _ARCHIVE_SIZE, _ARCHIVE_SHA256 = 13, 14, 15, 16


def _task_rows(cursor: Cursor, gids: Iterable[int]) -> dict[int, sqlite3.Row]:
    return {row[0]: row for row in cursor.execute(_ROWS_SQL, (_ids(gids),))}


_TOMBSTONES_SQL = sql("SELECT gid FROM task_operation WHERE state = 'DELETED' AND gid {in_array}")
_OPERATION_ID_TAKEN_SQL = sql("SELECT 1 FROM task_operation WHERE operation_id = ?")


def _tombstones(cursor: Cursor, gids: Iterable[int]) -> set[int]:
    rows = cursor.execute(_TOMBSTONES_SQL, (_ids(gids),))
    return {row[0] for row in rows}


def _unused_id(cursor: Cursor, operation_id: str | None) -> str | None:
    """``operation_id`` unless another gid already uses it (operationIds are
    unique): a confused node must not make its report fail forever."""
    if operation_id is None:
        return None
    taken = cursor.execute(_OPERATION_ID_TAKEN_SQL, (operation_id,)).fetchone()
    return None if taken else operation_id


def _owner_check(outcome: ReportOutcome, node_id: str, row: sqlite3.Row) -> str | None:
    """``None`` when ``node_id`` may report ``row``'s task, else the drop
    reason (recorded in ``outcome``).  A claimable row is claimed here (the
    caller writes the claim)."""
    owner = row[_NODE_ID]
    if owner == node_id:
        return None
    if owner is None and awaits_claim(row):
        outcome.claimed.append(row["gid"])
        return None
    outcome.drop(row["gid"], NOT_OWNER)
    return NOT_OWNER


_RECORDED_SQL = sql("SELECT report_id FROM report_receipt WHERE report_id {in_array}")
_RECEIPT_SQL = sql(
    "INSERT INTO report_receipt (report_id, node_id, revision, received_at) VALUES (?, ?, ?, {now})"
)
# The archive's digest rides along with the completion that carries it
# (NULL parameters keep what is recorded: an entry without one changes none).
_UPDATE_TASK_SQL = sql(
    "UPDATE gallery SET status = ?, progress = ?, queued = ?, detail = ?,"
    " archive_size = COALESCE(?, archive_size), archive_sha256 = COALESCE(?, archive_sha256),"
    " updated_at = {now} WHERE gid = ?"
)
# A change that is also a throughput sample writes both in one statement.
_UPDATE_SAMPLED_TASK_SQL = sql(
    "UPDATE gallery SET status = ?, progress = ?, queued = ?, detail = ?,"
    " archive_size = COALESCE(?, archive_size), archive_sha256 = COALESCE(?, archive_sha256),"
    " updated_at = {now}, speed = ?, sampled_at = ?, moved_at = ?,"
    " completed_at = COALESCE(completed_at, ?) WHERE gid = ?"
)
# A claim names node_id in its own statement: naming it in the one above
# would cost an index update (gallery_node) on every row, even when it stays.
_CLAIM_SQL = sql("UPDATE gallery SET node_id = ? WHERE gid = ? AND node_id IS NULL")
# One row per report: its revision and its changed gids as an array.
_UPDATE_REVISION_SQL = sql(
    "UPDATE task_operation SET last_revision = ?, updated_at = {now} WHERE gid {in_array}"
)
_HIGHS_SQL = sql("SELECT node_id, high_revision FROM node_revision WHERE node_id {in_array}")
_HIGH_SQL = sql(
    "INSERT INTO node_revision (node_id, high_revision) VALUES (?, ?)"
    " ON CONFLICT (node_id) DO UPDATE"
    " SET high_revision = {greatest:node_revision.high_revision, excluded.high_revision}"
)
_NEW_EPOCH_SQL = sql(
    "UPDATE node_revision SET high_revision = ?, epoch = epoch + 1,"
    " epoch_started_at = {now} WHERE node_id = ?"
)
_FORGET_REVISIONS_SQL = sql(
    "UPDATE task_operation SET last_revision = NULL WHERE last_revision IS NOT NULL"
    " AND gid IN (SELECT gid FROM gallery WHERE node_id = ?)"
)
_COUNT_DROPS_SQL = sql(
    "INSERT INTO node_dropped_entry (node_id, reason, count, last_at) VALUES (?, ?, ?, {now})"
    " ON CONFLICT (node_id, reason) DO UPDATE"
    " SET count = node_dropped_entry.count + excluded.count,"
    " last_at = {now}"
)
_DELETE_ID_SQL = sql("SELECT delete_operation_id FROM task_operation WHERE gid = ?")
_DELETE_STATE_SQL = sql(
    "SELECT o.state, o.delete_operation_id, g.node_id FROM task_operation AS o"
    " LEFT JOIN gallery AS g ON g.gid = o.gid WHERE o.gid = ?"
)


def _recorded(cursor: Cursor, report_ids: Sequence[str]) -> set[str]:
    """Which of ``report_ids`` are already recorded (their reports are duplicates)."""
    return {row[0] for row in cursor.execute(_RECORDED_SQL, (list(report_ids),))}


def _start_epochs(
    cursor: Cursor,
    fresh: Sequence[tuple[str, TaskReport]],
    firsts: Sequence[bool],
    outcomes: list[ReportOutcome],
) -> dict[str, int | None]:
    """Move each reporting node's high-water mark; a node's first report
    after login whose revision is at or below it starts a new epoch (see
    the module doc).  Returns the mark each report is judged against:
    the node's mark before it, ``None`` when there is none (a node never
    recorded) or the report started an epoch.  The caller passes at most one
    report per node."""
    nodes = [node_id for node_id, _ in fresh]
    highs: dict[str, int | None] = dict.fromkeys(nodes)
    for row in cursor.execute(_HIGHS_SQL, (nodes,)):
        highs[row["node_id"]] = row["high_revision"]
    raised = []
    for (node_id, report), first, outcome in zip(fresh, firsts, outcomes, strict=True):
        high = highs[node_id]
        if first and high is not None and report.revision <= high:
            cursor.execute(_NEW_EPOCH_SQL, (report.revision, node_id))
            cursor.execute(_FORGET_REVISIONS_SQL, (node_id,))
            outcome.new_epoch = True
            highs[node_id] = None
        elif high is None or report.revision > high:
            # Only a mark that moves is written (a repeat at or below it
            # would rewrite the row unchanged).
            raised.append((node_id, report.revision))
    if raised:
        cursor.executemany(_HIGH_SQL, raised)
    return highs


def count_drops(cursor: Cursor, node_id: str, outcome: ReportOutcome) -> None:
    """Add ``outcome``'s drops to the node's persisted counts."""
    if outcome.drop_counts:
        cursor.executemany(
            _COUNT_DROPS_SQL, [(node_id, r, n) for r, n in sorted(outcome.drop_counts.items())]
        )


class _Changes:
    """The task writes of one or more reports, gathered so that each kind is
    written with one statement (``executemany``) and all their outbox rows
    with one view query."""

    def __init__(self) -> None:
        # (status, progress, queued, detail, archive_size, archive_sha256, gid)
        self.tasks: list[tuple[int, float, int, str | None, int | None, str | None, int]] = []
        self.claims: list[tuple[str, int]] = []
        self.revisions: list[tuple[int, list[int]]] = []
        self.announce: list[int] = []

    def add(
        self,
        outcome: ReportOutcome,
        node_id: str,
        entries: dict[int, TaskEntry],
        rows: dict[int, sqlite3.Row],
        revision: int | None,
    ) -> None:
        """Gather ``outcome``'s claims and the applied entries of
        ``outcome.applied``; the visible changes among them will be
        announced, and only they write the report's revision."""
        self.claims.extend((node_id, g) for g in outcome.claimed)
        if not outcome.applied:
            return
        changed = []
        for g in outcome.applied:
            row, entry = rows[g], entries[g]
            # ``queued``, ``detail`` and a completion's digest (v2 entries; a
            # legacy entry has none) are part of what a person sees: a
            # change of any is a change of the task.
            if (
                row[_STATUS] != entry.status
                or float(row[_PROGRESS]) != entry.progress
                or bool(row[_QUEUED]) != entry.queued
                or (row[_DETAIL] or "") != entry.detail
                or (
                    entry.sha256 != ""
                    and entry.status == _COMPLETED
                    and (row[_ARCHIVE_SHA256] != entry.sha256 or row[_ARCHIVE_SIZE] != entry.size)
                )
            ):
                changed.append(g)
        for g in changed:
            entry = entries[g]
            # A digest only with a completion ("" = not sent): recorded as is.
            digest = entry.status == _COMPLETED and entry.sha256 != ""
            self.tasks.append(
                (
                    entry.status,
                    entry.progress,
                    int(entry.queued),
                    entry.detail or None,
                    entry.size if digest else None,
                    entry.sha256 if digest else None,
                    g,
                )
            )
        if revision is not None and changed:
            self.revisions.append((revision, changed))
        self.announce.extend(changed)
        outcome.changed.extend(changed)
        outcome.notifications += len(changed)

    def write(self, cursor: Cursor, samples: dict[int, throughput.Sample]) -> None:
        """Write the gathered changes, each changed task with its throughput
        sample (``samples``, by gid) in the same statement."""
        if self.claims:
            cursor.executemany(_CLAIM_SQL, self.claims)
        if samples:
            plain = [t for t in self.tasks if t[-1] not in samples]
            sampled = [
                (st, pr, qu, de, size, sha, *samples[g], g)
                for st, pr, qu, de, size, sha, g in self.tasks
                if g in samples
            ]
            cursor.executemany(_UPDATE_SAMPLED_TASK_SQL, sampled)
        else:
            plain = self.tasks
        if plain:
            cursor.executemany(_UPDATE_TASK_SQL, plain)
        if self.revisions:
            cursor.executemany(_UPDATE_REVISION_SQL, self.revisions)
        outbox.enqueue_task_changes(cursor, self.announce)


def _judge_entries(
    cursor: Cursor,
    outcome: ReportOutcome,
    node_id: str,
    report: TaskReport,
    entries: dict[int, TaskEntry],
    rows: dict[int, sqlite3.Row],
    tombstones: set[int],
    high: int | None,
) -> None:
    """Sort the ``galleryTasks`` entries of one v2 report from ``node_id`` by
    the module rules into ``outcome`` (backfilling a legacy row's generation
    on the way).  ``high``: the node's revision mark this report is judged
    against (see :func:`_start_epochs`)."""
    for gid in entries:
        row = rows.get(gid)
        if row is None:
            outcome.ignored[gid] = TOMBSTONE if gid in tombstones else UNKNOWN_GID
            continue
        state = row[_STATE]
        if state == _DELETED:
            outcome.ignored[gid] = TOMBSTONE
            continue
        if _owner_check(outcome, node_id, row) is not None:
            continue
        sent = report.operation_ids.get(gid)
        current = row[_OPERATION_ID]
        legacy = bool(row[_LEGACY])
        if state is None:
            current = backfill_legacy(cursor, gid, _unused_id(cursor, sent))
            state, legacy = _SUBMITTED, True
            outcome.backfilled.append(gid)
        if state in _NOT_REPORTABLE:
            outcome.drop(gid, state)
        elif sent is None and not legacy:
            outcome.drop(gid, MISSING_OPERATION)
        elif sent is not None and sent != current:
            outcome.drop(gid, OLD_GENERATION)
        elif _stale(report.revision, row[_LAST_REVISION], high):
            outcome.drop(gid, STALE)
        elif _regressed(row, entries[gid]):
            outcome.drop(gid, REGRESSED)
        else:
            outcome.applied.append(gid)


def _regressed(row: sqlite3.Row, entry: TaskEntry) -> bool:
    """``entry`` would move its ``COMPLETED`` task backwards (the same
    generation: the caller has judged the operationId)."""
    return row[_STATUS] == _COMPLETED and entry.status < _COMPLETED


def _stale(revision: int, last: int | None, high: int | None) -> bool:
    """The revision rule.  With a mark for the node, a revision at or below
    it is stale for every task the node owns: each task's last revision is
    at most the mark (only its owner writes it), so this is the per-task
    rule and more -- it also covers an unchanged entry whose revision was
    not written, and it ignores a revision some other node once forged onto
    the task.  Without a mark (nothing recorded from the node), per task."""
    if high is not None:
        return revision <= high
    return last is not None and revision <= last


def _report_gids(report: TaskReport) -> set[int]:
    return (
        {e.gid for e in report.gallery_tasks}
        | {d.gid for d in report.deleted}
        | {r.gid for r in report.released}
    )


def _apply_task_reports(
    cursor: Cursor,
    reports: Sequence[tuple[str, TaskReport]],
    firsts: Sequence[bool] | None = None,
) -> list[ReportOutcome]:
    """Apply v2 reports with a few set-at-a-time statements for all of them,
    with exactly the effect of applying them one after the other.

    That holds because the caller passes reports with distinct reportIds
    and nodes that share no gid: no report can see another's receipt, epoch
    or task change, so reading every row first and writing every change
    last is the same as taking them in turn.  The outbox rows keep report
    order.  ``firsts[i]``: report ``i`` is the first of its node's session
    (it may start a revision epoch).
    """
    recorded = _recorded(cursor, [report.report_id for _, report in reports])
    if firsts is None:
        firsts = [False] * len(reports)
    fresh = [(node_id, r) for node_id, r in reports if r.report_id not in recorded]
    fresh_firsts = [
        first for (_, r), first in zip(reports, firsts, strict=True) if r.report_id not in recorded
    ]
    if fresh:
        cursor.executemany(_RECEIPT_SQL, [(r.report_id, n, r.revision) for n, r in fresh])
    outcomes = [ReportOutcome(ACK_APPLIED, r.revision) for _, r in fresh]
    highs = _start_epochs(cursor, fresh, fresh_firsts, outcomes) if fresh else {}
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
    samples = []
    for (node_id, report), mine, outcome in zip(fresh, entries, outcomes, strict=True):
        _judge_entries(cursor, outcome, node_id, report, mine, rows, tombstones, highs.get(node_id))
        changes.add(outcome, node_id, mine, rows, report.revision)
        # A sample is a change (status, or a download's progress): only
        # changed entries need looking at.
        samples.append((node_id, outcome.changed, mine, rows))
        applied[report.report_id] = outcome
    # One set of throughput statements for the whole run (no gid is in two reports).
    changes.write(cursor, throughput.sample_reports(cursor, samples, rows))
    now: str | None = None  # the transaction's time, read once when a release needs it
    for node_id, report in fresh:
        outcome = applied[report.report_id]
        for deleted in report.deleted:
            _apply_delete(
                cursor,
                outcome,
                node_id,
                deleted.gid,
                deleted.operation_id,
                failed=deleted.result == DELETE_FAILED,
                reason=deleted.reason,
                gid_is_tombstone=deleted.gid in tombstones,
            )
        if report.released:
            now = now or cursor.execute(_NOW_SQL).fetchone()[0]
            for released in report.released:
                _apply_release(cursor, outcome, node_id, released, now)
        count_drops(cursor, node_id, outcome)
    return [
        applied.get(report.report_id) or ReportOutcome(ACK_DUPLICATE, report.revision)
        for _, report in reports
    ]


_NOW_SQL = sql("SELECT {now}")
_RELEASE_ROW_SQL = sql(
    "SELECT g.node_id, g.status, g.archive_gone_reason, o.state, o.operation_id"
    " FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid WHERE g.gid = ?"
)


def _apply_release(
    cursor: Cursor, outcome: ReportOutcome, node_id: str, entry: ReleasedEntry, now: str
) -> None:
    """One ``released`` entry from ``node_id`` (the module's release rules)."""
    gid, operation_id, reason = entry
    if reason == "CANCELLED" and settle_cancel(cursor, node_id=node_id, operation_id=operation_id):
        outcome.cancels_settled.append(gid)
        return
    row = cursor.execute(_RELEASE_ROW_SQL, (gid,)).fetchone()
    if row is None:
        outcome.ignored[gid] = TOMBSTONE if _tombstones(cursor, [gid]) else UNKNOWN_GID
        return
    node, status, gone, state, current = row
    if state == _DELETED:
        outcome.ignored[gid] = TOMBSTONE
    elif node != node_id:
        outcome.drop(gid, NOT_OWNER)
    elif state is None or operation_id != current:
        outcome.drop(gid, OLD_GENERATION)
    elif state != _SUBMITTED:
        outcome.drop(gid, state)
    elif status != _COMPLETED:
        outcome.drop(gid, NOT_COMPLETED)
    elif gone is not None:
        outcome.ignored[gid] = ALREADY_GONE
    elif mark_archive_gone(
        cursor, gid=gid, operation_id=operation_id, reason=reason, node_id=node_id, now=now
    ):
        outcome.released.append(gid)
        outcome.notifications += 1


@read_committed
def apply_task_report(
    cursor: Cursor, node_id: str, report: TaskReport, first_after_login: bool = False
) -> ReportOutcome:
    """Apply one v2 ``TaskReport`` from ``node_id`` (see the module rules);
    ``first_after_login``: the first report of the node's connection."""
    _lock_reported(cursor, [(node_id, report)])
    return _apply_task_reports(cursor, [(node_id, report)], [first_after_login])[0]


def _legacy_queued(entry: TaskEntry, row: sqlite3.Row | None) -> TaskEntry:
    """A legacy entry as the site can tell it (issue 36, item 1): a legacy
    node cannot say "queued", so an entry at status 1 whose progress has
    never left 0 (in this report and in the row) is held, not started --
    shown QUEUED, not as a download that stalled; it is downloading from
    the first report that moves it."""
    if (
        entry.status == _DOWNLOADING
        and entry.progress == 0.0
        and (row is None or not row[_PROGRESS])
    ):
        return entry._replace(queued=True)
    return entry


def _apply_status_report(cursor: Cursor, node_id: str, report: StatusReport) -> ReportOutcome:
    outcome = ReportOutcome(LEGACY)
    entries = {e.gid: e for e in report.gallery_tasks}
    rows = _task_rows(cursor, entries)
    entries = {gid: _legacy_queued(entry, rows.get(gid)) for gid, entry in entries.items()}
    for gid in entries:
        row = rows.get(gid)
        if row is None:
            outcome.ignored[gid] = UNKNOWN_GID
            continue
        state = row["state"]
        if state == _DELETED:
            outcome.ignored[gid] = TOMBSTONE
            continue
        if _owner_check(outcome, node_id, row) is not None:
            continue
        if state is None:
            backfill_legacy(cursor, gid)
            outcome.backfilled.append(gid)
            state = _SUBMITTED
        if state != _SUBMITTED:
            outcome.drop(gid, state)
        elif _regressed(row, entries[gid]):
            outcome.drop(gid, REGRESSED)
        else:
            outcome.applied.append(gid)
    changes = _Changes()
    changes.add(outcome, node_id, entries, rows, None)
    changes.write(
        cursor, throughput.sample_reports(cursor, [(node_id, outcome.changed, entries, rows)], rows)
    )
    count_drops(cursor, node_id, outcome)
    return outcome


def _apply_delete_result(cursor: Cursor, node_id: str, result: DeleteResult) -> ReportOutcome:
    outcome = ReportOutcome(LEGACY)
    row = cursor.execute(_DELETE_ID_SQL, (result.gid,)).fetchone()
    # Unknown gids, tombstones and ownership are judged by _apply_delete, as for v2.
    _apply_delete(
        cursor,
        outcome,
        node_id,
        result.gid,
        (row["delete_operation_id"] if row is not None else None) or "",
        failed=not result.success,
        reason=result.reason,
        gid_is_tombstone=False,
    )
    count_drops(cursor, node_id, outcome)
    return outcome


def _apply_delete(
    cursor: Cursor,
    outcome: ReportOutcome,
    node_id: str,
    gid: int,
    delete_operation_id: str,
    *,
    failed: bool,
    reason: str,
    gid_is_tombstone: bool,
) -> None:
    """One delete confirmation from ``node_id``: complete (``DELETED``/
    ``NOT_FOUND``) or mark failed (``FAILED``), only from the task's assigned
    node and only with the task's own delete id."""
    row = cursor.execute(_DELETE_STATE_SQL, (gid,)).fetchone()
    if row is None:
        outcome.ignored[gid] = UNKNOWN_GID
        return
    if row["state"] == _DELETED or gid_is_tombstone:
        # Already complete: the node's repeat is answered by the ACK alone.
        outcome.ignored[gid] = TOMBSTONE
        return
    if row["node_id"] != node_id:
        # Another node's task, or one with no recorded node: its delete waits
        # for a claim (or an operator).
        outcome.drop(gid, NOT_OWNER)
        return
    if row["state"] != _DELETE_PENDING:
        outcome.drop(gid, NOT_DELETE_PENDING)
        return
    if not delete_operation_id or row["delete_operation_id"] != delete_operation_id:
        outcome.drop(gid, DELETE_ID_MISMATCH)
        return
    # The lifecycle functions enqueue their own notification when they act.
    if failed:
        if mark_delete_failed(cursor, gid, delete_operation_id, reason):
            outcome.deletes_failed.append(gid)
            outcome.notifications += 1
        else:
            outcome.drop(gid, DELETE_ID_MISMATCH)
    elif complete_delete(cursor, gid, delete_operation_id):
        outcome.deletes_completed.append(gid)
        outcome.notifications += 1
    else:
        outcome.drop(gid, DELETE_ID_MISMATCH)


@read_committed
def apply_report(
    cursor: Cursor, node_id: str, message: NodeReport, first_after_login: bool = False
) -> ReportOutcome:
    """Apply any node report message (v2 or legacy); ``first_after_login``
    (v2 only): the first report of the node's connection."""
    _lock_reported(cursor, [(node_id, message)])
    return _apply_one(cursor, node_id, message, first_after_login)


def _apply_one(
    cursor: Cursor, node_id: str, message: NodeReport, first_after_login: bool
) -> ReportOutcome:
    """:func:`apply_report` once its rows are locked."""
    if isinstance(message, TaskReport):
        return _apply_task_reports(cursor, [(node_id, message)], [first_after_login])[0]
    if isinstance(message, StatusReport):
        return _apply_status_report(cursor, node_id, message)
    if isinstance(message, DeleteResult):
        return _apply_delete_result(cursor, node_id, message)
    raise TypeError(f"not a node report: {message!r}")


# -- row locks (PostgreSQL) ---------------------------------------------------------------

#: The class of the transaction-level advisory lock (two-key form) taken
#: per reporting node: one node's reports apply one at a time, at whichever
#: sites they arrive (a node moving between sites).  Next to lease.py's.
REPORT_NODE_CLASS = 0x7455

_LOCK_NODES_SQL = postgres_only(
    f"SELECT pg_advisory_xact_lock({REPORT_NODE_CLASS}, k) FROM"  # noqa: S608
    " (SELECT DISTINCT hashtext(n) AS k FROM unnest(CAST(? AS text[])) AS n ORDER BY k) AS s"
)
# Counted, not fetched (a report names hundreds of gids): how many of the
# ?1 gids have no task_operation row to lock (on SQLite: none to lock, 0).
_LOCK_OPERATIONS_SQL = postgres_only(
    "SELECT ?1 - COUNT(*) FROM (SELECT gid FROM task_operation"
    " WHERE gid {in_array:?2} ORDER BY gid {for_update}) AS locked",
    sqlite_answer="0",
)
_LOCK_LEGACY_TASKS_SQL = postgres_only(
    "SELECT gid FROM gallery AS g WHERE gid {in_array}"
    " AND NOT EXISTS (SELECT 1 FROM task_operation AS o WHERE o.gid = g.gid)"
    " ORDER BY gid {for_update}"
)


def _message_gids(message: NodeReport) -> set[int]:
    if isinstance(message, TaskReport):
        return _report_gids(message)
    if isinstance(message, StatusReport):
        return {e.gid for e in message.gallery_tasks}
    if isinstance(message, DeleteResult):
        return {message.gid}
    raise TypeError(f"not a node report: {message!r}")


def _lock_reported(cursor: Cursor, reports: Iterable[tuple[str, NodeReport]]) -> None:
    """Before anything is read: lock what the reports decide from (see the
    module doc, "Several sites"; on SQLite, whose one writer holds the whole
    database, each statement is a neutral ``SELECT``)."""
    nodes: set[str] = set()
    gids: set[int] = set()
    for node_id, message in reports:
        nodes.add(node_id)
        gids |= _message_gids(message)
    cursor.execute(_LOCK_NODES_SQL, (sorted(nodes),))
    if not gids:
        return
    ordered = sorted(gids)
    if cursor.execute(_LOCK_OPERATIONS_SQL, (len(ordered), ordered)).fetchone()[0]:
        # Legacy rows (no generation yet): their task row (unknown gids lock nothing).
        cursor.execute(_LOCK_LEGACY_TASKS_SQL, (ordered,)).fetchall()


@dataclass(frozen=True)
class QueuedReport:
    """One report as the pipeline queues it: from ``node_id``;
    ``first_after_login`` (v2 only): the first report of the node's
    connection (it may start a revision epoch); ``holding``: its
    connection's hold on the node, judged in the transaction (``None``: a
    site without node ownership, nothing to judge)."""

    node_id: str
    message: NodeReport
    first_after_login: bool = False
    holding: Holding | None = None


def _not_held(cursor: Cursor, reports: Sequence[QueuedReport]) -> set[int]:
    """The positions of the reports whose connection no longer holds its
    node (one read for all of them)."""
    holdings = {r.holding for r in reports if r.holding is not None}
    if not holdings:
        return set()
    held = still_held(cursor, holdings)
    return {i for i, r in enumerate(reports) if r.holding is not None and r.holding not in held}


@read_committed
def apply_reports(cursor: Cursor, reports: Sequence[QueuedReport]) -> list[ReportOutcome]:
    """Apply several reports in this one transaction, with the effect of
    applying them in order, each alone (one outcome each): the batch
    function of the report pipeline's joined writes
    (``Database.write_joined``).

    Runs of v2 reports that share no gid, no reportId and no node (the usual
    batch: one report per node) are applied together, with one statement per
    kind of write for the whole run (:func:`_apply_task_reports`); the rest
    one by one.  Should any report raise, the whole call raises: the
    database layer then rolls it back and applies each report alone under a
    savepoint of its own, so only the failing one is lost.

    A report whose connection no longer holds its node is refused
    (:data:`NOT_HELD`, see the module doc), and the others are applied as
    if it had not been queued.
    """
    _lock_reported(cursor, [(r.node_id, r.message) for r in reports])
    refused = _not_held(cursor, reports)
    if not refused:
        return _apply_queued(cursor, reports)
    applied = iter(_apply_queued(cursor, [r for i, r in enumerate(reports) if i not in refused]))
    return [ReportOutcome(NOT_HELD) if i in refused else next(applied) for i in range(len(reports))]


def _apply_queued(cursor: Cursor, reports: Sequence[QueuedReport]) -> list[ReportOutcome]:
    """:func:`apply_reports` once its rows are locked and its reports judged."""
    outcomes: list[ReportOutcome] = []
    start = 0
    while start < len(reports):
        run = _independent_run(reports, start)
        if len(run) > 1:
            outcomes.extend(
                _apply_task_reports(
                    cursor,
                    [(r.node_id, cast(TaskReport, r.message)) for r in run],
                    [r.first_after_login for r in run],
                )
            )
            start += len(run)
        else:
            report = reports[start]
            outcomes.append(
                _apply_one(cursor, report.node_id, report.message, report.first_after_login)
            )
            start += 1
    return outcomes


def _independent_run(reports: Sequence[QueuedReport], start: int) -> list[QueuedReport]:
    """The longest run of ``TaskReport`` s from ``start`` with distinct
    reportIds, distinct nodes (a node's epoch is decided report by report)
    and no gid in two of them."""
    run: list[QueuedReport] = []
    report_ids: set[str] = set()
    nodes: set[str] = set()
    gids: set[int] = set()
    for report in reports[start:]:
        message = report.message
        if (
            not isinstance(message, TaskReport)
            or message.report_id in report_ids
            or report.node_id in nodes
        ):
            break
        mine = _report_gids(message)
        if not gids.isdisjoint(mine):
            break
        report_ids.add(message.report_id)
        nodes.add(report.node_id)
        gids |= mine
        run.append(report)
    return run
