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
* Every connection is given its :class:`~tasknet.site.storage.engine.
  sources.Sources` (:func:`configure_connection`): the SQL function
  ``tasknet_now()`` (:data:`NOW_FUNCTION`: the wall clock, Unix seconds cut
  to milliseconds), which ``{now}`` reads in place of SQLite's own
  ``'now'`` (:mod:`~tasknet.site.storage.engine.sql`), registered
  deterministic so that SQLite evaluates it once per statement (per place
  it appears), not once per row; and, on a :class:`SiteConnection` (every
  connection the engine opens), the sources themselves, which a transaction
  function reads from its cursor (:func:`~tasknet.site.storage.engine.
  sources.now_of`).  With the system's clock (production's) that is the
  very clock SQLite's ``'now'`` reads.
* A new database file is created 0600 (:func:`create_private`): it and its
  backups hold node secrets and users' upstream tokens.
* SQLite's ``SQLITE_BUSY``/``SQLITE_LOCKED`` is "busy" (:func:`is_busy`).
* A site process of its own turns SQLite's memory statistics off before
  it opens a connection (:func:`stop_memory_statistics`).
"""

from __future__ import annotations

import ctypes
import json
import os
import sqlite3
from collections.abc import Callable
from typing import Any

import orjson

from tasknet.site.storage.engine.sources import SYSTEM, Sources
from tasknet.site.storage.engine.timestamps import truncated

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


#: The SQL function of a connection's wall clock (``{now}``'s "now").
NOW_FUNCTION = "tasknet_now"


class SiteConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` carrying the :class:`Sources` of its
    transactions (the ``factory`` of every connection the engine opens)."""

    sources: Sources


def register_now(connection: sqlite3.Connection, wall: Callable[[], float]) -> None:
    """Give ``connection`` the SQL function ``tasknet_now()``: ``wall()``
    cut to milliseconds (:func:`~tasknet.site.storage.engine.timestamps.truncated`)."""

    def tasknet_now() -> float:
        return truncated(wall())

    connection.create_function(NOW_FUNCTION, 0, tasknet_now, deterministic=True)


def configure_connection(connection: sqlite3.Connection, sources: Sources = SYSTEM) -> None:
    """Apply the PRAGMAs every connection of the site must have, and give it
    ``sources`` (the module doc; a pool passes its own, a tool's or a
    test's connection gets :data:`~tasknet.site.storage.engine.sources.SYSTEM`)."""
    connection.row_factory = sqlite3.Row
    register_now(connection, sources.wall)
    if isinstance(connection, SiteConnection):
        connection.sources = sources
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


def connect_sqlite(path: str, sources: Sources = SYSTEM) -> sqlite3.Connection:
    """A configured connection to the SQLite file ``path`` (autocommit
    mode; a new file is created 0600) with ``sources``, for tools, tests
    and the site's work before its pools open."""
    create_private(path)
    connection = sqlite3.connect(
        path,
        isolation_level=None,
        timeout=BUSY_TIMEOUT_MS / 1000,
        factory=SiteConnection,
    )
    configure_connection(connection, sources)
    return connection


def is_busy(error: sqlite3.Error) -> bool:
    """Another connection held the lock past ``busy_timeout``."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    return isinstance(error, sqlite3.OperationalError) and (
        "locked" in str(error) or "busy" in str(error)
    )


# sqlite3_config's verb for the memory statistics (sqlite3.h).
_SQLITE_CONFIG_MEMSTATUS = 9
_memory_statistics_stopped = False


def stop_memory_statistics() -> bool:
    """Turn SQLite's memory statistics off for this process
    (``SQLITE_CONFIG_MEMSTATUS``; Debian's library has them on).  While they
    are on, every allocation of every connection takes one process-wide
    mutex, so the site's reader threads, which run their statements with
    the GIL released, ran one at a time and slower than one alone (B9 with
    8 clients; bench/README.md).

    SQLite takes the setting only between ``sqlite3_shutdown`` and
    ``sqlite3_initialize``, which must not run while anything of the
    library is in use: so only when nothing is allocated (no connection
    open).  True if the statistics are off (now or by an earlier call),
    False if they were left on (a connection is open, or the library's
    symbols cannot be reached)."""
    global _memory_statistics_stopped
    if _memory_statistics_stopped:
        return True
    import _sqlite3

    try:
        library = ctypes.CDLL(_sqlite3.__file__)
        memory_used = library.sqlite3_memory_used
        configure = library.sqlite3_config
    except (OSError, AttributeError):
        return False
    memory_used.restype = ctypes.c_int64
    if memory_used() != 0:
        return False
    configure.argtypes = [ctypes.c_int, ctypes.c_int]
    library.sqlite3_shutdown()
    stopped = configure(_SQLITE_CONFIG_MEMSTATUS, 0) == 0
    library.sqlite3_initialize()
    _memory_statistics_stopped = stopped
    return stopped
