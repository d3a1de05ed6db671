"""``python -m tests.sim.mutants run [NAME...] [--parallel N] [--record]``:
the simulator's block on each mutant, as a table (mutant, caught?, first
seed, check, seconds).  ``--record`` writes each first failing seed and
check into ``mutants.json``.  ``python -m tests.sim.mutants check``: does
every patch still apply?"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tests.sim.mutants import Mutant, Result, applies, load, run, save


def _table(results: list[Result], mutants: dict[str, Mutant]) -> str:
    rows = [("mutant", "db", "caught?", "first seed", "check", "seconds")]
    for r in results:
        m = mutants[r.name]
        caught = "yes" if r.caught else ("ERROR" if r.error else "no")
        seed = "" if r.seed is None else str(r.seed)
        check = r.check or (r.error or "")[:60]
        rows.append((r.name, m.db, caught, seed, check, f"{r.seconds:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.mutants")
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="run each mutant's block of seeds")
    go.add_argument("names", nargs="*", help="mutants (default: all)")
    go.add_argument("--parallel", type=int, default=1, help="mutants run at once")
    go.add_argument("--seeds", help="A..B instead of each mutant's block")
    go.add_argument("--record", action="store_true", help="write the results to mutants.json")
    commands.add_parser("check", help="does every patch apply to this tree?")
    options = parser.parse_args(argv)

    mutants = load()
    by_name = {m.name: m for m in mutants}
    if options.command == "check":
        bad = [(m.name, why) for m in mutants if (why := applies(m)) is not None]
        for name, why in bad:
            print(f"{name}: {why}")
        print(f"{len(mutants) - len(bad)} of {len(mutants)} patches apply")
        return 1 if bad else 0

    unknown = [n for n in options.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(unknown)}")
    chosen = [by_name[n] for n in options.names] if options.names else mutants
    started = time.perf_counter()

    def one(mutant: Mutant) -> Result:
        result = run(mutant, options.seeds)
        where = f"seed {result.seed}: {result.check}" if result.caught else "not caught"
        if result.error:
            where = f"ERROR {result.error[:200]}"
        print(f"{mutant.name}: {where} ({result.seconds:.0f} s)", file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(max(1, options.parallel)) as pool:
        results = list(pool.map(one, chosen))
    print(_table(results, by_name))
    print(f"total {time.perf_counter() - started:.0f} s")
    if options.record and options.seeds is None:
        for r in results:
            if r.error:
                continue
            m = by_name[r.name]
            m.first_seed, m.check, m.detail = r.seed, r.check, r.detail
        save(mutants)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
