"""Node reports: apply, commit, then ACK (LIFECYCLE.md invariant 7).

:class:`ReportPipeline` hands every report to the database as one item of
the joined write :func:`storage.apply_reports
<tasknet.site.storage.reports.apply_reports>`
(``Database.write_joined``): reports that arrive while the writer is
busy share the next transaction and one call of the batch function; the
database layer's group commit isolates a failing report under its own
savepoint.  What the pipeline keeps is what happens after the commit: the
ACK and the metrics.

Each report is ACKed only after the commit that carried it, on the session
it came from.  A report that failed (on its own, or with its transaction)
gets no ACK: its node keeps the snapshot and redelivers it (and then gets
``DUPLICATE`` if the first one had committed after all).  Legacy messages
are applied the same way but never ACKed, and no legacy node sends one
again (it forgets a finished task once its status is on the wire): so a
legacy report that failed on a database error is tried again by the site
itself, with backoff on its clock, until it commits or the site stops
(:meth:`ReportPipeline.stop_retrying`).  Only what no later report would
say again is kept for that: a ``StatusReport``'s completed entries (the
rest is progress, which the node's next snapshot repeats), and a
``DeleteResult`` whole.

Entries the rules drop (another node's task: ``not_owner``, stale, a
completed task moved backwards: ``regressed``, ...) are
still committed and ACKed; after the commit they are counted in
``tasknet_report_entries_dropped_total{node,reason}`` and logged through
:class:`DropLog` (rate-limited on the pipeline's clock).  The pipeline also
tells storage which report is the first of its session, where a wiped node
may start a new revision epoch (``storage/reports.py``).

Several sites (SCALE.md 5): a report submitted with a ``holding`` (the
Deferred of its session's hold on its node, ``NodeOwnership.holding``) is
queued once that fires, and carries it into its transaction, which judges
it there, once (``storage/reports.py``, :data:`~tasknet.site.storage.reports.NOT_HELD`).
A report whose session holds nothing, or whose holding that judgement finds
taken, is not applied and not ACKed: ``refused()`` is called (the session
handler closes the connection; the node sends the report again on its newer
one).  Such a report is in flight from its arrival: :meth:`ReportPipeline.idle`
waits for it too, so a stop never closes the connection of a report still
waiting for its holding (its ACK would never go out).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping

from twisted.application.internet import backoffPolicy
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.protocol.messages import StatusReport, TaskReport
from tasknet.protocol.session import INodeSession
from tasknet.site import metrics
from tasknet.site.storage import reports as storage
from tasknet.site.storage.engine.database import Committed, Database
from tasknet.site.storage.engine.errors import DatabaseError
from tasknet.site.storage.node_sessions import Holding
from tasknet.status import NodeCode

log = Logger()

DROP_LOG_INTERVAL = 60.0
#: A legacy report not committed is tried again after 1 s, doubling to 30 s.
LEGACY_RETRY_FIRST = 1.0
LEGACY_RETRY_MAX = 30.0
#: Drops that say a node misbehaves (the rest happen in ordinary races).
_WARN_REASONS = frozenset({storage.NOT_OWNER, storage.REGRESSED})


class DropLog:
    """Logs dropped report entries at most once per node and reason every
    ``interval`` seconds (on ``clock``), with how many were dropped since the
    last line: a misconfigured or hostile node reporting every second must
    not flood the log.  ``not_owner`` and ``regressed`` (a node moving its
    own completed task backwards) are warnings, other reasons are info (a
    task being deleted is still listed by its node for a while)."""

    def __init__(self, clock: IReactorTime, interval: float = DROP_LOG_INTERVAL) -> None:
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
            emit = log.warn if reason in _WARN_REASONS else log.info
            emit(
                "node {node}: dropped {count} report entr(y/ies) ({reason})"
                " in the last {interval:.0f} s",
                node=node_id,
                count=dropped,
                reason=reason,
                interval=self._interval,
            )


class ReportPipeline:
    """Applies node reports in group-committed write transactions, ACKs them
    after the commit and keeps the report metrics.

    ``on_committed(notifications)`` runs once after every commit that wrote
    outbox rows for reports (the outbox executor's ``wake``);
    ``on_applied(session, outcome)`` after each committed report
    (bookkeeping such as the node's last revision).
    """

    def __init__(
        self,
        db: Database,
        *,
        on_committed: Callable[[int], object] | None = None,
        on_applied: Callable[[INodeSession, storage.ReportOutcome], object] | None = None,
        clock: IReactorTime,
    ) -> None:
        self._db = db
        self._on_committed = on_committed
        self._on_applied = on_applied
        self._clock = clock
        self.drop_log = DropLog(clock)
        # Sessions with a committed report.
        self._reported: weakref.WeakSet[INodeSession] = weakref.WeakSet()
        self._in_flight = 0  # submitted reports not yet answered
        self._idle: list[Deferred[None]] = []
        # The last transaction seen carrying reports, and the last one whose
        # outbox rows were announced (each once, however many reports it had).
        self._last_transaction = 0
        self._woken_for = 0
        #: Committed write transactions and the reports they carried (tests, logs).
        self.transactions = 0
        self.reports_committed = 0
        self.reports_failed = 0
        self._legacy_backoff = backoffPolicy(
            LEGACY_RETRY_FIRST, LEGACY_RETRY_MAX, factor=2.0, jitter=lambda: 0.0
        )
        #: The waits of legacy reports to be tried again (cancelled by the stop).
        self._legacy_retries: dict[Deferred[None], None] = {}
        self._stopping = False

    def submit(
        self,
        session: INodeSession,
        message: storage.NodeReport,
        holding: Deferred[Holding | None] | None = None,
        *,
        refused: Callable[[], object] = lambda: None,
    ) -> Deferred[storage.ReportOutcome | None]:
        """Queue one report; with a ``holding`` (see the module doc) once it
        fired, judged against it in its transaction (``None``: it holds
        nothing, ``refused()`` at once).  The Deferred fires after its
        transaction ended: with the outcome (committed; a v2 report has been
        ACKed) or ``None`` (not committed or refused, not ACKed).  It never
        fails."""
        arrived = self._clock.seconds()
        self._in_flight += 1
        if holding is None:
            answered = self._queue(session, message, None, arrived, refused)
        else:

            def held(
                holds: Holding | None,
            ) -> Deferred[storage.ReportOutcome | None] | None:
                if holds is None:
                    refused()
                    return None
                return self._queue(session, message, holds, arrived, refused)

            answered = holding.addCallback(held)
        answered.addErrback(self._bookkeeping_failed)
        answered.addBoth(self._ended)
        return answered

    def _queue(
        self,
        session: INodeSession,
        message: storage.NodeReport,
        holding: Holding | None,
        arrived: float,
        refused: Callable[[], object],
        attempt: int = 0,
    ) -> Deferred[storage.ReportOutcome | None]:
        first = isinstance(message, TaskReport) and session not in self._reported
        d = self._db.write_joined(
            storage.apply_reports, storage.QueuedReport(session.node_id, message, first, holding)
        )
        return d.addCallbacks(
            self._committed,
            self._not_committed,
            callbackArgs=(session, message, arrived, refused),
            errbackArgs=(session, message, holding, arrived, refused, attempt),
        )

    def idle(self) -> Deferred[None]:
        """Fires once no report is in flight (for shutdown and tests)."""
        if not self._in_flight:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._idle.append(d)
        return d

    def _committed(
        self,
        committed: Committed[storage.ReportOutcome],
        session: INodeSession,
        message: storage.NodeReport,
        arrived: float,
        refused: Callable[[], object],
    ) -> storage.ReportOutcome | None:
        outcome = committed.value
        if outcome.result == storage.NOT_HELD:
            refused()  # its session no longer holds its node: nothing was written
            return None
        if committed.transaction != self._last_transaction:
            self._last_transaction = committed.transaction
            self.transactions += 1
            metrics.APPLY_LATENCY.observe(committed.seconds)
        self.reports_committed += 1
        if isinstance(message, TaskReport):
            self._reported.add(session)
            session.send_ack(message.report_id, outcome.result)
            metrics.observe_since(metrics.ACK_LATENCY, arrived, self._clock.seconds())
        metrics.REPORTS.labels(result=outcome.result).inc()
        if isinstance(message, TaskReport) and outcome.released:
            metrics.count_releases(message.released, outcome.released)
        self._log_outcome(session.node_id, outcome)
        if self._on_applied is not None:
            try:
                self._on_applied(session, outcome)
            except Exception:
                log.failure("on_applied hook failed")
        if (
            outcome.notifications
            and self._on_committed is not None
            and committed.transaction != self._woken_for
        ):
            # Every report of the transaction is committed by now: one
            # wake-up covers all their outbox rows.
            self._woken_for = committed.transaction
            self._on_committed(outcome.notifications)
        return outcome

    def _log_outcome(self, node_id: str, outcome: storage.ReportOutcome) -> None:
        if outcome.drop_counts:
            for reason, n in outcome.drop_counts.items():
                metrics.DROPPED_ENTRIES.labels(node=node_id, reason=reason).inc(n)
            self.drop_log.note(node_id, outcome.drop_counts)
        if outcome.new_epoch:
            log.info(
                "node {node}: revision {revision} went backwards (wiped node?):"
                " new revision epoch for its tasks",
                node=node_id,
                revision=outcome.revision,
            )
        for gid in outcome.claimed:
            log.info("node {node} claimed legacy task {gid}", node=node_id, gid=gid)

    @property
    def legacy_retries_waiting(self) -> int:
        """Legacy reports waiting for their next try (tests, logs)."""
        return len(self._legacy_retries)

    def stop_retrying(self) -> None:
        """Try no legacy report again (the site stops): what they carried is
        lost, as a legacy frame lost on the wire is (docs/protocol.md)."""
        self._stopping = True
        for waiting in list(self._legacy_retries):
            waiting.cancel()

    def _not_committed(
        self,
        failure: Failure,
        session: INodeSession,
        message: storage.NodeReport,
        holding: Holding | None,
        arrived: float,
        refused: Callable[[], object],
        attempt: int,
    ) -> Deferred[storage.ReportOutcome | None] | None:
        self.reports_failed += 1
        metrics.REPORTS.labels(result="FAILED").inc()
        why = f"{type(failure.value).__name__}: {failure.getErrorMessage()}"
        if isinstance(message, TaskReport):
            log.error(
                "report {report} from {node} not committed, not ACKed (the node redelivers): {why}",
                report=message.report_id,
                node=session.node_id,
                why=why,
            )
            return None
        kept = _worth_retrying(message)
        if kept is None or self._stopping or not failure.check(DatabaseError):
            log.error(
                "legacy {type} from {node} not committed: {why}",
                type=type(message).__name__,
                node=session.node_id,
                why=why,
            )
            return None
        delay = self._legacy_backoff(attempt)
        log.error(
            "legacy {type} from {node} not committed: {why}; the site tries it again in"
            " {delay:.0f} s (a legacy node never sends it again)",
            type=type(message).__name__,
            node=session.node_id,
            why=why,
            delay=delay,
        )
        waiting = deferLater(self._clock, delay, lambda: None)
        self._legacy_retries[waiting] = None

        def again(_: object) -> Deferred[storage.ReportOutcome | None]:
            self._legacy_retries.pop(waiting, None)
            return self._queue(session, kept, holding, arrived, refused, attempt + 1)

        def stopped(reason: Failure) -> None:
            reason.trap(CancelledError)
            self._legacy_retries.pop(waiting, None)
            log.warn(
                "legacy {type} from {node} not committed before the stop: lost",
                type=type(message).__name__,
                node=session.node_id,
            )

        return waiting.addCallbacks(again, stopped)

    def _bookkeeping_failed(self, failure: Failure) -> None:
        log.failure("report pipeline bookkeeping failed", failure)

    def _ended(self, result: storage.ReportOutcome | None) -> storage.ReportOutcome | None:
        self._in_flight -= 1
        if not self._in_flight:
            waiters, self._idle = self._idle, []
            for d in waiters:
                d.callback(None)
        return result


def _worth_retrying(message: storage.NodeReport) -> storage.NodeReport | None:
    """What of a legacy report no later one says again: a ``StatusReport``'s
    completed entries, a ``DeleteResult`` whole (``None``: nothing)."""
    if isinstance(message, StatusReport):
        done = tuple(e for e in message.gallery_tasks if e.status == NodeCode.COMPLETED)
        return StatusReport(done) if done else None
    return message
