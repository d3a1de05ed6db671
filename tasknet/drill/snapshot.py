"""Read-only snapshots of everything the invariants look at.

The site database and every node database are opened read-only
(``file:...?mode=ro``), so a check can never change what it checks.  A
database whose WAL index cannot be opened read-only (its owner was SIGKILLed
and its ``-shm`` is gone) is copied with its WAL to a temp directory first.
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


def read_site(db: Path) -> SiteSnapshot:
    with read_only(db) as conn:
        snap = SiteSnapshot()
        snap.operations = {r["gid"]: r for r in _rows(conn, "SELECT * FROM task_operation")}
        snap.galleries = {r["gid"]: r for r in _rows(conn, "SELECT * FROM gallery")}
        snap.usage = _rows(conn, "SELECT * FROM weekly_usage")
        snap.receipts = {r["report_id"]: r for r in _rows(conn, "SELECT * FROM report_receipt")}
        snap.outbox = _rows(conn, "SELECT * FROM notification_outbox ORDER BY id")
        snap.favorites = _rows(conn, "SELECT * FROM favorite")
        snap.audit = _rows(conn, "SELECT * FROM reconciliation_audit ORDER BY id")
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
