"""Housekeeping on a schedule: prunes node report receipts and audit rows
(reconciliation verdicts, forced deletes) past their retention
(docs/operations.md "Retention and limits"; the SQL is
:mod:`tasknet.site.storage.retention`).  The outbox prunes itself
(:class:`tasknet.site.outbox.OutboxExecutor`).

A service: runs every ``interval`` seconds on the site's clock (and once
at start; a ``TimerService`` child), ``batch`` rows per write transaction; a
prune still running when the next is due is not started twice, and
:meth:`Housekeeping.stopService` waits for it.

Sites sharing a database prune one at a time (SCALE.md 7): a prune
transaction that finds another site's under way does nothing, and the pass
ends there (that site is doing the work; the next pass looks again).
"""

from __future__ import annotations

from datetime import UTC, datetime

from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from tasknet.site.storage import retention
from tasknet.site.storage.engine.database import Database

log = Logger()

#: A receipt is kept this long (and each node's newest for ever): far past
#: any ACK timeout or reconnect, so a redelivery is answered DUPLICATE.
RECEIPT_RETENTION_DAYS = 7.0
#: Who resolved an UNKNOWN or forced a delete, and why, is kept a year.
AUDIT_RETENTION_DAYS = 365.0
INTERVAL = 3600.0
BATCH = 2000


def stored_timestamp(seconds: float) -> str:
    """``seconds`` (Unix time) in the format the database stores ``now`` in."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"


class Housekeeping(MultiService):
    """The periodic prune of receipts and audit rows over ``db``."""

    def __init__(
        self,
        db: Database,
        *,
        clock: IReactorTime,
        receipt_retention_days: float = RECEIPT_RETENTION_DAYS,
        audit_retention_days: float = AUDIT_RETENTION_DAYS,
        interval: float = INTERVAL,
        batch: int = BATCH,
    ) -> None:
        if receipt_retention_days < 0 or audit_retention_days < 0 or batch < 1 or interval <= 0:
            raise ValueError("retentions must be >= 0, the interval > 0 and the batch >= 1")
        super().__init__()
        self._db = db
        self._clock: IReactorTime = clock
        timer = TimerService(interval, self._in_background)
        timer.clock = self._clock
        timer.setServiceParent(self)
        self._receipt_seconds = receipt_retention_days * 86400.0
        self._audit_seconds = audit_retention_days * 86400.0
        self._batch = batch
        self._running: Deferred[None] | None = None
        self._stopped = False
        #: Rows pruned since start, by table, passes finished, and passes cut
        #: short because another site was pruning (tests, logs).
        self.pruned = {"report_receipt": 0, "audit": 0}
        self.runs = 0
        self.yielded = 0
        self._other_site_pruning = False

    def startService(self) -> None:
        self._stopped = False
        super().startService()

    def _in_background(self) -> None:
        # Not returned to the timer: a failed or slow prune must not stop it.
        if self._running is None and not self._stopped:
            self._running = Deferred.fromCoroutine(self.prune())
            self._running.addErrback(lambda f: log.failure("housekeeping prune failed", f))
            self._running.addBoth(self._done)

    def _done(self, result: object) -> None:
        self._running = None

    async def prune(self) -> None:
        """One pass: receipts, then audit rows, each in batches; cut short
        when another site is pruning (that site does the rest)."""
        now = self._clock.seconds()
        self._other_site_pruning = False
        receipts = await self._prune_receipts(stored_timestamp(now - self._receipt_seconds))
        audit = 0
        if not self._other_site_pruning:
            audit = await self._prune_audit(stored_timestamp(now - self._audit_seconds))
        self.pruned["report_receipt"] += receipts
        self.pruned["audit"] += audit
        self.runs += 1
        if self._other_site_pruning:
            self.yielded += 1
            log.info("housekeeping: another site is pruning now; this pass stops here")
        if receipts or audit:
            log.info(
                "housekeeping: pruned {receipts} report receipt(s), {audit} audit row(s)",
                receipts=receipts,
                audit=audit,
            )

    async def _prune_receipts(self, cutoff: str) -> int:
        found = await self._db.read(retention.prunable_receipts, cutoff)
        if not found.keep:
            return 0  # no receipt is old: no write transaction at all
        total, after = 0, 0
        while not self._stopped and after < found.below:
            batch = await self._db.write(
                retention.prune_receipts, after, found.below, found.keep, self._batch
            )
            if batch is None:
                self._other_site_pruning = True
                break
            deleted, after = batch
            total += deleted
        return total

    async def _prune_audit(self, cutoff: str) -> int:
        total = 0
        while not self._stopped:
            deleted = await self._db.write(retention.prune_audit, cutoff, self._batch)
            if deleted is None:
                self._other_site_pruning = True
                break
            total += deleted
            if deleted < self._batch:
                break
        return total

    def stopService(self) -> Deferred[None]:
        """Stop the timer; fires once a prune under way has stopped."""
        self._stopped = True
        timer: Deferred[None] = super().stopService() if self.running else succeed(None)
        return timer.addCallback(lambda _: self._running)
