"""``tasknet-migrate --db PATH``: back up, then migrate a site database to the
current schema; refused (exit 1) while a site holds the database.

``tasknet-migrate --db postgresql://…``: create the schema on an empty
PostgreSQL database, or apply the additive upgrades to an older one (what a
starting site does; safe beside running sites).  The v1 -> v2 migration and
its backup are SQLite's alone."""

from __future__ import annotations

import argparse
import sys

from tasknet.site.storage.db import classify, describe
from tasknet.site.storage.errors import DatabaseError
from tasknet.site.storage.lock import DatabaseInUse
from tasknet.site.storage.migrate import DuplicateGids, migrate
from tasknet.site.storage.schema import SchemaError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tasknet-migrate",
        description="Back the site database up (SQLite online backup, mode 0600) before "
        "changing anything, then apply the schema upgrades in one transaction. Refused while "
        "a tasknet-site holds the database. Running it twice is harmless. On PostgreSQL: "
        "create the schema on an empty database (or upgrade it), beside running sites.",
    )
    parser.add_argument(
        "--db",
        required=True,
        metavar="PATH|URL",
        help="the site's database: a SQLite file, or a postgresql:// URL",
    )
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
    except SchemaError as e:
        print(f"tasknet-migrate: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        if not isinstance(classify(e), DatabaseError):
            raise
        print(f"tasknet-migrate: {describe(args.db)}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
