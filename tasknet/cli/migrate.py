"""``tasknet-migrate --db PATH``: back up, then migrate a site database to the
current schema; refused (exit 1) while a site holds the database.

``tasknet-migrate --db postgresql://…``: create the schema on an empty
PostgreSQL database, or apply the additive upgrades to an older one (what a
starting site does; safe beside running sites).  The v1 -> v2 migration and
its backup are SQLite's alone."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tasknet.cli.args import parse
from tasknet.site.storage.engine.database import classify, describe, is_postgres, redact
from tasknet.site.storage.engine.errors import DatabaseError
from tasknet.site.storage.engine.file_lock import DatabaseInUse
from tasknet.site.storage.engine.migrate import DuplicateGids, migrate
from tasknet.site.storage.engine.schema import SchemaError
from tasknet.version import version_line


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
    parser.add_argument("--version", action="version", version=version_line("tasknet-migrate"))
    args = parse(parser, argv)

    def progress(line: str) -> None:
        print(redact(line, args.db), flush=True)

    def refused(message: str) -> None:
        # Every line goes through the one redaction helper: no password of
        # the --db URL, whatever the driver repeated of it.
        print(f"tasknet-migrate: {redact(message, args.db)}", file=sys.stderr)

    if not is_postgres(args.db):
        problem = _path_problem(args.db)
        if problem is not None:
            refused(problem)
            return 1
    try:
        migrate(args.db, progress)
    except DuplicateGids as e:
        refused(str(e))
        if e.backup:
            print(f"(backup kept at {e.backup}; nothing was changed)", file=sys.stderr)
        return 2
    except DatabaseInUse as e:
        refused(str(e))
        return 1
    except SchemaError as e:
        refused(str(e))
        return 1
    except OSError as e:
        # The lock file or the backup cannot be written (no rights, no space).
        where = f": {e.filename}" if e.filename else ""
        refused(f"{describe(args.db)}: {e.strerror or e}{where}; nothing was changed")
        return 1
    except Exception as e:
        if not isinstance(classify(e), DatabaseError):
            raise
        refused(f"cannot migrate {describe(args.db)}: {e}")
        return 1
    return 0


def _path_problem(path: str) -> str | None:
    """Why a SQLite ``--db`` cannot be migrated (None: it can be tried)."""
    target = Path(path)
    if target.is_dir():
        return (
            f"--db {path} is a directory, not a database file: give the site's database"
            " file (the path given to tasknet-site --db)"
        )
    if not target.exists():
        return (
            f"no database at {path!r}, nothing to migrate (a site started on a new path"
            " creates its database at the current schema by itself)"
        )
    if not target.is_file():
        return f"--db {path} is not a regular file"
    return None


if __name__ == "__main__":
    sys.exit(main())
