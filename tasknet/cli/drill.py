"""``tasknet-drill``: fault drills against real processes (DRILLS.md).

    tasknet-drill [SCENARIO...] [--db sqlite|postgres|postgres-ha|URL] [--repeat N]
                  [--report FILE] [--keep] [--quick] [--netns]

``--netns`` with ``--db postgres-ha``: the primary's host in a network
namespace of its own; S24 then cuts that host off the network (DRILLS.md's
second run of S24) instead of SIGKILLing it, and its figures are reported
as "S24 (host cut off)".

With no scenario, all of the database's run: S1–S19 on SQLite, S1–S23 on
PostgreSQL (S20–S23, several sites on one database, run only there), S24–S26
on ``postgres-ha`` (a pg_auto_failover cluster per run: the database fails
over under load; the recovery times are printed after the table).
Exit status: 0 when every run passed, 1 when any invariant or expectation
FAILed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasknet.drill import reactor_thread
from tasknet.drill.databases import (
    POSTGRES_HA_CHOICE,
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
from tasknet.drill.scenarios import QUICK, QUICK_FAILOVER, QUICK_POSTGRES, SCENARIOS, Scenario
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
        metavar="sqlite|postgres|postgres-ha|URL",
        help="the sites' database: sqlite (default, a file per run), postgres (a throwaway "
        "PostgreSQL server, a database per run), postgres-ha (a pg_auto_failover cluster per "
        "run: monitor, primary, synchronous standby; S24-S26) or a postgresql:// URL of an "
        "existing server (a database per run is created on it: the user needs CREATEDB)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"the CI set: {' '.join(QUICK)} (with --db postgres: {' '.join(QUICK_POSTGRES)};"
        f" with --db postgres-ha: {' '.join(QUICK_FAILOVER)})",
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
        help="site and nodes in separate network namespaces joined by veth (root only); with "
        "--db postgres-ha the primary's host in a namespace of its own, and S24 cuts it off the "
        "network instead of killing it",
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
    backend = _backend(args.db)
    chosen = _chosen(parser, args, backend)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    primary_netns = args.netns and backend == POSTGRES_HA_CHOICE
    if primary_netns:
        # postgres-ha: the namespace is the primary's host's (S24 cuts it
        # off); sites and nodes stay on loopback.
        why_not_netns = netns_available()
        if why_not_netns:
            print(f"tasknet-drill: --db postgres-ha --netns: {why_not_netns}", file=sys.stderr)
            return 2
        print("--netns: the primary's host in a network namespace of its own (veth)")
    netns = _netns_or_loopback() if args.netns and not primary_netns else None
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    databases = databases_for(args.db, socket=netns is not None, primary_netns=primary_netns)
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
    _print_recovery(results)
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


def _backend(db: str) -> str:
    """Which scenarios the ``--db`` runs: sqlite, postgresql or postgres-ha."""
    if db == SQLITE_CHOICE:
        return SQLITE
    return POSTGRES_HA_CHOICE if db == POSTGRES_HA_CHOICE else POSTGRESQL


def _tags(scenario: Scenario) -> str:
    tags = []
    if scenario.id in QUICK:
        tags.append("quick")
    if scenario.id in QUICK_POSTGRES:
        tags.append("quick with --db postgres")
    if scenario.id in QUICK_FAILOVER:
        tags.append("quick with --db postgres-ha")
    if scenario.backends == (POSTGRES_HA_CHOICE,):
        tags.append("postgres-ha only")
    elif SQLITE not in scenario.backends:
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
        quick = {SQLITE: QUICK, POSTGRESQL: QUICK_POSTGRES}.get(backend, QUICK_FAILOVER)
        names += [n for n in quick if n not in names]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    elsewhere = [n for n in names if backend not in SCENARIOS[n].backends]
    if elsewhere:
        failover = [n for n in elsewhere if SCENARIOS[n].backends == (POSTGRES_HA_CHOICE,)]
        multi_site = [n for n in elsewhere if n not in failover]
        needs = []
        if multi_site:
            needs.append(
                f"{', '.join(multi_site)} run(s) only with --db postgres"
                " (several sites on one PostgreSQL database)"
            )
        if failover:
            needs.append(
                f"{', '.join(failover)} run(s) only with --db postgres-ha"
                " (a pg_auto_failover cluster: the database fails over)"
            )
        parser.error("; ".join(needs))
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


#: The recovery figures of S24-S26 printed after the table (seconds).
RECOVERY_PARTS = ("recovery_s", "detection_s", "promotion_s", "reconnect_s", "back_s")


def recovery_figures(results: list[RunResult]) -> dict[str, dict[str, Any]]:
    """scenario -> part -> {"runs": [...], "median", "worst"} of the
    failover drills' figures (the E verdict's evidence), for the table
    printed after the runs and for docs/operations.md."""
    out: dict[str, dict[str, Any]] = {}
    for result in results:
        figures = _figures_of(result)
        variant = figures.get("variant")
        label = f"{result.scenario} ({variant})" if variant else result.scenario
        for part in RECOVERY_PARTS:
            value = figures.get(part)
            if isinstance(value, (int, float)):
                entry = out.setdefault(label, {}).setdefault(part, {"runs": []})
                entry["runs"].append(value)
    for parts in out.values():
        for entry in parts.values():
            entry["median"] = round(statistics.median(entry["runs"]), 2)
            entry["worst"] = max(entry["runs"])
    return out


def _figures_of(result: RunResult) -> dict[str, Any]:
    for verdict in result.verdicts:
        if verdict.invariant == "E":
            for item in verdict.evidence:
                if isinstance(item, dict) and isinstance(item.get("figures"), dict):
                    return dict(item["figures"])
    return {}


def _print_recovery(results: list[RunResult]) -> None:
    figures = recovery_figures(results)
    if not figures:
        return
    print()
    print("recovery (s): median / worst over the runs")
    for scenario, parts in figures.items():
        cells = [
            f"{part.removesuffix('_s')} {entry['median']:.1f} / {entry['worst']:.1f}"
            for part, entry in parts.items()
        ]
        print(f"  {scenario}: {', '.join(cells)}")


def _print_results(results: list[RunResult]) -> None:
    print()
    print(table(results))
    evidence = failures(results)
    if evidence:
        print()
        print(evidence)


if __name__ == "__main__":
    sys.exit(main())
