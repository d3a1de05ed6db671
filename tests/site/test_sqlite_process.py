"""What a site process of its own sets up for SQLite.

Its memory statistics are off: with them on (Debian's build), every
allocation of every connection takes one process-wide mutex, so the reader
threads ran one at a time.  The switch can only be thrown while nothing of
the library is in use, so each of those cases runs in a fresh interpreter.
Its reader connections follow the machine's cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tasknet.site.storage.engine.database import DEFAULT_READERS, reader_count

# What the child reports: whether the switch took, and the bytes SQLite
# counts as in use with a connection open and a table written (always 0 with
# the statistics off).
_PROBE = """
import ctypes, json, sqlite3, _sqlite3
from tasknet.site.storage.engine.sqlite import stop_memory_statistics

library = ctypes.CDLL(_sqlite3.__file__)
library.sqlite3_memory_used.restype = ctypes.c_int64
{before}
stopped = stop_memory_statistics()
again = stop_memory_statistics()
connection = sqlite3.connect(":memory:")
connection.execute("CREATE TABLE t (x)")
connection.executemany("INSERT INTO t VALUES (?)", [(str(n) * 50,) for n in range(1000)])
rows = connection.execute("SELECT COUNT(*) FROM t").fetchone()[0]
print(json.dumps({{
    "stopped": stopped, "again": again, "rows": rows,
    "counted": library.sqlite3_memory_used(),
}}))
"""


def _probe(before: str = "") -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROBE.format(before=before))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_statistics_stop_before_the_first_connection() -> None:
    found = _probe()
    assert found == {"stopped": True, "again": True, "rows": 1000, "counted": 0}


def test_an_open_connection_leaves_them_on_and_working() -> None:
    # A connection open when the switch is asked for: sqlite3_shutdown would
    # pull the library from under it, so nothing is changed.
    found = _probe(before="held = sqlite3.connect(':memory:'); held.execute('SELECT 1')")
    assert found["stopped"] is False
    assert found["again"] is False
    assert found["rows"] == 1000
    assert isinstance(found["counted"], int) and found["counted"] > 0


@pytest.mark.parametrize(
    ("cpus", "readers"), [(None, DEFAULT_READERS), (1, 2), (2, 2), (3, 3), (4, 4), (64, 4)]
)
def test_sqlite_readers_follow_the_cores(cpus: int | None, readers: int) -> None:
    # More SQLite readers than cores take the GIL from each other.
    assert reader_count("/var/lib/tasknet/site.sqlite", cpus) == readers


def test_postgresql_readers_do_not() -> None:
    assert reader_count("postgresql://tasknet@127.0.0.1/site", 1) == DEFAULT_READERS
