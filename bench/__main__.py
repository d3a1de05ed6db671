"""``python -m bench [B1 ...|all] [--quick] [--workdir DIR] [--keep]``.

Runs the chosen benchmarks one after another (never in parallel: they would
measure each other), prints the table and writes ``bench/results.json``.
Exit status 0 when every chosen benchmark ran (whether or not it met its
target), 1 when one of them failed to run.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.harness import (
    RESULTS_PATH,
    Context,
    Row,
    format_notes,
    format_table,
    machine_facts,
    write_results,
)

#: id -> (module, title, target); the module defines ``run(ctx: Context) -> Row``.
BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "B1": ("bench.b1_reports", "report apply", ">= 1.5x at 50 nodes"),
    "B2": ("bench.b2_create", "create", ">= 0.5x, p99 < 50 ms"),
    "B3": ("bench.b3_codec", "codec", ">= 0.8x"),
    "B4": ("bench.b4_scale", "scale", "< 10 s, RSS < 300 MB, flat"),
    "B5": ("bench.b5_connections", "connections", "CPU < 20%, no drops"),
    "B6": ("bench.b6_download", "download", ">= 0.8x"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "benchmarks",
        nargs="*",
        metavar="B1..B6|all",
        help="benchmarks to run (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves they still run")
    parser.add_argument(
        "--workdir", type=Path, help="where databases and logs go (default: a temp dir)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="B1: sample the site with py-spy under load"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory afterwards")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH, help="JSON output file")
    args = parser.parse_args(argv)
    chosen = [b.upper() for b in args.benchmarks] or ["ALL"]
    if "ALL" in chosen:
        chosen = list(BENCHMARKS)
    unknown = [b for b in chosen if b not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)} or all"
        )
    args.chosen = list(dict.fromkeys(chosen))
    return args


def run_one(bench_id: str, ctx: Context) -> Row:
    module_name, title, target = BENCHMARKS[bench_id]
    started = time.monotonic()
    try:
        module = importlib.import_module(module_name)
        row: Row = module.run(ctx)
    except Exception as e:  # one broken benchmark must not hide the others' rows
        traceback.print_exc(file=sys.stderr)
        row = Row(
            bench=bench_id, title=title, unit="", target=target, error=f"{type(e).__name__}: {e}"
        )
    row.seconds = round(time.monotonic() - started, 2)
    if ctx.quick and row.error is None:
        # Tiny sizes prove the benchmark runs; the targets are for the full sizes.
        row.met = None
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.time()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        workdir = args.workdir
    else:
        workdir = Path(tempfile.mkdtemp(prefix="tasknet-bench-"))
    ctx = Context(quick=args.quick, workdir=workdir, profile=args.profile)
    machine = machine_facts(workdir)
    size = "quick" if args.quick else "full"
    print(
        f"tasknet bench ({size}): nproc={machine['nproc']} python={machine['python']} "
        f"sqlite={machine['sqlite']} twisted={machine['twisted']} "
        f"synchronous={machine['synchronous']} workdir={workdir} ({machine['workdir_filesystem']})",
        flush=True,
    )
    rows: list[Row] = []
    try:
        for bench_id in args.chosen:
            print(f"== {bench_id} {BENCHMARKS[bench_id][1]} ...", flush=True)
            row = run_one(bench_id, ctx)
            rows.append(row)
            status = "error" if row.error else f"{row.seconds:.1f}s"
            print(f"   {bench_id} done ({status})", flush=True)
            # Write after every row, so an interrupted full run keeps what it measured.
            write_results(args.results, rows, machine, args.quick, started)
    finally:
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
