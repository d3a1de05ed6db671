"""``tasknet-migrate --db PATH``: back up, then migrate a site database to the
current schema; refused (exit 1) while a site holds the database."""

from __future__ import annotations

import argparse
import sqlite3
import sys

from tasknet.site.storage.lock import DatabaseInUse
from tasknet.site.storage.migrate import DuplicateGids, migrate
from tasknet.site.storage.schema import SchemaError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tasknet-migrate",
        description="Back the site database up (SQLite online backup, mode 0600) before "
        "changing anything, then apply the schema upgrades in one transaction. Refused while "
        "a tasknet-site holds the database. Running it twice is harmless.",
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
    except DatabaseInUse as e:
        print(f"tasknet-migrate: {e}", file=sys.stderr)
        return 1
    except (SchemaError, sqlite3.Error) as e:
        print(f"tasknet-migrate: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
