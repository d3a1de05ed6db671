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
from bench.procs import BenchError, free_port
from bench.profile import Recorder, format_summary
from bench.seed import seed_site
from bench.services import start_site
from bench.sqlite_baseline import connect, journal_mode_of, synchronous_of

TARGET_RATIO = 1.5


def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"nodes": 4, "entries": 5, "warmup": 0.3, "window": 1.0, "processes": 1}
    return {"nodes": 50, "entries": 20, "warmup": 2.0, "window": 10.0, "processes": 2}


def node_tasks(
    db_ops: dict[int, str], nodes: int, entries: int
) -> dict[int, list[tuple[int, str]]]:
    return {i: [(gid, db_ops[gid]) for gid in plan.node_gids(i, entries)] for i in range(nodes)}


def run_baseline(
    db: Path, tasks: dict[int, list[tuple[int, str]]], seconds: float, *, fsync: bool = True
) -> dict[str, Any]:
    """Round-robin over the nodes, one report per transaction, for ``seconds``.

    ``fsync=False`` (``synchronous=OFF``) is not a baseline but a ceiling: the
    same statements with no commit cost at all, i.e. the most any group commit
    could reach with one writer thread doing these statements."""
    from tasknet.protocol.messages import ACK_APPLIED, TaskEntry, TaskReport
    from tasknet.site.storage.db import run_write
    from tasknet.site.storage.reports import apply_task_report

    connection = connect(db)
    if not fsync:
        connection.execute("PRAGMA synchronous=OFF")
    facts = {"synchronous": synchronous_of(connection), "journal_mode": journal_mode_of(connection)}
    latencies: list[float] = []
    seq = 0
    revision = int(time.time() * 1000)
    started = time.perf_counter()
    deadline = started + seconds
    try:
        while time.perf_counter() < deadline:
            for index, held in tasks.items():
                seq += 1
                revision += 1
                progress = (seq % 1000) / 1000
                report = TaskReport(
                    report_id=f"baseline-{seq}",
                    revision=revision,
                    gallery_tasks=tuple(TaskEntry(g, 1, progress) for g, _ in held),
                    operation_ids=dict(held),
                    deleted=(),
                )
                t0 = time.perf_counter()
                outcome = run_write(connection, apply_task_report, plan.node_id(index), report)
                latencies.append((time.perf_counter() - t0) * 1000)
                if outcome.result != ACK_APPLIED or len(outcome.applied) != len(held):
                    raise BenchError(f"baseline report not applied: {outcome}")
        elapsed = time.perf_counter() - started
    finally:
        connection.close()
    return {
        "rate": len(latencies) / elapsed,
        "latencies": latencies,
        "reports": len(latencies),
        **facts,
    }


def check_applied(db: Path, tasks: dict[int, list[tuple[int, str]]]) -> int:
    """Every seeded task must have had a report applied (its last_revision set)."""
    from tasknet.site.storage.tasks import operation_row

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


def run(ctx: Context) -> Row:
    size = _sizes(ctx.quick)
    nodes, entries = size["nodes"], size["entries"]
    directory = ctx.scratch("b1")
    assigned = {i: plan.node_gids(i, entries) for i in range(nodes)}

    base_db = directory / "baseline.sqlite"
    base_seed = seed_site(base_db, node_count=nodes, assigned=assigned)
    base = run_baseline(
        base_db, node_tasks(base_seed.operation_ids, nodes, entries), size["window"]
    )
    ceiling_db = directory / "ceiling.sqlite"
    ceiling_seed = seed_site(ceiling_db, node_count=nodes, assigned=assigned)
    ceiling = run_baseline(
        ceiling_db,
        node_tasks(ceiling_seed.operation_ids, nodes, entries),
        size["window"] / 2,
        fsync=False,
    )

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

    row = Row(
        bench="B1",
        title="report apply",
        unit="reports/s",
        figure=acked / window,
        baseline=base["rate"],
        baseline_label=(
            "raw sqlite3, storage.reports.apply_task_report, one report per transaction, "
            f"synchronous={base['synchronous']}, journal={base['journal_mode']}"
        ),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        target=f">= {TARGET_RATIO}x at 50 nodes",
    )
    row.met = (row.ratio or 0) >= TARGET_RATIO and nodes >= 50
    row.notes.append(
        f"{nodes} nodes x {entries} entries, {size['processes']} load process(es), "
        f"{window:.1f}s window after {size['warmup']}s warm-up; site CPU {100 * site_cpu:.0f}% "
        f"of one core; baseline p50/p99 {percentile(base['latencies'], 50):.1f}/"
        f"{percentile(base['latencies'], 99):.1f} ms per transaction"
    )
    row.notes.append(
        f"ceiling: the same statements with synchronous=OFF (no commit cost) reach "
        f"{ceiling['rate']:.0f} reports/s = {ceiling['rate'] / base['rate']:.2f}x the baseline: "
        "no group commit in one writer thread can pass that"
    )
    if ctx.quick:
        row.notes.append("quick size: fewer than 50 nodes, target not judged")
    row.notes.extend(profile_lines)
    row.details = {
        **size,
        "acked": acked,
        "duplicates": sum(w["duplicate"] for w in windows),
        "site_cpu_fraction": site_cpu,
        "site_rss_bytes": memory.get("VmHWM"),
        "tasks_checked": applied_tasks,
        "baseline_reports": base["reports"],
        "ceiling_no_fsync_rate": ceiling["rate"],
        "baseline_p50_ms": percentile(base["latencies"], 50),
        "baseline_p99_ms": percentile(base["latencies"], 99),
        "profile": profile_lines,
    }
    return row
