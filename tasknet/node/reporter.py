"""Reports to the site: reliable v2 snapshots, or the legacy fire-and-forget.

v2 (PROTOCOL.md, "Reliable reports", node side): a TaskReport is a snapshot of
every task held (an entry says ``queued`` while its task waits for a download
slot, and carries its last error as ``detail``); at most one is in flight; it
is persisted before it is sent and resent unchanged (same reportId and
revision) on reconnect and whenever no ACK arrives within ``ack_timeout``.
Changes made meanwhile only mark the state dirty and go into the next
snapshot, taken once the in-flight one is ACKed.
Completed, deleted and released entries leave the node in the ACK's own
transaction.

Legacy (``--protocol 1``, or a v2 node on a legacy site): a StatusReport of
every task and a DeleteResult per finished delete, and — the old behaviour,
kept on purpose — a finished task is dropped right after its status was sent,
ACK or not (docs/protocol.md, "The legacy boundary").  The legacy wire has
no ``released``: releases stay in the store until a v2 link carries them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from tasknet.coalesce import CoalescingRunner
from tasknet.node.store import FAILED, NodeStore, PendingReport
from tasknet.protocol.messages import (
    ACK_APPLIED,
    DeletedEntry,
    DeleteResult,
    ReleasedEntry,
    StatusReport,
    TaskEntry,
    TaskReport,
    TaskReportAck,
)
from tasknet.protocol.session import ISiteLink
from tasknet.runtime import IEntropy
from tasknet.status import NodeCode

log = Logger()

DEBOUNCE = 0.3  # seconds: progress ticks of many tasks coalesce into one snapshot
RETRY_AFTER_ERROR = 1.0


def to_message(report: PendingReport) -> TaskReport:
    return TaskReport(
        report_id=report.report_id,
        revision=report.revision,
        gallery_tasks=tuple(report.gallery_tasks),
        operation_ids=dict(report.operation_ids),
        deleted=tuple(DeletedEntry(*d) for d in report.deleted),
        released=tuple(ReleasedEntry(*r) for r in report.released),
    )


class Reporter:
    def __init__(
        self,
        store: NodeStore,
        *,
        legacy_node: bool,
        ack_timeout: float = 10.0,
        debounce: float = DEBOUNCE,
        clock: IReactorTime,
        queued: Callable[[], Collection[int]] = frozenset,
        entropy: IEntropy,
    ) -> None:
        """``clock``: the debounce and ACK timers, the reports' revisions;
        ``entropy``: the report ids (the node's root's)."""
        self.store = store
        self.entropy: IEntropy = entropy
        #: The gids waiting for a download slot now (their entries say ``queued``).
        self.queued = queued
        self.legacy_node = legacy_node
        self.ack_timeout = ack_timeout
        self.debounce = debounce
        self.clock: IReactorTime = clock
        self.link: ISiteLink | None = None
        self.in_flight: PendingReport | None = None
        #: When the report in flight was taken (or found at start), on ``clock``.
        self.in_flight_since: float | None = None
        self._dirty = True  # a fresh start reports what it holds
        self._flush_call: IDelayedCall | None = None
        self._ack_call: IDelayedCall | None = None
        # A flush asked for while one runs runs once more after it.
        self._flusher = CoalescingRunner(self._flush_once)
        self._stopped = False

    async def load(self) -> None:
        """Pick up the report left in flight by the previous run."""
        self.in_flight = await self.store.in_flight_report()
        if self.in_flight is not None:
            self.in_flight_since = self.clock.seconds()

    def stop(self) -> None:
        self._stopped = True
        self.link = None
        self._cancel(self._flush_call)
        self._cancel(self._ack_call)
        self._flush_call = self._ack_call = None

    def idle(self) -> Deferred[None]:
        """Fires once no flush is running (shutdown, tests)."""
        return self._flusher.idle()

    @property
    def legacy(self) -> bool:
        link = self.link
        return self.legacy_node or (link is not None and link.protocol_version == 1)

    # events -----------------------------------------------------------------
    def link_up(self, link: ISiteLink) -> None:
        self.link = link
        if self.legacy:
            self.changed()
        elif self.in_flight is not None:
            self._send_in_flight()
        else:
            self.changed()

    def link_down(self, link: ISiteLink) -> None:
        if link is self.link:
            self.link = None
            self._cancel(self._ack_call)
            self._ack_call = None

    def changed(self) -> None:
        """Something a report shows changed: report it soon (debounced)."""
        self._dirty = True
        self._schedule(self.debounce)

    def ack_received(self, ack: TaskReportAck) -> Deferred[None]:
        return Deferred.fromCoroutine(self._ack(ack))

    # v2 -----------------------------------------------------------------------
    async def _ack(self, ack: TaskReportAck) -> None:
        current = self.in_flight
        if current is None or current.report_id != ack.report_id:
            log.warn("ACK for {report_id} which is not in flight: ignored", report_id=ack.report_id)
            return
        if not await self.store.acknowledge(ack.report_id):
            return
        # Routine (twice a second while anything moves): debug; a DUPLICATE
        # (a resend the site had already applied) is worth a line.
        emit = log.debug if ack.result == ACK_APPLIED else log.info
        emit(
            "report {report_id} (revision {revision}) ACKed: {result}",
            report_id=ack.report_id,
            revision=current.revision,
            result=ack.result,
        )
        if self.in_flight is current:
            self.in_flight = None
            self.in_flight_since = None
        self._cancel(self._ack_call)
        self._ack_call = None
        if self._dirty:
            self._schedule(0)

    def _send_in_flight(self) -> None:
        report, link = self.in_flight, self.link
        if report is None or link is None or self._stopped:
            return
        link.send(to_message(report))
        self._cancel(self._ack_call)
        self._ack_call = self.clock.callLater(self.ack_timeout, self._ack_timed_out)

    def _ack_timed_out(self) -> None:
        self._ack_call = None
        if self.in_flight is not None and self.link is not None:
            log.info(
                "no ACK for report {report_id} in {timeout} s: resending",
                report_id=self.in_flight.report_id,
                timeout=self.ack_timeout,
            )
            self._send_in_flight()

    async def _snapshot(self) -> None:
        if self.in_flight is not None or not self._dirty:
            return
        self._dirty = False
        report = await self.store.create_report(
            self.entropy.uuid4().hex, int(self.clock.seconds() * 1000), frozenset(self.queued())
        )
        if report is None:
            return
        self.in_flight = report
        self.in_flight_since = self.clock.seconds()
        self._send_in_flight()

    # legacy ---------------------------------------------------------------------
    async def _legacy_flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        tasks, deletions = await self.store.legacy_snapshot()
        link = self.link
        if link is None:
            self._dirty = True
            return
        for deletion in deletions:
            link.send(DeleteResult(deletion.gid, deletion.result != FAILED, deletion.reason))
            await self.store.drop_deletion(deletion.gid, deletion.operation_id)
        if tasks:
            link.send(StatusReport(tuple(TaskEntry(t.gid, t.status, t.progress) for t in tasks)))
            # The old node forgot a finished task as soon as its status was
            # written to the socket: the site may never have seen it.
            finished = [(t.gid, t.operation_id) for t in tasks if t.status == NodeCode.COMPLETED]
            if finished:
                await self.store.drop_reported_completions(finished)

    # scheduling -------------------------------------------------------------------
    def _schedule(self, delay: float) -> None:
        if self._stopped or (self._flush_call is not None and self._flush_call.active()):
            return
        self._flush_call = self.clock.callLater(delay, self._flush)

    def _flush(self) -> None:
        self._flush_call = None
        if self.link is None or self._stopped:
            return
        self._flusher.run().addCallback(self._flushed)

    async def _flush_once(self) -> None:
        try:
            await (self._legacy_flush() if self.legacy else self._snapshot())
        except Exception:
            log.failure("report failed; retrying")
            self._dirty = True
            self._schedule(RETRY_AFTER_ERROR)

    def _flushed(self, _result: object) -> None:
        if self._dirty and (self.legacy or self.in_flight is None):
            self._schedule(self.debounce)

    @staticmethod
    def _cancel(call: IDelayedCall | None) -> None:
        if call is not None and call.active():
            call.cancel()
