"""Raw ``sqlite3`` for the baselines: the site's PRAGMAs, no reactor, no threads.

The baselines open their connection with the site's own ``connect`` (a plain
``sqlite3`` connection plus the PRAGMAs of LIFECYCLE.md: WAL,
``synchronous=FULL``), so both sides pay the same fsync per commit on the same
file system.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def connect(path: Path) -> sqlite3.Connection:
    """A raw connection configured exactly like each of the site's."""
    from tasknet.site.storage.engine.database import connect as site_connect

    connection = site_connect(str(path))
    assert isinstance(connection, sqlite3.Connection)  # a file path: always SQLite
    return connection


def synchronous_of(connection: sqlite3.Connection) -> str:
    (value,) = connection.execute("PRAGMA synchronous").fetchone()
    return SYNCHRONOUS_NAMES.get(value, str(value))


def journal_mode_of(connection: sqlite3.Connection) -> str:
    (value,) = connection.execute("PRAGMA journal_mode").fetchone()
    return str(value).upper()


def site_synchronous(probe: Path) -> str:
    """The ``synchronous`` setting a site connection gets (read, not assumed)."""
    try:
        connection = connect(probe)
    except ImportError:
        return "unknown (site storage not importable)"
    try:
        return f"{synchronous_of(connection)} ({journal_mode_of(connection)})"
    finally:
        connection.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{probe}{suffix}").unlink(missing_ok=True)
