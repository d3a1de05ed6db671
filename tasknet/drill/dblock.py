"""Hold an exclusive write lock on a SQLite database for a while (drill S6).

Run as ``python -m tasknet.drill.dblock --db PATH --seconds N [--ready-file F]``.
It takes ``BEGIN EXCLUSIVE`` (waiting up to ``--acquire-timeout`` for it),
then prints ``LOCKED`` on stdout and creates ``--ready-file`` so the drill
knows the lock is held, sleeps ``--seconds`` and rolls back: nothing is ever
written.  Another process (the site) trying to write meanwhile waits its
``busy_timeout`` and then gets ``SQLITE_BUSY``: the fault S6 is about.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path

READY_LINE = "LOCKED"


def hold_lock(db: Path, seconds: float, acquire_timeout: float, ready_file: Path | None) -> None:
    """Hold ``BEGIN EXCLUSIVE`` on ``db`` for ``seconds``, then roll back."""
    if not db.exists():
        raise FileNotFoundError(f"no database at {db}")
    conn = sqlite3.connect(str(db), timeout=acquire_timeout, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        print(READY_LINE, flush=True)
        if ready_file is not None:
            ready_file.write_text(f"{time.time()}\n")
        time.sleep(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasknet.drill.dblock", description=__doc__)
    parser.add_argument("--db", type=Path, required=True, help="SQLite database file")
    parser.add_argument("--seconds", type=float, required=True, help="how long to hold the lock")
    parser.add_argument("--acquire-timeout", type=float, default=10.0)
    parser.add_argument("--ready-file", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be > 0")
    try:
        hold_lock(args.db, args.seconds, args.acquire_timeout, args.ready_file)
    except (OSError, sqlite3.Error) as err:
        print(f"dblock: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
