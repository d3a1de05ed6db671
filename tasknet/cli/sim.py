"""``tasknet-sim``: the deterministic simulator (SIMULATION.md "The command").

    tasknet-sim run --seeds 0..999 [--db sqlite|postgres] [--faults KIND,...]
                    [--jobs N] [--json FILE] [--first-failure]
    tasknet-sim replay SEED [--db ...] [--trace FILE]
    tasknet-sim shrink SEED [--db ...]

``run`` prints a line per failing seed and a last line of totals (plain
numbers: scripts read it), and exits 1 when any seed failed.  ``replay``
runs one seed and ends with ``trace sha256 HEX``.  ``shrink`` prints the
smallest schedule it found that still fails.  ``--db postgres`` starts a
throwaway PostgreSQL server (``initdb``/``pg_ctl``; as the ``postgres``
user when run as root) and runs several sites on it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasknet.version import version_line

__all__ = ["main"]

#: Sites of a PostgreSQL run (several sites on one database, SCALE.md).
POSTGRES_SITES = 2


def _seeds(text: str) -> range:
    first, sep, last = text.partition("..")
    try:
        low = int(first)
        high = int(last) if sep else low
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds wants A..B or N, got {text!r}") from None
    if low < 0 or high < low:
        raise argparse.ArgumentTypeError(f"--seeds wants 0 <= A <= B, got {text!r}")
    return range(low, high + 1)


def _faults(text: str) -> tuple[str, ...]:
    from tasknet.sim.schedule import FAULT_KINDS, POSTGRES_FAULT_KINDS

    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    known = FAULT_KINDS + POSTGRES_FAULT_KINDS
    unknown = [k for k in kinds if k not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return kinds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tasknet-sim", description="The deterministic simulator (SIMULATION.md)."
    )
    parser.add_argument("--version", action="version", version=version_line("tasknet-sim"))
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run many seeds and check every one")
    run.add_argument("--seeds", type=_seeds, default=range(0, 100), help="A..B (both included)")
    run.add_argument("--jobs", type=int, default=1, help="processes to run seeds in")
    run.add_argument("--json", type=Path, help="write every seed's outcome here")
    run.add_argument(
        "--first-failure",
        action="store_true",
        help="stop at the first failing seed (in seed order; the mutant suite's use)",
    )
    for name, what in (("replay", "run one seed again"), ("shrink", "shrink a failing seed")):
        one = commands.add_parser(name, help=what)
        one.add_argument("seed", type=int)
        if name == "replay":
            one.add_argument("--trace", type=Path, help="write the event trace here")
    for sub in commands.choices.values():
        sub.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
        sub.add_argument("--faults", type=_faults, default=None, help="KIND,... (default: all)")
    return parser


# -- one seed, in this process or a worker ------------------------------------------------

_postgres: Any = None


def _schedule(seed: int, db: str, faults: tuple[str, ...] | None) -> Any:
    from tasknet.sim.schedule import FAULT_KINDS, POSTGRES_FAULT_KINDS, generate

    if faults is None:
        faults = FAULT_KINDS + (POSTGRES_FAULT_KINDS if db == "postgres" else ())
    sites = POSTGRES_SITES if db == "postgres" else 1
    return generate(seed, faults=faults, sites=sites)


def _run_one(seed: int, db: str, faults: tuple[str, ...] | None, keep: int | None = 0) -> Any:
    from tasknet.sim.run import run_schedule

    return run_schedule(
        _schedule(seed, db, faults), db=db, keep_trace=keep, postgres=_fresh_database
    )


def _fresh_database() -> str:
    if _postgres is None:
        raise RuntimeError("no PostgreSQL server was started")
    return str(_postgres.fresh_database())


def _summary(outcome: Any) -> dict[str, Any]:
    return {
        "seed": outcome.seed,
        "failed": outcome.failed,
        "failures": [list(f) for f in outcome.failures],
        "events": outcome.events,
        "simulated": round(outcome.simulated, 3),
        "wall": round(outcome.wall, 3),
        "faults": outcome.faults,
        "digest": outcome.digest,
        "fetches": outcome.fetches,
    }


def _worker(args: tuple[int, str, tuple[str, ...] | None]) -> dict[str, Any]:
    seed, db, faults = args
    return _summary(_run_one(seed, db, faults))


def _worker_init(admin_url: str | None) -> None:
    global _postgres
    from tasknet.sim.no_global_reactor import forbid

    forbid()
    _quiet()
    if admin_url is not None:
        from tasknet.sim.postgres import SimPostgres

        _postgres = SimPostgres(admin_url)  # the server the parent started


@contextmanager
def _server(db: str) -> Iterator[None]:
    if db != "postgres":
        yield
        return
    _start_postgres()
    try:
        yield
    finally:
        _stop_postgres()


def _start_postgres() -> None:
    global _postgres
    from tasknet.sim.postgres import SimPostgres

    _postgres = SimPostgres.start()


def _stop_postgres() -> None:
    global _postgres
    if _postgres is not None:
        _postgres.stop()
        _postgres = None


def _quiet() -> None:
    """The roles log as they would under twistd; a run of a thousand seeds
    keeps only its own lines."""
    from twisted.logger import globalLogBeginner, globalLogPublisher

    globalLogBeginner.beginLoggingTo([], discardBuffer=True, redirectStandardIO=False)
    for observer in list(globalLogPublisher._observers):  # noqa: SLF001 - none wanted
        globalLogPublisher.removeObserver(observer)


# -- the commands -------------------------------------------------------------------------


def _cmd_run(options: argparse.Namespace) -> int:
    seeds: range = options.seeds
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    failed = events = 0
    simulated = 0.0
    faults: dict[str, int] = {}
    jobs = max(1, options.jobs)
    work = [(seed, options.db, options.faults) for seed in seeds]

    def take(summary: dict[str, Any]) -> None:
        nonlocal failed, events, simulated
        results.append(summary)
        events += summary["events"]
        simulated += summary["simulated"]
        for kind, n in summary["faults"].items():
            faults[kind] = faults.get(kind, 0) + n
        if summary["failed"]:
            failed += 1
            check, detail = summary["failures"][0]
            more = len(summary["failures"]) - 1
            extra = f" (+{more} more)" if more else ""
            db = " --db postgres" if options.db == "postgres" else ""
            print(
                f"seed {summary['seed']}: {check} FAIL {detail}{extra}"
                f" (replay: tasknet-sim replay {summary['seed']}{db})",
                flush=True,
            )
        done = len(results)
        if done % 100 == 0 and done < len(work):
            print(f"... {done}/{len(work)} seeds, {failed} failed", file=sys.stderr, flush=True)

    with _server(options.db):
        if jobs == 1:
            for item in work:
                take(_worker(item))
                if options.first_failure and failed:
                    break
        else:
            admin_url = _postgres.admin_url if _postgres is not None else None
            context = multiprocessing.get_context("spawn")
            with context.Pool(jobs, initializer=_worker_init, initargs=(admin_url,)) as pool:
                for summary in pool.imap(_worker, work, chunksize=4):
                    take(summary)
                    if options.first_failure and failed:
                        break  # the with's exit terminates the workers
                else:
                    pool.close()
                    pool.join()
    wall = time.perf_counter() - started
    ratio = simulated / wall if wall > 0 else 0.0
    kinds = " ".join(f"{k}={n}" for k, n in sorted(faults.items()))
    print(
        f"{len(results)} seeds, {failed} failed, {events} events,"
        f" simulated {simulated / 3600:.2f} h in {wall:.1f} s (×{ratio:.0f}), faults: {kinds}",
        flush=True,
    )
    if options.json is not None:
        options.json.write_text(json.dumps({"seeds": results}, indent=1) + "\n")
    return 1 if failed else 0


def _cmd_replay(options: argparse.Namespace) -> int:
    with _server(options.db):
        outcome = _run_one(options.seed, options.db, options.faults, keep=None)
    schedule = _schedule(options.seed, options.db, options.faults)
    print(schedule.describe())
    status = outcome.first_failure() if outcome.failed else "ok"
    print(
        f"seed {outcome.seed}: {status}; {outcome.events} events,"
        f" simulated {outcome.simulated:.1f} s in {outcome.wall:.2f} s"
    )
    if options.trace is not None:
        options.trace.write_text("".join(outcome.trace))
    print(f"trace sha256 {outcome.digest}")
    return 1 if outcome.failed else 0


def _cmd_shrink(options: argparse.Namespace) -> int:
    from tasknet.sim.run import run_schedule
    from tasknet.sim.shrink import shrink

    schedule = _schedule(options.seed, options.db, options.faults)
    with _server(options.db):
        shrunk = shrink(
            schedule,
            lambda s: run_schedule(s, db=options.db, postgres=_fresh_database),
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    if shrunk is None:
        print(f"seed {options.seed}: does not fail; nothing to shrink")
        return 0
    print(
        f"seed {options.seed}: {len(schedule.steps)} steps shrunk to"
        f" {len(shrunk.schedule.steps)} in {shrunk.runs} runs; still"
        f" {shrunk.outcome.first_failure()}"
    )
    print(shrunk.schedule.describe())
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    from tasknet.sim.no_global_reactor import forbid

    forbid()
    _quiet()
    command = {"run": _cmd_run, "replay": _cmd_replay, "shrink": _cmd_shrink}[options.command]
    return command(options)


if __name__ == "__main__":
    sys.exit(main())
