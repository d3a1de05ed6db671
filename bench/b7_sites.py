"""B7 sites: B1's load against two site processes sharing one PostgreSQL database.

One database on the run's throwaway PostgreSQL server, seeded as B1's
(N node keys, K tasks each).  Site A (``--name bench-site-a``) runs
throughout; three measured windows of B1's load (``b1_reports.drive_reports``:
the same load processes, fresh connections each window):

1. one site: every load process to A;
2. two sites: site B (``--name bench-site-b``) started on the same
   database, half the load processes (so half the nodes) to each, checked
   in A's ``/api/admin/nodes``;
3. one site again: B stopped, every load process to A.

Figure: window 2's ACKed reports/s (both sites together).  Baseline: the
faster of windows 1 and 3 (the machine drifts within a run; the ratio must
never flatter two sites).  CPU is recorded per process in every window
(each site, the PostgreSQL server's processes together, each load
process), in fractions of one core: on this 2-core machine the sites, the
server and the load generators share two cores, so the same figures say
how far a larger machine could take it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.b1_reports import CHANGING, check_applied, drive_reports, failures_text, seed_reports
from bench.harness import POSTGRES, Context, Row, percentile
from bench.procs import BenchError
from bench.services import Site, http_json, start_site
from tasknet.process import free_port

TARGET_RATIO = 1.3
# Load processes in every window: two, so the two-site window can give
# each site one (the same load generators in all three windows).
PROCESSES = 2
SITE_A, SITE_B = "bench-site-a", "bench-site-b"


def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"nodes": 4, "entries": 5, "warmup": 0.3, "window": 1.0, "processes": PROCESSES}
    return {"nodes": 50, "entries": 20, "warmup": 2.0, "window": 10.0, "processes": PROCESSES}


def _start(directory: Path, target: str, name: str) -> Site:
    return start_site(
        directory,
        target,
        upstream_url=f"http://127.0.0.1:{free_port()}",
        extra_args=[f"--name={name}"],
        name=name,
    )


def _sites_of_nodes(site: Site, token: str) -> dict[str, int]:
    """How many connected nodes each site holds, as ``/api/admin/nodes`` says."""
    listed = http_json("GET", f"{site.http_url}/api/admin/nodes", token=token)
    return dict(Counter(n["site"] for n in listed["nodes"] if n.get("connected")))


def _cpu_text(cpu: dict[str, float]) -> str:
    parts = [f"{name} {100 * value:.0f}%" for name, value in cpu.items()]
    return ", ".join(parts) + f"; total {100 * sum(cpu.values()):.0f}%"


def run(ctx: Context) -> Row:
    if ctx.backend != POSTGRES:
        raise BenchError("B7 runs on PostgreSQL only")
    size = _sizes(ctx.quick)
    nodes, entries = size["nodes"], size["entries"]
    directory = ctx.scratch("b7")
    target = ctx.database(directory, "sites")
    seed = seed_reports(target, directory, nodes, entries)

    def window(name: str, sites: list[Site], check: _SplitCheck | None = None) -> dict[str, Any]:
        load_dir = directory / name
        load_dir.mkdir(exist_ok=True)
        return drive_reports(
            load_dir,
            ports=[s.nodes_port for s in sites],
            tasks_file=seed.tasks_file,
            size=size,
            entries=entries,
            watch={s.proc.name: s.proc for s in sites},
            pg=ctx.pg,
            during_load=check,
        )

    windows: dict[str, dict[str, Any]] = {}
    site_a = _start(directory, target, SITE_A)
    try:
        windows["one-before"] = window("one-before", [site_a])
        site_b = _start(directory, target, SITE_B)
        try:
            split = _SplitCheck(site_a, seed.token, nodes)
            windows["two"] = window("two", [site_a, site_b], split)
        finally:
            site_b.proc.stop()
        windows["one-after"] = window("one-after", [site_a])
    finally:
        site_a.proc.stop()
    applied = check_applied(target, seed.tasks)

    two = windows["two"]
    one = max(windows["one-before"], windows["one-after"], key=lambda w: float(w["rate"]))
    row = Row(
        bench="B7",
        title="sites",
        unit="reports/s",
        figure=two["rate"],
        baseline=one["rate"],
        baseline_label=(
            "B1's load against one site process on the same PostgreSQL database, same run; "
            "faster of the windows before and after the two-site one"
        ),
        p50_ms=percentile(two["latencies"], 50),
        p99_ms=percentile(two["latencies"], 99),
        target=f">= {TARGET_RATIO}x",
    )
    row.met = (row.ratio or 0) >= TARGET_RATIO and nodes >= 50
    row.notes.append(
        f"{nodes} nodes x {entries} entries ({min(CHANGING, entries)} changing per snapshot), "
        f"{PROCESSES} load processes (one per site with two sites), {size['window']:g}s windows "
        f"after {size['warmup']:g}s warm-up; one site {windows['one-before']['rate']:.0f} before "
        f"/ {windows['one-after']['rate']:.0f} after (p99 "
        f"{percentile(one['latencies'], 99) or 0:.1f} ms); nodes per site with two: "
        f"{split.seen}"
    )
    for name in ("one-before", "two", "one-after"):
        row.notes.append(f"CPU of one core, {name}: {_cpu_text(windows[name]['cpu'])}")
        if failures := failures_text(windows[name]):
            row.notes.append(f"{name}: {failures}")
    row.details = {
        **size,
        "changing": min(CHANGING, entries),
        "tasks_checked": applied,
        "nodes_per_site_two_sites": split.seen,
        "windows": {
            name: {
                "rate": w["rate"],
                "acked": w["acked"],
                "duplicates": w["duplicates"],
                "resent": w["resent"],
                "site_failures": w["site_failures"],
                "p50_ms": percentile(w["latencies"], 50),
                "p99_ms": percentile(w["latencies"], 99),
                "cpu_fraction_by_process": w["cpu"],
                "cpu_fraction_total": sum(w["cpu"].values()),
            }
            for name, w in windows.items()
        },
    }
    return row


class _SplitCheck:
    """After the two-site window (the load still on): every node is
    connected, half to each site, as site A's node list says."""

    def __init__(self, site: Site, token: str, nodes: int) -> None:
        self.site = site
        self.token = token
        self.nodes = nodes
        self.seen: dict[str, int] = {}

    def __call__(self) -> list[str]:
        deadline = time.monotonic() + 10
        while True:
            self.seen = _sites_of_nodes(self.site, self.token)
            wanted = {SITE_A: self.nodes - self.nodes // 2, SITE_B: self.nodes // 2}
            if self.seen == wanted:
                return []
            if time.monotonic() > deadline:
                raise BenchError(f"nodes per site {self.seen}, wanted {wanted}")
            time.sleep(0.2)
