"""``tasknet-drill``: fault drills against real processes (DRILLS.md).

    tasknet-drill [SCENARIO...] [--db sqlite|postgres|URL] [--repeat N] [--report FILE]
                  [--keep] [--quick] [--netns]

With no scenario, all of the database's run: S1–S19 on SQLite, S1–S23 on
PostgreSQL (S20–S23, several sites on one database, run only there).
Exit status: 0 when every run passed, 1 when any invariant or expectation
FAILed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tasknet.drill import reactor_thread
from tasknet.drill.databases import (
    SQLITE_CHOICE,
    DatabaseChoiceError,
    Databases,
    databases_for,
    parse_db_option,
)
from tasknet.drill.netns import Netns, NetnsError
from tasknet.drill.netns import available as netns_available
from tasknet.drill.pgserver import PostgresFailed, PostgresNotInstalled
from tasknet.drill.report import Progress, RunResult, failures, table, to_json
from tasknet.drill.runner import run_all
from tasknet.drill.scenarios import QUICK, QUICK_POSTGRES, SCENARIOS, Scenario
from tasknet.site.storage.engine.database import POSTGRESQL, SQLITE, describe, redact
from tasknet.version import version_line


def _db_option(value: str) -> str:
    try:
        return parse_db_option(value)
    except DatabaseChoiceError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tasknet-drill",
        description="Fault drills: real upstream, site and node processes, a fault "
        "injected, invariants D1-D10 checked.",
    )
    p.add_argument(
        "scenarios",
        nargs="*",
        metavar="SCENARIO",
        help="e.g. S1 S7 (default: all those of the chosen database)",
    )
    p.add_argument(
        "--db",
        type=_db_option,
        default=SQLITE_CHOICE,
        metavar="sqlite|postgres|URL",
        help="the sites' database: sqlite (default, a file per run), postgres (a throwaway "
        "PostgreSQL server, a database per run) or a postgresql:// URL of an existing "
        "server (a database per run is created on it: the user needs CREATEDB)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"the CI set: {' '.join(QUICK)} (with --db postgres: {' '.join(QUICK_POSTGRES)})",
    )
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run each scenario N times")
    p.add_argument("--report", type=Path, metavar="FILE", help="write the JSON report here")
    p.add_argument("--keep", action="store_true", help="keep temp directories and logs")
    p.add_argument("--root", type=Path, help="where run directories go (default: a temp dir)")
    p.add_argument("--seed", type=int, help="seed for gid choice (default: random, printed)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument(
        "--netns",
        action="store_true",
        help="site and nodes in separate network namespaces joined by veth (root only)",
    )
    p.add_argument("--version", action="version", version=version_line("tasknet-drill"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.id:<4} {s.title}{_tags(s)}")
        return 0
    backend = SQLITE if args.db == SQLITE_CHOICE else POSTGRESQL
    chosen = _chosen(parser, args, backend)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    netns = _netns_or_loopback() if args.netns else None
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    databases = databases_for(args.db, socket=netns is not None)
    why_not = _start(databases)
    if why_not:
        print(
            f"tasknet-drill: --db {describe(args.db)}: {redact(str(why_not), args.db)}",
            file=sys.stderr,
        )
        if netns is not None:
            netns.destroy()
        return 2
    root = args.root or Path(tempfile.mkdtemp(prefix="tasknet-drill-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"tasknet-drill: {len(chosen)} scenario(s) x {args.repeat}, seed {seed}, dir {root}")
    print(f"tasknet-drill: site database: {databases.describe()}")

    started = time.time()
    try:
        results = run_all(
            chosen,
            args.repeat,
            root,
            keep=args.keep,
            progress=Progress(),
            seed=seed,
            netns=netns,
            databases=databases,
        )
    finally:
        reactor_thread.stop()
        _close(databases)
        if netns is not None:
            netns.destroy()
    _print_results(results)
    if args.report:
        report = to_json(results, started, sys.argv if argv is None else list(argv))
        report["seed"] = seed
        report["db"] = backend
        args.report.write_text(json.dumps(report, ensure_ascii=False, indent=1, default=str))
        print(f"\nJSON report: {args.report}")
    if args.keep:
        print(f"kept: {root} (one directory per run: logs, databases, archives)")
    elif not any(r.failed for r in results):
        try:
            root.rmdir()  # empty once every passing run removed its directory
        except OSError:
            pass
    return 1 if any(r.failed for r in results) else 0


def _tags(scenario: Scenario) -> str:
    tags = []
    if scenario.id in QUICK:
        tags.append("quick")
    if scenario.id in QUICK_POSTGRES:
        tags.append("quick with --db postgres")
    if SQLITE not in scenario.backends:
        tags.append("postgres only")
    return f"  ({', '.join(tags)})" if tags else ""


def _chosen(
    parser: argparse.ArgumentParser, args: argparse.Namespace, backend: str
) -> list[Scenario]:
    """The scenarios asked for (``--quick`` adds the CI set of the database;
    none named: all of the database's); exits on an unknown one, or on one
    the database cannot run."""
    names = [n.upper() for n in args.scenarios]
    if args.quick:
        quick = QUICK if backend == SQLITE else QUICK_POSTGRES
        names += [n for n in quick if n not in names]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    elsewhere = [n for n in names if backend not in SCENARIOS[n].backends]
    if elsewhere:
        parser.error(
            f"{', '.join(elsewhere)} run(s) only with --db postgres"
            " (several sites on one PostgreSQL database)"
        )
    if not names:
        return [s for s in SCENARIOS.values() if backend in s.backends]
    return [SCENARIOS[n] for n in names]


def _start(databases: Databases) -> str:
    """Start the session's database server (or reach the one given); why
    not, or ``""``."""
    try:
        databases.start()
    except (PostgresNotInstalled, PostgresFailed, OSError) as err:
        return str(err)
    except Exception as err:  # noqa: BLE001 - psycopg's errors for an existing server
        return f"cannot use it: {err}"
    return ""


def _close(databases: Databases) -> None:
    try:
        databases.close()
    except Exception as err:  # noqa: BLE001 - the results stand; say it
        print(f"tasknet-drill: stopping the database server: {err}", file=sys.stderr)


def _netns_or_loopback() -> Netns | None:
    """The drill's network namespaces, or None (run on loopback) when they cannot be made."""
    why_not = netns_available()
    if why_not:
        print(f"--netns skipped: {why_not}; running on loopback")
        return None
    netns = Netns()
    try:
        netns.create()
    except NetnsError as err:
        netns.destroy()
        print(f"--netns skipped: {err}; running on loopback")
        return None
    print(f"--netns: site in namespace {netns.site}, nodes in {netns.nodes} (veth)")
    return netns


def _print_results(results: list[RunResult]) -> None:
    print()
    print(table(results))
    evidence = failures(results)
    if evidence:
        print()
        print(evidence)


if __name__ == "__main__":
    sys.exit(main())
