"""Read-only snapshots of everything the invariants look at.

The site database is read in one read-only transaction, so a check sees
one consistent state and can never change what it checks: a PostgreSQL
database through the site's own :func:`tasknet.site.storage.engine.database.connect`
(``BEGIN`` is its ``REPEATABLE READ READ ONLY`` snapshot); a SQLite file,
like every node database, opened read-only (``file:...?mode=ro``: the
site's connect would set its journal mode, a write).  A SQLite database
whose WAL index cannot be opened read-only (its owner was SIGKILLed and its
``-shm`` is gone) is copied with its WAL to a temp directory first.  Tables
a schema version does not have yet read as empty.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasknet.node.paths import DataDir
from tasknet.site.storage.engine import database as site_db
from tasknet.site.storage.engine.transactions import BEGIN_READ


@contextmanager
def read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``path`` (rows as ``sqlite3.Row``)."""
    if not path.exists():
        raise FileNotFoundError(f"no database at {path}")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        with tempfile.TemporaryDirectory(prefix="drill-ro-") as tmp:
            copy = Path(tmp) / path.name
            for suffix in ("", "-wal"):
                src = Path(f"{path}{suffix}")
                if src.exists():
                    shutil.copyfile(src, f"{copy}{suffix}")
            conn = sqlite3.connect(str(copy), timeout=10)
            conn.row_factory = sqlite3.Row
            try:
                yield conn
            finally:
                conn.close()
            return
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def _rows(conn: sqlite3.Connection, sql: str) -> list[dict[str, Any]]:
    try:
        return [dict(r) for r in conn.execute(sql).fetchall()]
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return []
        raise


@dataclass
class SiteSnapshot:
    operations: dict[int, dict[str, Any]] = field(default_factory=dict)  # gid -> row
    galleries: dict[int, dict[str, Any]] = field(default_factory=dict)  # gid -> row
    usage: list[dict[str, Any]] = field(default_factory=list)
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)  # report_id -> row
    outbox: list[dict[str, Any]] = field(default_factory=list)
    favorites: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    # Schema v4 (several sites): site processes, what was settled for gone
    # ones, and which site holds each node.
    instances: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> site_instance
    reaps: list[dict[str, Any]] = field(default_factory=list)  # instance_reap, in order
    node_sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # node_id -> row
    users: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> user (no secrets)
    backend: str = site_db.SQLITE
    tables: set[str] = field(default_factory=set)  # the tables the database has


# (attribute, table, statement, key column or None for a list) of a SiteSnapshot.
_SITE_TABLES: tuple[tuple[str, str, str, str | None], ...] = (
    ("operations", "task_operation", "SELECT * FROM task_operation", "gid"),
    ("galleries", "gallery", "SELECT * FROM gallery", "gid"),
    ("usage", "weekly_usage", "SELECT * FROM weekly_usage", None),
    ("receipts", "report_receipt", "SELECT * FROM report_receipt", "report_id"),
    ("outbox", "notification_outbox", "SELECT * FROM notification_outbox ORDER BY id", None),
    ("favorites", "favorite", "SELECT * FROM favorite", None),
    ("audit", "reconciliation_audit", "SELECT * FROM reconciliation_audit ORDER BY id", None),
    ("instances", "site_instance", "SELECT * FROM site_instance ORDER BY id", "id"),
    ("reaps", "instance_reap", "SELECT * FROM instance_reap ORDER BY id", None),
    ("node_sessions", "node_session", "SELECT * FROM node_session", "node_id"),
    ("users", "user", 'SELECT id, name, is_admin, quota FROM "user"', "id"),
)


def _dicts(cursor: Any) -> list[dict[str, Any]]:
    return [dict(zip(row.keys(), row, strict=True)) for row in cursor.fetchall()]


def _site_tables(conn: Any, backend: str) -> set[str]:
    if backend == site_db.POSTGRESQL:
        sql = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    else:
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    return {str(row[0]) for row in conn.execute(sql).fetchall()}


@contextmanager
def site_reader(target: str | Path) -> Iterator[tuple[Any, set[str]]]:
    """One read-only transaction on the site database ``target`` (a SQLite
    path or a PostgreSQL URL; see the module doc); yields the connection
    and the names of the tables it has."""
    target = str(target)
    if site_db.backend_of(target) == site_db.SQLITE:
        with read_only(Path(target)) as lite:
            lite.execute("BEGIN")  # one snapshot for every statement
            try:
                yield lite, _site_tables(lite, site_db.SQLITE)
            finally:
                lite.execute("ROLLBACK")
        return
    pg = site_db.connect(target)
    try:
        pg.execute(BEGIN_READ)  # REPEATABLE READ READ ONLY: one snapshot
        try:
            yield pg, _site_tables(pg, site_db.POSTGRESQL)
        finally:
            pg.execute("ROLLBACK")
    finally:
        pg.close()


def site_rows(target: str | Path, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """The rows of one read-only query on the site database (``?`` placeholders)."""
    with site_reader(target) as (conn, _):
        return _dicts(conn.execute(sql, params))


def read_site(target: str | Path) -> SiteSnapshot:
    """Everything the invariants read from the site database, in one snapshot."""
    snap = SiteSnapshot(backend=site_db.backend_of(str(target)))
    with site_reader(target) as (conn, tables):
        snap.tables = tables
        for attribute, table, sql, key in _SITE_TABLES:
            if table not in tables:
                continue
            rows = _dicts(conn.execute(sql))
            setattr(snap, attribute, rows if key is None else {r[key]: r for r in rows})
    return snap


@dataclass
class NodeSnapshot:
    node_id: str
    tasks: dict[int, dict[str, Any]] = field(default_factory=dict)
    deletions: dict[int, dict[str, Any]] = field(default_factory=dict)
    in_flight: dict[str, Any] | None = None
    commands: list[dict[str, Any]] = field(default_factory=list)
    archives: list[str] = field(default_factory=list)  # complete archive file names
    partials: list[str] = field(default_factory=list)

    def holds_archive(self, gid: int, operation_id: str, data: DataDir) -> bool:
        return data.archive_path(gid, operation_id).name in self.archives


def read_node(node_id: str, data_dir: Path) -> NodeSnapshot:
    data = DataDir(data_dir)
    snap = NodeSnapshot(node_id)
    if data.archives.exists():
        snap.archives = sorted(p.name for p in data.archives.glob("*.zip"))
    if data.partial.exists():
        snap.partials = sorted(p.name for p in data.partial.iterdir())
    if not data.database.exists():
        return snap
    with read_only(data.database) as conn:
        snap.tasks = {r["gid"]: r for r in _rows(conn, "SELECT * FROM task")}
        snap.deletions = {r["gid"]: r for r in _rows(conn, "SELECT * FROM deletion")}
        flights = _rows(conn, "SELECT report_id, revision, created_at FROM in_flight_report")
        snap.in_flight = flights[0] if flights else None
        snap.commands = _rows(conn, "SELECT * FROM received_command ORDER BY id")
    return snap
