"""The two schemas are one contract (SCALE.md, "How it is built and tested").

SQLite's schema is the v1 baseline plus every upgrade (``prepare_database``
on a fresh file); PostgreSQL's is ``schema_postgres.sql`` plus its upgrades
(``prepare_database`` on an empty database).  Both must define the same
tables, the same columns of each, the same primary keys and unique
constraints, the same named indexes (columns and uniqueness), and their
transition triggers must allow exactly :data:`tasknet.site.transitions.ALLOWED`:
every pair of states is tried on each backend with raw SQL, past the
storage layer's own check.

Each schema is read from the database's own catalog (``sqlite_master`` and
the ``PRAGMA``s; ``information_schema`` and ``pg_catalog``), never from the
``.sql`` files.  Types are not compared: the dialects spell them differently.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tasknet.site import transitions
from tasknet.site.storage.engine.schema import (
    POSTGRES_ONLY_INDEXES,
    SQLITE_ONLY_TABLES,
    prepare_database,
)
from tasknet.status import OperationState
from tests.backends import BACKENDS, DRIVER_ERRORS, DatabasePool, is_postgres

REFUSAL = "illegal task_operation transition"


@dataclass(frozen=True)
class Index:
    table: str
    columns: tuple[str, ...]
    unique: bool


@dataclass
class Schema:
    columns: dict[str, list[str]]  # table -> its columns, sorted
    primary_keys: dict[str, tuple[str, ...]]  # table -> its key's columns, in key order
    unique: dict[str, set[tuple[str, ...]]]  # table -> its unique constraints' columns
    indexes: dict[str, Index]  # named (CREATE INDEX) indexes

    @property
    def tables(self) -> set[str]:
        return set(self.columns)


def sqlite_schema(path: str) -> Schema:
    connection = sqlite3.connect(path)
    try:
        tables = [
            r[0]
            for r in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            if r[0] not in SQLITE_ONLY_TABLES  # the search's FTS5 table (v6)
        ]
        schema = Schema({}, {}, {}, {})
        for table in tables:
            info = connection.execute(f'PRAGMA table_info("{table}")').fetchall()
            schema.columns[table] = sorted(r[1] for r in info)
            key = sorted((r[5], r[1]) for r in info if r[5])
            if key:
                schema.primary_keys[table] = tuple(name for _, name in key)
            schema.unique[table] = set()
            # (seq, name, unique, origin, partial); origin c: CREATE INDEX,
            # u: a UNIQUE constraint, pk: a (non-rowid) PRIMARY KEY.
            for _, name, unique, origin, _ in connection.execute(
                f'PRAGMA index_list("{table}")'
            ).fetchall():
                columns = tuple(
                    r[2] for r in connection.execute(f'PRAGMA index_info("{name}")').fetchall()
                )
                if origin == "c":
                    schema.indexes[name] = Index(table, columns, bool(unique))
                elif origin == "u":
                    schema.unique[table].add(columns)
        return schema
    finally:
        connection.close()


def postgres_schema(url: str) -> Schema:
    with psycopg.connect(url, autocommit=True) as connection:
        schema = Schema({}, {}, {}, {})
        for table, column in connection.execute(
            "SELECT c.table_name, c.column_name FROM information_schema.columns AS c"
            " JOIN information_schema.tables AS t"
            "   ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
            " WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
        ):
            schema.columns.setdefault(table, []).append(column)
        for columns in schema.columns.values():
            columns.sort()
        schema.unique = {table: set() for table in schema.columns}
        for table, kind, columns in connection.execute(
            "SELECT t.relname, c.contype,"
            "       ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY AS k(num, pos)"
            "             JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = k.num"
            "             ORDER BY k.pos)"
            " FROM pg_constraint AS c JOIN pg_class AS t ON t.oid = c.conrelid"
            " WHERE t.relnamespace = current_schema()::regnamespace AND c.contype IN ('p', 'u')"
        ):
            if kind == "p":
                schema.primary_keys[table] = tuple(columns)
            else:
                schema.unique[table].add(tuple(columns))
        # Named indexes: those no constraint owns (a key's or a UNIQUE
        # constraint's index is compared as that constraint, above).
        for name, table, unique, columns in connection.execute(
            "SELECT i.relname, t.relname, x.indisunique,"
            "       ARRAY(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY AS k(num, pos)"
            "             JOIN pg_attribute AS a ON a.attrelid = x.indrelid AND a.attnum = k.num"
            "             ORDER BY k.pos)"
            " FROM pg_index AS x"
            " JOIN pg_class AS i ON i.oid = x.indexrelid"
            " JOIN pg_class AS t ON t.oid = x.indrelid"
            " WHERE t.relnamespace = current_schema()::regnamespace"
            "   AND NOT EXISTS (SELECT 1 FROM pg_constraint AS c WHERE c.conindid = x.indexrelid)"
        ):
            if name not in POSTGRES_ONLY_INDEXES:  # the search's pg_trgm indexes (v6)
                schema.indexes[name] = Index(table, tuple(columns), bool(unique))
    return schema


@pytest.fixture
def both(tmp_path: Path, pg_pool: DatabasePool) -> Iterator[tuple[Schema, Schema]]:
    path = str(tmp_path / "site.sqlite")
    database = pg_pool.take()
    try:
        url = pg_pool.server.url(database)
        assert prepare_database(path) is True
        assert prepare_database(url) is True
        yield sqlite_schema(path), postgres_schema(url)
    finally:
        pg_pool.give_back(database)


def test_both_schemas_define_the_same_tables_and_columns(both: tuple[Schema, Schema]) -> None:
    sqlite, postgres = both
    assert sqlite.tables, "the SQLite schema has no tables"
    assert postgres.tables == sqlite.tables
    assert postgres.columns == sqlite.columns


def test_both_schemas_define_the_same_keys_and_unique_constraints(
    both: tuple[Schema, Schema],
) -> None:
    sqlite, postgres = both
    assert postgres.primary_keys == sqlite.primary_keys
    assert postgres.unique == sqlite.unique


def test_both_schemas_define_the_same_named_indexes(both: tuple[Schema, Schema]) -> None:
    sqlite, postgres = both
    assert sqlite.indexes, "the SQLite schema has no named indexes"
    assert sorted(postgres.indexes) == sorted(sqlite.indexes)
    assert postgres.indexes == sqlite.indexes


# -- the transition triggers ---------------------------------------------------

State = OperationState | None
STATES: list[State] = [None, *OperationState]


def _paths() -> dict[State, list[State]]:
    """For each state, the allowed steps that reach it from no row."""
    paths: dict[State, list[State]] = {None: []}
    todo: deque[State] = deque([None])
    while todo:
        here = todo.popleft()
        for old, new in sorted(transitions.ALLOWED, key=str):
            if old == here and new is not None and new not in paths:
                paths[new] = [*paths[here], new]
                todo.append(new)
    return paths


PATHS = _paths()
PAIRS = [(old, new) for old in STATES for new in STATES if old != new]


RECREATE_AFTER_GONE = (OperationState.SUBMITTED, OperationState.RESERVED)


def _name(state: State) -> str:
    return "none" if state is None else state.value.lower()


def _move(execute: Any, old: State, new: State) -> None:
    """One change of the gid-1 row from ``old`` to ``new`` in raw SQL."""
    if old is None:
        assert new is not None
        execute(
            "INSERT INTO task_operation (gid, operation_id, state) VALUES (1, 'op-1', ?)",
            new.value,
        )
    elif new is None:
        execute("DELETE FROM task_operation WHERE gid = 1")
    else:
        execute("UPDATE task_operation SET state = ? WHERE gid = 1", new.value)


class RawSession:
    """One transaction of the driver itself (no storage layer), rolled back."""

    def __init__(self, target: str) -> None:
        self.postgres = is_postgres(target)
        if self.postgres:
            self.pg = psycopg.connect(target)  # a transaction from the first statement on
        else:
            self.lite = sqlite3.connect(target, isolation_level=None)
            self.lite.execute("BEGIN IMMEDIATE")

    def execute(self, sql: str, *params: Any) -> None:
        if self.postgres:
            self.pg.execute(sql.replace("?", "%s"), params)
        else:
            self.lite.execute(sql, params)

    def fetch_one(self, sql: str) -> Any:
        """The first column of the first row of ``sql``."""
        if self.postgres:
            row = self.pg.execute(sql).fetchone()
        else:
            row = self.lite.execute(sql).fetchone()
        assert row is not None
        return row[0]

    def close(self) -> None:
        if self.postgres:
            self.pg.rollback()
            self.pg.close()
        else:
            self.lite.execute("ROLLBACK")
            self.lite.close()


def test_every_state_is_reachable_by_allowed_steps() -> None:
    assert set(PATHS) == set(STATES)


@pytest.fixture(scope="module", params=BACKENDS)
def prepared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One prepared database per backend for every pair (each pair's
    transaction is rolled back)."""
    if request.param == "sqlite":
        path = str(tmp_path_factory.mktemp("transitions") / "site.sqlite")
        prepare_database(path)
        yield path
        return
    pool: DatabasePool = request.getfixturevalue("pg_pool")
    database = pool.take()
    try:
        url = pool.server.url(database)
        prepare_database(url)
        yield url
    finally:
        pool.give_back(database)


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=[f"{_name(a)}-{_name(b)}" for a, b in PAIRS])
def test_the_trigger_allows_exactly_the_allowed_transitions(
    prepared: str, old: State, new: State
) -> None:
    session = RawSession(prepared)
    try:
        before: State = None
        for step in PATHS[old]:  # reach ``old`` (every step is allowed)
            _move(session.execute, before, step)
            before = step
        if (old, new) == RECREATE_AFTER_GONE:
            # allowed only while the generation's archive is gone (schema v13)
            with pytest.raises(DRIVER_ERRORS, match=REFUSAL):
                _move(session.execute, old, new)
        elif (old, new) in transitions.ALLOWED:
            _move(session.execute, old, new)
        else:
            with pytest.raises(DRIVER_ERRORS, match=REFUSAL):
                _move(session.execute, old, new)
    finally:
        session.close()


def test_a_submitted_generation_is_created_again_only_when_its_archive_is_gone(
    prepared: str,
) -> None:
    """SUBMITTED -> RESERVED with a new operationId (confirmCharge) passes the
    triggers once the task row says its archive is gone, and its stored
    status key says ARCHIVE_GONE until then."""
    session = RawSession(prepared)
    try:
        session.execute("""INSERT INTO "user" (name, token_hash) VALUES ('u', 'h')""")
        session.execute(
            "INSERT INTO task_operation (gid, operation_id, state) VALUES (1, 'op-1', 'SUBMITTED')"
        )
        session.execute(
            """INSERT INTO gallery (gid, user_id, status)"""
            """ VALUES (1, (SELECT id FROM "user" WHERE name = 'u'), 4)"""
        )
        assert session.fetch_one("SELECT status_key FROM gallery WHERE gid = 1") == "COMPLETED"
        session.execute("UPDATE gallery SET archive_gone_reason = 'EXPIRED' WHERE gid = 1")
        assert session.fetch_one("SELECT status_key FROM gallery WHERE gid = 1") == "ARCHIVE_GONE"
        session.execute(
            "UPDATE task_operation SET state = 'RESERVED', operation_id = 'op-2' WHERE gid = 1"
        )
        assert session.fetch_one("SELECT status_key FROM gallery WHERE gid = 1") == "SUBMITTING"
    finally:
        session.close()
