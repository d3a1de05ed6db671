"""Node reports: apply, commit, then ACK (LIFECYCLE.md invariant 7), with
group commit.

:class:`ReportPipeline` queues every report it is given and keeps one write
transaction scheduled on the writer thread while reports wait.  That
transaction takes its batch (everything queued, at most ``max_batch``) only
when it starts, in the writer thread: reports that arrive while a
transaction runs join the next one, which starts the moment the previous one
has committed, without a round trip through the reactor.  So under load many
reports share one commit (one fsync) and the writer never waits for the
reactor; when idle a report waits for nothing (plus ``max_wait`` seconds
when configured).

Each report is ACKed only after the commit that carried it, on the session
it came from.  A report whose own savepoint failed, or any report of a
transaction that failed, gets no ACK: its node keeps the snapshot and
redelivers it (and then gets ``DUPLICATE`` if the first one had committed
after all).  Legacy messages are applied the same way but never ACKed.

Entries the rules drop (another node's task: ``not_owner``, stale, ...) are
still committed and ACKed; after the commit they are counted in
``tasknet_report_entries_dropped_total{node,reason}`` and logged through
:class:`DropLog` (rate-limited on the pipeline's clock).  The pipeline also
tells storage which report is the first of its session, where a wiped node
may start a new revision epoch (``storage/reports.py``).
"""

from __future__ import annotations

import sqlite3
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.protocol.messages import TaskReport
from tasknet.site import metrics
from tasknet.site.dispatch import Session
from tasknet.site.storage import reports as storage
from tasknet.site.storage.db import Database

log = Logger()

DEFAULT_MAX_BATCH = 64
DROP_LOG_INTERVAL = 60.0


class DropLog:
    """Logs dropped report entries at most once per node and reason every
    ``interval`` seconds (on ``clock``), with how many were dropped since the
    last line: a misconfigured or hostile node reporting every second must
    not flood the log.  ``not_owner`` is a warning, other reasons are info
    (a task being deleted is still listed by its node for a while)."""

    def __init__(self, clock: Any, interval: float = DROP_LOG_INTERVAL) -> None:
        self._clock = clock
        self._interval = interval
        self._last: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], int] = {}
        #: Lines written (tests).
        self.lines = 0

    def note(self, node_id: str, counts: Mapping[str, int]) -> None:
        now = self._clock.seconds()
        for reason, n in counts.items():
            key = (node_id, reason)
            self._pending[key] = self._pending.get(key, 0) + n
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                continue
            self._last[key] = now
            dropped = self._pending.pop(key)
            self.lines += 1
            emit = log.warn if reason == storage.NOT_OWNER else log.info
            emit(
                "node {node}: dropped {count} report entr(y/ies) ({reason})"
                " in the last {interval:.0f} s",
                node=node_id,
                count=dropped,
                reason=reason,
                interval=self._interval,
            )


@dataclass
class _Pending:
    session: Session
    message: storage.NodeReport
    arrived: float
    #: No report of this session has been committed yet (a wiped node's
    #: first report after login may start a new revision epoch).
    first: bool = False
    done: Deferred[storage.ReportOutcome | None] = field(default_factory=Deferred)


@dataclass
class _Taken:
    """What one scheduled write transaction took from the queue (set in the
    writer thread, read on the reactor once the transaction has ended)."""

    batch: list[_Pending] | None = None
    started: float = 0.0


class ReportPipeline:
    """Applies node reports in group-committed write transactions.

    ``on_committed(notifications)`` runs after every commit that wrote outbox
    rows (the outbox executor's ``wake``); ``on_applied(session, outcome)``
    after each committed report (bookkeeping such as the node's last revision).
    """

    def __init__(
        self,
        db: Database,
        *,
        on_committed: Callable[[int], object] | None = None,
        on_applied: Callable[[Session, storage.ReportOutcome], object] | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait: float = 0.0,
        clock: Any = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait < 0:
            raise ValueError(f"max_wait must be >= 0, got {max_wait}")
        if clock is None:
            from twisted.internet import reactor as clock
        self._db = db
        self._on_committed = on_committed
        self._on_applied = on_applied
        self._max_batch = max_batch
        self._max_wait = max_wait
        self._clock = clock
        self.drop_log = DropLog(clock)
        # Appended on the reactor, taken in the writer thread (deque's append
        # and popleft are atomic).
        self._queue: deque[_Pending] = deque()
        # Sessions with a committed report (reactor only).
        self._reported: weakref.WeakSet[Any] = weakref.WeakSet()
        # A write is scheduled that has not taken its batch yet.  Set on the
        # reactor; cleared by that write in the writer thread *before* it
        # takes from the queue, so a report queued after the clear is either
        # taken by it or schedules the next write: none is stranded.
        self._scheduled = False
        self._in_flight = 0  # scheduled writes not yet ended (reactor only)
        self._linger: Any = None
        self._idle: list[Deferred[None]] = []
        #: Committed write transactions and the reports they carried (tests, logs).
        self.transactions = 0
        self.reports_committed = 0
        self.reports_failed = 0

    def submit(
        self, session: Session, message: storage.NodeReport
    ) -> Deferred[storage.ReportOutcome | None]:
        """Queue one report.  The Deferred fires after its transaction ended:
        with the outcome (committed; a v2 report has been ACKed) or ``None``
        (not committed, not ACKed).  It never fails."""
        pending = _Pending(
            session,
            message,
            time.monotonic(),
            first=isinstance(message, TaskReport) and session not in self._reported,
        )
        self._queue.append(pending)
        self._maybe_schedule()
        return pending.done

    def idle(self) -> Deferred[None]:
        """Fires once nothing is queued or in flight (for shutdown and tests)."""
        if not self._in_flight and not self._queue:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._idle.append(d)
        return d

    def _maybe_schedule(self) -> None:
        if self._scheduled or not self._queue or self._linger is not None:
            return
        if self._max_wait and not self._in_flight and len(self._queue) < self._max_batch:
            # Idle writer, few reports: let more join for up to max_wait.
            self._linger = self._clock.callLater(self._max_wait, self._linger_over)
            return
        self._schedule()

    def _linger_over(self) -> None:
        self._linger = None
        if not self._scheduled and self._queue:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        self._in_flight += 1
        taken = _Taken()
        d = self._db.write(self._apply_queued, taken)
        d.addCallbacks(self._committed, self._failed, callbackArgs=(taken,), errbackArgs=(taken,))
        d.addErrback(lambda f: log.failure("report pipeline bookkeeping failed", f))
        d.addBoth(self._ended)

    def _apply_queued(
        self, cursor: sqlite3.Cursor, taken: _Taken
    ) -> list[storage.ReportOutcome | storage.ReportFailure]:
        """The transaction body, in the writer thread: take what is queued
        now and apply it.  Touches no Deferred (not thread-safe)."""
        self._scheduled = False
        batch: list[_Pending] = []
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.popleft())
            except IndexError:
                break
        taken.batch = batch
        taken.started = time.monotonic()
        if not batch:
            return []
        return storage.apply_batch(
            cursor, [(p.session.node_id, p.message) for p in batch], [p.first for p in batch]
        )

    def _committed(
        self,
        results: list[storage.ReportOutcome | storage.ReportFailure],
        taken: _Taken,
    ) -> None:
        batch = taken.batch or []
        if not batch:
            return
        metrics.observe_since(metrics.APPLY_LATENCY, taken.started)
        self.transactions += 1
        notifications = 0
        for pending, result in zip(batch, results, strict=True):
            if isinstance(result, storage.ReportFailure):
                self._not_acked(pending, result.error)
                continue
            self.reports_committed += 1
            notifications += result.notifications
            self._acknowledge(pending, result)
        if notifications and self._on_committed is not None:
            self._on_committed(notifications)

    def _acknowledge(self, pending: _Pending, outcome: storage.ReportOutcome) -> None:
        message = pending.message
        if isinstance(message, TaskReport):
            self._reported.add(pending.session)
            pending.session.send_ack(message.report_id, outcome.result)
            metrics.observe_since(metrics.ACK_LATENCY, pending.arrived)
        metrics.REPORTS.labels(result=outcome.result).inc()
        if outcome.drop_counts:
            node_id = pending.session.node_id
            for reason, n in outcome.drop_counts.items():
                metrics.DROPPED_ENTRIES.labels(node=node_id, reason=reason).inc(n)
            self.drop_log.note(node_id, outcome.drop_counts)
        if outcome.new_epoch:
            log.info(
                "node {node}: revision {revision} went backwards (wiped node?):"
                " new revision epoch for its tasks",
                node=pending.session.node_id,
                revision=outcome.revision,
            )
        for gid in outcome.claimed:
            log.info("node {node} claimed legacy task {gid}", node=pending.session.node_id, gid=gid)
        if self._on_applied is not None:
            try:
                self._on_applied(pending.session, outcome)
            except Exception:
                log.failure("on_applied hook failed")
        pending.done.callback(outcome)

    def _not_acked(self, pending: _Pending, why: str) -> None:
        self.reports_failed += 1
        metrics.REPORTS.labels(result="FAILED").inc()
        log.error(
            "report {report} from {node} not committed, not ACKed (the node redelivers): {why}",
            report=getattr(pending.message, "report_id", type(pending.message).__name__),
            node=pending.session.node_id,
            why=why,
        )
        pending.done.callback(None)

    def _failed(self, failure: Failure, taken: _Taken) -> None:
        batch = taken.batch
        if batch is None:
            # The transaction failed before its body ran (BEGIN could not get
            # the write lock), so the writer took nothing and nothing else is
            # taking from the queue: fail the batch it would have taken here,
            # or a locked database would be retried in a busy loop.
            self._scheduled = False
            batch = [self._queue.popleft() for _ in range(min(self._max_batch, len(self._queue)))]
        for pending in batch:
            self._not_acked(pending, failure.getErrorMessage())

    def _ended(self, _: object) -> None:
        self._in_flight -= 1
        self._maybe_schedule()
        if not self._in_flight and not self._queue:
            waiters, self._idle = self._idle, []
            for d in waiters:
                d.callback(None)
