"""B1 report apply: v2 reports/s end to end, N node connections over loopback.

Ours: ``twistd -n tasknet-site`` on a seeded SQLite file; N load-node
connections (``bench.loadnode``, in their own processes) each send snapshot
``TaskReport`` s of K tasks, one in flight, the next after the ACK.  A report
counts when its ACK (sent after the commit that carried it) arrives.
Baseline: the site's own ``storage.reports.apply_task_report`` on a raw
``sqlite3`` connection with the site's PRAGMAs (WAL, ``synchronous=FULL``), one
report per ``BEGIN IMMEDIATE … COMMIT``, no reactor, no network, on an
identically seeded file in the same directory: the same statements, paid one
fsync each.  Group commit is what lets the site beat it.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from bench import plan
from bench.harness import Context, Row, percentile
from bench.load import LoadFleet
from bench.loadnode import write_tasks
from bench.procs import BenchError
from bench.profile import Recorder, format_summary
from bench.seed import seed_site
from bench.services import start_site
from bench.sqlite_baseline import connect, journal_mode_of, synchronous_of
from tasknet.process import free_port

TARGET_RATIO = 1.5
# Of each snapshot's K tasks, this many are downloading (progress moves every
# snapshot, so each is a visible change with its notification); the others
# wait at 0, as on a node with the default 4 download slots.
CHANGING = 4


def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"nodes": 4, "entries": 5, "warmup": 0.3, "window": 1.0, "processes": 1}
    return {"nodes": 50, "entries": 20, "warmup": 2.0, "window": 10.0, "processes": 2}


def node_tasks(
    db_ops: dict[int, str], nodes: int, entries: int
) -> dict[int, list[tuple[int, str]]]:
    return {i: [(gid, db_ops[gid]) for gid in plan.node_gids(i, entries)] for i in range(nodes)}


class RawApplier:
    """The baseline: the site's ``apply_task_report`` on a raw connection,
    round-robin over the nodes, one report per transaction.

    ``fsync=False`` (``synchronous=OFF``) is not a baseline but a ceiling: the
    same statements with no commit cost at all, i.e. the most any group commit
    could reach with one writer thread doing these statements."""

    def __init__(
        self, db: Path, tasks: dict[int, list[tuple[int, str]]], *, fsync: bool = True
    ) -> None:
        self.tasks = tasks
        self.connection = connect(db)
        if not fsync:
            self.connection.execute("PRAGMA synchronous=OFF")
        self.synchronous = synchronous_of(self.connection)
        self.journal_mode = journal_mode_of(self.connection)
        self.seq = 0
        self.revision = int(time.time() * 1000)

    def run(self, seconds: float) -> dict[str, Any]:
        """Apply reports for ``seconds``; their rate and per-transaction latencies."""
        from tasknet.protocol.messages import ACK_APPLIED, TaskReport
        from tasknet.site.storage.db import run_write
        from tasknet.site.storage.reports import apply_task_report

        latencies: list[float] = []
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            for index, held in self.tasks.items():
                self.seq += 1
                self.revision += 1
                report = TaskReport(
                    report_id=f"baseline-{self.seq}",
                    revision=self.revision,
                    gallery_tasks=plan.snapshot_entries([g for g, _ in held], self.seq, CHANGING),
                    operation_ids=dict(held),
                    deleted=(),
                )
                t0 = time.perf_counter()
                outcome = run_write(self.connection, apply_task_report, plan.node_id(index), report)
                latencies.append((time.perf_counter() - t0) * 1000)
                if outcome.result != ACK_APPLIED or len(outcome.applied) != len(held):
                    raise BenchError(f"baseline report not applied: {outcome}")
        elapsed = time.perf_counter() - started
        return {"rate": len(latencies) / elapsed, "latencies": latencies}

    def close(self) -> None:
        self.connection.close()


def check_applied(db: Path, tasks: dict[int, list[tuple[int, str]]]) -> int:
    """Every seeded task must have had a report applied (its last_revision set)."""
    from tasknet.site.storage.rows import operation_row

    connection = sqlite3.connect(db)
    connection.row_factory = sqlite3.Row
    try:
        cursor = connection.cursor()
        missing = [
            gid
            for held in tasks.values()
            for gid, _ in held
            if (row := operation_row(cursor, gid)) is None or row["last_revision"] is None
        ]
    finally:
        connection.close()
    if missing:
        raise BenchError(
            f"{len(missing)} seeded tasks never got a report applied, e.g. {missing[:5]}"
        )
    return sum(len(h) for h in tasks.values())


def _run_site(
    ctx: Context,
    directory: Path,
    nodes: int,
    entries: int,
    assigned: dict[int, range],
    size: dict[str, Any],
) -> dict[str, Any]:
    """The site under the load nodes: ACKed reports in the window, latencies, CPU."""
    site_db = directory / "site.sqlite"
    seeded = seed_site(site_db, node_count=nodes, assigned=assigned)
    tasks = node_tasks(seeded.operation_ids, nodes, entries)
    tasks_file = directory / "tasks.json"
    write_tasks(str(tasks_file), tasks)

    site = start_site(directory, site_db, upstream_url=f"http://127.0.0.1:{free_port()}")
    profile_lines: list[str] = []
    try:
        with LoadFleet(
            directory,
            port=site.nodes_port,
            nodes=nodes,
            processes=size["processes"],
            mode="reports",
            tasks=tasks_file,
            changing=min(CHANGING, entries),
        ) as fleet:
            ready = fleet.wait_ready(60)
            logged_in = sum(r["logged_in"] for r in ready)
            if logged_in != nodes:
                raise BenchError(f"only {logged_in} of {nodes} nodes logged in: {ready}")
            fleet.broadcast("go")
            time.sleep(size["warmup"])
            cpu0 = site.proc.cpu_seconds()
            fleet.broadcast("mark")
            time.sleep(size["window"])
            fleet.broadcast("snapshot")
            site_cpu = (site.proc.cpu_seconds() - cpu0) / size["window"]
            windows = [p.wait_event("window", 30) for p in fleet.processes]
            if ctx.profile:
                seconds = 5.0 if ctx.quick else 10.0
                recorder = Recorder(site.proc.pid, seconds, directory / "b1-site.collapsed")
                profile_lines = format_summary(recorder.finish(timeout=seconds + 60))
            results = fleet.results()
        memory = site.proc.memory()
    finally:
        site.proc.stop()
    applied_tasks = check_applied(site_db, tasks)

    acked = sum(w["applied"] + w["duplicate"] for w in windows)
    window = sum(w["window_s"] for w in windows) / len(windows)
    latencies = [x for w in windows for x in w["latencies_ms"]]
    problems = [
        f"{r['dropped']} dropped, errors {r['errors']}"
        for r in results
        if r["dropped"] or r["errors"]
    ]
    if problems:
        raise BenchError(f"load nodes saw failures: {problems}")

    return {
        "rate": acked / window,
        "acked": acked,
        "duplicates": sum(w["duplicate"] for w in windows),
        "latencies": latencies,
        "site_cpu": site_cpu,
        "rss": memory.get("VmHWM"),
        "tasks_checked": applied_tasks,
        "profile": profile_lines,
    }


def run(ctx: Context) -> Row:
    size = _sizes(ctx.quick)
    nodes, entries = size["nodes"], size["entries"]
    directory = ctx.scratch("b1")
    assigned = {i: plan.node_gids(i, entries) for i in range(nodes)}

    # The baseline runs half before and half after the site, and the faster
    # half counts: fsync times on a shared disk drift within a run, and the
    # ratio should not flatter the site when they do.
    base_db = directory / "baseline.sqlite"
    base_seed = seed_site(base_db, node_count=nodes, assigned=assigned)
    baseline = RawApplier(base_db, node_tasks(base_seed.operation_ids, nodes, entries))
    ceiling_db = directory / "ceiling.sqlite"
    ceiling_seed = seed_site(ceiling_db, node_count=nodes, assigned=assigned)
    ceiling_applier = RawApplier(
        ceiling_db, node_tasks(ceiling_seed.operation_ids, nodes, entries), fsync=False
    )
    try:
        base_before = baseline.run(size["window"] / 2)
        ceiling = ceiling_applier.run(size["window"] / 2)
        ours = _run_site(ctx, directory, nodes, entries, assigned, size)
        base_after = baseline.run(size["window"] / 2)
    finally:
        baseline.close()
        ceiling_applier.close()
    base = max(base_before, base_after, key=lambda b: float(b["rate"]))
    base_latencies = base_before["latencies"] + base_after["latencies"]

    row = Row(
        bench="B1",
        title="report apply",
        unit="reports/s",
        figure=ours["rate"],
        baseline=base["rate"],
        baseline_label=(
            "raw sqlite3, storage.reports.apply_task_report, one report per transaction, "
            f"synchronous={baseline.synchronous}, journal={baseline.journal_mode}; "
            "faster of two half-windows, before and after the site"
        ),
        p50_ms=percentile(ours["latencies"], 50),
        p99_ms=percentile(ours["latencies"], 99),
        target=f">= {TARGET_RATIO}x at 50 nodes",
    )
    row.met = (row.ratio or 0) >= TARGET_RATIO and nodes >= 50
    row.notes.append(
        f"{nodes} nodes x {entries} entries ({min(CHANGING, entries)} changing per snapshot), "
        f"{size['processes']} load process(es), {size['window']:g}s window after "
        f"{size['warmup']:g}s warm-up; site CPU {100 * ours['site_cpu']:.0f}% of one core; "
        f"baseline {base_before['rate']:.0f} before / {base_after['rate']:.0f} after, p50/p99 "
        f"{percentile(base_latencies, 50):.1f}/{percentile(base_latencies, 99):.1f} ms per "
        "transaction"
    )
    row.notes.append(
        f"ceiling: the same statements with synchronous=OFF (no commit cost) reach "
        f"{ceiling['rate']:.0f} reports/s = {ceiling['rate'] / base['rate']:.2f}x the baseline: "
        "no group commit in one writer thread can pass that"
    )
    row.notes.extend(ours["profile"])
    row.details = {
        **size,
        "changing": min(CHANGING, entries),
        "acked": ours["acked"],
        "duplicates": ours["duplicates"],
        "site_cpu_fraction": ours["site_cpu"],
        "site_peak_rss_bytes": ours["rss"],
        "tasks_checked": ours["tasks_checked"],
        "baseline_before_rate": base_before["rate"],
        "baseline_after_rate": base_after["rate"],
        "ceiling_no_fsync_rate": ceiling["rate"],
        "baseline_p50_ms": percentile(base_latencies, 50),
        "baseline_p99_ms": percentile(base_latencies, 99),
        "profile": ours["profile"],
    }
    return row
