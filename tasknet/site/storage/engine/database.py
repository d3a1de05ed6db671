"""The site database: adbapi pools over one SQLite file or one PostgreSQL
database, the queue of writes their group commit takes from, and the
engine's API in one import.

The engine (``tasknet/site/storage/engine/``) is laid out by job:

* :mod:`~.targets`: what a ``--db`` value names (a SQLite file or a
  PostgreSQL URL) and how it is shown without its password;
* :mod:`~.sqlite` and :mod:`~.postgres`: the two drivers (connections,
  session settings, error classes);
* :mod:`~.sql`: every statement written once and rendered for both
  engines at import (:class:`~.sql.Sql`), with the pieces that differ;
* :mod:`~.transactions`: one transaction (``BEGIN``, isolation, classified
  errors, reruns, the write fence; :func:`run_write`, :func:`run_read`);
* :mod:`~.group_commit`: the writes queued together run as one
  transaction, a savepoint each;
* :mod:`~.sources`: the wall clock and entropy a transaction reads from
  its cursor, given to every connection of a pool;
* this module: :class:`Database`, the pools and the queue;
* :mod:`~.errors`, :mod:`~.timestamps`, :mod:`~.schema` and
  :mod:`~.migrate` with the ``.sql`` files, :mod:`~.listen`
  (``LISTEN``/``NOTIFY``), :mod:`~.file_lock` (SQLite's instance flock).

Every transaction of the site is one named function of a cursor
(``fn(cursor, *args)``), grouped by subject in ``tasknet/site/storage/*.py``,
and run by :class:`Database`:

* :meth:`Database.write` queues it for the single writer connection
  (SQLite serialises writers anyway; one writer thread means no
  ``SQLITE_BUSY`` between our own transactions); writes queued while the
  writer is busy share the next transaction (group commit,
  :mod:`~.group_commit`).  Its Deferred fires with ``fn``'s result once
  committed; an exception from ``fn`` rolls back everything ``fn`` did and
  fails its Deferred.
* :meth:`Database.write_joined` gives one *item* to a batch function
  ``fn(cursor, items) -> results`` (one result per item, with the effect of
  the items applied in order, each alone): an item joins the write of ``fn``
  still waiting in the queue, if there is one, else queues a new one; so at
  most one write of ``fn`` waits at any time, whatever the burst, and its
  items are handed to ``fn`` in one call (the report pipeline: many
  reports, a few set-at-a-time statements; a burst of logins' takes and
  ``node_seen`` rows).  It is one write of the queue: a plain write queued
  after an item runs after it, never behind the whole burst.
* :meth:`Database.read` runs it inside a read transaction on a separate
  read connection; with WAL it sees the last committed state and never
  waits for the writer.
* :meth:`Database.write_retrying`: the one retry of whole transactions
  while the database is busy (backoff on the database's clock, up to a
  deadline).

A batch is taken from the queue in the writer thread when its transaction
starts, so it starts the moment the previous one has committed, without a
round trip through the reactor.  Errors leave classified
(:func:`~.transactions.classify`).

Two backends, one API.  ``target`` is a SQLite file path or a
``postgresql://`` / ``postgres://`` URL (:func:`is_postgres`); everything
here takes either, and :attr:`Database.backend` says which (logs,
``/healthz``).  What the layers above depend on is what it can do,
:attr:`Database.capabilities` (:class:`~.targets.Capabilities`), never its
name.  On PostgreSQL the connections are :class:`~.postgres.PgConnection`
(psycopg 3, autocommit, rows indexable like ``sqlite3.Row``); adbapi loads that module
as its DB-API module, so the pools are the same ``ConnectionPool``
objects: one writer connection (group commit works exactly as on SQLite),
and a reader pool of ``readers`` connections (:data:`DEFAULT_READERS`, on
SQLite as on PostgreSQL: both serve them in parallel).  ``busy_timeout_ms``
is its ``lock_timeout``: a statement that waits that long for a lock fails
busy, never hangs.  A write transaction that lost a serialization conflict
or its connection is run again in the writer thread (:mod:`~.transactions`,
"Reruns"); :attr:`Database.conflicts` and :attr:`Database.reconnects`
count them.  A read that meets a dead connection is run once more on a
fresh one.

A :class:`Database` given a ``fence`` (the site instance's lease) passes
every write through it (:mod:`~.transactions`, "The write fence").
"""

from __future__ import annotations

import functools
import math
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypedDict, TypeVar, Unpack

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorCore, IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.runtime import IEntropy, IThreadPools, ThreadedConnectionPool
from tasknet.site.storage.engine.errors import DatabaseBusy
from tasknet.site.storage.engine.group_commit import (
    Committed,
    Transactions,
    Write,
    run_batch,
    run_coalesced,
)
from tasknet.site.storage.engine.sources import SYSTEM, Sources, StorageFaults
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.sqlite import (
    BUSY_TIMEOUT_MS,
    PRIVATE_MODE,
    SiteConnection,
    configure_connection,
    connect_sqlite,
    create_private,
    set_busy_timeout,
    set_query_only,
)
from tasknet.site.storage.engine.targets import (
    POSTGRESQL,
    SQLITE,
    Capabilities,
    backend_of,
    capabilities_of,
    describe,
    is_postgres,
    redact,
)
from tasknet.site.storage.engine.transactions import (
    READ_COMMITTED,
    SERIALIZABLE,
    Connection,
    Cursor,
    IWriteFence,
    classify,
    is_integrity_error,
    isolation_of,
    read_committed,
    read_reconnecting,
    reraise_classified,
    run_read,
    run_write,
)

# The engine's API in one import (its callers name these from here).
__all__ = [
    "BUSY_TIMEOUT_MS",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_READERS",
    "reader_count",
    "POSTGRESQL",
    "PRIVATE_MODE",
    "READ_COMMITTED",
    "SERIALIZABLE",
    "SQLITE",
    "SYSTEM",
    "Capabilities",
    "Committed",
    "Connection",
    "Cursor",
    "Database",
    "IWriteFence",
    "Retry",
    "Sources",
    "backend_of",
    "capabilities_of",
    "classify",
    "configure_connection",
    "connect",
    "connect_sqlite",
    "create_private",
    "describe",
    "is_integrity_error",
    "is_postgres",
    "isolation_of",
    "open_pool",
    "read_committed",
    "redact",
    "run_coalesced",
    "run_read",
    "run_write",
]

log = Logger()

P = ParamSpec("P")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 -- an item of a joined write
R = TypeVar("R")

#: Queued writes sharing one transaction at most (a joined write, with all
#: its items, counts once): bounds how long the first of them waits for the
#: last, and how much one failed COMMIT takes down with it.
DEFAULT_MAX_BATCH = 64

_PING = sql("SELECT 1")


def connect(target: str, sources: Sources = SYSTEM) -> Connection:
    """A plain configured connection (autocommit mode), for tools and tests
    that work outside the reactor (``tasknet-migrate``, ``tasknet-admin``)
    and the site's work before its pools open: a SQLite file (a new one is
    created 0600) or a PostgreSQL database.  Its transactions read the wall
    clock and entropy of ``sources`` (:mod:`~.sources`: a tool's are the
    system's; the site passes its root's)."""
    if is_postgres(target):
        from tasknet.site.storage.engine import postgres  # psycopg only when PostgreSQL is used

        return postgres.connect(target, lock_timeout_ms=BUSY_TIMEOUT_MS, sources=sources)
    return connect_sqlite(target, sources)


@dataclass(frozen=True)
class Retry:
    """How :meth:`Database.write_retrying` retries a write while the database
    is busy: ``backoff(attempt)`` seconds before attempt ``attempt + 2``
    (e.g. Twisted's ``backoffPolicy``), giving up (raising the last
    :class:`DatabaseBusy`) when the next attempt would start more than
    ``within`` seconds after the first (``math.inf``: never).  ``what``
    names the write in the log."""

    what: str
    within: float
    backoff: Callable[[int], float]

    def __post_init__(self) -> None:
        if self.within < 0 or math.isnan(self.within):
            raise ValueError(f"within must be >= 0, got {self.within}")


#: Reader connections (either backend): reads run in parallel on them
#: (SQLite's WAL readers never wait for each other or for the writer, and
#: sqlite3 and psycopg release the GIL while a statement runs), so a slow
#: view does not queue every other behind it (B9: with one, 8 concurrent
#: views took 8 times as long as one).  A deployment with many API clients
#: may give more (``readers``).
DEFAULT_READERS = 4


def reader_count(target: str, cpus: int | None) -> int:
    """The reader connections a site process of its own opens on ``target``
    on a machine of ``cpus`` cores (None: unknown).  PostgreSQL:
    :data:`DEFAULT_READERS` (a reader mostly waits for the server).  SQLite:
    one per core, at least 2 and at most :data:`DEFAULT_READERS`: a reader
    runs SQLite in this process, and more readers than cores only take the
    GIL from each other between rows (B9 on 2 cores, 8 clients: the worst
    p99 of the stats 57 ms with 4 readers, 44 ms with 2)."""
    if is_postgres(target) or cpus is None:
        return DEFAULT_READERS
    return max(2, min(DEFAULT_READERS, cpus))


class Database:
    """The site's database handle: one writer connection (group commit),
    ``readers`` reader connections (:data:`DEFAULT_READERS`).  ``target`` is
    a SQLite path or a PostgreSQL URL.  From the composition root: the
    ``reactor`` its ``adbapi`` pools run on (``IReactorCore``: started and
    stopped with it, results delivered to it), ``threads`` (their thread
    pools), ``entropy`` (seeds the jitter of the writer's conflict reruns;
    the ids and secrets its transactions make), ``wall`` (the wall clock of
    its transactions: ``{now}`` in SQL, :func:`~.sources.now_of` in Python;
    the reactor's ``seconds``) and ``monotonic`` (the clock a transaction's
    duration is measured on); every connection of both pools carries
    ``wall`` and ``entropy`` (:class:`~.sources.Sources`);
    ``clock`` (default: ``reactor``) times the retries of
    :meth:`write_retrying`.  ``application_name`` names the PostgreSQL
    sessions (``pg_stat_activity``).  ``storage_faults``: a simulation's
    (:data:`~.sources.StorageFaults`); None in production.

    ``writes`` and ``transactions`` count committed writes and the
    transactions that carried them (logs, tests, benchmarks)."""

    def __init__(
        self,
        target: str,
        *,
        reactor: IReactorCore,
        threads: IThreadPools,
        entropy: IEntropy,
        wall: Callable[[], float],
        monotonic: Callable[[], float],
        clock: IReactorTime | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        readers: int = DEFAULT_READERS,
        application_name: str = "tasknet-site",
        reader_application_name: str | None = None,
        fence: IWriteFence | None = None,
        storage_faults: StorageFaults | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
        if readers < 1:
            raise ValueError(f"readers must be >= 1, got {readers}")
        self.target = target
        self.backend = backend_of(target)
        #: What the layers above may depend on (they never compare ``backend``).
        self.capabilities: Capabilities = capabilities_of(target)
        self.max_batch = max_batch
        self._busy_timeout_ms = busy_timeout_ms
        self._reactor = reactor
        self._threads = threads
        self._clock: IReactorTime = clock if clock is not None else IReactorTime(reactor)
        #: What its transactions read of the world (their connections carry it).
        self.sources = Sources(wall, entropy, storage_faults)
        if self.backend == POSTGRESQL:
            self._writer = self._postgres_pool(target, application_name, readers=0)
            self._reader = self._postgres_pool(
                target, reader_application_name or application_name, readers=readers
            )
        else:
            create_private(target)
            self._writer = self._pool(target, query_only=False)
            self._reader = self._pool(target, query_only=True, connections=readers, role="reader")
        # Appended on the reactor, taken in the writer thread (deque's
        # append and popleft are atomic): a plain write alone, or the items
        # of a joined write, which grows until the writer takes it.
        self._queue: deque[list[Write]] = deque()
        # The joined write of each batch function still waiting in the
        # queue; the reactor adds to it and the writer thread takes it
        # under this lock, so an item is either taken with it or joins a
        # new write.
        self._joining: dict[Callable[..., object], list[Write]] = {}
        self._joining_lock = threading.Lock()
        # A job is scheduled on the writer thread that has not taken its
        # batch yet.  Set on the reactor; cleared by that job in the writer
        # thread *before* it takes from the queue, so a write queued after
        # the clear is either taken by it or schedules the next job: none is
        # stranded, and at most one job waits behind the running one.
        self._scheduled = False
        # Numbered in the writer thread, one job at a time.
        self._numbering = Transactions(fence, jitter=entropy.random(), monotonic=monotonic)
        self.writes = 0
        self.transactions = 0

    @property
    def conflicts(self) -> int:
        """Write transactions that lost a serialization conflict (or a
        deadlock) and were run again (PostgreSQL; logs, tests, benchmarks)."""
        return self._numbering.conflicts

    @property
    def reconnects(self) -> int:
        """Write transactions that met a dead connection and were run again
        on a fresh one (PostgreSQL; logs, tests)."""
        return self._numbering.reconnects

    def _pool(
        self, path: str, *, query_only: bool, connections: int = 1, role: str = "writer"
    ) -> adbapi.ConnectionPool:
        busy_timeout_ms = self._busy_timeout_ms
        sources = self.sources

        def openfun(connection: sqlite3.Connection) -> None:
            configure_connection(connection, sources)
            if busy_timeout_ms != BUSY_TIMEOUT_MS:
                set_busy_timeout(connection, busy_timeout_ms)
            if query_only:
                set_query_only(connection)

        return ThreadedConnectionPool(
            self._reactor,
            self._threads,
            f"database-{role}",
            "sqlite3",
            path,
            check_same_thread=False,
            isolation_level=None,
            timeout=busy_timeout_ms / 1000,
            factory=SiteConnection,
            cp_min=1,
            cp_max=connections,
            cp_openfun=openfun,
            cp_noisy=False,
        )

    def _postgres_pool(
        self, target: str, application_name: str, *, readers: int
    ) -> adbapi.ConnectionPool:
        """The writer's pool (``readers=0``: one connection) or the readers'
        (read-only sessions).  adbapi loads the adapter module as its DB-API
        module and passes these keywords to its ``connect``."""
        return ThreadedConnectionPool(
            self._reactor,
            self._threads,
            "database-reader" if readers > 0 else "database-writer",
            "tasknet.site.storage.engine.postgres",
            target,
            lock_timeout_ms=self._busy_timeout_ms,
            read_only=readers > 0,
            application_name=application_name,
            sources=self.sources,
            cp_min=1,
            cp_max=max(1, readers),
            cp_noisy=False,
        )

    def write(
        self, fn: Callable[Concatenate[Cursor, P], T], *args: P.args, **kw: P.kwargs
    ) -> Deferred[T]:
        """Run ``fn(cursor, *args)`` in a ``BEGIN IMMEDIATE … COMMIT`` write
        transaction in the writer thread, possibly shared with other writes
        (group commit, see the module doc).  Fires with its result once
        committed; fails (nothing of ``fn`` committed) if ``fn``, the
        ``BEGIN`` or the ``COMMIT`` raises (classified, see the module doc)."""
        if kw:
            bound = functools.wraps(fn)(lambda cursor: fn(cursor, *args, **kw))
            # Named as ``fn`` (wraps): the fault points name the storage
            # functions a transaction ran, and a lambda would hide it.
            return self._queued([Write(bound, isolation=isolation_of(fn))])
        return self._queued([Write(fn, args)])

    def write_joined(
        self, fn: Callable[[Cursor, list[I]], Sequence[R]], item: I
    ) -> Deferred[Committed[R]]:
        """Give ``item`` to the batch function ``fn``: it joins the write of
        ``fn`` waiting in the queue, or queues a new one if none waits (or
        the writer took it).  The items of a write run in one call
        ``fn(cursor, items)`` under one savepoint (should it raise: each
        alone, a savepoint each).  Fires with ``item``'s result once
        committed, or fails as :meth:`write`."""
        write = Write(fn, item=item)
        with self._joining_lock:
            joining = self._joining.get(fn)
            if joining is not None:
                joining.append(write)
                return write.done
            self._joining[fn] = joining = [write]
        return self._queued(joining)

    def write_retrying(
        self,
        retry: Retry,
        fn: Callable[Concatenate[Cursor, P], T],
        *args: P.args,
        **kw: P.kwargs,
    ) -> Deferred[T]:
        """:meth:`write`, run again (the whole transaction) after each
        :class:`DatabaseBusy` as ``retry`` says; any other failure, and the
        last ``DatabaseBusy`` once ``retry.within`` is spent, fail it.
        Cancelling it stops the retries (a write already running still
        lands or not)."""
        return Deferred.fromCoroutine(self._retrying(retry, lambda: self.write(fn, *args, **kw)))

    async def _retrying(self, retry: Retry, attempt: Callable[[], Deferred[T]]) -> T:
        deadline = self._clock.seconds() + retry.within
        attempts = 0
        while True:
            try:
                return await attempt()
            except DatabaseBusy as e:
                delay = retry.backoff(attempts)
                if self._clock.seconds() + delay > deadline:
                    raise
                log.warn(
                    "{what}: {error}; retrying in {delay:.1f} s",
                    what=retry.what,
                    error=e,
                    delay=delay,
                )
                await deferLater(self._clock, delay, lambda: None)
                attempts += 1

    def _queued(self, writes: list[Write]) -> Deferred[Any]:
        self._queue.append(writes)
        if not self._scheduled:
            self._schedule()
        return writes[0].done

    def _take(self) -> list[Write]:
        """Up to ``max_batch`` queued writes (a joined one whole, its items
        closed to newcomers), in queue order."""
        batch: list[Write] = []
        with self._joining_lock:
            for _ in range(min(self.max_batch, len(self._queue))):
                writes = self._queue.popleft()
                if writes[0].coalesced and self._joining.get(writes[0].fn) is writes:
                    del self._joining[writes[0].fn]
                batch.extend(writes)
        return batch

    def _schedule(self) -> None:
        self._scheduled = True
        taken: list[list[Write] | None] = [None]
        d = self._writer.runWithConnection(self._run_queued, taken)
        d.addCallbacks(self._deliver, self._job_failed, callbackArgs=(taken,), errbackArgs=(taken,))
        d.addErrback(lambda f: log.failure("delivering write results failed", f))
        d.addBoth(self._job_ended)

    def _run_queued(self, adbapi_connection: Any, taken: list[list[Write] | None]) -> None:
        """The job, in the writer thread: take what is queued now and run it.
        Touches no Deferred (they are not thread-safe)."""
        self._scheduled = False
        batch = self._take()
        taken[0] = batch
        run_batch(_raw(adbapi_connection), batch, self._numbering)

    def _deliver(self, _: None, taken: list[list[Write] | None]) -> None:
        batch = taken[0] or []
        carried = {w.transaction for w in batch if w.failure is None}
        self.transactions += len(carried)
        for write in batch:
            if write.failure is None:
                self.writes += 1
                if write.coalesced:
                    write.done.callback(Committed(write.result, write.transaction, write.seconds))
                else:
                    write.done.callback(write.result)
            else:
                write.done.errback(write.failure)

    def _job_failed(self, failure: Failure, taken: list[list[Write] | None]) -> None:
        batch = taken[0]
        if batch is None:
            # The job failed before it ran (adbapi could not connect), so it
            # took nothing and nothing else is taking from the queue: fail
            # what it would have taken, or a broken database would be
            # retried in a busy loop.
            self._scheduled = False
            batch = self._take()
        value = classify(failure.value)
        classified = failure if value is failure.value else Failure(value)
        for write in batch:
            if not write.done.called:
                write.done.errback(write.failure or classified)

    def _job_ended(self, _: object) -> None:
        # More than max_batch were queued: the rest need a job of their own.
        if self._queue and not self._scheduled:
            self._schedule()

    def read(
        self, fn: Callable[Concatenate[Cursor, P], T], *args: P.args, **kw: P.kwargs
    ) -> Deferred[T]:
        """Run ``fn(cursor, *args)`` in a read transaction on the reader
        connection (``query_only``: a write there raises); errors classified
        as :meth:`write`'s."""
        d = self._reader.runWithConnection(
            lambda c: read_reconnecting(_raw(c), lambda cur: fn(cur, *args, **kw))
        )
        return d.addErrback(reraise_classified)

    def ping(self) -> Deferred[None]:
        """A trivial read: fires if the database answers (``/healthz``)."""
        return self.read(_ping)

    def close(self) -> None:
        """Stop both pools (joins their threads; pending work finishes first)."""
        if self._writer.running and self.transactions:
            log.info(
                "database: {writes} write(s) committed in {transactions} transaction(s),"
                " {conflicts} lost to a serialization conflict and run again",
                writes=self.writes,
                transactions=self.transactions,
                conflicts=self.conflicts,
            )
        for pool in (self._writer, self._reader):
            if pool.running:
                pool.close()

    def drop(self) -> None:
        """What the kernel does when this process dies: every connection of
        both pools closes (the server rolls back what was not committed and
        ends the sessions); nothing else runs (a simulated crash)."""
        for pool in (self._writer, self._reader):
            connections, pool.connections = list(pool.connections.values()), {}
            for connection in connections:
                try:
                    connection.close()
                except Exception:  # noqa: BLE001 - a dead process reports nothing
                    continue


def _ping(cursor: Cursor) -> None:
    cursor.execute(_PING).fetchone()


class PoolOptions(TypedDict, total=False):
    """:class:`Database`'s keyword arguments beside its target, reactor,
    threads, entropy and clocks (:func:`open_pool`'s ``options``)."""

    clock: IReactorTime | None
    max_batch: int
    busy_timeout_ms: int
    readers: int
    application_name: str
    reader_application_name: str | None
    fence: IWriteFence | None
    storage_faults: StorageFaults | None


def open_pool(
    target: str,
    *,
    reactor: IReactorCore,
    threads: IThreadPools,
    entropy: IEntropy,
    wall: Callable[[], float],
    monotonic: Callable[[], float],
    **options: Unpack[PoolOptions],
) -> Database:
    """Open the site database ``target`` (a SQLite file, created if absent,
    or a PostgreSQL URL) on ``reactor``, ``threads``, ``entropy``, ``wall``
    and ``monotonic`` (the composition root's); ``options`` are
    :class:`Database`'s other keyword arguments."""
    return Database(
        target,
        reactor=reactor,
        threads=threads,
        entropy=entropy,
        wall=wall,
        monotonic=monotonic,
        **options,
    )


def _raw(adbapi_connection: Any) -> Connection:
    # adbapi hands runWithConnection its own Connection wrapper; the driver
    # connection (sqlite3's, or a PgConnection) is inside.
    return adbapi_connection._connection  # type: ignore[no-any-return]
