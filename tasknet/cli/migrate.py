"""``tasknet-migrate --db PATH``: back up, then migrate a site database to v2."""

from __future__ import annotations

import argparse
import sqlite3
import sys

from tasknet.site.storage.migrate import DuplicateGids, migrate
from tasknet.site.storage.schema import SchemaError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tasknet-migrate",
        description="Back the site database up (SQLite online backup), then apply "
        "migrate_task_operation_v2.sql in one transaction. Running it twice is harmless.",
    )
    parser.add_argument("--db", required=True, metavar="PATH", help="the site's SQLite database")
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(line, flush=True)

    try:
        migrate(args.db, progress)
    except DuplicateGids as e:
        print(f"tasknet-migrate: {e}", file=sys.stderr)
        if e.backup:
            print(f"(backup kept at {e.backup}; nothing was changed)", file=sys.stderr)
        return 2
    except (SchemaError, sqlite3.Error) as e:
        print(f"tasknet-migrate: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
