"""The v2 migration wrapper (LIFECYCLE.md, "Deployment and migration").

0. Take the database's instance lock (:mod:`tasknet.site.storage.engine.file_lock`):
   refused, naming the holder, while a site runs on it.
1. Back the database up with SQLite's online backup API to
   ``PATH.bak-<UTC timestamp>`` (mode 0600) before anything changes: the
   connection that reads the version and takes the backup sets no
   ``journal_mode`` (that PRAGMA would switch an old database to WAL, a
   change to the file); the site's PRAGMAs are applied only after the backup.
2. Refuse if ``gallery`` holds duplicate gids: list each (gid, count, row
   ids) and stop.  Nothing is ever deleted: which row is right is a human's
   decision.
3. Run the whole of ``migrate_task_operation_v2.sql`` statement by statement
   inside one ``BEGIN IMMEDIATE`` transaction; any error rolls all of it back.

A database already at v2 is left untouched ("already migrated"), without a
backup.  An empty database gets the v1 baseline and v2 (as the site would).

On PostgreSQL there is no legacy schema to migrate: ``tasknet-migrate --db
postgresql://…`` creates the schema on an empty database, or applies the
additive upgrades to an older one, exactly as a starting site would
(:func:`~tasknet.site.storage.engine.schema.prepare_database`, under its advisory
lock, beside running sites).  No backup is taken: use ``pg_dump``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tasknet.site.storage.engine import file_lock as lock
from tasknet.site.storage.engine.database import connect
from tasknet.site.storage.engine.schema import (
    CURRENT_VERSION,
    V1_SCRIPT,
    SchemaError,
    apply_statements,
    load_script,
    postgres_upgrade_scripts,
    prepare_database,
    schema_version,
    split_statements,
    upgrade_statements,
)
from tasknet.site.storage.engine.sql import per_backend, sql
from tasknet.site.storage.engine.sqlite import (
    BUSY_TIMEOUT_MS,
    configure_connection,
    create_private,
    set_busy_timeout,
)
from tasknet.site.storage.engine.targets import describe, is_postgres
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, COMMIT, ROLLBACK, SERIALIZABLE

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Duplicate:
    gid: int
    count: int
    row_ids: list[int]


class DuplicateGids(SchemaError):
    """The unique index on ``gallery(gid)`` cannot be built; nothing changed."""

    def __init__(self, duplicates: list[Duplicate], backup: str | None) -> None:
        lines = [
            f"  gid {d.gid}: {d.count} rows (gallery ids {', '.join(map(str, d.row_ids))})"
            for d in duplicates
        ]
        super().__init__(
            f"{len(duplicates)} gid(s) appear in more than one gallery row; the migration "
            "needs one row per gid and deletes nothing. Decide which rows are right, remove "
            "the others yourself, then run the migration again:\n" + "\n".join(lines)
        )
        self.duplicates = duplicates
        self.backup = backup


@dataclass
class MigrationResult:
    already_migrated: bool
    backup: str | None = None
    statements: int = 0
    rows_before: dict[str, int] = field(default_factory=dict)


# Run on SQLite only (a v1 database is a SQLite file); PostgreSQL's
# spelling keeps the statement one that both engines accept.
_DUPLICATES = per_backend(
    sqlite=(
        "SELECT gid, COUNT(*), group_concat(id) FROM "
        "(SELECT gid, id FROM gallery ORDER BY gid, id) AS g "
        "GROUP BY gid HAVING COUNT(*) > 1 ORDER BY gid"
    ),
    postgres=(
        "SELECT gid, COUNT(*), string_agg(CAST(id AS text), ',' ORDER BY id) FROM gallery "
        "GROUP BY gid HAVING COUNT(*) > 1 ORDER BY gid"
    ),
)
_ROW_COUNTS = {
    table: sql(f'SELECT COUNT(*) FROM "{table}"')  # noqa: S608
    for table in ("user", "gallery", "favorite", "weekly_usage")
}


def find_duplicates(connection: sqlite3.Connection) -> list[Duplicate]:
    rows = connection.execute(_DUPLICATES).fetchall()
    return [Duplicate(r[0], r[1], [int(i) for i in str(r[2]).split(",")]) for r in rows]


def backup_path(path: str) -> str:
    # A tool's real time, on purpose: it names the operator's backup file.
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate = f"{path}.bak-{stamp}"
    n = 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{path}.bak-{stamp}-{n}"
    return candidate


def backup(connection: sqlite3.Connection, path: str, progress: Progress) -> str:
    """Copy the database with the online backup API; returns the copy's path."""
    target_path = backup_path(path)
    create_private(target_path)
    target = sqlite3.connect(target_path)
    try:
        shown = [-1]  # the last tenth reported: a line per 10 %, not per step

        def step(status: int, remaining: int, total: int) -> None:
            done = total - remaining
            tenth = done * 10 // total if total else 10
            if tenth > shown[0]:
                shown[0] = tenth
                progress(f"backup: {done}/{total} pages")

        connection.backup(target, pages=256, progress=step)
    finally:
        target.close()
    progress(f"backup written to {target_path}")
    return target_path


def _row_counts(connection: sqlite3.Connection) -> dict[str, int]:
    return {table: connection.execute(count).fetchone()[0] for table, count in _ROW_COUNTS.items()}


def _open_unchanged(path: str) -> sqlite3.Connection:
    """A connection whose opening changes nothing in the file (only
    ``busy_timeout``, a per-connection setting)."""
    connection = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    connection.row_factory = sqlite3.Row
    set_busy_timeout(connection, BUSY_TIMEOUT_MS)
    return connection


def migrate(path: str, progress: Progress = print) -> MigrationResult:
    """Migrate the database at ``path`` to the current schema (see the
    module docstring); raises :class:`~tasknet.site.storage.engine.file_lock.DatabaseInUse`
    while a site holds the database (SQLite)."""
    if is_postgres(path):
        return _migrate_postgres(path, progress)
    if not os.path.exists(path):
        raise SchemaError(f"no database at {path!r}")
    held = lock.acquire(path, role="tasknet-migrate")
    try:
        result = _migrate_locked(path, progress)
    except BaseException:
        held.release_refused()  # no NAME.lock left behind by a refusal
        raise
    held.release()
    return result


def _migrate_postgres(target: str, progress: Progress) -> MigrationResult:
    """The PostgreSQL schema command (see the module doc)."""
    name = describe(target)
    connection = connect(target)
    try:
        version = schema_version(connection)
    finally:
        connection.close()
    if version is not None and version >= CURRENT_VERSION:
        progress(f"{name}: already at schema v{version}; nothing to do")
        return MigrationResult(already_migrated=True)
    scripts = postgres_upgrade_scripts(version or 0)
    for script in scripts:
        progress(f"{name}: {script}")
    # The same decision as a starting site's, under the same lock: whoever
    # gets there first creates or upgrades, the other finds it done.
    prepare_database(target)
    progress(f"{name}: at schema v{CURRENT_VERSION}")
    return MigrationResult(False, None, len(scripts))


def _migrate_locked(path: str, progress: Progress) -> MigrationResult:
    connection = _open_unchanged(path)
    try:
        version = schema_version(connection)
        if version is not None and version >= CURRENT_VERSION:
            progress(f"{path}: already migrated (schema v{version}); nothing to do")
            return MigrationResult(already_migrated=True)
        statements = upgrade_statements(version or 1)
        if version is None:
            progress(f"{path}: empty database; creating the v1 baseline and upgrading it")
            statements = split_statements(load_script(V1_SCRIPT)) + statements
            counts: dict[str, int] = {}
        else:
            counts = _row_counts(connection)
            progress(
                f"{path}: schema v{version}, "
                + ", ".join(f"{n} {table} rows" for table, n in counts.items())
            )
        saved = backup(connection, path, progress)
        if version == 1:
            duplicates = find_duplicates(connection)
            if duplicates:
                raise DuplicateGids(duplicates, saved)
        # The backup is taken: from here on the site's PRAGMAs (WAL and all).
        configure_connection(connection)
        cursor = connection.cursor()
        cursor.execute(BEGIN_WRITE[SERIALIZABLE])
        try:
            apply_statements(cursor, statements, progress)
            cursor.execute(COMMIT)
        except BaseException:
            if connection.in_transaction:
                connection.execute(ROLLBACK)
            progress("error: rolled back; the database is unchanged")
            raise
        progress(f"{path}: migrated to schema v{CURRENT_VERSION} ({len(statements)} statements)")
        return MigrationResult(False, saved, len(statements), counts)
    finally:
        connection.close()
