"""The outbox's webhook room: the sender, and where its rows come from.

Delivery semantics: at-least-once, one POST of the row's payload per row
(header ``X-Tasknet-Notification: <row id>`` lets a receiver drop repeats),
with a timeout, retries with exponential backoff up to ``max_attempts``
(``webhook_state`` ``delivered`` or ``failed``), at most ``concurrency``
requests at once.  Rows of different tasks may arrive out of order.
Backpressure: the sender holds at most ``max_held`` rows in memory (queued,
in flight, waiting for a retry); the executor hands it rows from the
database, in id order, only while it has room, so a dead webhook with a
large backlog costs ``max_held`` rows of memory, not the backlog.  Its
requests run concurrently (bounded) and their outcomes are written in small
batched transactions of their own: a slow or dead webhook never delays a
commit or an ACK.

Where the rows come from is chosen once, by the composition root
(``tasknet.site.root``):

* :class:`LocalWebhook`, one site alone on its database: the pending rows
  after the last one handed over, in id order;
* :class:`SharedWebhook`, several sites on one PostgreSQL database (SCALE.md
  6, ``storage/outbox.py``): webhook rows are claimed with a lease
  (``FOR UPDATE SKIP LOCKED``), renewed every third of ``webhook_lease``
  while held (:class:`ClaimRenewer`, a ``TimerService`` of its own) and
  given back at a clean stop: each row is delivered by one site
  (at-least-once across a crash, whose claims another site takes over once
  the lease ran out or the reaper freed them).  The sender's in-memory set
  only keeps one site from holding a row twice; the claim is what keeps two
  sites apart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import treq
from twisted.application.internet import TimerService, backoffPolicy
from twisted.application.service import IService
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from tasknet.coalesce import CoalescingRunner
from tasknet.netclient import DirectEndpoints, quiet_pool
from tasknet.site import metrics
from tasknet.site.storage import outbox as outbox_rows
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.engine.errors import DatabaseError
from tasknet.site.upstream_client import BytesBody

log = Logger()

#: Outbox rows a webhook sender holds in memory at most (queued, in flight,
#: waiting for a retry); the rest wait in the database (a dead webhook).
MAX_HELD = 1000
#: Seconds before webhook outcomes whose write failed are written again.
RESULTS_RETRY = 2.0


class WebhookSender:
    """POSTs outbox rows to one URL: bounded concurrency, timeout, retries,
    and at most ``max_held`` rows in memory (queued, in flight or waiting
    for a retry).  The executor hands rows over only while :meth:`room` is
    positive and reads the rest from the database later; ``on_room()`` is
    called when a full sender has drained to half, so that it does."""

    def __init__(
        self,
        url: str,
        db: Database,
        *,
        concurrency: int = 4,
        timeout: float = 10.0,
        max_attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        max_held: int = MAX_HELD,
        clock: IReactorTime,
        reactor: IReactorTCP,
    ) -> None:
        """``clock`` times the retries and the requests' timeouts;
        ``reactor`` is what the connection pool connects on.  The root
        passes the site's reactor as both (a test may time on a
        ``task.Clock`` and connect on a real reactor)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook URL must be http:// or https://, got {url!r}")
        if concurrency < 1 or max_attempts < 1 or timeout <= 0 or max_held < 1:
            raise ValueError(
                "webhook concurrency, max_attempts, max_held and timeout must be positive"
            )
        self.url = url
        self._db = db
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._retry_delay = backoffPolicy(backoff, max_backoff, factor=2.0, jitter=lambda: 0.0)
        self._concurrency = concurrency
        self.max_held = max_held
        self._clock: IReactorTime = clock
        self._pool = quiet_pool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = concurrency
        self._agent = Agent.usingEndpointFactory(reactor, DirectEndpoints(reactor), pool=self._pool)
        #: Row ids handed over and not yet finished (queued, in flight, backing off).
        self.known: set[int] = set()
        #: The most rows held at once since start (tests, logs).
        self.peak_held = 0
        self.on_room: Callable[[], object] = lambda: None
        self._ready: deque[tuple[outbox_rows.OutboxRow, int]] = deque()
        self._in_flight = 0
        self._pumping = False
        #: Requests in flight, in the order they were made (``stop`` cancels
        #: them in that order).
        self._requests: dict[Deferred[Any], None] = {}
        self._retries: dict[int, IDelayedCall] = {}
        self._results: list[outbox_rows.WebhookResult] = []
        self._writer = CoalescingRunner(self._write_results)
        # Outcomes whose write failed are written again after this long: a
        # delivery not recorded would stay pending, and be sent again only
        # after the next start.
        self._results_retry: IDelayedCall | None = None
        self._stopped = False
        self.delivered = 0

    def room(self) -> int:
        """How many more rows may be handed over now."""
        return 0 if self._stopped else max(0, self.max_held - len(self.known))

    def enqueue(self, row: outbox_rows.OutboxRow) -> bool:
        """Take ``row`` (``False``: stopped, already held, or no room)."""
        if self._stopped or row.id in self.known or len(self.known) >= self.max_held:
            return False
        self.known.add(row.id)
        self.peak_held = max(self.peak_held, len(self.known))
        self._ready.append((row, row.webhook_attempts))
        self._pump()
        return True

    def _pump(self) -> None:
        # A loop, not recursion: an attempt that finishes at once (stopped,
        # refused) calls back in here, and only the outer call starts more.
        if self._pumping:
            return
        self._pumping = True
        try:
            while self._ready and self._in_flight < self._concurrency and not self._stopped:
                row, attempts = self._ready.popleft()
                self._in_flight += 1
                d = Deferred.fromCoroutine(self._attempt(row, attempts))
                d.addErrback(lambda f: log.failure("webhook bookkeeping failed", f))
                d.addBoth(self._attempt_done)
        finally:
            self._pumping = False

    def _attempt_done(self, _: object) -> None:
        self._in_flight -= 1
        self._pump()

    async def _attempt(self, row: outbox_rows.OutboxRow, attempts: int) -> None:
        if self._stopped:
            return
        attempts += 1
        error: str | None = None
        request = treq.post(
            self.url,
            # Written whole: treq would stream bytes on the global cooperator.
            data=BytesBody(row.payload.encode("utf-8")),
            headers=Headers(
                {
                    "Content-Type": ["application/json"],
                    "X-Tasknet-Notification": [str(row.id)],
                }
            ),
            agent=self._agent,
        )
        # Timed on the sender's clock (treq's own timeout takes the global reactor).
        request.addTimeout(self._timeout, self._clock)
        self._requests[request] = None
        try:
            response = await request
            await treq.content(response)
            if not 200 <= response.code < 300:
                error = f"HTTP {response.code}"
        except Exception as e:  # timeout, refused, reset, cancelled at stop
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        finally:
            self._requests.pop(request, None)
        if self._stopped:
            return  # not recorded: still pending, delivered after the restart
        if error is None:
            self.delivered += 1
            self._finish(
                outbox_rows.WebhookResult(row.id, outbox_rows.WEBHOOK_DELIVERED, attempts, None)
            )
            return
        metrics.WEBHOOK_FAILURES.inc()
        if attempts >= self._max_attempts:
            log.warn(
                "webhook gave up on notification {id} after {n} attempts: {error}",
                id=row.id,
                n=attempts,
                error=error,
            )
            self._finish(
                outbox_rows.WebhookResult(row.id, outbox_rows.WEBHOOK_FAILED, attempts, error)
            )
            return
        delay = self._retry_delay(attempts - 1)
        self._record(
            outbox_rows.WebhookResult(row.id, outbox_rows.WEBHOOK_PENDING, attempts, error)
        )
        self._retries[row.id] = self._clock.callLater(delay, self._retry, row, attempts)

    def _retry(self, row: outbox_rows.OutboxRow, attempts: int) -> None:
        self._retries.pop(row.id, None)
        if not self._stopped:
            self._ready.append((row, attempts))
            self._pump()

    def _finish(self, result: outbox_rows.WebhookResult) -> None:
        self.known.discard(result.id)
        self._record(result)
        if len(self.known) == self.max_held // 2:
            # Drained to half from above (one row finishes at a time): the
            # executor reads the next pending rows from the database.
            try:
                self.on_room()
            except Exception:
                log.failure("asking for more webhook rows failed")

    def _record(self, result: outbox_rows.WebhookResult) -> None:
        self._results.append(result)
        self._writer.run()

    async def _write_results(self) -> None:
        # Outcomes that arrive while one write is running go into the next.
        batch, self._results = self._results, []
        if not batch:
            return
        try:
            await self._db.write(outbox_rows.record_webhook_results, batch)
        except DatabaseError as e:
            # Recording an outcome twice changes nothing (only a pending row
            # is updated): keep them for the next write.
            log.error(
                "recording {n} webhook result(s) failed ({error}); again in {delay:.0f} s",
                n=len(batch),
                error=e,
                delay=RESULTS_RETRY,
            )
            self._results[:0] = batch
            if not self._stopped and self._results_retry is None:
                self._results_retry = self._clock.callLater(RESULTS_RETRY, self._write_again)
        except Exception:
            log.failure("recording {n} webhook result(s) failed", n=len(batch))

    def _write_again(self) -> None:
        self._results_retry = None
        self._writer.run()

    def drop(self, ids: Iterable[int]) -> None:
        """Forget rows another site now holds (our claim on them lapsed):
        not queued, not retried.  A request already in flight still lands
        (its outcome is recorded only while the row is pending)."""
        gone = set(ids) & self.known
        if not gone:
            return
        self.known -= gone
        self._ready = deque(item for item in self._ready if item[0].id not in gone)
        for row_id in gone:
            call = self._retries.pop(row_id, None)
            if call is not None and call.active():
                call.cancel()

    def idle(self) -> bool:
        return not self.known and not self._results and not self._writer.running

    async def stop(self) -> None:
        """Drop the queued rows, cancel pending retries and requests in
        flight (their rows stay ``pending`` and are delivered after the next
        start), finish writing the outcomes already known, close the
        connection pool.  Leaves no delayed call behind."""
        self._stopped = True
        self._ready.clear()
        for call in self._retries.values():
            if call.active():
                call.cancel()
        self._retries.clear()
        if self._results_retry is not None and self._results_retry.active():
            self._results_retry.cancel()  # one last try now; then pending at the next start
            self._writer.run()
        self._results_retry = None
        for request in list(self._requests):
            request.cancel()
        self.known.clear()
        await self._writer.idle()
        await self._pool.closeCachedConnections()


class WebhookRoom(Protocol):
    """The webhook room as the executor sees it: the sender, where its rows
    come from (:meth:`take`), the timers it runs (children of the
    executor) and what it gives back at a clean stop (:meth:`release`)."""

    sender: WebhookSender
    timers: Sequence[IService]

    async def take(self, room: int) -> list[outbox_rows.OutboxRow]: ...

    async def release(self) -> None: ...


class LocalWebhook:
    """One site alone on its database: the pending rows, in id order, after
    the last one handed over (the sender's set keeps a row held once)."""

    timers: Sequence[IService] = ()

    def __init__(self, sender: WebhookSender, db: Database) -> None:
        self.sender = sender
        self._db = db
        self._after = 0  # rows up to this id were handed to the sender

    async def take(self, room: int) -> list[outbox_rows.OutboxRow]:
        rows: list[outbox_rows.OutboxRow] = await self._db.read(
            outbox_rows.webhook_rows, self._after, room
        )
        if rows:
            self._after = rows[-1].id
        return rows

    async def release(self) -> None:
        """Nothing claimed, nothing to give back."""


class SharedWebhook:
    """Several sites on one database: the rows are claimed with a lease of
    ``lease`` seconds, renewed by :attr:`renewer` (every third of the lease,
    on ``clock``) while the sender holds them, and given back at a clean
    stop (the module doc)."""

    def __init__(
        self,
        sender: WebhookSender,
        db: Database,
        instance_id: int,
        *,
        lease: float = outbox_rows.WEBHOOK_LEASE,
        clock: IReactorTime,
    ) -> None:
        if lease <= 0:
            raise ValueError(f"webhook_lease must be > 0, got {lease}")
        self.sender = sender
        self._db = db
        self._instance_id = instance_id
        self.lease = lease
        #: Renews the claims every third of the lease.
        self.renewer = ClaimRenewer(self, clock=clock)
        self.timers: Sequence[IService] = (self.renewer,)

    async def take(self, room: int) -> list[outbox_rows.OutboxRow]:
        # A read first: most wakes find nothing claimable (another site has
        # them, or there is none), and a read costs no write transaction.
        if not await self._db.read(outbox_rows.claimable_webhook_rows):
            return []
        rows: list[outbox_rows.OutboxRow] = await self._db.write(
            outbox_rows.claim_webhook_rows, self._instance_id, room, self.lease
        )
        return rows

    async def renew(self) -> None:
        """Extend the lease of every row the sender holds; the rows whose
        claim lapsed (another site took them) are dropped."""
        lost = await self._db.write(
            outbox_rows.renew_webhook_claims,
            self._instance_id,
            sorted(self.sender.known),
            self.lease,
        )
        if lost:
            log.warn(
                "webhook: the claims on {n} notification(s) lapsed and another site took"
                " them; dropping them here",
                n=len(lost),
            )
            self.sender.drop(lost)

    async def release(self) -> None:
        """A clean stop: give the claims back (another site delivers them)."""
        await self._db.write(outbox_rows.release_webhook_claims, self._instance_id)


class ClaimRenewer(TimerService):
    """Renews the claims of a :class:`SharedWebhook` every third of its
    lease, on its own clock.  Its first call comes as it starts (nothing
    held yet: nothing written).  A renewal runs in the background, not
    returned to the timer: a failed one is logged and the next one tries
    again before the lease runs out."""

    def __init__(self, claims: SharedWebhook, *, clock: IReactorTime) -> None:
        super().__init__(claims.lease / 3, self._renew_in_background)
        self.clock = clock
        self._claims = claims
        #: Renewals started since start (tests, logs).
        self.renewals = 0

    def _renew_in_background(self) -> None:
        if self.running and self._claims.sender.known:
            self.renewals += 1
            d = Deferred.fromCoroutine(self._claims.renew())
            d.addErrback(lambda f: log.failure("renewing the webhook claims failed", f))
