"""One transaction of the site: its ``BEGIN``, its isolation, the
classification of its errors and the reruns of one that lost a conflict
or its connection.

Every transaction of the site is one named function of a cursor
(``fn(cursor, *args)``), grouped by subject in ``tasknet/site/storage/*.py``.
:func:`run_write` runs it between the engine's ``BEGIN`` of a write and
``COMMIT`` and rolls back on any exception; :func:`run_read` inside a read
transaction (one consistent snapshot).  The pool
(:mod:`~tasknet.site.storage.engine.database`) and its group commit
(:mod:`~tasknet.site.storage.engine.group_commit`) run them with the same
code; tools and tests run them on a plain connection.  ``fn`` never issues
``BEGIN``, ``COMMIT`` or ``ROLLBACK`` itself (savepoints of its own are
fine: they nest).

The ``BEGIN`` is chosen here and nowhere else (:data:`BEGIN_READ`,
:data:`BEGIN_WRITE`; each a statement with a text per engine,
:func:`~tasknet.site.storage.engine.sql.per_backend`):

* SQLite: a write is ``BEGIN IMMEDIATE`` (the write lock up front, so a
  transaction never fails half-way when it upgrades from read to write; the
  pool has one writer connection, so no ``SQLITE_BUSY`` between our own
  transactions), a read a plain ``BEGIN`` (with WAL it sees the last
  committed state and never waits for the writer);
* PostgreSQL: a write is ``SERIALIZABLE`` unless its function declares
  ``READ COMMITTED`` (:func:`read_committed`, "Isolation" below); a read is
  ``REPEATABLE READ READ ONLY`` (one snapshot, like SQLite's read).

Errors leave the engine classified (``tasknet.site.storage.engine.errors``,
:func:`classify`): :class:`DatabaseBusy` ("busy, retry the transaction":
the lock was not granted within ``busy_timeout``, or the transaction was
lost to another write's error) or :class:`DatabaseFailed` (a retry would
not help); a :class:`TaskError` or any other exception of ``fn`` itself
passes unchanged.  No module above storage sees a driver's exception.
Constraint and trigger violations are the driver's integrity errors on
both backends (:func:`is_integrity_error`).  On PostgreSQL a failed
statement aborts its transaction, so storage code never catches one and
carries on: it writes ``ON CONFLICT DO NOTHING`` and looks at ``rowcount``
(or puts the statement under a savepoint of its own).

Reruns (PostgreSQL; never on SQLite, whose errors have no ``sqlstate``).
Several sites write one database, so two writes can conflict: a
serialization failure (40001) or a deadlock (40P01), wherever it surfaces
(a statement, the ``COMMIT``, or an error a function swallowed), rolls
the transaction back and runs it again from scratch after a short
jittered pause (:data:`CONFLICT_RETRIES` times at most; then
:class:`DatabaseBusy`).  A connection that died (server restart,
``idle_session_timeout``, a pooler, an operator ending the session) is
replaced and the transaction that met it is run again whole on the fresh
connection (:data:`RECONNECT_RETRIES` times at most; then
:class:`DatabaseUnavailable`, "busy").  A transaction that lost its
connection *while committing* is not run again here: it may have
committed, so it fails :class:`CommitUnknown` and only its caller, who
knows whether the function's guards make a repeat a no-op, may repeat it
(SCALE.md "Fencing" 4).  Only writes not yet committed are ever run again,
and a function is never run again after its transaction committed.

The write fence (SCALE.md "Fencing" 3).  A write run with a ``fence`` (the
site instance's lease, :class:`IWriteFence`) asks it, before every
``BEGIN``, whether the lease is fresh (else no transaction starts:
``LeaseStale``, busy, or ``LeaseLost``), and right after the ``BEGIN`` lets
it check, inside the transaction, that the instance is still open (on
PostgreSQL a ``FOR SHARE`` read of its ``site_instance`` row, which a
reaper's update must wait for).  So nothing a fenced site writes commits
after its reap.  A refusal before the ``BEGIN`` is never taken for a dead
connection (:func:`refuse_if_fenced`), even when the connection is broken
too (its primary died with the lease): a fenced site's writes fail at once
with ``LeaseLost``, never rerun, so its queue drains and it can exit.

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
  key), the rows it decides from (``SELECT … ORDER BY key {for_update}``,
  :mod:`~tasknet.site.storage.engine.sql`; advisory locks for what has no
  row), and writes only through statements that hold on the latest row
  version;
* every ``SERIALIZABLE`` write that changes what such a function decides
  from writes (not only reads) one of the rows it locks: it then waits for
  the lock, and if the locking transaction changed that row it fails 40001
  and reruns on the new state; if it committed first, the locking read
  returns after it and sees its result.  Either way the outcome is one of
  the two serial orders.  (SSI does not see a ``READ COMMITTED`` writer, so
  this rule, not SSI, is what keeps the two correct; reports.py, "Several
  sites", checks it for every writer of a reported task);
* on SQLite nothing changes (one writer, ``BEGIN IMMEDIATE``);
* a group-committed transaction runs at the strictest isolation any of its
  writes declared (the row locks are taken all the same), so a
  ``SERIALIZABLE`` write never runs weaker than it asked.

Reports (:mod:`~tasknet.site.storage.reports`) and the outbox marks
(:mod:`~tasknet.site.storage.outbox`) are ``READ COMMITTED``; every other
write stays ``SERIALIZABLE``.  The same two sessions then saw no conflict
at all; the locks cost about 9 % of a 25-report batch's time in the
database (1.9 of 21.6 ms, median).
"""

from __future__ import annotations

import random
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, TypeVarTuple

from twisted.python.failure import Failure
from zope.interface import Interface

from tasknet.site.storage.engine import sqlite
from tasknet.site.storage.engine.errors import (
    CommitUnknown,
    DatabaseBusy,
    DatabaseFailed,
    DatabaseUnavailable,
)
from tasknet.site.storage.engine.sources import fault_point
from tasknet.site.storage.engine.sql import per_backend, sql

if TYPE_CHECKING:
    from tasknet.site.storage.engine.postgres import PgConnection, PgCursor

T = TypeVar("T")
#: The arguments a transaction function takes after its cursor.
Ts = TypeVarTuple("Ts")

#: A connection of either backend (the sqlite3 subset the storage code uses).
Connection: TypeAlias = "sqlite3.Connection | PgConnection"
#: The cursor every transaction function takes, of either backend.
Cursor: TypeAlias = "sqlite3.Cursor | PgCursor"

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


# -- isolation and the transaction statements -------------------------------------------

#: The isolation a write function may declare (PostgreSQL; on SQLite every
#: write is the one writer's ``BEGIN IMMEDIATE`` whatever it declares).
#: Ordered weakest first: a transaction runs at the strictest of its writes'.
READ_COMMITTED = "read committed"
SERIALIZABLE = "serializable"
_STRICTNESS = {READ_COMMITTED: 0, SERIALIZABLE: 1}
_ISOLATION = "__tasknet_isolation__"

F = TypeVar("F", bound=Callable[..., Any])

#: The ``BEGIN`` of a read transaction.
BEGIN_READ = per_backend(sqlite="BEGIN", postgres="BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
#: The ``BEGIN`` of a write transaction at each isolation.
BEGIN_WRITE = {
    SERIALIZABLE: per_backend(
        sqlite="BEGIN IMMEDIATE", postgres="BEGIN ISOLATION LEVEL SERIALIZABLE"
    ),
    READ_COMMITTED: per_backend(
        sqlite="BEGIN IMMEDIATE", postgres="BEGIN ISOLATION LEVEL READ COMMITTED"
    ),
}
COMMIT = sql("COMMIT")
ROLLBACK = sql("ROLLBACK")


def read_committed(fn: F) -> F:
    """Declare that the write function ``fn`` runs at ``READ COMMITTED`` on
    PostgreSQL (see the module doc, "Isolation"): ``fn`` itself locks, in a
    fixed order and before it reads them, the rows it decides from
    (``{for_update}``), so that it is correct against every other write."""
    setattr(fn, _ISOLATION, READ_COMMITTED)
    return fn


def isolation_of(fn: Callable[..., object]) -> str:
    """The isolation ``fn`` declared (:data:`SERIALIZABLE` unless it says
    otherwise)."""
    return getattr(fn, _ISOLATION, SERIALIZABLE)


def strictest(levels: Iterable[str]) -> str:
    """The strictest of ``levels`` (:data:`SERIALIZABLE` for none)."""
    return max(levels, key=_STRICTNESS.__getitem__, default=SERIALIZABLE)


def refuse_if_fenced(fence: IWriteFence | None) -> None:
    """The fence's check before a write transaction (the module doc): call
    it before :func:`begin`, outside what is classified as a dead
    connection.  Its refusal (a lost or stale lease) is its answer even when
    the connection is broken too: a fenced site never reruns a write on a
    fresh connection (nor reopens one)."""
    if fence is not None:
        fence.before_transaction()


def begin(
    connection: Connection, cursor: Cursor, isolation: str, fence: IWriteFence | None
) -> None:
    """The ``BEGIN`` of a write at ``isolation`` and the fence's check
    inside it (the module doc; :func:`refuse_if_fenced` comes first)."""
    fault_point(connection, "begin")
    cursor.execute(BEGIN_WRITE[isolation])
    if fence is not None:
        try:
            fence.in_transaction(cursor)
        except BaseException:
            if connection.in_transaction:
                connection.execute(ROLLBACK)
            raise


# -- errors ---------------------------------------------------------------------------

# SQLSTATEs of a serialization failure and a deadlock (postgres.CONFLICTS,
# repeated so that the SQLite path never imports the PostgreSQL module).
_CONFLICTS = frozenset({"40001", "40P01"})


def _postgres_module() -> ModuleType:
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
        busy = sqlite.is_busy(error)
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


def classified_failure() -> Failure:
    """The exception being handled, classified, as a Failure."""
    failure = Failure()
    classified = classify(failure.value)
    return failure if classified is failure.value else Failure(classified)


def reraise_classified(failure: Failure) -> Failure:
    """An errback: ``failure`` with its exception classified."""
    classified = classify(failure.value)
    return failure if classified is failure.value else Failure(classified)


def is_conflict(error: BaseException, connection: Connection) -> bool:
    """A serialization failure or deadlock (PostgreSQL), raised by a
    statement or swallowed by ``fn`` and left on its aborted transaction.
    Ask before rolling back.  Never true on SQLite (no ``sqlstate``)."""
    if getattr(error, "sqlstate", None) in _CONFLICTS:
        return True
    failed_by = getattr(connection, "failed_by", None)
    return getattr(failed_by, "sqlstate", None) in _CONFLICTS


def connection_lost(error: BaseException, connection: Connection) -> bool:
    """The connection died under ``error`` (PostgreSQL; a SQLite connection
    is a file, never ``broken``)."""
    if bool(getattr(connection, "broken", False)):
        return True
    return _is_psycopg_error(error) and bool(_postgres_module().is_connection_lost(error))


class Conflict(Exception):
    """A transaction lost a serialization conflict: run it again."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Reconnect(Exception):
    """A transaction met a dead connection before its ``COMMIT``: nothing
    of it committed; run it again on a fresh connection."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def commit_unknown(error: BaseException) -> CommitUnknown:
    unknown = CommitUnknown(
        "the database connection was lost during COMMIT: the transaction may or may not "
        f"have committed ({type(error).__name__}: {error})"
    )
    unknown.__cause__ = error
    return unknown


def reconnect_pause(attempt: int) -> None:
    """The pause before rerun ``attempt`` (1, 2, ...) on a fresh connection."""
    time.sleep(RECONNECT_PAUSE * 2 ** (attempt - 1))


def unavailable(error: BaseException) -> DatabaseUnavailable:
    found = DatabaseUnavailable(
        f"the database connection failed on each of {RECONNECT_RETRIES + 1} attempts: "
        f"{type(error).__name__}: {error}"
    )
    found.__cause__ = error
    return found


def conflict_pause(attempt: int, jitter: random.Random | None = None) -> None:
    """The writer thread's pause before rerun ``attempt`` (1, 2, ...), its
    jitter drawn from ``jitter`` (the site's, from its root's entropy; None,
    a tool's own: the process's ``random``)."""
    delay = min(CONFLICT_PAUSE_MAX, CONFLICT_PAUSE * 2 ** (attempt - 1))
    source: ModuleType | random.Random = random if jitter is None else jitter
    time.sleep(delay * source.uniform(0.5, 1.5))


def conflicts_exhausted(error: BaseException) -> DatabaseBusy:
    busy = DatabaseBusy(
        f"serialization conflict on every one of {CONFLICT_RETRIES + 1} attempts: {error}"
    )
    busy.__cause__ = error
    return busy


# -- running one transaction ------------------------------------------------------------


def write_once(
    connection: Connection,
    fn: Callable[[Cursor, *Ts], T],
    *args: *Ts,
    isolation: str | None = None,
    fence: IWriteFence | None = None,
    functions: tuple[str, ...] = (),
) -> T:
    """One ``BEGIN; fn; COMMIT`` of a write (at ``isolation``, else the one
    ``fn`` declared, behind ``fence``); raises :class:`Conflict` for a
    serialization conflict, :class:`Reconnect` for a dead connection before
    the ``COMMIT``, :class:`CommitUnknown` for one during it, anything else
    as it was raised.  ``functions``: the storage functions ``fn`` runs, as
    its fault points name them (default: ``fn``'s own name)."""
    functions = functions or (_name(fn),)
    refuse_if_fenced(fence)
    cursor = connection.cursor()
    committing = False
    try:
        begin(connection, cursor, isolation or isolation_of(fn), fence)
    except Exception as error:
        cursor.close()
        if connection_lost(error, connection):
            raise Reconnect(error) from error
        raise
    try:
        result = fn(cursor, *args)
        fault_point(connection, "commit", functions)
        committing = True
        cursor.execute(COMMIT)
    except Exception as error:
        conflict = is_conflict(error, connection)
        lost = connection_lost(error, connection)
        if connection.in_transaction and not lost:
            connection.execute(ROLLBACK)
        if conflict:
            raise Conflict(error) from error
        if lost:
            if committing:
                raise commit_unknown(error) from error
            raise Reconnect(error) from error
        raise
    except BaseException:
        if connection.in_transaction:
            connection.execute(ROLLBACK)
        raise
    finally:
        cursor.close()
    fault_point(connection, "committed", functions)
    return result


def _name(fn: Callable[..., object]) -> str:
    return str(getattr(fn, "__name__", fn))


def run_write(
    connection: Connection,
    fn: Callable[[Cursor, *Ts], T],
    *args: *Ts,
    jitter: random.Random | None = None,
) -> T:
    """Run ``fn(cursor, *args)`` in one write transaction on a plain
    connection (at the isolation ``fn`` declared); roll back on any
    exception (raised as the driver's: tools outside the site classify
    nothing).  A serialization conflict or a dead connection (PostgreSQL)
    runs it again, as the writer does (see the module doc).  Used by the
    pool and by synchronous tools, so both share one definition of "a
    transaction".  ``jitter`` is the conflict reruns' (see
    :func:`conflict_pause`): a site part passes its root's."""
    attempt = reconnects = 0
    while True:
        try:
            return write_once(connection, fn, *args)
        except Conflict as conflict:
            attempt += 1
            if attempt > CONFLICT_RETRIES:
                raise conflict.error from None
            conflict_pause(attempt, jitter)
        except Reconnect as reconnect:
            reconnects += 1
            if reconnects > RECONNECT_RETRIES:
                raise reconnect.error from None
            reconnect_pause(reconnects)


def run_read(connection: Connection, fn: Callable[[Cursor, *Ts], T], *args: *Ts) -> T:
    """Run ``fn(cursor, *args)`` in one read transaction (a consistent snapshot)."""
    cursor = connection.cursor()
    cursor.execute(BEGIN_READ)
    try:
        result = fn(cursor, *args)
    except BaseException:
        if connection.in_transaction:
            connection.execute(ROLLBACK)
        raise
    finally:
        if connection.in_transaction:
            connection.execute(COMMIT)
        cursor.close()
    return result


def read_reconnecting(connection: Connection, fn: Callable[[Cursor], T]) -> T:
    """:func:`run_read`, once more on a fresh connection if the first met a
    dead one (a read is always safe to repeat)."""
    try:
        return run_read(connection, fn)
    except Exception as error:
        if not connection_lost(error, connection):
            raise
    return run_read(connection, fn)
