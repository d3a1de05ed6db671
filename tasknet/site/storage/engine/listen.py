"""Wake-ups between the sites of one database (SCALE.md 6: ``LISTEN``/``NOTIFY``).

Several sites on one PostgreSQL database learn of each other's commits by
``NOTIFY``; on SQLite there is one site per file, so every wake-up stays in
the process and nothing here crosses one.  A notification is only a hint:
each site still polls (outbox, dispatch, node ownership), so a notification
lost with a dropped connection delays work by one poll interval, never loses
it.

Channels (:data:`CHANNELS`, payloads are plain text):

* :data:`OUTBOX` -- outbox rows were committed (payload empty): every site
  wakes its WebSocket tail and webhook feed.  Sent *inside* the writing
  transaction (:func:`notify`, from :mod:`tasknet.site.storage.outbox`), so
  PostgreSQL delivers it exactly when the rows become visible, whoever wrote
  them (another site, ``tasknet-admin``);
* :data:`DISPATCH` -- a task became dispatchable or deletable (payload: the
  gid): the site holding its node sends the command.  Sent after the commit
  by the site that made the change (:meth:`Listener.notify`);
* :data:`NODE_TAKEN` -- a node logged in at some site (payload: see
  :mod:`tasknet.site.storage.node_sessions`), sent inside the ownership
  transaction: the site holding the older connection closes it.

:func:`open_wakeups` gives the backend's implementation of :class:`Wakeups`:
:class:`Listener` on PostgreSQL, :class:`NoWakeups` on SQLite.

:class:`Listener` is one dedicated autocommit psycopg connection in a thread
of its own, started with the first subscription and stopped with the last
(so whoever needs wake-ups starts and stops them with its own service: the
outbox executor, the dispatcher, the node listener).  The thread waits in
``select`` on the connection's socket and on a pipe the reactor writes to
(new channels, notifications to send, stop); each notification is handed to
the reactor with ``reactor.callFromThread`` and passed to the channel's
callbacks as ``callback(channel, payload)``.  Notifications sent on this very
connection (``be_pid`` is ours) are not handed back: the site already acted
on them in-process.  Every ``ping_interval`` seconds without traffic it runs
``SELECT 1`` to find a dead server; a lost connection is reopened with
backoff, and once it listens again every callback gets ``payload=None``
(:data:`RESYNC`): notifications may have been lost, catch up now rather than
at the next poll.  Nothing above storage sees psycopg.
"""

from __future__ import annotations

import os
import re
import select
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger

from tasknet.site.storage.engine.sql import postgres_only
from tasknet.site.storage.engine.targets import is_postgres

if TYPE_CHECKING:
    from tasknet.site.storage.engine.transactions import Cursor

log = Logger()

OUTBOX = "tasknet_outbox"
DISPATCH = "tasknet_dispatch"
NODE_TAKEN = "tasknet_node_taken"
CHANNELS = frozenset({OUTBOX, DISPATCH, NODE_TAKEN})

#: The payload a callback gets after the connection was (re)established:
#: notifications may have been missed meanwhile.
RESYNC = None

#: ``callback(channel, payload)``, on the reactor.
Callback = Callable[[str, "str | None"], object]

# Channel names are identifiers in LISTEN statements: never quoted, so checked.
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")

PING_INTERVAL = 5.0
CONNECT_TIMEOUT = 5
RECONNECT_DELAY = 0.5
MAX_RECONNECT_DELAY = 10.0


_NOTIFY = postgres_only("SELECT pg_notify(?, ?)")


def notify(cursor: Cursor, channel: str, payload: str = "") -> None:
    """Inside a write transaction: ``NOTIFY channel, payload`` at its commit
    (PostgreSQL delivers it then, and not at all after a rollback; equal
    notifications of one transaction are delivered once).  Nothing on SQLite
    (the statement is PostgreSQL's only)."""
    _check_channel(channel)
    cursor.execute(_NOTIFY, (channel, payload))


def _check_channel(channel: str) -> None:
    if channel not in CHANNELS or not _CHANNEL.fullmatch(channel):
        raise ValueError(f"unknown notification channel {channel!r}")


class Subscription(Protocol):
    def cancel(self) -> Deferred[None]:
        """Stop calling back (idempotent); fires once the wake-ups that
        remain have taken the change in (the last one: the thread ended)."""
        ...


class Wakeups(Protocol):
    """What sites use to wake each other (see the module doc)."""

    def subscribe(self, channel: str, callback: Callback) -> Subscription: ...

    def notify(self, channel: str, payload: str = "") -> None:
        """After a commit: tell the other sites (best effort, never blocks)."""
        ...


class _NoSubscription:
    def cancel(self) -> Deferred[None]:
        return succeed(None)


class NoWakeups:
    """One site per database (SQLite): every wake-up is in-process already,
    so there is nothing to listen to and nobody to tell."""

    def subscribe(self, channel: str, callback: Callback) -> Subscription:
        _check_channel(channel)
        return _NoSubscription()

    def notify(self, channel: str, payload: str = "") -> None:
        _check_channel(channel)


class _Subscription:
    def __init__(self, listener: Listener, channel: str, callback: Callback) -> None:
        self._listener = listener
        self.channel = channel
        self.callback = callback
        self.active = True

    def cancel(self) -> Deferred[None]:
        if not self.active:
            return succeed(None)
        self.active = False
        return self._listener._unsubscribe(self)


class Listener:
    """The PostgreSQL :class:`Wakeups`: one LISTEN connection to ``target``
    in a thread (see the module doc).  Callbacks run on ``reactor``."""

    def __init__(
        self,
        target: str,
        *,
        reactor: IReactorFromThreads,
        ping_interval: float = PING_INTERVAL,
        reconnect_delay: float = RECONNECT_DELAY,
        max_reconnect_delay: float = MAX_RECONNECT_DELAY,
        application_name: str = "tasknet-site listen",
    ) -> None:
        self._target = target
        self._reactor = reactor
        self._ping_interval = ping_interval
        self._reconnect_delay = reconnect_delay
        self._max_reconnect_delay = max_reconnect_delay
        self._application_name = application_name
        self._subscriptions: list[_Subscription] = []
        # Shared with the thread, under _lock: the channels wanted, the
        # notifications to send, whether to stop.
        self._lock = threading.Lock()
        self._wanted: frozenset[str] = frozenset()
        self._wanted_version = 0
        self._outgoing: deque[tuple[str, str]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._stop_waiters: list[Deferred[None]] = []
        # Reactor side: waiters for "listening to what was wanted at version N".
        self._listening_version = 0
        self._listening_waiters: list[tuple[int, Deferred[None]]] = []
        #: Notifications handed to callbacks, and (re)connections made (tests, logs).
        self.received = 0
        self.connections = 0

    # -- the reactor side

    @property
    def running(self) -> bool:
        """The thread (and its connection) is there."""
        return self._thread is not None

    def subscribe(self, channel: str, callback: Callback) -> Subscription:
        """Call ``callback(channel, payload)`` on the reactor for each
        notification on ``channel`` from another session (and with
        :data:`RESYNC` after each (re)connection); the first subscription
        starts the thread."""
        _check_channel(channel)
        subscription = _Subscription(self, channel, callback)
        self._subscriptions.append(subscription)
        self._want()
        return subscription

    def _unsubscribe(self, subscription: _Subscription) -> Deferred[None]:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
        if self._subscriptions:
            self._want()
            return succeed(None)
        return self._stop()

    def notify(self, channel: str, payload: str = "") -> None:
        """Send ``NOTIFY channel, payload`` on the listening connection
        (autocommit), as soon as the thread gets to it; dropped if no
        connection is open (a hint, the poll covers it)."""
        _check_channel(channel)
        with self._lock:
            if self._thread is None or self._stopping:
                return
            self._outgoing.append((channel, payload))
        self._poke()

    def wait_listening(self) -> Deferred[None]:
        """Fires once the connection listens to every channel subscribed
        so far (tests; a site does not wait for it)."""
        with self._lock:
            version = self._wanted_version
        if self._listening_version >= version:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._listening_waiters.append((version, d))
        return d

    def _want(self) -> None:
        channels = frozenset(s.channel for s in self._subscriptions)
        with self._lock:
            if channels != self._wanted:
                self._wanted = channels
                self._wanted_version += 1
            start = self._thread is None
            if start:
                self._stopping = False
                self._wake_r, self._wake_w = os.pipe()
                self._thread = threading.Thread(
                    target=self._run, name="tasknet-listen", daemon=True
                )
        if start:
            assert self._thread is not None
            self._thread.start()
        elif not self._stopping:
            self._poke()
        # else: the thread is ending; _ended starts a new one for these.

    def _stop(self) -> Deferred[None]:
        with self._lock:
            if self._thread is None:
                return succeed(None)
            self._stopping = True
            self._outgoing.clear()
        self._poke()
        waiter: Deferred[None] = Deferred()
        self._stop_waiters.append(waiter)
        return waiter

    def _poke(self) -> None:
        # The pipe lives from the thread's start to _ended, both on the
        # reactor, so this never writes to a closed (or reused) descriptor.
        if self._thread is not None:
            os.write(self._wake_w, b"x")

    def _deliver(self, channel: str, payload: str | None) -> None:
        for subscription in list(self._subscriptions):
            if subscription.active and subscription.channel == channel:
                self.received += payload is not None
                try:
                    subscription.callback(channel, payload)
                except Exception:
                    log.failure("wake-up callback for {channel} failed", channel=channel)

    def _listened(self, version: int, channels: frozenset[str], reconnected: bool) -> None:
        self._listening_version = max(self._listening_version, version)
        waiting, self._listening_waiters = self._listening_waiters, []
        for wanted, d in waiting:
            if wanted <= self._listening_version:
                d.callback(None)
            else:
                self._listening_waiters.append((wanted, d))
        if reconnected:
            for channel in sorted(channels):
                self._deliver(channel, RESYNC)

    def _ended(self) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._lock:
            self._thread = None
        waiters, self._stop_waiters = self._stop_waiters, []
        for d in waiters:
            d.callback(None)
        if self._subscriptions:  # subscribed again while the thread was ending
            self._want()

    # -- the thread

    def _run(self) -> None:
        import psycopg  # the driver stays inside storage (import-linter)

        delay = self._reconnect_delay
        try:
            while not self._should_stop():
                try:
                    connection = psycopg.connect(
                        self._target,
                        autocommit=True,
                        connect_timeout=CONNECT_TIMEOUT,
                        application_name=self._application_name,
                    )
                except psycopg.Error as e:
                    self._from_thread(
                        log.warn, "LISTEN connection failed: {error}; retrying", error=str(e)
                    )
                    self._sleep(delay)
                    delay = min(delay * 2, self._max_reconnect_delay)
                    continue
                delay = self._reconnect_delay
                try:
                    self._serve(connection)
                except psycopg.Error as e:
                    if not self._should_stop():
                        self._from_thread(
                            log.warn, "LISTEN connection lost: {error}; reconnecting", error=str(e)
                        )
                        self._sleep(delay)
                finally:
                    connection.close()
        except Exception as e:  # a bug: say so; the polls still cover everything
            self._from_thread(log.error, "LISTEN thread failed: {error}", error=repr(e))
        finally:
            self._reactor.callFromThread(self._ended)

    def _should_stop(self) -> bool:
        with self._lock:
            return self._stopping

    def _from_thread(self, emit: Callable[..., None], fmt: str, **kw: Any) -> None:
        self._reactor.callFromThread(lambda: emit(fmt, **kw))

    def _sleep(self, seconds: float) -> None:
        # Interruptible by a poke (stop).
        ready, _, _ = select.select([self._wake_r], [], [], seconds)
        if ready:
            os.read(self._wake_r, 4096)

    def _serve(self, connection: Any) -> None:
        """Listen and relay until stopped; raises psycopg.Error when the
        connection breaks."""
        own_pid = connection.info.backend_pid
        listening: frozenset[str] = frozenset()
        self.connections += 1
        first = True
        while True:
            with self._lock:
                if self._stopping:
                    return
                wanted, version = self._wanted, self._wanted_version
                outgoing = list(self._outgoing)
                self._outgoing.clear()
            for channel in sorted(wanted - listening):
                connection.execute(f"LISTEN {channel}")
            for channel in sorted(listening - wanted):
                connection.execute(f"UNLISTEN {channel}")
            if wanted != listening or first:
                self._reactor.callFromThread(
                    self._listened, version, wanted, first and self.connections > 1
                )
                listening, first = wanted, False
            for channel, payload in outgoing:
                connection.execute("SELECT pg_notify(%s, %s)", (channel, payload))
            self._relay(connection, own_pid)
            ready, _, _ = select.select(
                [connection.fileno(), self._wake_r], [], [], self._ping_interval
            )
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            if not ready:
                connection.execute("SELECT 1")  # finds a dead server
            self._relay(connection, own_pid)

    def _relay(self, connection: Any, own_pid: int) -> None:
        for n in connection.notifies(timeout=0):
            if n.pid != own_pid:
                self._reactor.callFromThread(self._deliver, n.channel, n.payload)


def open_wakeups(target: str, reactor: IReactorFromThreads, *, site_name: str = "") -> Wakeups:
    """The :class:`Wakeups` for the database ``target``: a :class:`Listener`
    on a PostgreSQL URL (its session named after ``site_name`` in
    ``pg_stat_activity``), :class:`NoWakeups` on a SQLite file."""
    if is_postgres(target):
        name = f"tasknet-site {site_name} listen" if site_name else "tasknet-site listen"
        return Listener(target, reactor=reactor, application_name=name[:63])
    return NoWakeups()
