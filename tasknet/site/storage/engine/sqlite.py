"""SQLite behind the storage seam: the site's connections to its file.

* Every connection gets the PRAGMAs of LIFECYCLE.md "Deployment and
  migration" 3 (:data:`PRAGMAS`): WAL, ``synchronous=FULL`` (an ACK tells a
  node to forget its snapshot: the commit behind it has to survive a power
  cut, not only a process crash), foreign keys, ``busy_timeout``; rows are
  :class:`sqlite3.Row`; ``isolation_level=None``, so the sqlite3 module
  never opens or commits a transaction on its own (the engine's statements
  do, :mod:`~tasknet.site.storage.engine.transactions`).
* A Python ``list`` parameter is sent as its JSON text (the adapter
  registered here, for the whole process: sqlite3 refuses a list
  otherwise), which the ``{in_array}`` piece reads with ``json_each``
  (:mod:`~tasknet.site.storage.engine.sql`); psycopg sends the same list
  as an array.
* A new database file is created 0600 (:func:`create_private`): it and its
  backups hold node secrets and users' upstream tokens.
* SQLite's ``SQLITE_BUSY``/``SQLITE_LOCKED`` is "busy" (:func:`is_busy`).
"""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any

import orjson

BUSY_TIMEOUT_MS = 5000

PRAGMAS = (
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
)

#: The database and its backups hold node secrets and users' upstream tokens.
PRIVATE_MODE = 0o600

# SQLite's primary result codes for "another connection holds the lock"
# (SQLITE_BUSY past busy_timeout, SQLITE_LOCKED within a connection).
_BUSY_CODES = frozenset({5, 6})


def _json_array(values: list[Any]) -> str:
    try:
        # orjson: every report's statements take a few of these.
        return orjson.dumps(values).decode()
    except TypeError:  # an int beyond 64 bits
        return json.dumps(values)


sqlite3.register_adapter(list, _json_array)


def configure_connection(connection: sqlite3.Connection) -> None:
    """Apply the PRAGMAs every connection of the site must have."""
    connection.row_factory = sqlite3.Row
    for pragma in PRAGMAS:
        connection.execute(pragma)


def set_busy_timeout(connection: sqlite3.Connection, milliseconds: int) -> None:
    """Wait up to ``milliseconds`` for another connection's lock."""
    connection.execute(f"PRAGMA busy_timeout={int(milliseconds)}")


def set_query_only(connection: sqlite3.Connection) -> None:
    """Refuse every write on ``connection`` (the pool's reader)."""
    connection.execute("PRAGMA query_only=ON")


def create_private(path: str) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist, so SQLite
    opens it rather than creating it with the umask's mode.  SQLite gives the
    ``-wal`` and ``-shm`` files the mode of the database file, so they are
    0600 too.  An existing file is left as it is (``":memory:"`` and URIs are
    not files)."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def connect_sqlite(path: str) -> sqlite3.Connection:
    """A configured connection to the SQLite file ``path`` (autocommit
    mode; a new file is created 0600), for tools and tests."""
    create_private(path)
    connection = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    configure_connection(connection)
    return connection


def is_busy(error: sqlite3.Error) -> bool:
    """Another connection held the lock past ``busy_timeout``."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    return isinstance(error, sqlite3.OperationalError) and (
        "locked" in str(error) or "busy" in str(error)
    )
