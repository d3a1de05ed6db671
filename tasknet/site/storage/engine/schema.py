"""The schema: the v1 baseline, the v2 migration, and the site's start check.

A fresh (empty) database gets the v1 baseline and then the v2 migration, so a
new install and a migrated old database end up with the same schema.  A
database that has tables but is not migrated is refused: migrating is an
operator's decision (``tasknet-migrate --db PATH`` takes a backup first).

PostgreSQL has no legacy: a fresh database gets ``schema_postgres.sql`` (the
schema at :data:`POSTGRES_BASE_VERSION`, what SQLite has after v1, v2 and
v3) and then every script of :data:`UPGRADES_POSTGRES` after it, so a fresh
database and an upgraded one end up alike, as on SQLite.  A script is run
whole (PL/pgSQL bodies in ``$$`` quotes need no splitting) and records its
own version in ``schema_version``.  :func:`prepare_database` decides and
creates under a transaction-level advisory lock (:data:`SCHEMA_LOCK_KEY`)
in a ``READ COMMITTED`` transaction: sites starting together on an empty
database wait for each other, and the one that gets the lock second sees
the tables the first created (its next statement takes a fresh snapshot)
and creates nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from importlib import resources

from tasknet.site.storage.engine.sql import per_backend, postgres_only, sql
from tasknet.site.storage.engine.sqlite import BUSY_TIMEOUT_MS, connect_sqlite
from tasknet.site.storage.engine.targets import describe, is_postgres
from tasknet.site.storage.engine.transactions import (
    BEGIN_WRITE,
    COMMIT,
    READ_COMMITTED,
    ROLLBACK,
    SERIALIZABLE,
    Connection,
    Cursor,
)

V1_SCRIPT = "schema_v1.sql"
V2_SCRIPT = "migrate_task_operation_v2.sql"
V3_SCRIPT = "migrate_v3.sql"
V4_SCRIPT = "migrate_v4.sql"  # several sites: instances, leases, reaping
V4_POSTGRES_SCRIPT = "migrate_v4_postgres.sql"
V5_SCRIPT = "migrate_v5.sql"  # fencing and trust: verdict waits, browser sessions
V5_POSTGRES_SCRIPT = "migrate_v5_postgres.sql"
V6_SCRIPT = "migrate_v6.sql"  # views at scale: the stored status key, search indexes
V6_POSTGRES_SCRIPT = "migrate_v6_postgres.sql"
V7_SCRIPT = "migrate_v7.sql"  # each node's tasks counted from an index (issue 23)
V7_POSTGRES_SCRIPT = "migrate_v7_postgres.sql"
V8_SCRIPT = "migrate_v8.sql"  # /api/stats from rollups (issue 23, item 4)
V8_POSTGRES_SCRIPT = "migrate_v8_postgres.sql"
V9_SCRIPT = "migrate_v9.sql"  # the task counts kept by triggers (issue 23)
V9_POSTGRES_SCRIPT = "migrate_v9_postgres.sql"
V10_SCRIPT = "migrate_v10.sql"  # the search's trigram table answers exactly (issue 23)
V10_POSTGRES_SCRIPT = "migrate_v10_postgres.sql"
V11_SCRIPT = "migrate_v11.sql"  # a completed task's archive size and SHA-256 (DELIVERY.md)
V11_POSTGRES_SCRIPT = "migrate_v11_postgres.sql"
V12_SCRIPT = "migrate_v12.sql"  # a user id is never given twice (issue 38)
V12_POSTGRES_SCRIPT = "migrate_v12_postgres.sql"
V13_SCRIPT = "migrate_v13.sql"  # custody: archives gone, CANCELs owed, inventories (issue 34)
V13_POSTGRES_SCRIPT = "migrate_v13_postgres.sql"
V14_SCRIPT = "migrate_v14.sql"  # an operator's control of a node (issue 36, item 6)
V14_POSTGRES_SCRIPT = "migrate_v14_postgres.sql"
CURRENT_VERSION = 14

# Scripts that take a database from the version before them to their own.
# v3 is additive (new tables and columns only), so the site applies it by
# itself at start; v2 rewrites tables and stays an operator's decision.
UPGRADES = {
    2: V2_SCRIPT,
    3: V3_SCRIPT,
    4: V4_SCRIPT,
    5: V5_SCRIPT,
    6: V6_SCRIPT,
    7: V7_SCRIPT,
    8: V8_SCRIPT,
    9: V9_SCRIPT,
    10: V10_SCRIPT,
    11: V11_SCRIPT,
    12: V12_SCRIPT,
    13: V13_SCRIPT,
    14: V14_SCRIPT,
}
AUTOMATIC_FROM = 2

#: PostgreSQL: the whole schema at POSTGRES_BASE_VERSION, then the upgrades
#: past it (the same versions as UPGRADES, in PostgreSQL's spelling).
POSTGRES_SCRIPT = "schema_postgres.sql"
POSTGRES_BASE_VERSION = 3
UPGRADES_POSTGRES = {
    4: V4_POSTGRES_SCRIPT,
    5: V5_POSTGRES_SCRIPT,
    6: V6_POSTGRES_SCRIPT,
    7: V7_POSTGRES_SCRIPT,
    8: V8_POSTGRES_SCRIPT,
    9: V9_POSTGRES_SCRIPT,
    10: V10_POSTGRES_SCRIPT,
    11: V11_POSTGRES_SCRIPT,
    12: V12_POSTGRES_SCRIPT,
    13: V13_POSTGRES_SCRIPT,
    14: V14_POSTGRES_SCRIPT,
}

#: What one engine has and the other has not (v6's search indexes), left
#: out where the two schemas are compared: SQLite's FTS5 trigram table of
#: the task search and its shadow tables; PostgreSQL's pg_trgm indexes
#: (absent where pg_trgm cannot be had).
SQLITE_ONLY_TABLES = frozenset(
    {"gallery_text", "gallery_text_data", "gallery_text_idx", "gallery_text_config"}
)
POSTGRES_ONLY_INDEXES = frozenset({"gallery_name_trgm", "gallery_gid_trgm"})

#: The advisory lock (one 64-bit key) under which a PostgreSQL database's
#: schema is created or upgraded: "tn-schem".
SCHEMA_LOCK_KEY = int.from_bytes(b"tn-schem", "big")
# Creating the schema takes well under a second; a site waiting for another
# to finish it waits this long (past the session's short lock_timeout).
_SCHEMA_LOCK_TIMEOUT_MS = 60_000

_TABLES = per_backend(
    sqlite="SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    postgres=(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
    ),
)
_VERSION = sql("SELECT MAX(version) FROM schema_version")
_WAIT_FOR_THE_SCHEMA_LOCK = postgres_only(f"SET LOCAL lock_timeout = {_SCHEMA_LOCK_TIMEOUT_MS}")
_SCHEMA_LOCK = postgres_only(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})")

Progress = Callable[[str], None]


class SchemaError(Exception):
    """The database cannot be used as it is; the message says what to do."""


class UnmigratedDatabase(SchemaError):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"database {path!r} has the legacy (v1) schema and is not migrated; "
            f"run: tasknet-migrate --db {path}"
        )
        self.path = path


def load_script(name: str) -> str:
    """The text of one of the packaged ``.sql`` files."""
    return resources.files("tasknet.site.storage.engine").joinpath(name).read_text(encoding="utf-8")


def split_statements(script: str) -> list[str]:
    """Split a SQL script into complete statements.

    ``sqlite3.complete_statement`` follows SQLite's own tokenizer, so a
    ``;`` inside a comment, a string or a trigger's ``BEGIN … END`` body does
    not end a statement.  Comment-only tails are dropped.
    """
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    rest = "\n".join(
        line for line in buffer.splitlines() if line.strip() and not line.strip().startswith("--")
    )
    if rest.strip():
        raise SchemaError(f"incomplete SQL statement at the end of the script: {rest.strip()!r}")
    return statements


def user_tables(connection: Connection) -> set[str]:
    """The tables of the database (PostgreSQL: of the current schema)."""
    return {row[0] for row in connection.execute(_TABLES).fetchall()}


def schema_version(connection: Connection) -> int | None:
    """``None`` for an empty database, 1 for the legacy schema, else the
    highest ``schema_version`` row."""
    tables = user_tables(connection)
    if not tables:
        return None
    if "schema_version" not in tables:
        return 1
    row = connection.execute(_VERSION).fetchone()
    return int(row[0]) if row and row[0] is not None else 1


def apply_statements(
    cursor: Cursor, statements: Iterable[str], progress: Progress | None = None
) -> int:
    """Execute statements one by one on ``cursor`` (inside the caller's
    transaction: no ``executescript``, which would commit on its own)."""
    statements = list(statements)
    for number, statement in enumerate(statements, 1):
        if progress is not None:
            first_line = statement.splitlines()[0] if statement else ""
            for candidate in statement.splitlines():
                if candidate.strip() and not candidate.strip().startswith("--"):
                    first_line = candidate.strip()
                    break
            progress(f"[{number}/{len(statements)}] {first_line}")
        cursor.execute(statement)
    return len(statements)


def upgrade_statements(version: int) -> list[str]:
    """The statements that take a database at ``version`` to the current one."""
    statements: list[str] = []
    for target in range(version + 1, CURRENT_VERSION + 1):
        statements += split_statements(load_script(UPGRADES[target]))
    return statements


def create_fresh(cursor: Cursor) -> None:
    """Body of the fresh-install transaction: v1 baseline, then every upgrade."""
    apply_statements(cursor, split_statements(load_script(V1_SCRIPT)))
    apply_statements(cursor, upgrade_statements(1))


def postgres_upgrade_scripts(version: int) -> list[str]:
    """The PostgreSQL scripts that take a database at ``version`` to the
    current one, in order (a fresh one: ``schema_postgres.sql`` first)."""
    scripts = [POSTGRES_SCRIPT] if version < POSTGRES_BASE_VERSION else []
    start = max(version, POSTGRES_BASE_VERSION)
    return scripts + [UPGRADES_POSTGRES[v] for v in range(start + 1, CURRENT_VERSION + 1)]


def _prepare_postgres(target: str) -> bool:
    """:func:`prepare_database` on PostgreSQL (see the module doc)."""
    from tasknet.site.storage.engine import postgres  # psycopg only when PostgreSQL is used

    connection = postgres.connect(target, lock_timeout_ms=BUSY_TIMEOUT_MS)
    try:
        connection.execute(BEGIN_WRITE[READ_COMMITTED])
        try:
            connection.execute(_WAIT_FOR_THE_SCHEMA_LOCK)
            connection.execute(_SCHEMA_LOCK)
            tables = user_tables(connection)
            if not tables:
                version = 0
            elif "schema_version" not in tables:
                raise SchemaError(
                    f"database {describe(target)!r} has tables but no tasknet schema "
                    "(no schema_version table); give the site a database of its own"
                )
            else:
                version = schema_version(connection) or 0
                if version < POSTGRES_BASE_VERSION:
                    raise SchemaError(
                        f"database {describe(target)!r} is at schema v{version}, older than "
                        f"any tasknet schema on PostgreSQL (v{POSTGRES_BASE_VERSION})"
                    )
            for script in postgres_upgrade_scripts(version):
                connection.run_script(load_script(script))
            connection.execute(COMMIT)
            return version == 0
        finally:
            if connection.in_transaction:
                connection.execute(ROLLBACK)
    finally:
        connection.close()


def prepare_database(path: str) -> bool:
    """Make ``path`` (a SQLite file or a PostgreSQL URL) ready for the site:
    initialise it if empty (returns ``True``: a fresh database), accept it
    if migrated (``False``), applying the additive upgrades past v2 in the
    same transaction, and raise :class:`UnmigratedDatabase` for a legacy
    (v1) database, changing nothing."""
    if is_postgres(path):
        return _prepare_postgres(path)
    connection = connect_sqlite(path)
    try:
        cursor = connection.cursor()
        # Decide and create under one write lock, so two sites starting on
        # one new file cannot both initialise it.
        cursor.execute(BEGIN_WRITE[SERIALIZABLE])
        try:
            version = schema_version(connection)
            if version is None:
                create_fresh(cursor)
                cursor.execute(COMMIT)
                return True
            if version < AUTOMATIC_FROM:
                raise UnmigratedDatabase(path)
            if version < CURRENT_VERSION:
                apply_statements(cursor, upgrade_statements(version))
            cursor.execute(COMMIT)
            return False
        finally:
            if connection.in_transaction:
                connection.execute(ROLLBACK)
    finally:
        connection.close()
