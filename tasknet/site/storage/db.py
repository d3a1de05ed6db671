"""The site database: an adbapi pool over one SQLite file.

Every transaction of the site is one named function of a cursor
(``fn(cursor, *args)``), grouped by subject in ``tasknet/site/storage/*.py``,
and run here:

* :meth:`Database.write` runs it between ``BEGIN IMMEDIATE`` and ``COMMIT`` on
  the single writer connection (SQLite serialises writers anyway; one writer
  thread means no ``SQLITE_BUSY`` between our own transactions, and
  ``BEGIN IMMEDIATE`` takes the write lock up front, so a transaction never
  fails half-way when it upgrades from read to write).  Any exception rolls
  the whole transaction back and fails the Deferred.
* :meth:`Database.read` runs it inside a deferred (read) transaction on a
  separate read connection; with WAL it sees the last committed state and
  never waits for the writer.

Rows are :class:`sqlite3.Row` (index by position or by column name).
Connections use ``isolation_level=None``: the sqlite3 module never opens or
commits a transaction on its own, only the statements above do.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred
from twisted.logger import Logger

log = Logger()

P = ParamSpec("P")
T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000

# LIFECYCLE.md, "Deployment and migration" 3: every connection.  FULL
# synchronous because an ACK tells a node to forget its snapshot: the commit
# behind it has to survive a power cut, not only a process crash.
PRAGMAS = (
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
)


def configure_connection(connection: sqlite3.Connection) -> None:
    """Apply the PRAGMAs every connection of the site must have."""
    connection.row_factory = sqlite3.Row
    for pragma in PRAGMAS:
        connection.execute(pragma)


def connect(path: str) -> sqlite3.Connection:
    """A plain configured connection (autocommit mode), for tools and tests
    that work outside the reactor (``tasknet-migrate``, ``tasknet-admin``)."""
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


class Database:
    """The site's database handle: one writer connection, one reader connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._writer = self._pool(path, query_only=False)
        self._reader = self._pool(path, query_only=True)

    @staticmethod
    def _pool(path: str, *, query_only: bool) -> adbapi.ConnectionPool:
        def openfun(connection: sqlite3.Connection) -> None:
            configure_connection(connection)
            if query_only:
                connection.execute("PRAGMA query_only=ON")

        return adbapi.ConnectionPool(
            "sqlite3",
            path,
            check_same_thread=False,
            isolation_level=None,
            timeout=BUSY_TIMEOUT_MS / 1000,
            cp_min=1,
            cp_max=1,
            cp_openfun=openfun,
            cp_noisy=False,
        )

    def write(
        self, fn: Callable[Concatenate[sqlite3.Cursor, P], T], *args: P.args, **kw: P.kwargs
    ) -> Deferred[T]:
        """Run ``fn(cursor, *args)`` in a ``BEGIN IMMEDIATE … COMMIT`` write
        transaction in the writer thread.  Fires with its result once
        committed; fails (nothing committed) if ``fn`` or the commit raises."""
        return self._writer.runWithConnection(
            lambda c: run_write(_raw(c), lambda cur: fn(cur, *args, **kw))
        )

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
        for pool in (self._writer, self._reader):
            if pool.running:
                pool.close()


def open_pool(path: str) -> Database:
    """Open the site database at ``path`` (created if absent)."""
    return Database(path)
