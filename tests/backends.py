"""What a test does differently on the two database backends.

The tests run on a SQLite file or a PostgreSQL database (``db_target`` in
tests/conftest.py).  The site's own code takes either through the storage
seam; a test that reaches past it (a fault injected with a trigger, a lock
held by "another process", the driver's exception behind a classified one)
uses these, so the test itself is written once.  They talk to the database
directly (sqlite3, psycopg), never through the code under test.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors

from tasknet.drill.pgserver import ThrowawayPostgres
from tasknet.site.storage.engine.database import (
    backend_of as backend_of,  # re-exported for the tests
)
from tasknet.site.storage.engine.database import is_postgres


def replication_of(target: str) -> str:
    """What ``/healthz`` says of replication on the suite's databases: the
    one throwaway server has no standby (``none``); SQLite has none to have."""
    return "none" if is_postgres(target) else "n/a"


#: The backends a ``db_target`` test runs on (its parameter ids).
BACKENDS = ("sqlite", "postgresql")

#: ``new_db_target`` (tests/conftest.py): each call a fresh empty database of
#: the test's backend, ``new_db_target("name")`` to tell several apart.
NewTarget = Callable[..., str]

#: The driver's exception for a refused constraint or trigger, either backend.
INTEGRITY_ERRORS: tuple[type[Exception], ...] = (sqlite3.IntegrityError, psycopg.IntegrityError)

#: Any driver error, either backend.
DRIVER_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, psycopg.Error)


def _pg(target: str) -> psycopg.Connection[Any]:
    return psycopg.connect(target, autocommit=True)


def execute(target: str, sql: str, *params: Any) -> None:
    """Run one statement on its own connection, outside any test helper's."""
    if is_postgres(target):
        with _pg(target) as connection:
            connection.execute(sql.replace("?", "%s"), params or None)
        return
    connection = sqlite3.connect(target, isolation_level=None)
    try:
        connection.execute(sql, params)
    finally:
        connection.close()


def add_failing_trigger(
    target: str,
    name: str,
    table: str,
    message: str,
    *,
    event: str = "INSERT",
    when: str | None = None,
) -> None:
    """A trigger that refuses every row ``event`` (INSERT, UPDATE, ...) on
    ``table`` (``when``: only rows matching that condition on ``NEW``) with
    ``message``: a real error of the database, raised inside the code under
    test's own statement (an integrity error on both backends)."""
    if is_postgres(target):
        condition = f" WHEN ({when})" if when else ""
        execute(
            target,
            f"CREATE FUNCTION {name}_refuse() RETURNS trigger LANGUAGE plpgsql AS $body$"
            f" BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = 'integrity_constraint_violation';"
            " END $body$",
        )
        execute(
            target,
            f'CREATE TRIGGER {name} BEFORE {event} ON "{table}" FOR EACH ROW{condition}'
            f" EXECUTE FUNCTION {name}_refuse()",
        )
        return
    condition = f" WHEN {when}" if when else ""
    execute(
        target,
        f'CREATE TRIGGER {name} BEFORE {event} ON "{table}"{condition}'
        f" BEGIN SELECT RAISE(ABORT, '{message}'); END",
    )


def drop_failing_trigger(target: str, name: str, table: str) -> None:
    if is_postgres(target):
        execute(target, f'DROP TRIGGER {name} ON "{table}"')
        execute(target, f"DROP FUNCTION {name}_refuse()")
        return
    execute(target, f"DROP TRIGGER {name}")


def busy_timeout_sql(target: str, milliseconds: int) -> str:
    """The statement that makes a connection wait at most ``milliseconds``
    for a lock before failing busy (to shorten a test's wait)."""
    if is_postgres(target):
        return f"SET lock_timeout = {int(milliseconds)}"
    return f"PRAGMA busy_timeout = {int(milliseconds)}"


class WriteLock:
    """Every write of the database blocked by another session, as another
    process holding the lock would: SQLite's ``BEGIN EXCLUSIVE`` (WAL:
    readers go on), PostgreSQL's ``LOCK TABLE … IN EXCLUSIVE MODE`` on every
    table (reads go on, writes wait).  Nothing is written; :meth:`release`
    rolls back."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None

    def acquire(self) -> WriteLock:
        if is_postgres(self.target):
            connection = psycopg.connect(self.target)  # a transaction until rollback
            tables = [
                r[0]
                for r in connection.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                )
            ]
            names = ", ".join(f'"{t}"' for t in tables)
            connection.execute(f"LOCK TABLE {names} IN EXCLUSIVE MODE")
            self._pg = connection
        else:
            self._sqlite = sqlite3.connect(self.target, isolation_level=None, timeout=0)
            self._sqlite.execute("BEGIN EXCLUSIVE")
        return self

    def release(self) -> None:
        if self._pg is not None:
            self._pg.rollback()
            self._pg.close()
            self._pg = None
        if self._sqlite is not None:
            self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
            self._sqlite = None

    @property
    def held(self) -> bool:
        return self._pg is not None or self._sqlite is not None


@contextmanager
def write_lock(target: str) -> Iterator[WriteLock]:
    """:class:`WriteLock` held for the ``with`` block."""
    lock = WriteLock(target).acquire()
    try:
        yield lock
    finally:
        lock.release()


class SeededCopies:
    """Fresh copies of one seeded database, for tests that need many (a
    property test's examples): the seed runs once into a template, each
    :meth:`copy` is a copy of its file (SQLite) or a ``CREATE DATABASE …
    TEMPLATE`` (PostgreSQL; dropped by :meth:`close`).

    ``seed(target)`` prepares and fills an empty database; ``directory``:
    where the SQLite files go; ``server``: PostgreSQL's (None: SQLite)."""

    def __init__(
        self,
        seed: Callable[[str], None],
        *,
        name: str,
        directory: Path,
        server: ThrowawayPostgres | None,
    ) -> None:
        self.name = name
        self.directory = directory
        self.server = server
        self._copies = itertools.count(1)
        self._databases: list[str] = []
        if server is None:
            self.template = str(directory / f"{name}-template.sqlite")
        else:
            self.template = server.create_database(f"{name}_template")
            self._databases.append(f"{name}_template")
        seed(self.template)

    @property
    def backend(self) -> str:
        return "sqlite" if self.server is None else "postgresql"

    def copy(self) -> str:
        number = next(self._copies)
        if self.server is None:
            target = self.directory / f"{self.name}-copy-{number}.sqlite"
            shutil.copyfile(self.template, target)
            return str(target)
        database = f"{self.name}_copy_{number}"
        self._databases.append(database)
        return self.server.create_database(
            database, template=f"{self.name}_template", file_copy=True
        )

    def close(self) -> None:
        if self.server is not None:
            for database in reversed(self._databases):
                self.server.drop_database(database)
        self._databases.clear()


#: :meth:`ThrowawayPostgres.reset_database`'s statements: the other sessions
#: ended (and waited for), every schema dropped, ``public`` as initdb makes it.
_RESET = (
    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid();"
    " DO $reset$ DECLARE s name; BEGIN"
    "   FOR s IN SELECT nspname FROM pg_namespace"
    "     WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' LOOP"
    "     EXECUTE format('DROP SCHEMA %I CASCADE', s);"
    "   END LOOP;"
    " END $reset$;"
    " CREATE SCHEMA public AUTHORIZATION pg_database_owner;"
    " GRANT USAGE ON SCHEMA public TO PUBLIC;"
)


class DatabasePool:
    """Empty PostgreSQL databases for the tests, reused: a database a test
    is done with is emptied (as :meth:`ThrowawayPostgres.reset_database`
    does, over one psycopg connection of the unix socket rather than a psql
    process: several times faster, and once per PostgreSQL test) and handed
    to the next test, several times cheaper than dropping it and creating
    another.  One per session (``pg_pool`` in tests/conftest.py)."""

    def __init__(self, server: ThrowawayPostgres) -> None:
        self.server = server
        self._free: list[str] = []
        self._numbers = itertools.count(1)

    def take(self) -> str:
        """The name of an empty database nobody else uses now."""
        if self._free:
            return self._free.pop()
        name = f"test_{next(self._numbers)}"
        self.server.create_database(name)
        return name

    def give_back(self, name: str) -> None:
        """Empty ``name`` for the next test (dropped if it cannot be)."""
        try:
            with psycopg.connect(self.server.socket_url(name), autocommit=True) as connection:
                connection.execute(_RESET)
        except Exception:
            self.server.drop_database(name)
            raise
        self._free.append(name)


class FailingCommits:
    """A pool's storage faults (``open_pool(storage_faults=...)``): the next
    ``left`` write transactions fail at their ``COMMIT`` with the driver's
    own error of either backend, an I/O error or (``disk_full``) a full
    disk, as the storage layer would meet a real one.  ``left`` may be set
    later (armed at the instant a test chooses)."""

    def __init__(self, target: str, left: int = 0, *, disk_full: bool = False) -> None:
        self.postgres = is_postgres(target)
        self.left = left
        self.disk_full = disk_full

    def __call__(self, point: str, connection: Any, functions: tuple[str, ...] = ()) -> None:
        if point != "commit" or self.left <= 0:
            return
        self.left -= 1
        if self.postgres:
            if self.disk_full:
                raise psycopg.errors.DiskFull("could not extend file: No space left on device")
            raise psycopg.errors.IoError("could not write to file: Input/output error")
        raise sqlite3.OperationalError(
            "database or disk is full" if self.disk_full else "disk I/O error"
        )
