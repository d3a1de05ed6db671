"""What a synchronous standby costs per commit: ``python -m bench.commit_cost``.

B1-pg-sync and B2*-pg-sync measure the site on a primary with a synchronous
standby, but their single-server rows run minutes earlier, and on a shared
machine the load moves in between.  This measures the commit alone, both
ways in the same minute: a throwaway server and a pg_auto_failover cluster
(primary + synchronous standby, the same settings) started side by side,
one small transaction per commit (an ``INSERT`` of one row, as a create's
``reserve`` is), in alternating batches so both see the same load; the
per-commit latency's p50 and p99 on each, and the difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from bench.harness import percentile

BATCH = 50
ROUNDS = 10


def _commit_times(url: str, count: int) -> list[float]:
    """``count`` transactions of one INSERT each (autocommit: each its own
    commit, ``synchronous_commit = on``); each one's milliseconds."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SET synchronous_commit = on")
        times = []
        for _ in range(count):
            started = time.perf_counter()
            connection.execute("INSERT INTO bench_commit (at) VALUES (now())")
            times.append((time.perf_counter() - started) * 1000.0)
        return times


def _prepare(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS bench_commit (id BIGSERIAL PRIMARY KEY, at TIMESTAMPTZ)"
        )


def measure(batch: int = BATCH, rounds: int = ROUNDS) -> dict[str, Any]:
    """Per-commit latencies (ms) on one server and on a primary with a
    synchronous standby, interleaved batch by batch."""
    from tasknet.drill.pgcluster import PgCluster
    from tasknet.drill.pgserver import ThrowawayPostgres

    with ThrowawayPostgres() as single, PgCluster() as cluster:
        single_url = single.create_database("commits")
        standby_url = cluster.uri
        for url in (single_url, standby_url):
            _prepare(url)
        times: dict[str, list[float]] = {"single": [], "standby": []}
        for _ in range(rounds):
            times["single"] += _commit_times(single_url, batch)
            times["standby"] += _commit_times(standby_url, batch)
    out: dict[str, Any] = {"batch": batch, "rounds": rounds}
    for name, values in times.items():
        out[name] = {
            "commits": len(values),
            "p50_ms": round(statistics.median(values), 2),
            "p99_ms": round(percentile(values, 99) or 0.0, 2),
        }
    out["added_p50_ms"] = round(out["standby"]["p50_ms"] - out["single"]["p50_ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.commit_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--batch", type=int, default=BATCH, help=f"commits per batch ({BATCH})")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"batches each way ({ROUNDS})")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.rounds < 1:
        parser.error("--batch and --rounds must be >= 1")
    result = measure(args.batch, args.rounds)
    for name in ("single", "standby"):
        row = result[name]
        print(f"{name:8} {row['commits']} commits: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms")
    print(f"a synchronous standby adds {result['added_p50_ms']} ms per commit (p50)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
