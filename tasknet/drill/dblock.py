"""Hold a lock on the site database that blocks the site's writes for a
while (drill S6).

Run as ``python -m tasknet.drill.dblock --db PATH|URL --seconds N [--ready-file F]``.
On a SQLite file it takes ``BEGIN EXCLUSIVE``; on a PostgreSQL database
(a ``postgresql://`` URL) it takes, in a transaction of another session,
``LOCK TABLE task_operation IN EXCLUSIVE MODE`` (reads go on, every write
of an operation waits).  Either waits up to ``--acquire-timeout`` for the
lock, then prints ``LOCKED`` on stdout and creates ``--ready-file`` so the
drill knows the lock is held, sleeps ``--seconds`` and rolls back: nothing is
ever written.  The site trying to write meanwhile waits its ``busy_timeout``
(SQLite) or ``lock_timeout`` (PostgreSQL) and then fails "busy": the fault
S6 is about.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tasknet.site.storage.engine.database import is_postgres

READY_LINE = "LOCKED"
#: The table whose writes the PostgreSQL lock blocks: every create's persist.
LOCKED_TABLE = "task_operation"


def _locked(seconds: float, ready_file: Path | None) -> None:
    print(READY_LINE, flush=True)
    if ready_file is not None:
        ready_file.write_text(f"{time.time()}\n")
    time.sleep(seconds)


def hold_lock(db: Path, seconds: float, acquire_timeout: float, ready_file: Path | None) -> None:
    """Hold ``BEGIN EXCLUSIVE`` on ``db`` for ``seconds``, then roll back."""
    if not db.exists():
        raise FileNotFoundError(f"no database at {db}")
    conn = sqlite3.connect(str(db), timeout=acquire_timeout, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        _locked(seconds, ready_file)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def hold_postgres_lock(
    url: str, seconds: float, acquire_timeout: float, ready_file: Path | None
) -> None:
    """Hold an EXCLUSIVE lock on ``task_operation`` for ``seconds`` in a
    transaction of its own, then roll back."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"SET lock_timeout = {max(1, int(acquire_timeout * 1000))}")
        conn.execute("BEGIN")
        conn.execute(f"LOCK TABLE {LOCKED_TABLE} IN EXCLUSIVE MODE")
        _locked(seconds, ready_file)
        conn.execute("ROLLBACK")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasknet.drill.dblock", description=__doc__)
    parser.add_argument("--db", required=True, help="SQLite database file or postgresql:// URL")
    parser.add_argument("--seconds", type=float, required=True, help="how long to hold the lock")
    parser.add_argument("--acquire-timeout", type=float, default=10.0)
    parser.add_argument("--ready-file", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be > 0")
    try:
        if is_postgres(args.db):
            hold_postgres_lock(args.db, args.seconds, args.acquire_timeout, args.ready_file)
        else:
            hold_lock(Path(args.db), args.seconds, args.acquire_timeout, args.ready_file)
    except (OSError, sqlite3.Error) as err:
        print(f"dblock: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - psycopg's errors: said, exit 1
        print(f"dblock: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
