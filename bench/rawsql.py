"""The plain SQL of a storage read, and running it again through the raw driver (B9).

:func:`record` runs a storage function (``fn(cursor, *args)``) once in a read
transaction, as the site does, and keeps every statement it sent with its
parameters: on SQLite at the ``sqlite3`` cursor (a proxy that writes them
down), on PostgreSQL at the ``psycopg`` level (a cursor class of the
connection's), i.e. the text the server received, ``BEGIN`` and ``COMMIT``
included.  A :class:`Replayer` then sends exactly those statements on a
connection of its own (the engine's ``connect``: the same session settings
and PRAGMAs), fetching every row as plain tuples and building nothing: the
baseline of a view is its database work alone.  :func:`explain` gives the
plan of one statement (SQLite ``EXPLAIN QUERY PLAN``; PostgreSQL
``EXPLAIN (ANALYZE, BUFFERS)``, parameters bound on the client).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Statement:
    sql: Any  # str (an engine ``Sql`` on SQLite, a psycopg query on PostgreSQL)
    params: Any


def _frozen(params: Any) -> Any:
    """The parameters as they were sent: storage code may extend its list
    for the next statement (a page's keyset after its count)."""
    if isinstance(params, list):
        return tuple(params)
    if isinstance(params, dict):
        return dict(params)
    return params


def _is_postgres(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def _connect(target: str, any_thread: bool = False) -> Any:
    from tasknet.site.storage.engine.database import connect

    if any_thread and not _is_postgres(target):
        # The engine's own connection (PRAGMAs, adapters), usable from the
        # worker thread that will run it (sqlite3 checks the thread that
        # made it).  Opened from one thread at a time (the patch is global).
        import sqlite3

        original = sqlite3.connect

        def connect_any_thread(*args: Any, **kw: Any) -> Any:
            kw["check_same_thread"] = False
            return original(*args, **kw)

        sqlite3.connect = connect_any_thread  # type: ignore[assignment]
        try:
            return connect(target)
        finally:
            sqlite3.connect = original  # type: ignore[assignment]
    return connect(target)


def psycopg_of(connection: Any) -> Any:
    """The ``psycopg.Connection`` under an engine connection."""
    import psycopg

    raw = getattr(connection, "raw", None)
    if isinstance(raw, psycopg.Connection):
        return raw
    for value in vars(connection).values():
        if isinstance(value, psycopg.Connection):
            return value
    raise TypeError(f"no psycopg connection in {connection!r}")


class _RecordingCursor:
    """A sqlite3 cursor that writes down what it executes."""

    def __init__(self, cursor: Any, log: list[Statement]) -> None:
        self._cursor = cursor
        self._log = log

    def execute(self, sql: Any, params: Any = ()) -> Any:
        self._log.append(Statement(sql, _frozen(params)))
        return self._cursor.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Any:
        return iter(self._cursor)


def record(target: str, fn: Callable[..., Any], *args: Any) -> tuple[list[Statement], Any]:
    """The statements ``fn(cursor, *args)`` sends in one read transaction,
    and its result."""
    connection = _connect(target)
    log: list[Statement] = []
    try:
        if _is_postgres(target):
            import psycopg

            from tasknet.site.storage.engine.database import run_read

            raw = psycopg_of(connection)

            class Recording(psycopg.Cursor):  # type: ignore[type-arg]
                def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
                    log.append(Statement(query, _frozen(params)))
                    return super().execute(query, params, **kw)

            raw.cursor_factory = Recording
            result = run_read(connection, fn, *args)
        else:
            cursor = connection.cursor()
            cursor.execute("BEGIN")
            try:
                result = fn(_RecordingCursor(cursor, log), *args)
            finally:
                connection.execute("COMMIT")
                cursor.close()
    finally:
        connection.close()
    return log, result


class Replayer:
    """One raw connection sending recorded statements (one thread's)."""

    def __init__(self, target: str, any_thread: bool = False) -> None:
        self.postgres = _is_postgres(target)
        self.engine_connection = _connect(target, any_thread)
        if self.postgres:
            from psycopg.rows import tuple_row

            self.raw = psycopg_of(self.engine_connection)
            self.raw.row_factory = tuple_row
        else:
            self.raw = self.engine_connection
            self.raw.row_factory = None

    def run(self, statements: Sequence[Statement], timings: list[float] | None = None) -> int:
        """Send them all, fetch every row; returns the rows fetched.
        ``timings`` gets each statement's seconds."""
        rows = 0
        raw = self.raw
        if not self.postgres:
            raw.execute("BEGIN")
        try:
            for statement in statements:
                t0 = time.perf_counter()
                cursor = raw.execute(statement.sql, statement.params)
                if cursor.description is not None:
                    rows += len(cursor.fetchall())
                if timings is not None:
                    timings.append(time.perf_counter() - t0)
        finally:
            if not self.postgres and raw.in_transaction:
                raw.execute("COMMIT")
        return rows

    def close(self) -> None:
        self.engine_connection.close()


_SKIP = ("BEGIN", "COMMIT", "ROLLBACK", "SET ", "SAVEPOINT", "RELEASE")


def is_query(statement: Statement) -> bool:
    return not str(statement.sql).lstrip().upper().startswith(_SKIP)


def explain(target: str, statement: Statement) -> list[str]:
    """The plan of ``statement`` (PostgreSQL: as run, with its timings)."""
    connection = _connect(target)
    # The plain text (an engine ``Sql`` is never formatted into another).
    text = str(statement.sql)
    try:
        if _is_postgres(target):
            import psycopg

            raw = psycopg_of(connection)
            cursor = psycopg.ClientCursor(raw)
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, statement.params)
            return [str(r[0]) for r in cursor.fetchall()]
        rows = connection.execute("EXPLAIN QUERY PLAN " + text, statement.params).fetchall()
        depth: dict[int, int] = {0: -1}
        lines = []
        for node_id, parent, _unused, detail in rows:
            depth[node_id] = depth.get(parent, -1) + 1
            lines.append("  " * depth[node_id] + str(detail))
        return lines
    finally:
        connection.close()


def one_line(sql: Any, limit: int = 400) -> str:
    text = " ".join(str(sql).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
