"""The outbox executor: delivers committed notifications, off the commit path
(LIFECYCLE.md invariant 8).

Nothing here runs inside a report or lifecycle transaction.  A commit that
wrote outbox rows calls :meth:`OutboxExecutor.wake`, which only schedules a
drain; the drain reads committed rows (reader connection), pushes them to the
WebSocket clients, hands them to the webhook sender and marks them.  A slow
or dead webhook therefore never delays a commit or an ACK: its requests run
concurrently (bounded), and their outcomes are written in small batched
transactions of their own.

Delivery semantics:

* WebSocket: at-least-once to the clients connected when the row is drained;
  the row is then marked ``ws_delivered_at``.  A client that connects later
  does not get old rows replayed: it loads the current state
  (``GET /api/tasks``) and follows the pushes from then on.  A crash after
  the push and before the mark pushes the row again after the restart.
* Webhook: at-least-once, one POST of the row's payload per row (header
  ``X-Tasknet-Notification: <row id>`` lets a receiver drop repeats), with a
  timeout, retries with exponential backoff up to ``max_attempts``
  (``webhook_state`` ``delivered`` or ``failed``), at most ``concurrency``
  requests at once.  Rows of different tasks may arrive out of order.
  Backpressure: the sender holds at most ``max_held`` rows in memory
  (queued, in flight, waiting for a retry); the executor hands it rows from
  the database, in id order, only while it has room, so a dead webhook with
  a large backlog costs ``max_held`` rows of memory, not the backlog.
* Rows left undelivered by a previous run are delivered once the executor
  (a service) starts.

Several sites on one PostgreSQL database (*shared* mode: a database several
sites may share, ``db.capabilities.shared_by_sites``, and an
``instance_id``; SCALE.md 6, ``storage/outbox.py``):

* every site tails every row for its own WebSocket clients, from the newest
  row at its start, by id (the outbox lock makes ids visible in id order, so
  the tail never passes a row that may still commit); its marks record how
  far it read (``outbox_reader``), and a row is marked (or, without a
  webhook, deleted) only once every open instance has read it;
* webhook rows are claimed with a lease (``FOR UPDATE SKIP LOCKED``), renewed
  every third of ``webhook_lease`` while held and given back at a clean stop:
  each row is delivered by one site (at-least-once across a crash, whose
  claims another site takes over once the lease ran out or the reaper freed
  them).  The sender's in-memory set only keeps one site from holding a row
  twice; the claim is what keeps two sites apart;
* ``wakeups`` carries ``tasknet_outbox`` (sent at the commit of every
  transaction that wrote rows, whichever process wrote them): each site
  drains at once instead of at its next poll; the poll stays the safety net.

Housekeeping: with no webhook configured a row is deleted as soon as it is
fanned out to the WebSocket clients (nothing else will read it).  With a
webhook, finished rows (WebSocket delivered, webhook delivered or given up)
older than ``retention_days`` are deleted every
``prune_interval`` seconds (and once at start; a ``TimerService`` child, as
is the ``poll_interval`` poll), ``prune_batch`` rows per
write transaction, so the table does not grow without limit and no prune
ever holds the writer the reports need for long.

Liveness pushes (:class:`LivenessWatch`): some changes of a task's view
come with no commit of the task: its node dropped (or came back: the
view's ``nodeConnected``), or its download stopped moving (``speed`` gone
after ``throughput.STALL_SECONDS``, ``stalledSince`` after
``views.STALL_AFTER_SECONDS``).  At every poll (``poll_interval``) the
executor compares the connected nodes (and, while WebSocket clients
listen, the moving tasks) with what it saw last and pushes the current view of
each task whose liveness changed (straight to this site's clients, like a
drained row; nothing is written, and a webhook does not hear of it: the
task itself did not change).  A node that drops pushes its unfinished
tasks, newest first, at most ``node_limit`` of them (a client that shows
more marks the rest of that node's rows by the same push).

Reading the connected nodes lists every node's session row (10,000 of them
with as many nodes: most of an idle site's CPU when read at every poll).
One site alone on its database (not *shared*) writes those rows itself,
through its registry of connected nodes (``connected_nodes.py``), so the
watch reads them only when the registry's nodes changed since the last
read, when that read disagreed with the registry (a take or release still
on its way to the database, a row left by a previous run), and at least
every ``refresh_sweeps`` sweeps (a minute at the default poll) for what the
registry cannot see (the admin CLI).  Shared, other sites' logins and
drops change the rows unseen here: it reads them at every sweep.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol

import treq
from twisted.application.internet import TimerService, backoffPolicy
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from tasknet.coalesce import CoalescingRunner
from tasknet.netclient import DirectEndpoints, quiet_pool
from tasknet.site import metrics
from tasknet.site.storage import node_sessions, outbox, views
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Cursor, Database
from tasknet.site.storage.engine.errors import DatabaseError
from tasknet.site.upstream_client import BytesBody
from tasknet.status import TaskStatus

log = Logger()

#: Finished notifications are kept this long (for inspection), then pruned.
RETENTION_DAYS = 7.0
#: Seconds between prunes, and rows deleted per transaction.
PRUNE_INTERVAL = 3600.0
PRUNE_BATCH = 500
#: Outbox rows a webhook sender holds in memory at most (queued, in flight,
#: waiting for a retry); the rest wait in the database (a dead webhook).
MAX_HELD = 1000
#: Seconds before webhook outcomes whose write failed are written again.
RESULTS_RETRY = 2.0


#: The unfinished tasks of a node that dropped or came back pushed at most,
#: newest first; the moving tasks whose stall is watched at most.
LIVENESS_NODE_LIMIT = 500
LIVENESS_MOVING_LIMIT = 500
#: Sweeps at most between two reads of the connected nodes while the
#: registry says nothing changed (the module doc, last paragraph).
LIVENESS_REFRESH_SWEEPS = 12

#: The statuses whose row says something about its node (queued on it,
#: downloading on it, a delete waiting for it).
_NODE_BOUND = frozenset(
    status.value
    for status in (
        TaskStatus.SUBMITTED,
        TaskStatus.DOWNLOADING,
        TaskStatus.WAITING_COMPRESSION,
        TaskStatus.COMPRESSING,
        TaskStatus.DELETE_PENDING,
    )
)
_MOVING = frozenset({TaskStatus.DOWNLOADING.value, TaskStatus.COMPRESSING.value})


def _connected(cursor: Cursor) -> set[str]:
    """The connected nodes of the database."""
    return {holder.node_id for holder in node_sessions.holders(cursor)}


def _moving(cursor: Cursor, limit: int) -> dict[int, tuple[bool, bool]]:
    """The moving tasks (newest first, at most ``limit``) as
    ``{gid: (speed shown, stalled)}``."""
    moving, _, _ = views.list_tasks(
        cursor, views.TaskQuery(user_id=None, limit=limit, statuses=_MOVING)
    )
    return {
        view["gid"]: (view["speed"] is not None, view["stalledSince"] is not None)
        for view in moving
    }


def _connected_and_moving(
    cursor: Cursor, limit: int
) -> tuple[set[str], dict[int, tuple[bool, bool]]]:
    """The connected nodes of the database, and the moving tasks (one snapshot)."""
    return _connected(cursor), _moving(cursor, limit)


def _views_to_push(
    cursor: Cursor, nodes: Iterable[str], gids: Iterable[int], node_limit: int
) -> list[tuple[dict[str, Any], int | None]]:
    """``(view, owner)`` of ``gids`` and of the unfinished tasks of each of
    ``nodes`` (newest first, at most ``node_limit`` a node), each once."""
    wanted = list(dict.fromkeys(gids))
    for node in sorted(nodes):
        listed, _, _ = views.list_tasks(
            cursor,
            views.TaskQuery(user_id=None, limit=node_limit, statuses=_NODE_BOUND, node=node),
        )
        wanted += [view["gid"] for view in listed]
    found = views.task_views_and_owners(cursor, dict.fromkeys(wanted))
    pushed = []
    for gid in dict.fromkeys(wanted):
        view, owner = found.get(gid, (None, None))
        if view is not None:
            pushed.append((view, owner))
    return pushed


class LivenessWatch:
    """Pushes the views whose liveness changed without a commit (the module
    doc, "Liveness pushes").  :meth:`sweep` compares with the last sweep.

    The connected nodes are read at every sweep, clients or not (one small
    read), so that a node that drops just before a client's first sweep is
    still a change.  The moving tasks are read only while clients listen;
    the first sweep of a listening spell pushes those that are not live
    (no speed, or stalled), which may have changed unseen since the
    client loaded its list.  The very first sweep only records the nodes.

    ``nodes``: the node ids of this site's registry (its
    ``ConnectedNodes``, a mapping by node id, read only), when the site is
    alone on its database (not shared): the connected nodes are then read
    only when they can have changed (the module doc, last paragraph);
    ``None``: at every sweep."""

    def __init__(
        self,
        db: Database,
        publisher: Publisher,
        *,
        node_limit: int = LIVENESS_NODE_LIMIT,
        moving_limit: int = LIVENESS_MOVING_LIMIT,
        nodes: Collection[str] | None = None,
        refresh_sweeps: int = LIVENESS_REFRESH_SWEEPS,
    ) -> None:
        if refresh_sweeps < 1:
            raise ValueError(f"refresh_sweeps must be >= 1, got {refresh_sweeps}")
        self._db = db
        self._publisher = publisher
        self._node_limit = node_limit
        self._moving_limit = moving_limit
        self._nodes = nodes
        self._refresh_sweeps = refresh_sweeps
        self._connected: set[str] | None = None
        #: The registry's nodes when the connected nodes were last read.
        self._held_at_read: frozenset[str] | None = None
        self._sweeps_unread = 0
        self._moving: dict[int, tuple[bool, bool]] | None = None
        #: Views pushed since start (tests, logs).
        self.pushed = 0
        #: Reads of the connected nodes since start (tests, logs).
        self.connected_reads = 0

    def _held(self) -> frozenset[str] | None:
        # Attached, not only held: a login's take may still be on its way
        # (then the read disagrees, and the next sweep reads again).
        return None if self._nodes is None else frozenset(self._nodes)

    def _must_read(self, held: frozenset[str] | None) -> bool:
        """Whether the connected nodes can have changed since the last read."""
        return (
            held is None
            or self._connected is None
            or held != self._held_at_read  # logins or drops here since
            or self._connected != held  # still on their way to the database
            or self._sweeps_unread + 1 >= self._refresh_sweeps
        )

    def _read_done(self, held: frozenset[str] | None) -> None:
        self._held_at_read = held
        self._sweeps_unread = 0
        self.connected_reads += 1

    async def sweep(self) -> int:
        """One comparison; returns how many views were pushed."""
        held = self._held()
        fresh = self._must_read(held)
        if not fresh:
            self._sweeps_unread += 1
        if not self._publisher.listening():
            if fresh:
                self._connected = await self._db.read(_connected)
                self._read_done(held)
            self._moving = None
            return 0
        if fresh:
            connected, moving = await self._db.read(_connected_and_moving, self._moving_limit)
            self._read_done(held)
        else:
            assert self._connected is not None
            connected = self._connected
            moving = await self._db.read(_moving, self._moving_limit)
        before, self._connected = self._connected, connected
        changed_nodes = set() if before is None else before ^ connected
        seen = self._moving
        if seen is None:
            changed = [gid for gid, (speed, stalled) in moving.items() if stalled or not speed]
        else:
            changed = [gid for gid, flags in moving.items() if gid in seen and seen[gid] != flags]
        self._moving = moving
        if not changed_nodes and not changed:
            return 0
        found = await self._db.read(_views_to_push, changed_nodes, changed, self._node_limit)
        for view, owner in found:
            payload = json.dumps({"type": "task", "task": view}, ensure_ascii=False)
            self._publisher.publish(owner, payload)
        self.pushed += len(found)
        return len(found)


class Publisher(Protocol):
    """Where WebSocket pushes go (``tasknet.site.web.events.EventHub``)."""

    def publish(self, user_id: int | None, payload: str) -> int: ...

    def listening(self) -> bool: ...


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
        self._ready: deque[tuple[outbox.OutboxRow, int]] = deque()
        self._in_flight = 0
        self._pumping = False
        #: Requests in flight, in the order they were made (``stop`` cancels
        #: them in that order).
        self._requests: dict[Deferred[Any], None] = {}
        self._retries: dict[int, Any] = {}
        self._results: list[outbox.WebhookResult] = []
        self._writer = CoalescingRunner(self._write_results)
        # Outcomes whose write failed are written again after this long: a
        # delivery not recorded would stay pending, and be sent again only
        # after the next start.
        self._results_retry: Any = None
        self._stopped = False
        self.delivered = 0

    def room(self) -> int:
        """How many more rows may be handed over now."""
        return 0 if self._stopped else max(0, self.max_held - len(self.known))

    def enqueue(self, row: outbox.OutboxRow) -> bool:
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

    async def _attempt(self, row: outbox.OutboxRow, attempts: int) -> None:
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
            self._finish(outbox.WebhookResult(row.id, outbox.WEBHOOK_DELIVERED, attempts, None))
            return
        metrics.WEBHOOK_FAILURES.inc()
        if attempts >= self._max_attempts:
            log.warn(
                "webhook gave up on notification {id} after {n} attempts: {error}",
                id=row.id,
                n=attempts,
                error=error,
            )
            self._finish(outbox.WebhookResult(row.id, outbox.WEBHOOK_FAILED, attempts, error))
            return
        delay = self._retry_delay(attempts - 1)
        self._record(outbox.WebhookResult(row.id, outbox.WEBHOOK_PENDING, attempts, error))
        self._retries[row.id] = self._clock.callLater(delay, self._retry, row, attempts)

    def _retry(self, row: outbox.OutboxRow, attempts: int) -> None:
        self._retries.pop(row.id, None)
        if not self._stopped:
            self._ready.append((row, attempts))
            self._pump()

    def _finish(self, result: outbox.WebhookResult) -> None:
        self.known.discard(result.id)
        self._record(result)
        if len(self.known) == self.max_held // 2:
            # Drained to half from above (one row finishes at a time): the
            # executor reads the next pending rows from the database.
            try:
                self.on_room()
            except Exception:
                log.failure("asking for more webhook rows failed")

    def _record(self, result: outbox.WebhookResult) -> None:
        self._results.append(result)
        self._writer.run()

    async def _write_results(self) -> None:
        # Outcomes that arrive while one write is running go into the next.
        batch, self._results = self._results, []
        if not batch:
            return
        try:
            await self._db.write(outbox.record_webhook_results, batch)
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


class OutboxExecutor(MultiService):
    """Drains the outbox after commits: WebSocket fan-out and webhook.

    A service: its ``TimerService`` children poll (rows written by another
    process, the admin CLI, have no in-process commit to wake us) and
    prune; :meth:`stopService` also finishes the drain and the marks."""

    def __init__(
        self,
        db: Database,
        publisher: Publisher | None,
        webhook: WebhookSender | None = None,
        *,
        page_size: int = 500,
        poll_interval: float | None = 5.0,
        mark_interval: float = 0.25,
        retention_days: float = RETENTION_DAYS,
        prune_interval: float | None = PRUNE_INTERVAL,
        prune_batch: int = PRUNE_BATCH,
        clock: IReactorTime,
        instance_id: int | None = None,
        wakeups: listen.Wakeups | None = None,
        webhook_lease: float = outbox.WEBHOOK_LEASE,
        nodes: Collection[str] | None = None,
    ) -> None:
        """``nodes``: the site's registry of connected nodes
        (``ConnectedNodes``; read only, by the liveness watch while not
        shared: :class:`LivenessWatch`)."""
        if retention_days < 0 or prune_batch < 1:
            raise ValueError("outbox retention_days must be >= 0 and prune_batch >= 1")
        if webhook_lease <= 0:
            raise ValueError(f"webhook_lease must be > 0, got {webhook_lease}")
        super().__init__()
        self._db = db
        #: Several sites may share the database and this is one of them,
        #: an instance (see the module doc).
        self.shared = db.capabilities.shared_by_sites and instance_id is not None
        self._instance_id = instance_id
        self._wakeups: listen.Wakeups = wakeups if wakeups is not None else listen.NoWakeups()
        self._subscription: listen.Subscription | None = None
        self._webhook_lease = webhook_lease
        self._joined = False  # shared: this instance's tail is registered
        self._joining = DeferredLock()
        self._retention_seconds = retention_days * 86400.0
        self._prune_batch = prune_batch
        self._pruning: Deferred[int] | None = None
        self._mark_interval = mark_interval
        self._marked = 0  # rows up to this id are marked in the database
        self._mark_call: Any = None
        self._marking: Deferred[None] | None = None
        self._clock: IReactorTime = clock
        # Each timer's first call comes as it starts: the first poll delivers
        # what a previous run left, the first prune runs at start.  Shared
        # mode with a webhook: the poll also renews the claims, every third
        # of the lease (ticking that often if the poll is slower, or off).
        self._poll_interval = poll_interval
        self._renew_every = webhook_lease / 3 if self.shared and webhook is not None else None
        self._renewed_at = -math.inf
        tick = poll_interval
        if self._renew_every is not None:
            tick = min(poll_interval or math.inf, self._renew_every)
        for interval, call in (
            (tick, self._tick),
            (prune_interval, self._prune_in_background),
        ):
            if interval:
                timer = TimerService(interval, call)
                timer.clock = self._clock
                timer.setServiceParent(self)
        self._publisher = publisher
        #: Pushes the views whose liveness changed without a commit.
        self.liveness = (
            LivenessWatch(db, publisher, nodes=None if self.shared else nodes)
            if publisher is not None
            else None
        )
        self._sweeping: Deferred[Any] | None = None
        self._webhook = webhook
        if webhook is not None:
            webhook.on_room = self.wake
        self._page_size = page_size
        self._after = 0  # rows up to this id are pushed to the WebSocket clients
        self._webhook_after = 0  # rows up to this id were handed to the webhook
        # Rows were committed while nobody was there to push them to: they
        # need marking, and the marking reads how far they go (last_id).
        self._unread = False
        self._drainer = CoalescingRunner(self._drain_logged)
        self._stopped = False
        #: Rows pushed to WebSocket clients since start (tests, logs).
        self.pushed = 0

    def startService(self) -> None:
        """Start polling and pruning (the first poll delivers what a previous
        run left undelivered; ``wake()`` fires when that drain is done)."""
        self._stopped = False
        self._db.read(outbox.backlog).addCallbacks(
            metrics.OUTBOX_BACKLOG.set,
            lambda f: log.failure("reading the outbox backlog failed", f),
        )
        if self._subscription is None:
            self._subscription = self._wakeups.subscribe(listen.OUTBOX, self._notified)
        self._join_in_background()
        super().startService()

    def _notified(self, channel: str, payload: str | None) -> None:
        # Rows were committed somewhere (or notifications were lost: drain
        # anyway, it is one read).
        self.wake()

    async def _join(self) -> None:
        """Shared mode: register this instance's tail, from the newest row.

        Done as the service starts, before this site's clients connect: a
        tail registered later (at its first drain) would start past the
        rows committed between a client's connect and that drain, and the
        client would never get them.  One join at a time (a second would
        start further on); a failed one is tried again by the next drain
        or marking."""
        if not self.shared or self._joined:
            return
        async with self._joining:
            if self._joined:
                return
            assert self._instance_id is not None
            start = await self._db.write(outbox.join_readers, self._instance_id)
            self._after = self._marked = max(self._after, start)
            self._joined = True

    def _join_in_background(self) -> None:
        Deferred.fromCoroutine(self._join()).addErrback(
            lambda f: log.failure("registering this site's outbox tail failed; retried", f)
        )

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
            self._schedule_marks()
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
        await self._join()
        fanout = outbox.rows_after if self.shared else outbox.fanout_rows
        while not self._stopped:
            if not self._ws_listening():
                # Nobody to push to: the rows need marking, not reading.
                self._unread = True
                break
            rows = await self._db.read(fanout, self._after, self._page_size)
            if not rows:
                break
            for row in rows:
                assert self._publisher is not None
                self.pushed += self._publisher.publish(row.user_id, row.payload)
            self._after = rows[-1].id
        await self._feed_webhook()
        self._schedule_marks()
        webhook = self._webhook
        if webhook is not None and webhook.room() == 0 and not self._stopped:
            # Full: more rows wait in the database than the sender holds.
            metrics.OUTBOX_BACKLOG.set(await self._db.read(outbox.backlog))
        else:
            metrics.OUTBOX_BACKLOG.set(len(webhook.known) if webhook is not None else 0)

    async def _feed_webhook(self) -> None:
        """Hand the webhook sender the next pending rows while it has room:
        a dead webhook holds ``max_held`` rows, the rest stay in the
        database and are read here once it drains (its ``on_room`` wakes us,
        and so does the poll)."""
        webhook = self._webhook
        while webhook is not None and not self._stopped:
            room = min(webhook.room(), self._page_size)
            if room <= 0:
                break
            if self.shared:
                rows = await self._claim_webhook_rows(room)
            else:
                rows = await self._db.read(outbox.webhook_rows, self._webhook_after, room)
            for row in rows:
                webhook.enqueue(row)
            if rows:
                self._webhook_after = rows[-1].id
            if len(rows) < room:
                break

    async def _claim_webhook_rows(self, room: int) -> list[outbox.OutboxRow]:
        # A read first: most wakes find nothing claimable (another site has
        # them, or there is none), and a read costs no write transaction.
        assert self._instance_id is not None
        if not await self._db.read(outbox.claimable_webhook_rows):
            return []
        return await self._db.write(
            outbox.claim_webhook_rows, self._instance_id, room, self._webhook_lease
        )

    def _sweep_liveness_in_background(self) -> None:
        # Not returned to the timer (a slow sweep must not hold the poll
        # back); one at a time; a failed sweep is logged and the next one
        # compares again.
        if self._sweeping is not None or self._stopped or self.liveness is None:
            return
        d = Deferred.fromCoroutine(self.liveness.sweep())
        self._sweeping = d
        d.addErrback(lambda f: log.failure("the liveness sweep failed", f))
        d.addBoth(self._swept)

    def _swept(self, result: object) -> None:
        self._sweeping = None

    def _tick(self) -> Deferred[None] | None:
        renew_every = self._renew_every
        if renew_every is not None and self._clock.seconds() - self._renewed_at >= renew_every:
            self._renewed_at = self._clock.seconds()
            self._renew_in_background()
        if self._poll_interval:
            self._sweep_liveness_in_background()
        # The poll's drain is returned to the timer, as before: the next poll
        # waits for it (it never fails: the drain logs its own errors).
        return self.wake() if self._poll_interval else None

    def _renew_in_background(self) -> None:
        # Not returned to the timer: a failed renewal must not stop it.
        if self._webhook is not None and self._webhook.known and not self._stopped:
            d = Deferred.fromCoroutine(self._renew())
            d.addErrback(lambda f: log.failure("renewing the webhook claims failed", f))

    async def _renew(self) -> None:
        """Shared mode: extend the lease of every row the sender holds; the
        rows whose claim lapsed (another site took them) are dropped."""
        webhook = self._webhook
        assert webhook is not None and self._instance_id is not None
        lost = await self._db.write(
            outbox.renew_webhook_claims,
            self._instance_id,
            sorted(webhook.known),
            self._webhook_lease,
        )
        if lost:
            log.warn(
                "webhook: the claims on {n} notification(s) lapsed and another site took"
                " them; dropping them here",
                n=len(lost),
            )
            webhook.drop(lost)

    def _schedule_marks(self) -> None:
        # The marks are written lazily, a few times a second at most: each
        # is a write transaction on the one writer the reports need, and the
        # in-memory watermark (_after) already keeps this run from repeating
        # a row.  A crash before the write only repeats pushes (at-least-once).
        # While a marking runs none is scheduled: it schedules the next
        # itself, as it ends, if a wake asked for one meanwhile.
        if (
            (self._after > self._marked or self._unread)
            and self._mark_call is None
            and self._marking is None
        ):
            self._mark_call = self._clock.callLater(self._mark_interval, self._flush_marks)

    def _flush_marks(self) -> Deferred[None]:
        self._mark_call = None
        marking = Deferred.fromCoroutine(self._write_marks())
        # Finished at once (nothing to await): its finally already ran.
        self._marking = None if marking.called else marking
        return marking

    async def _write_marks(self) -> None:
        failed = True
        try:
            try:
                await self._join()
            except Exception:
                log.failure("registering this site's outbox tail failed")
                return  # nothing marked: the next wake or poll retries
            if self._unread:
                self._unread = False
                if not self._ws_listening():
                    # Committed before this read with nobody listening: "drained"
                    # (at-least-once to the clients connected when drained).
                    try:
                        last = await self._db.read(outbox.last_id)
                    except Exception:
                        log.failure("reading the outbox watermark failed")
                        return  # left unmarked: the next wake or poll retries
                    self._after = max(self._after, last)
                else:
                    self.wake()  # a client came meanwhile: push them first
            while self._after > self._marked:
                lo, hi = self._marked, self._after
                try:
                    if self.shared:
                        assert self._instance_id is not None
                        await self._db.write(
                            outbox.mark_read,
                            self._instance_id,
                            hi,
                            skip_webhook=self._webhook is None,
                        )
                    else:
                        await self._db.write(
                            outbox.mark_range_fanned_out,
                            lo,
                            hi,
                            skip_webhook=self._webhook is None,
                        )
                except Exception:
                    log.failure("marking outbox rows {lo}..{hi} failed", lo=lo + 1, hi=hi)
                    return  # left unmarked: pushed again after a restart
                self._marked = hi
            failed = False
        finally:
            self._marking = None
            if not failed and not self._stopped:
                # A wake that came while this marking ran (rows committed
                # with nobody listening: _unread again) found it running and
                # scheduled nothing; without this its rows would wait for the
                # next wake or poll, unmarked, and a client connecting
                # meanwhile would not get them pushed.
                self._schedule_marks()

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
        found = await self._db.read(outbox.prunable, self._retention_seconds)
        if found.first is None:
            return 0  # nothing to prune: no write transaction at all
        total = 0
        after = found.first - 1
        while not self._stopped:
            deleted, after = await self._db.write(
                outbox.prune_finished, after, found.below, self._prune_batch
            )
            total += deleted
            if deleted < self._prune_batch:
                break
        if total:
            log.info("pruned {n} delivered notification(s) from the outbox", n=total)
        return total

    def stopService(self) -> Deferred[None]:
        """Stop polling, draining and pruning; cancel webhook work
        (undelivered rows stay in the outbox for the next start)."""
        self._stopped = True
        timers: Deferred[Any] = super().stopService() if self.running else succeed(None)
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            timers.addCallback(lambda _: subscription.cancel())
        return timers.addCallback(lambda _: Deferred.fromCoroutine(self._finish()))

    async def _finish(self) -> None:
        if self._pruning is not None:
            await self._pruning
        if self._sweeping is not None:
            await self._sweeping
        await self._drainer.idle()
        if self._mark_call is not None and self._mark_call.active():
            self._mark_call.cancel()
        self._mark_call = None
        if self._marking is not None:
            await self._marking
        await self._flush_marks()
        if self._webhook is not None:
            await self._webhook.stop()
        if self.shared and self._joined:
            await self._leave()

    async def _leave(self) -> None:
        """Shared mode, a clean stop: give back the webhook claims and stop
        holding the others' marks back."""
        assert self._instance_id is not None
        try:
            if self._webhook is not None:
                await self._db.write(outbox.release_webhook_claims, self._instance_id)
            await self._db.write(outbox.leave_readers, self._instance_id)
        except Exception:
            log.failure("leaving the outbox readers failed (the reaper frees them)")
        self._joined = False
