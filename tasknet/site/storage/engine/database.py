"""The site database: adbapi pools over one SQLite file or one PostgreSQL
database, group commit, classified errors and the retries of whole
transactions.

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

Errors leave this module classified (``tasknet.site.storage.engine.errors``):
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

Two backends, one API.  ``target`` is a SQLite file path or a
``postgresql://`` / ``postgres://`` URL (:func:`is_postgres`); everything
here takes either, and :attr:`Database.backend` says which.  On PostgreSQL
(:mod:`tasknet.site.storage.engine.postgres`):

* the connections are :class:`~tasknet.site.storage.engine.postgres.PgConnection`
  (psycopg 3, autocommit, the same SQL translated once per statement text,
  rows indexable like ``sqlite3.Row``); adbapi loads that module as its
  DB-API module, so the pools are the same ``ConnectionPool`` objects: one
  writer connection (group commit works exactly as above), and a reader
  pool of ``readers`` connections (default one; PostgreSQL can serve more
  in parallel);
* a write is ``SERIALIZABLE`` unless its function declares
  ``READ COMMITTED`` (see "Isolation" below), and a read is ``REPEATABLE
  READ READ ONLY``.  Several sites write one database, so two writes can
  conflict: a serialization failure (40001) or a deadlock (40P01),
  wherever it surfaces (a statement, the ``COMMIT``, or an error a
  function swallowed), rolls the transaction back and runs it again from
  scratch, in the writer thread, after a short jittered pause
  (:data:`CONFLICT_RETRIES` times at most; then :class:`DatabaseBusy`).
  A group-committed transaction that lost a conflict is run again write by
  write (each item of a coalesced unit alone), each in a transaction of
  its own with its own reruns: one conflicting write must not take the
  other writes of its batch down with it, nor make them conflict again
  together.  None of their first results is kept.  Only writes not yet
  committed are ever run again, and a function is never run again after
  its transaction committed, so no upstream call or Deferred sees the
  retry (each Deferred still fires only after the commit that carried its
  write).  :attr:`Database.conflicts` counts the transactions that lost;
* ``busy_timeout_ms`` is the ``lock_timeout``: a statement that waits that
  long for a lock fails busy (:class:`DatabaseBusy`), never hangs;
* a connection that died (server restart, ``idle_session_timeout``, a
  pooler, an operator ending the session) is replaced and the transaction
  that met it is run again whole on the fresh connection, in the writer
  thread (:data:`RECONNECT_RETRIES` times at most; then
  :class:`DatabaseUnavailable`, "busy").  A transaction that lost its
  connection *while committing* is not run again here: it may have
  committed, so it fails :class:`CommitUnknown` and only its caller, who
  knows whether the function's guards make a repeat a no-op, may repeat it
  (SCALE.md "Fencing" 4).  A read that meets a dead connection is run once
  more on a fresh one.

The write fence (SCALE.md "Fencing" 3).  A :class:`Database` given a
``fence`` (the site instance's lease) asks it, in the writer thread before
every ``BEGIN``, whether the lease is fresh (else no transaction starts:
``LeaseStale``, busy, or ``LeaseLost``), and right after the ``BEGIN``
lets it check, inside the transaction, that the instance is still open (on
PostgreSQL a ``FOR SHARE`` read of its ``site_instance`` row, which a
reaper's update must wait for).  So nothing a fenced site writes commits
after its reap.

Isolation (PostgreSQL), decided by measurement (issue 13, BENCH.md B7).
With every write ``SERIALIZABLE``, two sites applying reports for
*different* nodes conflicted: two sessions, 1,000 transactions each way,
saw 40001 in 11 % of batches of 12 reports (9 lost all their reruns)
and 0.4 % of single reports, and two sites made 0.4-0.5x the reports of
one.  The cause is SSI's predicate-lock granularity, not a real conflict:
``= ANY(…)`` over a node's gids is a bitmap heap scan, which locks heap
*pages*; more than ``max_pred_locks_per_page`` (2) tuples of a page, or
``max_pred_locks_per_relation`` of a table, are promoted to a page or a
whole-relation lock (``pg_locks`` during a batch of 12 reports: SIReadLock
on all of ``gallery``, ``task_operation`` and ``report_receipt``); and
btree scans lock index *leaf pages*, which hold hundreds of neighbouring
gids.  Raising the settings and forcing plain index scans brought the
heap locks down to tuples but left the leaf pages, and the conflicts
stayed (9-15 % of batches).  So a hot, row-scoped write declares
``READ COMMITTED`` (:func:`read_committed`) and takes explicit row locks
instead -- what production systems do for a hot path:

* such a function locks, before it reads them and in a fixed order (by
  key), the rows it decides from (``SELECT … ORDER BY key``
  :data:`~tasknet.site.storage.engine.dialect.FOR_UPDATE_SQL`; advisory locks for
  what has no row), and writes only through statements that hold on the
  latest row version;
* every ``SERIALIZABLE`` write that changes what such a function decides
  from writes (not only reads) one of the rows it locks: it then waits for
  the lock, and if the locking transaction changed that row it fails 40001
  and reruns on the new state; if it committed first, the locking read
  returns after it and sees its result.  Either way the outcome is one of the two serial
  orders.  (SSI does not see a ``READ COMMITTED`` writer, so this rule, not
  SSI, is what keeps the two correct; reports.py, "Several sites", checks
  it for every writer of a reported task);
* on SQLite nothing changes (one writer, ``BEGIN IMMEDIATE``);
* a group-committed transaction runs at the strictest isolation any of its
  writes declared (the row locks are taken all the same), so a
  ``SERIALIZABLE`` write never runs weaker than it asked.

Reports (:mod:`~tasknet.site.storage.reports`) and the outbox marks
(:mod:`~tasknet.site.storage.outbox`) are ``READ COMMITTED``; every other
write stays ``SERIALIZABLE``.  The same two sessions then saw no conflict
at all; the locks cost about 9 % of a 25-report batch's time in the
database (1.9 of 21.6 ms, median).

Constraint and trigger violations are the driver's integrity errors on
both backends (:func:`is_integrity_error` tells them apart; above storage
they are :class:`DatabaseFailed`, as on SQLite).  On PostgreSQL a failed
statement aborts its transaction, so storage code never catches one and
carries on: it writes ``ON CONFLICT DO NOTHING`` and looks at ``rowcount``
(or puts the statement under a savepoint of its own).
"""

from __future__ import annotations

import math
import os
import random
import re
import sqlite3
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeAlias, TypeVar
from urllib.parse import unquote

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Interface

from tasknet.clock import default_reactor
from tasknet.logging import REDACTED, redact_secrets
from tasknet.site.storage.engine.dialect import POSTGRES_BEGIN_READ_COMMITTED
from tasknet.site.storage.engine.errors import (
    CommitUnknown,
    DatabaseBusy,
    DatabaseFailed,
    DatabaseUnavailable,
    TransactionLost,
)

if TYPE_CHECKING:
    from tasknet.site.storage.engine.postgres import PgConnection, PgCursor

log = Logger()

P = ParamSpec("P")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 -- an item of a coalesced write
R = TypeVar("R")

#: A connection of either backend (the sqlite3 subset the storage code uses).
Connection: TypeAlias = "sqlite3.Connection | PgConnection"
#: The cursor every transaction function takes, of either backend.
Cursor: TypeAlias = "sqlite3.Cursor | PgCursor"

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
_URL_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str) -> bool:
    """Whether ``target`` (a ``--db`` value) names a PostgreSQL database
    (a ``postgresql://`` or ``postgres://`` URL) rather than a SQLite file."""
    return target.startswith(_URL_SCHEMES)


def backend_of(target: str) -> str:
    """``"postgresql"`` or ``"sqlite"`` for a ``--db`` value."""
    return POSTGRESQL if is_postgres(target) else SQLITE


def _passwords(target: str) -> set[str]:
    """Every spelling of the passwords in a ``--db`` URL: the userinfo's
    (``user:PW@``; up to the last ``@`` of the authority, or of the whole
    text for a URL too broken to tell) and each ``password=`` parameter,
    each as written and percent-decoded."""
    if not is_postgres(target):
        return set()
    rest = target.partition("://")[2]
    found: set[str] = set()
    authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    for userinfo in (rest[:authority_end], rest):
        credentials, at, _ = userinfo.rpartition("@")
        if at and ":" in credentials:
            found.add(credentials.split(":", 1)[1])
    for match in re.finditer(r"(?i)[?&]password=([^&#]*)", target):
        found.add(match.group(1))
    found |= {unquote(value) for value in found}
    found.discard("")
    return found


def redact(text: str, target: str | None = None) -> str:
    """``text`` (a message, a driver's error) fit for a log line or a
    terminal: no password of a URL or connection string in it, and none of
    ``target``'s (a ``--db`` value) wherever it appears, in any spelling
    (libpq's errors repeat a bad URI, or just its password, as written).
    The one helper for this: every message naming a target or carrying a
    database error goes through it (``describe`` for the target itself)."""
    if target is not None:
        # Longest first, so a password that contains another is replaced whole.
        for password in sorted(_passwords(target), key=len, reverse=True):
            text = text.replace(password, REDACTED)
    return redact_secrets(text)


def describe(target: str) -> str:
    """``target`` (a ``--db`` value) fit for a log line or a message: a URL
    without its password (``user:***@``, ``password=***``)."""
    return redact(target, target)


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

#: How many times a write transaction that lost a serialization conflict
#: (PostgreSQL) is run again before it fails :class:`DatabaseBusy`, and the
#: pause before the first rerun (doubled each time, jittered, capped).
CONFLICT_RETRIES = 8
CONFLICT_PAUSE = 0.004
CONFLICT_PAUSE_MAX = 0.2

#: How many times a write transaction that met a dead connection is run
#: again on a fresh one, and the pause before each rerun (doubled each time).
RECONNECT_RETRIES = 3
RECONNECT_PAUSE = 0.05


class IWriteFence(Interface):
    """What the writer asks before and inside every write transaction of a
    site instance (the module doc, "The write fence")."""

    def before_transaction() -> None:
        """Raise (``LeaseStale``, ``LeaseLost``) if no write may start now."""

    def in_transaction(cursor: Cursor) -> None:
        """Raise (``LeaseLost``) if this transaction must not commit."""


#: The isolation a write function may declare (PostgreSQL; on SQLite every
#: write is the one writer's ``BEGIN IMMEDIATE`` whatever it declares).
#: Ordered weakest first: a transaction runs at the strictest of its writes'.
READ_COMMITTED = "read committed"
SERIALIZABLE = "serializable"
_STRICTNESS = {READ_COMMITTED: 0, SERIALIZABLE: 1}
_ISOLATION = "__tasknet_isolation__"

F = TypeVar("F", bound=Callable[..., Any])


def read_committed(fn: F) -> F:
    """Declare that the write function ``fn`` runs at ``READ COMMITTED`` on
    PostgreSQL (see the module doc, "Isolation"): ``fn`` itself locks, in a
    fixed order and before it reads them, the rows it decides from
    (:data:`~tasknet.site.storage.engine.dialect.FOR_UPDATE_SQL`), so that it is
    correct against every other write."""
    setattr(fn, _ISOLATION, READ_COMMITTED)
    return fn


def isolation_of(fn: Callable[..., Any]) -> str:
    """The isolation ``fn`` declared (:data:`SERIALIZABLE` unless it says
    otherwise)."""
    return getattr(fn, _ISOLATION, SERIALIZABLE)


def _strictest(levels: Iterable[str]) -> str:
    return max(levels, key=_STRICTNESS.__getitem__, default=SERIALIZABLE)


def _begin_sql(connection: Any, isolation: str) -> str:
    """The ``BEGIN`` of a write at ``isolation`` on ``connection``."""
    if isolation == READ_COMMITTED and not isinstance(connection, sqlite3.Connection):
        return POSTGRES_BEGIN_READ_COMMITTED
    return "BEGIN IMMEDIATE"


# SQLSTATEs of a serialization failure and a deadlock (postgres.CONFLICTS,
# repeated so that the SQLite path never imports the PostgreSQL module).
_CONFLICTS = frozenset({"40001", "40P01"})


def _postgres_module() -> Any:
    from tasknet.site.storage.engine import postgres

    return postgres


def _is_psycopg_error(error: BaseException) -> bool:
    # psycopg is imported only by the PostgreSQL adapter: without it loaded,
    # no error can be psycopg's.
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(error, psycopg.Error)


def is_integrity_error(error: BaseException) -> bool:
    """The driver's constraint or trigger violation, on either backend."""
    if isinstance(error, sqlite3.IntegrityError):
        return True
    return _is_psycopg_error(error) and bool(_postgres_module().is_integrity_error(error))


def classify(error: BaseException | None) -> BaseException | None:
    """The exception a caller above storage sees for ``error``: a driver
    error becomes :class:`DatabaseBusy` or :class:`DatabaseFailed` (same
    message, the driver's exception as ``__cause__``); anything else (a
    :class:`TaskError`, a bug in ``fn``, one already classified) is kept."""
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        busy = (code is not None and code & 0xFF in _BUSY_CODES) or (
            code is None
            and isinstance(error, sqlite3.OperationalError)
            and ("locked" in str(error) or "busy" in str(error))
        )
    elif error is not None and _is_psycopg_error(error):
        if _postgres_module().is_connection_lost(error):
            unavailable = DatabaseUnavailable(f"the database cannot be reached: {error}")
            unavailable.__cause__ = error
            return unavailable
        busy = bool(_postgres_module().is_busy(error))
    else:
        return error  # not the driver's (a TaskError, a bug in fn, already classified)
    classified: Exception = DatabaseBusy(str(error)) if busy else DatabaseFailed(str(error))
    classified.__cause__ = error
    return classified


def _is_conflict(error: BaseException, connection: Any) -> bool:
    """A serialization failure or deadlock (PostgreSQL), raised by a
    statement or swallowed by ``fn`` and left on its aborted transaction.
    Ask before rolling back.  Never true on SQLite (no ``sqlstate``)."""
    if getattr(error, "sqlstate", None) in _CONFLICTS:
        return True
    failed_by = getattr(connection, "failed_by", None)
    return getattr(failed_by, "sqlstate", None) in _CONFLICTS


class _Conflict(Exception):
    """A transaction lost a serialization conflict: run it again."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Reconnect(Exception):
    """A transaction met a dead connection before its ``COMMIT``: nothing
    of it committed; run it again on a fresh connection."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _connection_lost(error: BaseException, connection: Any) -> bool:
    """The connection died under ``error`` (PostgreSQL; never on SQLite)."""
    if isinstance(connection, sqlite3.Connection):
        return False
    if bool(getattr(connection, "broken", False)):
        return True
    return _is_psycopg_error(error) and bool(_postgres_module().is_connection_lost(error))


def _commit_unknown(error: BaseException) -> CommitUnknown:
    unknown = CommitUnknown(
        "the database connection was lost during COMMIT: the transaction may or may not "
        f"have committed ({type(error).__name__}: {error})"
    )
    unknown.__cause__ = error
    return unknown


def _reconnect_pause(attempt: int) -> None:
    time.sleep(RECONNECT_PAUSE * 2 ** (attempt - 1))


def _unavailable(error: BaseException) -> DatabaseUnavailable:
    unavailable = DatabaseUnavailable(
        f"the database connection failed on each of {RECONNECT_RETRIES + 1} attempts: "
        f"{type(error).__name__}: {error}"
    )
    unavailable.__cause__ = error
    return unavailable


def _begin(
    connection: Connection, cursor: Cursor, isolation: str, fence: IWriteFence | None
) -> None:
    """The ``BEGIN`` of a write, behind the fence's checks (the module doc)."""
    if fence is not None:
        fence.before_transaction()
    cursor.execute(_begin_sql(connection, isolation))
    if fence is not None:
        try:
            fence.in_transaction(cursor)
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise


def _conflict_pause(attempt: int) -> None:
    """The writer thread's pause before rerun ``attempt`` (1, 2, ...)."""
    delay = min(CONFLICT_PAUSE_MAX, CONFLICT_PAUSE * 2 ** (attempt - 1))
    time.sleep(delay * random.uniform(0.5, 1.5))  # noqa: S311 -- jitter, not secrecy


def _conflicts_exhausted(error: BaseException) -> DatabaseBusy:
    busy = DatabaseBusy(
        f"serialization conflict on every one of {CONFLICT_RETRIES + 1} attempts: {error}"
    )
    busy.__cause__ = error
    return busy


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


def connect(target: str) -> Connection:
    """A plain configured connection (autocommit mode), for tools and tests
    that work outside the reactor (``tasknet-migrate``, ``tasknet-admin``):
    a SQLite file (a new one is created 0600) or a PostgreSQL database."""
    if is_postgres(target):
        return _postgres_module().connect(target, lock_timeout_ms=BUSY_TIMEOUT_MS)  # type: ignore[no-any-return]
    return connect_sqlite(target)


def connect_sqlite(path: str) -> sqlite3.Connection:
    """:func:`connect` for a SQLite file (the SQLite-only tools)."""
    create_private(path)
    connection = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    configure_connection(connection)
    return connection


def _write_once(
    connection: Connection,
    fn: Callable[..., T],
    *args: Any,
    isolation: str | None = None,
    fence: IWriteFence | None = None,
) -> T:
    """One ``BEGIN IMMEDIATE; fn; COMMIT`` (at ``isolation``, else the one
    ``fn`` declared, behind ``fence``); raises :class:`_Conflict` for a
    serialization conflict, :class:`_Reconnect` for a dead connection before
    the ``COMMIT``, :class:`CommitUnknown` for one during it, anything else
    as it was raised."""
    cursor = connection.cursor()
    committing = False
    try:
        _begin(connection, cursor, isolation or isolation_of(fn), fence)
    except Exception as error:
        cursor.close()
        if _connection_lost(error, connection):
            raise _Reconnect(error) from error
        raise
    try:
        result = fn(cursor, *args)
        committing = True
        cursor.execute("COMMIT")
    except Exception as error:
        conflict = _is_conflict(error, connection)
        lost = _connection_lost(error, connection)
        if connection.in_transaction and not lost:
            connection.execute("ROLLBACK")
        if conflict:
            raise _Conflict(error) from error
        if lost:
            if committing:
                raise _commit_unknown(error) from error
            raise _Reconnect(error) from error
        raise
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    finally:
        cursor.close()
    return result


def run_write(connection: Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(cursor, *args)`` in one ``BEGIN IMMEDIATE`` transaction on a
    plain connection (at the isolation ``fn`` declared); roll back on any
    exception (raised as the driver's: tools outside the site classify
    nothing).  A serialization conflict (PostgreSQL) runs it again, as the
    writer does (see the module doc).
    Used by the pool below and by synchronous tools, so both share one
    definition of "a transaction"."""
    attempt = reconnects = 0
    while True:
        try:
            return _write_once(connection, fn, *args)
        except _Conflict as conflict:
            attempt += 1
            if attempt > CONFLICT_RETRIES:
                raise conflict.error from None
            _conflict_pause(attempt)
        except _Reconnect as reconnect:
            reconnects += 1
            if reconnects > RECONNECT_RETRIES:
                raise reconnect.error from None
            _reconnect_pause(reconnects)


def run_read(connection: Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(cursor, *args)`` in one read transaction (a consistent snapshot)."""
    cursor = connection.cursor()
    cursor.execute("BEGIN")
    try:
        result = fn(cursor, *args)
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    finally:
        if connection.in_transaction:
            connection.execute("COMMIT")
        cursor.close()
    return result


def _raw(adbapi_connection: Any) -> Connection:
    # adbapi hands runWithConnection its own Connection wrapper; the driver
    # connection (sqlite3's, or a PgConnection) is inside.
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
    #: The isolation its function declared (:func:`isolation_of`).
    isolation: str = ""

    def __post_init__(self) -> None:
        if not self.isolation:
            self.isolation = isolation_of(self.fn)

    @property
    def coalesced(self) -> bool:
        return self.item is not _PLAIN


_Unit = list[_Write]


class _Transactions:
    """Numbers committed transactions and counts the transactions that lost
    a serialization conflict or met a dead connection (touched by one
    thread at a time); holds the write fence they all pass."""

    def __init__(self, fence: IWriteFence | None = None) -> None:
        self.count = 0
        self.conflicts = 0
        self.reconnects = 0
        self.fence = fence

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


def _call(cursor: Cursor, unit: _Unit) -> None:
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


def _run_alone(connection: Connection, unit: _Unit, transactions: _Transactions) -> None:
    """A lone write or item: exactly :func:`run_write` (its conflicts raised
    as :class:`_Conflict`, for :func:`_run_retrying` to run it again)."""
    started = time.monotonic()
    try:
        _write_once(
            connection,
            lambda cursor: _call(cursor, unit),
            isolation=_isolation_of(unit),
            fence=transactions.fence,
        )
    except (_Conflict, _Reconnect):
        raise
    except Exception:
        _fail(unit, _classified_failure())
        return
    transactions.committed(unit, started)


def _isolation_of(unit: Sequence[_Write]) -> str:
    return _strictest(w.isolation for w in unit)


def _run_retrying(connection: Connection, unit: _Unit, transactions: _Transactions) -> None:
    """:func:`_run_alone`, run again after each serialization conflict (at
    most :data:`CONFLICT_RETRIES` times, then :class:`DatabaseBusy`) and
    after each dead connection (at most :data:`RECONNECT_RETRIES` times,
    then :class:`DatabaseUnavailable`)."""
    conflicts = reconnects = 0
    while True:
        try:
            _run_alone(connection, unit, transactions)
            return
        except _Reconnect as reconnect:
            for write in unit:
                write.result, write.failure = None, None
            transactions.reconnects += 1
            reconnects += 1
            if reconnects > RECONNECT_RETRIES:
                _fail(unit, Failure(_unavailable(reconnect.error)))
                return
            _reconnect_pause(reconnects)
        except _Conflict as conflict:
            for write in unit:
                write.result, write.failure = None, None
            transactions.conflicts += 1
            conflicts += 1
            if conflicts > CONFLICT_RETRIES:
                _fail(unit, Failure(_conflicts_exhausted(conflict.error)))
                return
            _conflict_pause(conflicts)


def _abandon(connection: Connection, error: Exception) -> _Conflict:
    """Roll back a transaction that lost a serialization conflict."""
    if connection.in_transaction:
        connection.execute("ROLLBACK")
    return _Conflict(error)


def _run_together(
    connection: Connection, units: list[_Unit], transactions: _Transactions
) -> list[_Unit]:
    """Run ``units`` as one transaction, a savepoint each (a failed coalesced
    unit again item by item).  Returns the units not run because the
    transaction ended early (they get a transaction of their own next).
    A serialization conflict rolls it all back and raises :class:`_Conflict`."""
    cursor = connection.cursor()
    todo = deque(units)
    ran: list[_Write] = []
    started = time.monotonic()
    committing = False
    try:
        try:
            _begin(
                connection,
                cursor,
                _isolation_of([w for unit in units for w in unit]),
                transactions.fence,
            )
        except Exception as e:
            if _connection_lost(e, connection):
                raise _Reconnect(e) from e
            _fail([w for unit in units for w in unit], _classified_failure())
            return []
        try:
            while todo:
                unit = todo.popleft()
                cursor.execute(f"SAVEPOINT {_SAVEPOINT}")
                try:
                    _call(cursor, unit)
                except Exception as e:
                    if _connection_lost(e, connection):
                        raise _Reconnect(e) from e
                    if _is_conflict(e, connection):
                        raise _abandon(connection, e) from e
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
            committing = True
            cursor.execute("COMMIT")
        except (_Conflict, _Reconnect):
            raise
        except Exception as e:
            # COMMIT failed (e.g. a deferred constraint, a serialization
            # conflict), or a savepoint statement did: nothing of the
            # transaction is committed -- unless the connection died during
            # the COMMIT, when nobody knows.
            if _connection_lost(e, connection):
                if committing:
                    _fail(ran + [w for unit in todo for w in unit], Failure(_commit_unknown(e)))
                    return []
                raise _Reconnect(e) from e
            if _is_conflict(e, connection):
                raise _abandon(connection, e) from e
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
    connection: Connection, writes: Sequence[_Write], transactions: _Transactions
) -> None:
    """The writer's work for what it took from the queue: one transaction
    (or more, should one end early).  A transaction of several writes that
    lost a serialization conflict is run again write by write (an item of a
    coalesced unit alone), each its own transaction with its own reruns, its
    writes' results and failures forgotten (see the module doc).  Touches
    no Deferred."""
    units = _units(writes)
    while units:
        if len(units) == 1 and len(units[0]) == 1:
            _run_retrying(connection, units[0], transactions)
            return
        try:
            units = _run_together(connection, units, transactions)
        except (_Conflict, _Reconnect) as lost:
            if isinstance(lost, _Conflict):
                transactions.conflicts += 1
                _conflict_pause(1)
            else:
                transactions.reconnects += 1
            again = [w for unit in units for w in unit]
            for write in again:
                write.result, write.failure = None, None
            for write in again:
                _run_retrying(connection, [write], transactions)
            return


def run_coalesced(
    connection: Connection,
    fn: Callable[[Cursor, list[I]], Sequence[R]],
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


#: Reader connections of a PostgreSQL database (SQLite: always one, WAL
#: readers never wait).  One by default, as on SQLite: a site's reads are
#: short and its CPU, not the server, is what bounds them; a deployment
#: with long reports or many API clients may give more (``readers``).
DEFAULT_READERS = 1


class Database:
    """The site's database handle: one writer connection (group commit),
    one reader connection (PostgreSQL: ``readers`` of them).  ``target`` is
    a SQLite path or a PostgreSQL URL; ``clock`` times the retries of
    :meth:`write_retrying`; ``application_name`` names the PostgreSQL
    sessions (``pg_stat_activity``).

    ``writes`` and ``transactions`` count committed writes and the
    transactions that carried them (logs, tests, benchmarks)."""

    def __init__(
        self,
        target: str,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        clock: Any = None,
        readers: int = DEFAULT_READERS,
        application_name: str = "tasknet-site",
        reader_application_name: str | None = None,
        fence: IWriteFence | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
        if readers < 1:
            raise ValueError(f"readers must be >= 1, got {readers}")
        self.target = target
        #: The same as ``target`` (its name before PostgreSQL).
        self.path = target
        self.backend = backend_of(target)
        self.max_batch = max_batch
        self._busy_timeout_ms = busy_timeout_ms
        self._clock = default_reactor(clock)
        if self.backend == POSTGRESQL:
            self._writer = self._postgres_pool(target, application_name, readers=0)
            self._reader = self._postgres_pool(
                target, reader_application_name or application_name, readers=readers
            )
        else:
            create_private(target)
            self._writer = self._pool(target, query_only=False)
            self._reader = self._pool(target, query_only=True)
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
        self._numbering = _Transactions(fence)
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

    def _postgres_pool(
        self, target: str, application_name: str, *, readers: int
    ) -> adbapi.ConnectionPool:
        """The writer's pool (``readers=0``: one connection) or the readers'
        (read-only sessions).  adbapi loads the adapter module as its DB-API
        module and passes these keywords to its ``connect``."""
        return adbapi.ConnectionPool(
            "tasknet.site.storage.engine.postgres",
            target,
            lock_timeout_ms=self._busy_timeout_ms,
            read_only=readers > 0,
            application_name=application_name,
            cp_min=1,
            cp_max=max(1, readers),
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
            return self._queued(
                _Write(lambda cursor: fn(cursor, *args, **kw), isolation=isolation_of(fn))
            )
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
                    "{what}: {error}; retrying in {delay:.1f} s",
                    what=retry.what,
                    error=e,
                    delay=delay,
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
        self, fn: Callable[Concatenate[sqlite3.Cursor, P], T], *args: P.args, **kw: P.kwargs
    ) -> Deferred[T]:
        """Run ``fn(cursor, *args)`` in a read transaction on the reader
        connection (``query_only``: a write there raises); errors classified
        as :meth:`write`'s."""
        d = self._reader.runWithConnection(
            lambda c: _read_reconnecting(_raw(c), lambda cur: fn(cur, *args, **kw))
        )
        return d.addErrback(_reraise_classified)

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


def _ping(cursor: sqlite3.Cursor) -> None:
    cursor.execute("SELECT 1").fetchone()


def _read_reconnecting(connection: Connection, fn: Callable[[Any], T]) -> T:
    """:func:`run_read`, once more on a fresh connection if the first met a
    dead one (a read is always safe to repeat)."""
    try:
        return run_read(connection, fn)
    except Exception as error:
        if not _connection_lost(error, connection):
            raise
    return run_read(connection, fn)


def _reraise_classified(failure: Failure) -> Failure:
    classified = classify(failure.value)
    return failure if classified is failure.value else Failure(classified)


def open_pool(target: str, **options: Any) -> Database:
    """Open the site database ``target`` (a SQLite file, created if absent,
    or a PostgreSQL URL); ``options`` are :class:`Database`'s keyword
    arguments."""
    return Database(target, **options)
