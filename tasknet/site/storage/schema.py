"""The schema: the v1 baseline, the v2 migration, and the site's start check.

A fresh (empty) database gets the v1 baseline and then the v2 migration, so a
new install and a migrated old database end up with the same schema.  A
database that has tables but is not migrated is refused: migrating is an
operator's decision (``tasknet-migrate --db PATH`` takes a backup first).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from importlib import resources

from tasknet.site.storage.db import connect

V1_SCRIPT = "schema_v1.sql"
V2_SCRIPT = "migrate_task_operation_v2.sql"
V3_SCRIPT = "migrate_v3.sql"
CURRENT_VERSION = 3

# Scripts that take a database from the version before them to their own.
# v3 is additive (new tables and columns only), so the site applies it by
# itself at start; v2 rewrites tables and stays an operator's decision.
UPGRADES = {2: V2_SCRIPT, 3: V3_SCRIPT}
AUTOMATIC_FROM = 2

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
    return resources.files("tasknet.site.storage").joinpath(name).read_text(encoding="utf-8")


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


def user_tables(connection: sqlite3.Connection) -> set[str]:
    rows = connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return {row[0] for row in rows}


def schema_version(connection: sqlite3.Connection) -> int | None:
    """``None`` for an empty database, 1 for the legacy schema, else the
    highest ``schema_version`` row."""
    tables = user_tables(connection)
    if not tables:
        return None
    if "schema_version" not in tables:
        return 1
    row = connection.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 1


def apply_statements(
    cursor: sqlite3.Cursor, statements: Iterable[str], progress: Progress | None = None
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


def create_fresh(cursor: sqlite3.Cursor) -> None:
    """Body of the fresh-install transaction: v1 baseline, then every upgrade."""
    apply_statements(cursor, split_statements(load_script(V1_SCRIPT)))
    apply_statements(cursor, upgrade_statements(1))


def prepare_database(path: str) -> bool:
    """Make ``path`` ready for the site: initialise it if empty (returns
    ``True``: a fresh database), accept it if migrated (``False``), applying
    the additive upgrades past v2 in the same transaction, and raise
    :class:`UnmigratedDatabase` for a legacy (v1) database, changing nothing."""
    connection = connect(path)
    try:
        cursor = connection.cursor()
        # Decide and create under one write lock, so two sites starting on
        # one new file cannot both initialise it.
        cursor.execute("BEGIN IMMEDIATE")
        try:
            version = schema_version(connection)
            if version is None:
                create_fresh(cursor)
                cursor.execute("COMMIT")
                return True
            if version < AUTOMATIC_FROM:
                raise UnmigratedDatabase(path)
            if version < CURRENT_VERSION:
                apply_statements(cursor, upgrade_statements(version))
            cursor.execute("COMMIT")
            return False
        finally:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
    finally:
        connection.close()
