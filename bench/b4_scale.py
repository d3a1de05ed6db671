"""B4 scale: site RSS and time for recovery + dispatch of N ``SUBMITTED`` tasks to 100 nodes.

For each size (100,000 then 1,000,000; quick: 1,000 then 5,000): seed a
database with N unassigned ``SUBMITTED`` tasks and 100 node keys (the
site's own storage functions, ``bench.seed``; kept in the bench cache
between runs, ``bench.cache``: a million takes minutes), start the load nodes
(``commands`` mode: they count every ``TaskCommand`` they receive, retrying
their connects until the site listens), start ``twistd -n tasknet-site``, and
measure from the site's process start until the load nodes hold a command for
every task: startup, recovery, 100 logins and the whole dispatch.  The site's
peak RSS (``VmHWM``) is read at that moment.  Memory is flat in task count
when ten times the tasks costs at most ``FLAT_LIMIT`` times the peak RSS.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from bench import cache
from bench.harness import Context, Row
from bench.load import LoadFleet
from bench.procs import BenchError
from bench.seed import seed_site
from bench.services import require_dispatch, spawn_site, wait_site
from tasknet.process import free_port

TARGET_SECONDS = 60.0
TARGET_SECONDS_100K = 10.0
TARGET_RSS_MIB = 300.0
FLAT_LIMIT = 1.25
GID_START = 40_000_001
MIB = 2**20


def measure(ctx: Context, tasks: int, nodes: int) -> dict[str, float]:
    directory = ctx.scratch(f"b4-{tasks}")
    db = directory / "site.sqlite"

    def seed(path: Path) -> dict[str, Any]:
        started = time.monotonic()
        seed_site(
            path,
            node_count=nodes,
            unassigned=range(GID_START, GID_START + tasks),
            keep_ids=False,
        )
        connection = sqlite3.connect(path)
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            connection.close()
        return {"seed_seconds": time.monotonic() - started}

    made_by = [Path(cache.__file__).with_name("seed.py")]
    key = f"b4-{tasks}t-{nodes}n-{cache.digest(made_by)}"
    copy_started = time.monotonic()
    meta, cached = cache.seeded_copy(ctx.cache, key, db, seed)
    seed_seconds = float(meta["seed_seconds"])
    copy_seconds = time.monotonic() - copy_started if cached else 0.0

    site = spawn_site(directory, db, upstream_url=f"http://127.0.0.1:{free_port()}")
    try:
        with LoadFleet(
            directory,
            port=site.nodes_port,
            nodes=nodes,
            processes=2 if nodes > 10 else 1,
            mode="commands",
            retry_for=60.0,
        ) as fleet:
            deadline = time.monotonic() + (60 if ctx.quick else 900)
            peak_rss = 0
            while fleet.total("commands", "distinct_gids") < tasks:
                if not site.proc.alive:
                    raise site.proc.died("dispatching")
                if time.monotonic() > deadline:
                    got = fleet.total("commands", "distinct_gids")
                    raise BenchError(f"only {got} of {tasks} tasks dispatched before the deadline")
                peak_rss = max(peak_rss, site.proc.memory().get("VmHWM", 0))
                time.sleep(0.02)
            finished = max(
                float(event["last_at"])
                for p in fleet.processes
                if (event := p.last("commands")) is not None
            )
            memory = site.proc.memory()
            wait_site(site)
            require_dispatch(site)
            results = fleet.results()
    finally:
        site.proc.stop()
    commands = sum(r["commands"] for r in results)
    logged_in = sum(r["logged_in"] for r in results)
    receiving = sum(r["nodes_with_commands"] for r in results)
    return {
        "tasks": tasks,
        "seconds": finished - site.started_at,
        "peak_rss": max(peak_rss, memory.get("VmHWM", 0)),
        "commands": commands,
        "logged_in": logged_in,
        "nodes_with_commands": receiving,
        "seed_seconds": seed_seconds,
        "from_cache": cached,
        "copy_seconds": copy_seconds,
    }


def run(ctx: Context) -> Row:
    nodes = 10 if ctx.quick else 100
    small_n, large_n = (1_000, 5_000) if ctx.quick else (100_000, 1_000_000)
    small = measure(ctx, small_n, nodes)
    large = measure(ctx, large_n, nodes)

    growth = large["peak_rss"] / small["peak_rss"]
    rss_mib = large["peak_rss"] / MIB
    row = Row(
        bench="B4",
        title="scale",
        unit="s",
        figure=large["seconds"],
        target=(
            f"1M < {TARGET_SECONDS:.0f} s (100k < {TARGET_SECONDS_100K:.0f} s), "
            f"RSS < {TARGET_RSS_MIB:.0f} MB, flat"
        ),
    )
    row.met = (
        large["seconds"] < TARGET_SECONDS
        and (ctx.quick or small["seconds"] < TARGET_SECONDS_100K)
        and rss_mib < TARGET_RSS_MIB
        and growth <= FLAT_LIMIT
    )
    row.notes.append(
        f"{large_n} tasks to {nodes} nodes in {large['seconds']:.1f}s (from site start to the last "
        f"command), peak RSS {rss_mib:.0f} MiB; {small_n} tasks: {small['seconds']:.1f}s, "
        f"{small['peak_rss'] / MIB:.0f} MiB; RSS x{growth:.2f} for x{large_n // small_n} tasks "
        f"(flat: <= x{FLAT_LIMIT}); {large['nodes_with_commands']:.0f} of {nodes} nodes got "
        "commands"
    )
    for m in (small, large):
        how = "from the cache" if m["from_cache"] else "seeded"
        row.notes.append(
            f"{m['tasks']} tasks: database {how} (seeding took {m['seed_seconds']:.0f}s)"
        )
        if m["commands"] > m["tasks"]:
            row.notes.append(f"{m['tasks']} tasks: {m['commands']} commands (some sent twice)")
    row.details = {"nodes": nodes, "small": small, "large": large, "rss_growth": growth}
    return row
