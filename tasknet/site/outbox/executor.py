"""The outbox executor: the one service the composition root wires, which
drains committed notifications through the outbox's rooms (the package
doc), off the commit path (LIFECYCLE.md invariant 8).

A commit that wrote outbox rows calls :meth:`OutboxExecutor.wake`, which
only schedules a drain; the drain reads committed rows (reader connection)
through the tail, pushes them to the WebSocket clients, hands the webhook
room's rows to its sender and asks the marks machine for a marking.  Rows
left undelivered by a previous run are delivered once the executor starts
(its first poll, and the service's ``wake()`` at start).  ``wakeups``
carries ``tasknet_outbox`` (sent at the commit of every transaction that
wrote rows, whichever process wrote them): each site drains at once
instead of at its next poll; the poll stays the safety net.

Housekeeping: with no webhook configured a row is deleted as soon as it is
fanned out to the WebSocket clients (nothing else will read it).  With a
webhook, finished rows (WebSocket delivered, webhook delivered or given up)
older than ``retention_days`` are deleted every ``prune_interval`` seconds
(and once at start), ``prune_batch`` rows per write transaction, so the
table does not grow without limit and no prune ever holds the writer the
reports need for long.

Its ``TimerService`` children, each on the executor's clock: the poll
(``poll_interval``: rows written by another process, the admin CLI, have
no in-process commit to wake it), the prune (``prune_interval``), the
liveness sweep (at the poll interval, with a watch) and the webhook room's
timers (shared: the claim renewer, every third of the lease).
"""

from __future__ import annotations

from twisted.application.internet import TimerService
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from tasknet.coalesce import CoalescingRunner
from tasknet.site import metrics
from tasknet.site.outbox.liveness import LivenessSweep, LivenessWatch
from tasknet.site.outbox.marks import Marks
from tasknet.site.outbox.tail import LocalTail, Publisher, Tail
from tasknet.site.outbox.webhook import WebhookRoom
from tasknet.site.storage import outbox as outbox_rows
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Database

log = Logger()

#: Finished notifications are kept this long (for inspection), then pruned.
RETENTION_DAYS = 7.0
#: Seconds between prunes, and rows deleted per transaction.
PRUNE_INTERVAL = 3600.0
PRUNE_BATCH = 500


class OutboxExecutor(MultiService):
    """Drains the outbox after commits: WebSocket fan-out (``tail``, one
    site alone by default) and ``webhook``; pushes liveness changes
    (``liveness``).  The rooms are chosen by the composition root.

    A service: its ``TimerService`` children poll, prune, sweep and renew
    (the module doc); :meth:`stopService` also finishes the drain and the
    marks."""

    def __init__(
        self,
        db: Database,
        publisher: Publisher | None,
        webhook: WebhookRoom | None = None,
        *,
        tail: Tail | None = None,
        liveness: LivenessWatch | None = None,
        page_size: int = 500,
        poll_interval: float | None = 5.0,
        mark_interval: float = 0.25,
        retention_days: float = RETENTION_DAYS,
        prune_interval: float | None = PRUNE_INTERVAL,
        prune_batch: int = PRUNE_BATCH,
        clock: IReactorTime,
        wakeups: listen.Wakeups | None = None,
    ) -> None:
        """``liveness``: the watch swept at every ``poll_interval`` (none
        without a poll interval)."""
        if retention_days < 0 or prune_batch < 1:
            raise ValueError("outbox retention_days must be >= 0 and prune_batch >= 1")
        super().__init__()
        self._db = db
        self._clock: IReactorTime = clock
        self._publisher = publisher
        #: This site's position in the outbox (its WebSocket tail).
        self.tail: Tail = tail if tail is not None else LocalTail(db)
        self._webhook = webhook
        #: Pushes the views whose liveness changed without a commit.
        self.liveness = liveness
        self._wakeups: listen.Wakeups = wakeups if wakeups is not None else listen.NoWakeups()
        self._subscription: listen.Subscription | None = None
        self._retention_seconds = retention_days * 86400.0
        self._prune_batch = prune_batch
        self._pruning: Deferred[int] | None = None
        self._page_size = page_size
        #: The tail's marks (a state machine on the clock).
        self.marks = Marks(
            self._write_marks, self._marks_needed, interval=mark_interval, clock=clock
        )
        # Rows were committed while nobody was there to push them to: they
        # need marking, and the marking reads how far they go (last_id).
        self._unread = False
        self._drainer = CoalescingRunner(self._drain_logged)
        self._stopped = False
        #: Rows pushed to WebSocket clients since start (tests, logs).
        self.pushed = 0
        # Each timer's first call comes as it starts: the first poll delivers
        # what a previous run left, the first prune runs at start.
        timers: list[IService] = []
        if webhook is not None:
            webhook.sender.on_room = self.wake
            timers += webhook.timers
        if liveness is not None and poll_interval:
            timers.append(LivenessSweep(liveness, poll_interval, clock=clock))
        for interval, call in (
            (poll_interval, self.wake),
            (prune_interval, self._prune_in_background),
        ):
            if interval:
                timer = TimerService(interval, call)
                timer.clock = clock
                timers.append(timer)
        for each in timers:
            each.setServiceParent(self)

    def startService(self) -> None:
        """Start polling and pruning (the first poll delivers what a previous
        run left undelivered; ``wake()`` fires when that drain is done)."""
        self._stopped = False
        self.marks.start()
        self._db.read(outbox_rows.backlog).addCallbacks(
            metrics.OUTBOX_BACKLOG.set,
            lambda f: log.failure("reading the outbox backlog failed", f),
        )
        if self._subscription is None:
            self._subscription = self._wakeups.subscribe(listen.OUTBOX, self._notified)
        # Shared: the tail registers now, before this site's clients connect
        # (SharedTail.join); a failed join is retried by the next drain or marking.
        Deferred.fromCoroutine(self.tail.join()).addErrback(
            lambda f: log.failure("registering this site's outbox tail failed; retried", f)
        )
        super().startService()

    def _notified(self, channel: str, payload: str | None) -> None:
        # Rows were committed somewhere (or notifications were lost: drain
        # anyway, it is one read).
        self.wake()

    def wake(self, _notifications: int = 0) -> Deferred[None]:
        """New rows were committed: drain soon (coalesced; never blocks).
        The Deferred fires when the drain that covers them is done."""
        if self._stopped:
            return succeed(None)
        if self._drainer.running:
            return self._drainer.run()
        if self._nobody_to_deliver_to():
            # No read per wake (a create wakes us three times): the marking,
            # at most every mark_interval, reads the watermark once.
            self._unread = True
            self.marks.ask()
            return succeed(None)
        return self._drainer.run()

    def _ws_listening(self) -> bool:
        return self._publisher is not None and self._publisher.listening()

    def _nobody_to_deliver_to(self) -> bool:
        return self._webhook is None and not self._ws_listening()

    async def _drain_logged(self) -> None:
        try:
            await self._drain()
        except Exception:
            log.failure("outbox drain failed; retried on the next wake")

    async def _drain(self) -> None:
        await self.tail.join()
        while not self._stopped:
            if not self._ws_listening():
                # Nobody to push to: the rows need marking, not reading.
                self._unread = True
                break
            rows = await self.tail.rows(self._page_size)
            if not rows:
                break
            for row in rows:
                assert self._publisher is not None
                self.pushed += self._publisher.publish(row.user_id, row.payload)
            self.tail.after = rows[-1].id
        await self._feed_webhook()
        self.marks.ask()
        sender = self._webhook.sender if self._webhook is not None else None
        if sender is not None and sender.room() == 0 and not self._stopped:
            # Full: more rows wait in the database than the sender holds.
            metrics.OUTBOX_BACKLOG.set(await self._db.read(outbox_rows.backlog))
        else:
            metrics.OUTBOX_BACKLOG.set(len(sender.known) if sender is not None else 0)

    async def _feed_webhook(self) -> None:
        """Hand the webhook sender the next pending rows while it has room:
        a dead webhook holds ``max_held`` rows, the rest stay in the
        database and are read here once it drains (its ``on_room`` wakes us,
        and so does the poll)."""
        webhook = self._webhook
        while webhook is not None and not self._stopped:
            room = min(webhook.sender.room(), self._page_size)
            if room <= 0:
                break
            rows = await webhook.take(room)
            for row in rows:
                webhook.sender.enqueue(row)
            if len(rows) < room:
                break

    def _marks_needed(self) -> bool:
        return self.tail.after > self.tail.marked or self._unread

    async def _write_marks(self) -> bool:
        """One marking (run by :attr:`marks`): ``False`` when it stopped
        early (logged; the next wake or poll retries)."""
        try:
            await self.tail.join()
        except Exception:
            log.failure("registering this site's outbox tail failed")
            return False  # nothing marked: the next wake or poll retries
        if self._unread:
            self._unread = False
            if not self._ws_listening():
                # Committed before this read with nobody listening: "drained"
                # (at-least-once to the clients connected when drained).
                try:
                    last = await self._db.read(outbox_rows.last_id)
                except Exception:
                    log.failure("reading the outbox watermark failed")
                    return False  # left unmarked: the next wake or poll retries
                self.tail.after = max(self.tail.after, last)
            else:
                self.wake()  # a client came meanwhile: push them first
        # Left unmarked if a write fails: pushed again after a restart.
        return await self.tail.mark(skip_webhook=self._webhook is None)

    def _prune_in_background(self) -> None:
        # Not returned to the timer: a slow prune must not stop it,
        # and one already running is not started twice.
        if self._pruning is None and not self._stopped:
            self._pruning = Deferred.fromCoroutine(self.prune())
            self._pruning.addErrback(lambda f: log.failure("pruning the outbox failed", f))
            self._pruning.addBoth(self._pruned)

    def _pruned(self, result: object) -> object:
        self._pruning = None
        return result

    async def prune(self) -> int:
        """Delete the finished rows older than the retention, oldest first,
        ``prune_batch`` per write transaction; stop early when stopped.
        Returns the number of rows deleted."""
        found = await self._db.read(outbox_rows.prunable, self._retention_seconds)
        if found.first is None:
            return 0  # nothing to prune: no write transaction at all
        total = 0
        after = found.first - 1
        while not self._stopped:
            deleted, after = await self._db.write(
                outbox_rows.prune_finished, after, found.below, self._prune_batch
            )
            total += deleted
            if deleted < self._prune_batch:
                break
        if total:
            log.info("pruned {n} delivered notification(s) from the outbox", n=total)
        return total

    def stopService(self) -> Deferred[None]:
        """Stop polling, draining, sweeping, renewing and pruning; cancel
        webhook work (undelivered rows stay in the outbox for the next
        start)."""
        self._stopped = True
        timers: Deferred[None] = super().stopService() if self.running else succeed(None)
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            timers.addCallback(lambda _: subscription.cancel())
        return timers.addCallback(lambda _: Deferred.fromCoroutine(self._finish()))

    async def _finish(self) -> None:
        if self._pruning is not None:
            await self._pruning
        await self._drainer.idle()
        await self.marks.stop()
        if self._webhook is not None:
            await self._webhook.sender.stop()
        if self.tail.joined:
            await self._leave()

    async def _leave(self) -> None:
        """A registered tail's clean stop: give back the webhook claims and
        stop holding the others' marks back."""
        try:
            if self._webhook is not None:
                await self._webhook.release()
            await self.tail.leave()
        except Exception:
            log.failure("leaving the outbox readers failed (the reaper frees them)")
        self.tail.joined = False
