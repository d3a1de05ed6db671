"""``python -m bench [B1 ...|all] [--db CHOICE] [--quick] [--workdir DIR] [--keep]``.

Runs the chosen benchmarks one after another (never in parallel: they would
measure each other), prints the table and writes ``bench/results.json``.
Exit status 0 when every chosen benchmark ran (whether or not it met its
target), 1 when one of them failed to run.

``--db`` (default ``both``) chooses the backends of B1, B2 and B9: ``B1`` on
SQLite, ``B1-pg`` on a throwaway PostgreSQL server; B7 runs on PostgreSQL
only (left out by ``--db sqlite``); B3-B6, B10 and B11 do not depend on it.
``--db postgres-ha`` runs B1 and B2 against a primary with a synchronous
standby (pg_auto_failover on loopback; rows ``B1-pg-sync``, ``B2a-pg-sync``,
``B2b-pg-sync``), ``--db postgres+ha`` both beside each other in one run.
B4 and B9 keep their seeded databases in ``--cache`` between runs of the
same size (seeding a million tasks takes minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.harness import (
    CACHE_ENV,
    POSTGRES,
    POSTGRES_HA,
    RESULTS_PATH,
    SQLITE,
    Context,
    Row,
    default_cache,
    format_notes,
    format_table,
    machine_facts,
    write_results,
)

#: id -> (module, title, target); the module defines ``run(ctx: Context)``
#: returning one Row, or several (B2: the open loop B2a and the closed loop B2b).
BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "B1": ("bench.b1_reports", "report apply", ">= 1.5x at 50 nodes, or >= 0.9 of the ceiling"),
    "B2": ("bench.b2_create", "create", "(a) p99 < 50 ms open loop; (b) >= 0.5x"),
    "B3": ("bench.b3_codec", "codec", ">= 1.0x"),
    "B4": ("bench.b4_scale", "scale", "1M < 60 s, RSS < 300 MB, flat"),
    "B5": ("bench.b5_connections", "connections", "CPU < 20%, RSS < 1 GiB, no drops"),
    "B6": ("bench.b6_download", "download", ">= 0.8x"),
    "B7": ("bench.b7_sites", "sites", ">= 1.3x"),
    "B8": ("bench.b8_simulator", "simulator", ">= 100 seeds/min, simulated >= 100x wall"),
    "B9": ("bench.b9_views", "views", "p99 < 50 ms (PostgreSQL 100 ms)"),
    "B10": ("bench.b10_restart", "restart storm", "< 30 s, answers within 1 s"),
    "B11": (
        "bench.b11_serving",
        "serving",
        "node >= 0.8x nginx; via site >= 0.5x; link p99 < 20 ms",
    ),
}
#: Benchmarks with a site database under them that run on either backend.
EITHER_BACKEND = frozenset({"B1", "B2", "B9"})
#: Benchmarks that need PostgreSQL.
POSTGRES_ONLY = frozenset({"B7"})
#: --db value -> the backends it runs B1, B2 and B9 on.
DB_CHOICES = {
    "sqlite": (SQLITE,),
    "postgres": (POSTGRES,),
    "both": (SQLITE, POSTGRES),
    "postgres-ha": (POSTGRES_HA,),
    "postgres+ha": (POSTGRES, POSTGRES_HA),
}
#: Benchmarks that also run against a synchronous standby (the price per commit).
STANDBY_BENCHMARKS = frozenset({"B1", "B2"})


def _backends(bench_id: str, db: str) -> tuple[str, ...]:
    if bench_id in EITHER_BACKEND:
        chosen = DB_CHOICES[db]
        if bench_id not in STANDBY_BENCHMARKS:
            chosen = tuple(b for b in chosen if b != POSTGRES_HA)
        return chosen
    return (POSTGRES,) if bench_id in POSTGRES_ONLY else (SQLITE,)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "benchmarks",
        nargs="*",
        metavar="B1..B11|all",
        help="benchmarks to run (default: all)",
    )
    parser.add_argument(
        "--db",
        choices=sorted(DB_CHOICES),
        default="both",
        help="backends for B1, B2 and B9 (default both: SQLite rows B1/B2a/B2b/B9, "
        "PostgreSQL rows B1-pg/B2a-pg/B2b-pg/B9-pg on a throwaway server); postgres-ha: B1 and "
        "B2 against a primary with a synchronous standby (rows B1-pg-sync, B2a-pg-sync, "
        "B2b-pg-sync), postgres+ha: the single server's rows and those side by side; B7 needs "
        "PostgreSQL, sqlite leaves it out",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves they still run")
    parser.add_argument(
        "--workdir", type=Path, help="where databases and logs go (default: a temp dir)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="B1, B2: sample the site with py-spy under load (B2: under the open loop)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=default_cache(),
        help="where seeded databases of B4 and B9 are kept between runs of the same size "
        f"(default ${CACHE_ENV} or {default_cache()})",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="seed B4's and B9's databases afresh"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory afterwards")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH, help="JSON output file")
    args = parser.parse_args(argv)
    named = [b.upper() for b in args.benchmarks] or ["ALL"]
    everything = "ALL" in named
    chosen = list(BENCHMARKS) if everything else named
    unknown = [b for b in chosen if b not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)} or all"
        )
    args.chosen = list(dict.fromkeys(chosen))
    if args.db == "sqlite":
        explicit = [b for b in args.chosen if b in POSTGRES_ONLY and not everything]
        if explicit:
            parser.error(f"{', '.join(explicit)} runs on PostgreSQL only, not with --db sqlite")
        args.chosen = [b for b in args.chosen if b not in POSTGRES_ONLY]
    args.plan = [(b, backend) for b in args.chosen for backend in _backends(b, args.db)]
    return args


def run_one(bench_id: str, ctx: Context) -> list[Row]:
    module_name, title, target = BENCHMARKS[bench_id]
    if ctx.backend == POSTGRES_HA and bench_id in EITHER_BACKEND:
        bench_id, title = f"{bench_id}-pg-sync", f"{title} (PostgreSQL, synchronous standby)"
    elif ctx.on_postgres and bench_id in EITHER_BACKEND:
        bench_id, title = f"{bench_id}-pg", f"{title} (PostgreSQL)"
    started = time.monotonic()
    try:
        module = importlib.import_module(module_name)
        result: Row | list[Row] = module.run(ctx)
        rows = result if isinstance(result, list) else [result]
    except Exception as e:  # one broken benchmark must not hide the others' rows
        traceback.print_exc(file=sys.stderr)
        rows = [
            Row(
                bench=bench_id,
                title=title,
                unit="",
                target=target,
                error=f"{type(e).__name__}: {e}",
            )
        ]
    seconds = round(time.monotonic() - started, 2)
    for row in rows:
        row.seconds = seconds
        if ctx.quick and row.error is None:
            # Tiny sizes prove the benchmark runs; the targets are for the full sizes.
            row.met = None
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.time()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        workdir = args.workdir
    else:
        workdir = Path(tempfile.mkdtemp(prefix="tasknet-bench-"))
    ctx = Context(
        quick=args.quick,
        workdir=workdir,
        profile=args.profile,
        cache=None if args.no_cache else args.cache,
    )
    machine = machine_facts(workdir)
    size = "quick" if args.quick else "full"
    print(
        f"tasknet bench ({size}): nproc={machine['nproc']} python={machine['python']} "
        f"sqlite={machine['sqlite']} postgresql={machine['postgresql']} "
        f"twisted={machine['twisted']} synchronous={machine['synchronous']} "
        f"workdir={workdir} ({machine['workdir_filesystem']})",
        flush=True,
    )
    rows: list[Row] = []
    try:
        for bench_id, backend in args.plan:
            labels = {POSTGRES: " (PostgreSQL)", POSTGRES_HA: " (PostgreSQL, synchronous standby)"}
            on = labels.get(backend, "") if bench_id in EITHER_BACKEND else ""
            print(f"== {bench_id} {BENCHMARKS[bench_id][1]}{on} ...", flush=True)
            done = run_one(bench_id, dataclasses.replace(ctx, backend=backend))
            rows.extend(done)
            for row in done:
                status = "error" if row.error else f"{row.seconds:.1f}s"
                print(f"   {row.bench} done ({status})", flush=True)
            if ctx.pg.server is not None:
                machine["postgresql_server"] = ctx.pg.facts()
            if ctx.pg_ha.server is not None:
                machine["postgresql_synchronous_standby"] = ctx.pg_ha.facts()
            # Write after every row, so an interrupted full run keeps what it measured.
            write_results(args.results, rows, machine, args.quick, started)
    finally:
        ctx.pg.stop()
        ctx.pg_ha.stop()
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(format_table(rows))
    if args.quick:
        print("(quick sizes: targets are judged only at full size)")
    notes = format_notes(rows)
    if notes:
        print()
        print(notes)
    print(f"\nresults: {args.results}")
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
