"""The site database: an adbapi pool over one SQLite file.

Every transaction of the site is one named function of a cursor
(``fn(cursor, *args)``), grouped by subject in ``tasknet/site/storage/*.py``,
and run here:

* :meth:`Database.write` runs it between ``BEGIN IMMEDIATE`` and ``COMMIT`` on
  the single writer connection (SQLite serialises writers anyway; one writer
  thread means no ``SQLITE_BUSY`` between our own transactions, and
  ``BEGIN IMMEDIATE`` takes the write lock up front, so a transaction never
  fails half-way when it upgrades from read to write).  An exception from
  ``fn`` rolls back everything ``fn`` did and fails its Deferred.
* :meth:`Database.read` runs it inside a deferred (read) transaction on a
  separate read connection; with WAL it sees the last committed state and
  never waits for the writer.

Group commit.  With ``synchronous=FULL`` every ``COMMIT`` is an fsync, and
the fsync, not the statements, is what a write costs.  So writes that are
called while the writer thread is busy are queued and run together, in the
order they were called, as one ``BEGIN IMMEDIATE … COMMIT`` (at most
``max_batch`` of them), each inside its own ``SAVEPOINT``:

* a write whose ``fn`` raises is rolled back to its savepoint alone and its
  Deferred fails with its own exception; the others of the batch commit;
* every Deferred fires only after the ``COMMIT`` that carried its write (an
  answer or an ACK never precedes the commit), and if ``BEGIN`` or ``COMMIT``
  fails, nothing of the batch is committed and every write whose ``fn`` had
  not failed on its own fails with that error;
* a write's ``fn`` sees the uncommitted changes of the writes before it in
  the batch, exactly as if they had committed just before it.

A write called while the writer is idle runs at once, alone, exactly as a
plain ``BEGIN IMMEDIATE; fn; COMMIT`` (:func:`run_write`, no savepoint).  A
batch is taken from the queue in the writer thread when its transaction
starts, so it starts the moment the previous one has committed, without a
round trip through the reactor.  ``fn`` must not issue ``BEGIN``, ``COMMIT``
or ``ROLLBACK`` itself (savepoints of its own are fine: they nest).

Rows are :class:`sqlite3.Row` (index by position or by column name).
Connections use ``isolation_level=None``: the sqlite3 module never opens or
commits a transaction on its own, only the statements above do.
"""

from __future__ import annotations

import os
import sqlite3
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

log = Logger()

P = ParamSpec("P")
T = TypeVar("T")

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


class TransactionLost(sqlite3.OperationalError):
    """A write's changes were lost before the commit: the transaction it
    shared was rolled back as a whole (by SQLite, after another write's
    error such as a full disk, or by another write's function)."""


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
    plain connection; roll back on any exception.  Used by the pool below and
    by synchronous tools, so both share one definition of "a transaction"."""
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


@dataclass(eq=False)
class _Write:
    """One queued write.  ``result``/``failure`` are set in the writer
    thread; ``done`` is fired on the reactor after the transaction ended."""

    call: Callable[[sqlite3.Cursor], Any]
    done: Deferred[Any] = field(default_factory=Deferred)
    result: Any = None
    failure: Failure | None = None


@dataclass
class _Taken:
    """What one scheduled job took from the queue (``None``: it never ran)."""

    batch: list[_Write] | None = None
    transactions: int = 0


def _run_alone(connection: sqlite3.Connection, write: _Write) -> int:
    """A lone write: exactly :func:`run_write`.  Returns commits made (0/1)."""
    try:
        write.result = run_write(connection, write.call)
    except Exception:
        write.failure = Failure()
        return 0
    return 1


def _run_together(connection: sqlite3.Connection, batch: list[_Write]) -> list[_Write]:
    """Run ``batch`` as one transaction, a savepoint per write.  Returns the
    writes not run because SQLite ended the transaction early (they get a
    transaction of their own next)."""
    cursor = connection.cursor()
    try:
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except Exception:
            _fail_all(batch, Failure())
            return []
        ran: list[_Write] = []
        try:
            for index, write in enumerate(batch):
                cursor.execute(f"SAVEPOINT {_SAVEPOINT}")
                try:
                    write.result = write.call(cursor)
                except Exception as e:
                    write.failure = Failure()
                    if not connection.in_transaction:
                        _fail_all(ran, Failure(TransactionLost(_lost_because(e))))
                        return batch[index + 1 :]
                    cursor.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                cursor.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
                ran.append(write)
            cursor.execute("COMMIT")
        except Exception:
            # COMMIT failed (e.g. a deferred constraint), or a write ended
            # the transaction itself: nothing of the batch is committed.
            failure = Failure()
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            _fail_all(batch, failure)
        return []
    finally:
        cursor.close()


def _fail_all(writes: list[_Write], failure: Failure) -> None:
    for write in writes:
        if write.failure is None:
            write.failure = failure


def _lost_because(error: Exception) -> str:
    return (
        "rolled back with the rest of its group-committed transaction after another "
        f"write failed: {type(error).__name__}: {error}"
    )


class Database:
    """The site's database handle: one writer connection (group commit),
    one reader connection.

    ``writes`` and ``transactions`` count committed writes and the
    transactions that carried them (logs, tests, benchmarks)."""

    def __init__(
        self,
        path: str,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
        self.path = path
        self.max_batch = max_batch
        self._busy_timeout_ms = busy_timeout_ms
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
        ``BEGIN`` or the ``COMMIT`` raises."""
        write = _Write(lambda cursor: fn(cursor, *args, **kw))
        self._queue.append(write)
        if not self._scheduled:
            self._schedule()
        return write.done

    def _schedule(self) -> None:
        self._scheduled = True
        taken = _Taken()
        d = self._writer.runWithConnection(self._run_queued, taken)
        d.addCallbacks(self._deliver, self._job_failed, callbackArgs=(taken,), errbackArgs=(taken,))
        d.addErrback(lambda f: log.failure("delivering write results failed", f))
        d.addBoth(self._job_ended)

    def _run_queued(self, adbapi_connection: Any, taken: _Taken) -> None:
        """The job, in the writer thread: take what is queued now and run it.
        Touches no Deferred (they are not thread-safe)."""
        self._scheduled = False
        batch: list[_Write] = []
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.popleft())
            except IndexError:
                break
        taken.batch = batch
        connection = _raw(adbapi_connection)
        while batch:
            if len(batch) == 1:
                taken.transactions += _run_alone(connection, batch[0])
                return
            rest = _run_together(connection, batch)
            if any(w.failure is None for w in batch[: len(batch) - len(rest)]):
                taken.transactions += 1
            batch = rest

    def _deliver(self, _: None, taken: _Taken) -> None:
        batch = taken.batch or []
        self.transactions += taken.transactions
        for write in batch:
            if write.failure is None:
                self.writes += 1
                write.done.callback(write.result)
            else:
                write.done.errback(write.failure)

    def _job_failed(self, failure: Failure, taken: _Taken) -> None:
        batch = taken.batch
        if batch is None:
            # The job failed before it ran (adbapi could not connect), so it
            # took nothing and nothing else is taking from the queue: fail
            # what it would have taken, or a broken database would be
            # retried in a busy loop.
            self._scheduled = False
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
        for write in batch:
            if not write.done.called:
                write.done.errback(write.failure or failure)

    def _job_ended(self, _: object) -> None:
        # More than max_batch were queued: the rest need a job of their own.
        if self._queue and not self._scheduled:
            self._schedule()

    def read(
        self, fn: Callable[Concatenate[sqlite3.Cursor, P], T], *args: P.args, **kw: P.kwargs
    ) -> Deferred[T]:
        """Run ``fn(cursor, *args)`` in a read transaction on the reader
        connection (``query_only``: a write there raises)."""
        return self._reader.runWithConnection(
            lambda c: run_read(_raw(c), lambda cur: fn(cur, *args, **kw))
        )

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


def open_pool(path: str, **options: Any) -> Database:
    """Open the site database at ``path`` (created if absent); ``options``
    are :class:`Database`'s keyword arguments."""
    return Database(path, **options)
