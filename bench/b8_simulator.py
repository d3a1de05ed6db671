"""B8 simulator: seeds a minute of the default workload on one core.

``tasknet-sim run --seeds 0..N-1 --jobs 1`` (SIMULATION.md), one process,
so one core of the machine; the figures come from its last line
(``N seeds, F failed, E events, simulated H h in W s (×R), ...``): seeds a
minute, events a second, and simulated time over wall time.  It has no
baseline (BENCH.md): the targets are absolute, ≥ 100 seeds/min and ≥ ×100.
Three runs of the block; the table quotes their medians.  A seed that
fails is a failed benchmark (the figures of a broken run mean nothing).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from typing import Any

from bench.harness import Context, Row
from bench.procs import BenchError

TARGET_SEEDS_PER_MINUTE = 100.0
TARGET_TIME_RATIO = 100.0
#: The last line of ``tasknet-sim run``.
TOTALS = re.compile(
    r"^(?P<seeds>\d+) seeds, (?P<failed>\d+) failed, (?P<events>\d+) events,"
    r" simulated (?P<hours>[\d.]+) h in (?P<wall>[\d.]+) s \(×(?P<ratio>[\d.]+)\)"
)


def run_block(seeds: int) -> dict[str, float]:
    """One ``tasknet-sim run`` of seeds ``0..seeds-1`` in one process."""
    argv = [sys.executable, "-m", "tasknet.cli.sim", "run", "--seeds", f"0..{seeds - 1}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    match = TOTALS.match(last)
    if match is None:
        raise BenchError(
            f"tasknet-sim printed no totals ({done.returncode}): {done.stderr[-2000:]}"
        )
    if int(match["failed"]):
        raise BenchError(f"tasknet-sim: {last}\n{done.stdout[-3000:]}")
    wall = float(match["wall"])
    return {
        "seeds": int(match["seeds"]),
        "events": int(match["events"]),
        "wall_s": wall,
        "simulated_h": float(match["hours"]),
        "seeds_per_min": int(match["seeds"]) * 60 / wall,
        "events_per_s": int(match["events"]) / wall,
        "time_ratio": float(match["hours"]) * 3600 / wall,
    }


def run(ctx: Context) -> Row:
    seeds, runs = (6, 1) if ctx.quick else (300, 3)
    blocks = [run_block(seeds) for _ in range(runs)]
    per_min = statistics.median(b["seeds_per_min"] for b in blocks)
    events = statistics.median(b["events_per_s"] for b in blocks)
    ratio = statistics.median(b["time_ratio"] for b in blocks)
    row = Row(
        bench="B8",
        title="simulator",
        unit="seeds/min",
        figure=per_min,
        target=(
            f">= {TARGET_SEEDS_PER_MINUTE:.0f} seeds/min,"
            f" simulated >= {TARGET_TIME_RATIO:.0f}x wall"
        ),
    )
    row.met = per_min >= TARGET_SEEDS_PER_MINUTE and ratio >= TARGET_TIME_RATIO
    row.notes.append(
        f"seeds 0..{seeds - 1} on one core (--jobs 1), median of {runs}: {per_min:.0f} seeds/min,"
        f" {events:.0f} events/s, simulated time x{ratio:.0f} the wall time"
        f" ({statistics.median(b['events'] for b in blocks) / seeds:.0f} events a seed)"
    )
    details: dict[str, Any] = {"runs": blocks, "events_per_s": events, "time_ratio": ratio}
    row.details = details
    return row
