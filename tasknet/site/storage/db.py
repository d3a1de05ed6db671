"""The site database: an adbapi pool over one SQLite file, group commit,
classified errors and the retries of whole transactions.

Every transaction of the site is one named function of a cursor
(``fn(cursor, *args)``), grouped by subject in ``tasknet/site/storage/*.py``,
and run here:

* :meth:`Database.write` runs it between ``BEGIN IMMEDIATE`` and ``COMMIT`` on
  the single writer connection (SQLite serialises writers anyway; one writer
  thread means no ``SQLITE_BUSY`` between our own transactions, and
  ``BEGIN IMMEDIATE`` takes the write lock up front, so a transaction never
  fails half-way when it upgrades from read to write).  An exception from
  ``fn`` rolls back everything ``fn`` did and fails its Deferred.
* :meth:`Database.write_coalesced` queues one *item* for a batch function
  ``fn(cursor, items) -> results`` (one result per item, with the effect of
  the items applied in order, each alone): the items queued together for the
  same ``fn`` are handed to it in one call (the report pipeline: many
  reports, a few set-at-a-time statements).
* :meth:`Database.read` runs it inside a deferred (read) transaction on a
  separate read connection; with WAL it sees the last committed state and
  never waits for the writer.

Group commit, the one implementation of it.  With ``synchronous=FULL`` every
``COMMIT`` is an fsync, and the fsync, not the statements, is what a write
costs.  So writes queued while the writer thread is busy are run together as
one ``BEGIN IMMEDIATE … COMMIT`` (at most ``max_batch`` of them).  The
writes of a transaction form *units*: a plain write is a unit of its own;
the coalesced items of one batch function are one unit, run where its first
item was queued (writes queued together have not been answered yet, so no
caller can have ordered a plain write against another function's items;
each function's own items keep their order).  Each unit runs inside its own
``SAVEPOINT``:

* a unit that raises is rolled back to its savepoint alone; a plain write's
  Deferred fails with its own exception, a coalesced unit of several items
  is run again item by item, a savepoint each, so only the failing item
  fails; the others of the transaction commit;
* every Deferred fires only after the ``COMMIT`` that carried its write (an
  answer or an ACK never precedes the commit), and if ``BEGIN`` or ``COMMIT``
  fails, nothing of the transaction is committed and every write that had
  not failed on its own fails with that error;
* should a unit end the transaction itself (SQLite rolls it back on a full
  disk or an I/O error), the units before it fail with
  :class:`TransactionLost`, the failing plain write with its own error, and
  the rest (a coalesced unit item by item) get a transaction of their own;
* a write's ``fn`` sees the uncommitted changes of the units before it in
  the transaction, exactly as if they had committed just before it.

A transaction with one plain write (or one item) is exactly a plain
``BEGIN IMMEDIATE; fn; COMMIT`` (:func:`run_write`, no savepoint).  A batch is
taken from the queue in the writer thread when its transaction starts, so it
starts the moment the previous one has committed, without a round trip
through the reactor.  ``fn`` must not issue ``BEGIN``, ``COMMIT`` or
``ROLLBACK`` itself (savepoints of its own are fine: they nest).
:func:`run_coalesced` runs the same code synchronously (tools, tests).

Errors leave this module classified (``tasknet.site.storage.errors``):
:class:`DatabaseBusy` ("busy, retry the transaction": the lock was not
granted within ``busy_timeout``, or the transaction was lost to another
write's error) or :class:`DatabaseFailed` (a retry would not help); a
:class:`TaskError` or any other exception of ``fn`` itself passes unchanged.
No module above storage sees a driver's exception.  The one retry of whole
transactions is :meth:`Database.write_retrying` (backoff on the database's
clock, up to a deadline).

Rows are :class:`sqlite3.Row` (index by position or by column name).
Connections use ``isolation_level=None``: the sqlite3 module never opens or
commits a transaction on its own, only the statements above do.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.clock import default_reactor
from tasknet.site.storage.errors import DatabaseBusy, DatabaseFailed, TransactionLost

log = Logger()

P = ParamSpec("P")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 -- an item of a coalesced write
R = TypeVar("R")

#: The cursor every transaction function takes.
Cursor = sqlite3.Cursor

BUSY_TIMEOUT_MS = 5000

#: Writes sharing one transaction at most: bounds how long the first of them
#: waits for the last, and how much one failed COMMIT takes down with it.
DEFAULT_MAX_BATCH = 64

# LIFECYCLE.md, "Deployment and migration" 3: every connection.  FULL
# synchronous because an ACK tells a node to forget its snapshot: the commit
# behind it has to survive a power cut, not only a process crash.
PRAGMAS = (
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
)

# Distinct from any savepoint name a write function uses for itself.
_SAVEPOINT = "database_write"

# SQLite's primary result codes for "another connection holds the lock"
# (SQLITE_BUSY past busy_timeout, SQLITE_LOCKED within a connection).
_BUSY_CODES = frozenset({5, 6})


def classify(error: BaseException | None) -> BaseException | None:
    """The exception a caller above storage sees for ``error``: a driver
    error becomes :class:`DatabaseBusy` or :class:`DatabaseFailed` (same
    message, the driver's exception as ``__cause__``); anything else (a
    :class:`TaskError`, a bug in ``fn``, one already classified) is kept."""
    if not isinstance(error, sqlite3.Error):
        return error  # not the driver's (a TaskError, a bug in fn, already classified)
    code = getattr(error, "sqlite_errorcode", None)
    busy = (code is not None and code & 0xFF in _BUSY_CODES) or (
        code is None
        and isinstance(error, sqlite3.OperationalError)
        and ("locked" in str(error) or "busy" in str(error))
    )
    classified: Exception = DatabaseBusy(str(error)) if busy else DatabaseFailed(str(error))
    classified.__cause__ = error
    return classified


def _classified_failure() -> Failure:
    """The exception being handled, classified, as a Failure."""
    failure = Failure()
    classified = classify(failure.value)
    return failure if classified is failure.value else Failure(classified)


def configure_connection(connection: sqlite3.Connection) -> None:
    """Apply the PRAGMAs every connection of the site must have."""
    connection.row_factory = sqlite3.Row
    for pragma in PRAGMAS:
        connection.execute(pragma)


#: The database and its backups hold node secrets and users' upstream tokens.
PRIVATE_MODE = 0o600


def create_private(path: str) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist, so SQLite
    opens it rather than creating it with the umask's mode.  SQLite gives the
    ``-wal`` and ``-shm`` files the mode of the database file, so they are
    0600 too.  An existing file is left as it is (``":memory:"`` and URIs are
    not files)."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def connect(path: str) -> sqlite3.Connection:
    """A plain configured connection (autocommit mode), for tools and tests
    that work outside the reactor (``tasknet-migrate``, ``tasknet-admin``);
    a new database file is created 0600."""
    create_private(path)
    connection = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    configure_connection(connection)
    return connection


def run_write(connection: sqlite3.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(cursor, *args)`` in one ``BEGIN IMMEDIATE`` transaction on a
    plain connection; roll back on any exception (raised as the driver's:
    tools outside the site classify nothing).  Used by the pool below and by
    synchronous tools, so both share one definition of "a transaction"."""
    cursor = connection.cursor()
    cursor.execute("BEGIN IMMEDIATE")
    try:
        result = fn(cursor, *args)
        cursor.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    finally:
        cursor.close()
    return result


def run_read(connection: sqlite3.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(cursor, *args)`` in one read transaction (a consistent snapshot)."""
    cursor = connection.cursor()
    cursor.execute("BEGIN")
    try:
        return fn(cursor, *args)
    finally:
        if connection.in_transaction:
            connection.execute("COMMIT")
        cursor.close()


def _raw(adbapi_connection: Any) -> sqlite3.Connection:
    # adbapi hands runWithConnection its own Connection wrapper; the sqlite3
    # connection is inside (reconnected by adbapi if it ever broke).
    return adbapi_connection._connection  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Committed(Generic[R]):
    """A coalesced item's answer: its result, and the transaction that
    committed it (numbered from 1 per :class:`Database`; items with the same
    number shared one commit) with that transaction's duration."""

    value: R
    transaction: int
    seconds: float


_PLAIN: Any = object()  # the item of a plain (not coalesced) write


@dataclass(eq=False)
class _Write:
    """One queued write: ``fn(cursor, *args)``, or item ``item`` of the batch
    function ``fn``.  ``result``/``failure``/``transaction``/``seconds`` are
    set in the writer thread; ``done`` is fired on the reactor after the
    transaction ended."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    item: Any = _PLAIN
    done: Deferred[Any] = field(default_factory=Deferred)
    result: Any = None
    failure: Failure | None = None
    transaction: int = 0
    seconds: float = 0.0

    @property
    def coalesced(self) -> bool:
        return self.item is not _PLAIN


_Unit = list[_Write]


class _Transactions:
    """Numbers committed transactions (touched by one thread at a time)."""

    def __init__(self) -> None:
        self.count = 0

    def committed(self, writes: Sequence[_Write], started: float) -> None:
        self.count += 1
        seconds = time.monotonic() - started
        for write in writes:
            if write.failure is None:
                write.transaction, write.seconds = self.count, seconds


def _units(writes: Sequence[_Write]) -> list[_Unit]:
    """Plain writes alone; the coalesced items of each function together, at
    the place of its first item."""
    units: list[_Unit] = []
    by_fn: dict[Any, _Unit] = {}
    for write in writes:
        if not write.coalesced:
            units.append([write])
        elif write.fn in by_fn:
            by_fn[write.fn].append(write)
        else:
            by_fn[write.fn] = unit = [write]
            units.append(unit)
    return units


def _call(cursor: sqlite3.Cursor, unit: _Unit) -> None:
    """Run ``unit``'s function, setting each write's result; raises whatever
    it raises (the caller rolls back)."""
    first = unit[0]
    if not first.coalesced:
        first.result = first.fn(cursor, *first.args)
        return
    results = list(first.fn(cursor, [w.item for w in unit]))
    if len(results) != len(unit):
        raise RuntimeError(
            f"{getattr(first.fn, '__name__', first.fn)} answered {len(results)} results"
            f" for {len(unit)} items"
        )
    for write, result in zip(unit, results, strict=True):
        write.result = result


def _fail(writes: Sequence[_Write], failure: Failure) -> None:
    for write in writes:
        if write.failure is None:
            write.failure = failure


def _run_alone(connection: sqlite3.Connection, unit: _Unit, transactions: _Transactions) -> None:
    """A lone write or item: exactly :func:`run_write`."""
    started = time.monotonic()
    try:
        run_write(connection, lambda cursor: _call(cursor, unit))
    except Exception:
        _fail(unit, _classified_failure())
        return
    transactions.committed(unit, started)


def _run_together(
    connection: sqlite3.Connection, units: list[_Unit], transactions: _Transactions
) -> list[_Unit]:
    """Run ``units`` as one transaction, a savepoint each (a failed coalesced
    unit again item by item).  Returns the units not run because the
    transaction ended early (they get a transaction of their own next)."""
    cursor = connection.cursor()
    todo = deque(units)
    ran: list[_Write] = []
    started = time.monotonic()
    try:
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except Exception:
            _fail([w for unit in units for w in unit], _classified_failure())
            return []
        try:
            while todo:
                unit = todo.popleft()
                cursor.execute(f"SAVEPOINT {_SAVEPOINT}")
                try:
                    _call(cursor, unit)
                except Exception as e:
                    failure = _classified_failure()
                    singles = [[w] for w in unit] if len(unit) > 1 else []
                    if not connection.in_transaction:
                        _fail(ran, Failure(TransactionLost(_lost_because(e))))
                        if not singles:
                            _fail(unit, failure)
                        return singles + list(todo)
                    cursor.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                    cursor.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
                    if singles:
                        todo.extendleft(reversed(singles))
                    else:
                        _fail(unit, failure)
                        ran.extend(unit)
                    continue
                cursor.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
                ran.extend(unit)
            cursor.execute("COMMIT")
        except Exception:
            # COMMIT failed (e.g. a deferred constraint), or a savepoint
            # statement did: nothing of the transaction is committed.
            failure = _classified_failure()
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            _fail(ran + [w for unit in todo for w in unit], failure)
            return []
        transactions.committed(ran, started)
        return []
    finally:
        cursor.close()


def _lost_because(error: Exception) -> str:
    return (
        "rolled back with the rest of its group-committed transaction after another "
        f"write failed: {type(error).__name__}: {error}"
    )


def _run_batch(
    connection: sqlite3.Connection, writes: Sequence[_Write], transactions: _Transactions
) -> None:
    """The writer's work for what it took from the queue: one transaction
    (or more, should one end early).  Touches no Deferred."""
    units = _units(writes)
    while units:
        if len(units) == 1 and len(units[0]) == 1:
            _run_alone(connection, units[0], transactions)
            return
        units = _run_together(connection, units, transactions)


def run_coalesced(
    connection: sqlite3.Connection,
    fn: Callable[[sqlite3.Cursor, list[I]], Sequence[R]],
    items: Sequence[I],
) -> list[R | Failure]:
    """Run ``items`` of the batch function ``fn`` exactly as the writer runs
    them when they are queued together: per item its result, or the
    (classified) :class:`Failure` it failed with.  For tools and tests."""
    writes = [_Write(fn, item=item) for item in items]
    _run_batch(connection, writes, _Transactions())
    return [w.failure if w.failure is not None else w.result for w in writes]


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


class Database:
    """The site's database handle: one writer connection (group commit),
    one reader connection.  ``clock`` times the retries of
    :meth:`write_retrying`.

    ``writes`` and ``transactions`` count committed writes and the
    transactions that carried them (logs, tests, benchmarks)."""

    def __init__(
        self,
        path: str,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        clock: Any = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
        self.path = path
        self.max_batch = max_batch
        self._busy_timeout_ms = busy_timeout_ms
        self._clock = default_reactor(clock)
        create_private(path)
        self._writer = self._pool(path, query_only=False)
        self._reader = self._pool(path, query_only=True)
        # Appended on the reactor, taken in the writer thread (deque's
        # append and popleft are atomic).
        self._queue: deque[_Write] = deque()
        # A job is scheduled on the writer thread that has not taken its
        # batch yet.  Set on the reactor; cleared by that job in the writer
        # thread *before* it takes from the queue, so a write queued after
        # the clear is either taken by it or schedules the next job: none is
        # stranded, and at most one job waits behind the running one.
        self._scheduled = False
        # Numbered in the writer thread, one job at a time.
        self._numbering = _Transactions()
        self.writes = 0
        self.transactions = 0

    def _pool(self, path: str, *, query_only: bool) -> adbapi.ConnectionPool:
        busy_timeout_ms = self._busy_timeout_ms

        def openfun(connection: sqlite3.Connection) -> None:
            configure_connection(connection)
            if busy_timeout_ms != BUSY_TIMEOUT_MS:
                connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            if query_only:
                connection.execute("PRAGMA query_only=ON")

        return adbapi.ConnectionPool(
            "sqlite3",
            path,
            check_same_thread=False,
            isolation_level=None,
            timeout=busy_timeout_ms / 1000,
            cp_min=1,
            cp_max=1,
            cp_openfun=openfun,
            cp_noisy=False,
        )

    def write(
        self, fn: Callable[Concatenate[sqlite3.Cursor, P], T], *args: P.args, **kw: P.kwargs
    ) -> Deferred[T]:
        """Run ``fn(cursor, *args)`` in a ``BEGIN IMMEDIATE … COMMIT`` write
        transaction in the writer thread, possibly shared with other writes
        (group commit, see the module doc).  Fires with its result once
        committed; fails (nothing of ``fn`` committed) if ``fn``, the
        ``BEGIN`` or the ``COMMIT`` raises (classified, see the module doc)."""
        if kw:
            return self._queued(_Write(lambda cursor: fn(cursor, *args, **kw)))
        return self._queued(_Write(fn, args))

    def write_coalesced(
        self, fn: Callable[[sqlite3.Cursor, list[I]], Sequence[R]], item: I
    ) -> Deferred[Committed[R]]:
        """Queue ``item`` for the batch function ``fn``: the items queued
        together for ``fn`` run in one call ``fn(cursor, items)`` under one
        savepoint (should it raise: each alone, a savepoint each).  Fires
        with ``item``'s result once committed, or fails as :meth:`write`."""
        return self._queued(_Write(fn, item=item))

    def write_retrying(
        self,
        retry: Retry,
        fn: Callable[Concatenate[sqlite3.Cursor, P], T],
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
                    "{what}: {error}; retrying in {delay}s", what=retry.what, error=e, delay=delay
                )
                await deferLater(self._clock, delay, lambda: None)
                attempts += 1

    def _queued(self, write: _Write) -> Deferred[Any]:
        self._queue.append(write)
        if not self._scheduled:
            self._schedule()
        return write.done

    def _schedule(self) -> None:
        self._scheduled = True
        taken: list[list[_Write] | None] = [None]
        d = self._writer.runWithConnection(self._run_queued, taken)
        d.addCallbacks(self._deliver, self._job_failed, callbackArgs=(taken,), errbackArgs=(taken,))
        d.addErrback(lambda f: log.failure("delivering write results failed", f))
        d.addBoth(self._job_ended)

    def _run_queued(self, adbapi_connection: Any, taken: list[list[_Write] | None]) -> None:
        """The job, in the writer thread: take what is queued now and run it.
        Touches no Deferred (they are not thread-safe)."""
        self._scheduled = False
        batch: list[_Write] = []
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.popleft())
            except IndexError:
                break
        taken[0] = batch
        _run_batch(_raw(adbapi_connection), batch, self._numbering)

    def _deliver(self, _: None, taken: list[list[_Write] | None]) -> None:
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

    def _job_failed(self, failure: Failure, taken: list[list[_Write] | None]) -> None:
        batch = taken[0]
        if batch is None:
            # The job failed before it ran (adbapi could not connect), so it
            # took nothing and nothing else is taking from the queue: fail
            # what it would have taken, or a broken database would be
            # retried in a busy loop.
            self._scheduled = False
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
        classified = Failure(classify(failure.value)) if failure.check(sqlite3.Error) else failure
        for write in batch:
            if not write.done.called:
                write.done.errback(write.failure or classified)

    def _job_ended(self, _: object) -> None:
        # More than max_batch were queued: the rest need a job of their own.
        if self._queue and not self._scheduled:
            self._schedule()

    def read(
        self, fn: Callable[Concatenate[sqlite3.Cursor, P], T], *args: P.args, **kw: P.kwargs
    ) -> Deferred[T]:
        """Run ``fn(cursor, *args)`` in a read transaction on the reader
        connection (``query_only``: a write there raises); errors classified
        as :meth:`write`'s."""
        d = self._reader.runWithConnection(
            lambda c: run_read(_raw(c), lambda cur: fn(cur, *args, **kw))
        )
        return d.addErrback(_reraise_classified)

    def close(self) -> None:
        """Stop both pools (joins their threads; pending work finishes first)."""
        if self._writer.running and self.transactions:
            log.info(
                "database: {writes} write(s) committed in {transactions} transaction(s)",
                writes=self.writes,
                transactions=self.transactions,
            )
        for pool in (self._writer, self._reader):
            if pool.running:
                pool.close()


def _reraise_classified(failure: Failure) -> Failure:
    classified = classify(failure.value)
    return failure if classified is failure.value else Failure(classified)


def open_pool(path: str, **options: Any) -> Database:
    """Open the site database at ``path`` (created if absent); ``options``
    are :class:`Database`'s keyword arguments."""
    return Database(path, **options)
