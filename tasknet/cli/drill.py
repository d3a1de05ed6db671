"""``tasknet-drill``: fault drills against real processes (DRILLS.md).

    tasknet-drill [SCENARIO...] [--repeat N] [--report FILE] [--keep] [--quick] [--netns]

With no scenario, all of them run.  Exit status: 0 when every run passed,
1 when any invariant or expectation FAILed, 2 on a usage error.
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
from tasknet.drill.netns import Netns, NetnsError
from tasknet.drill.netns import available as netns_available
from tasknet.drill.report import Progress, RunResult, failures, table, to_json
from tasknet.drill.runner import run_all
from tasknet.drill.scenarios import QUICK, SCENARIOS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tasknet-drill",
        description="Fault drills: real upstream, site and node processes, a fault "
        "injected, invariants D1-D8 checked.",
    )
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="e.g. S1 S7 (default: all)")
    p.add_argument("--quick", action="store_true", help=f"the CI set: {' '.join(QUICK)}")
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.id:<4} {s.title}{'  (quick)' if s.id in QUICK else ''}")
        return 0
    names = _chosen_names(parser, args)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    netns = _netns_or_loopback() if args.netns else None
    chosen = [SCENARIOS[n] for n in (names or list(SCENARIOS))]
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    root = args.root or Path(tempfile.mkdtemp(prefix="tasknet-drill-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"tasknet-drill: {len(chosen)} scenario(s) x {args.repeat}, seed {seed}, dir {root}")

    started = time.time()
    try:
        results = run_all(
            chosen, args.repeat, root, keep=args.keep, progress=Progress(), seed=seed, netns=netns
        )
    finally:
        reactor_thread.stop()
        if netns is not None:
            netns.destroy()
    _print_results(results)
    if args.report:
        report = to_json(results, started, sys.argv if argv is None else list(argv))
        report["seed"] = seed
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


def _chosen_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The scenario ids asked for (``--quick`` adds the CI set); exits on an unknown one."""
    names = [n.upper() for n in args.scenarios]
    if args.quick:
        names += [n for n in QUICK if n not in names]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    return names


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
