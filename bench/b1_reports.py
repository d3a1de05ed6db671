"""B1 report apply: v2 reports/s end to end, N node connections over loopback.

Ours: ``twistd -n tasknet-site`` on a seeded database; N load-node
connections (``bench.loadnode``, in their own processes) each send snapshot
``TaskReport`` s of K tasks, one in flight, the next after the ACK.  A report
counts when its ACK (sent after the commit that carried it) arrives.
Baseline: the site's own ``storage.reports.apply_task_report`` on a raw
connection (``storage.db.connect`` + ``run_write``), one report per
transaction, no reactor, no network, on an identically seeded database of
the same backend: the same statements, paid one commit each.  Group commit
is what lets the site beat it.

Both backends (``Context.backend``): SQLite (WAL, ``synchronous=FULL``,
files in the work directory; the row ``B1``) and PostgreSQL (the run's
throwaway server, ``synchronous_commit=on``; the row ``B1-pg``, with the
server's CPU next to the site's).  :func:`drive_reports` is also B7's load.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import plan
from bench.harness import POSTGRES_HA, Context, Row, percentile
from bench.load import LoadFleet
from bench.loadnode import write_tasks
from bench.pg_baseline import BenchPostgres, cpu_delta, synchronous_commit_of
from bench.procs import BenchError, Proc
from bench.profile import Recorder, format_summary
from bench.seed import seed_site
from bench.services import start_site
from bench.sqlite_baseline import journal_mode_of, synchronous_of
from tasknet.process import free_port

TARGET_RATIO = 1.5
TARGET_CEILING_SHARE = 0.9
# Of each snapshot's K tasks, this many are downloading (progress moves every
# snapshot, so each is a visible change with its notification); the others
# wait at 0, as on a node with the default 4 download slots.
CHANGING = 4
# What a site logs for a report whose transaction failed (no ACK: the node
# resends it after its ACK timeout), and for a write that lost every retry
# to serialization conflicts (PostgreSQL).
REPORT_FAILED = "not committed, not ACKed"
CONFLICTS_EXHAUSTED = "serialization conflict on every one of"


def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"nodes": 4, "entries": 5, "warmup": 0.3, "window": 1.0, "processes": 1}
    return {"nodes": 50, "entries": 20, "warmup": 2.0, "window": 10.0, "processes": 2}


def node_tasks(
    db_ops: dict[int, str], nodes: int, entries: int
) -> dict[int, list[tuple[int, str]]]:
    return {i: [(gid, db_ops[gid]) for gid in plan.node_gids(i, entries)] for i in range(nodes)}


def row_id(ctx: Context, bench: str) -> str:
    """``B1`` on SQLite, ``B1-pg`` on PostgreSQL, ``B1-pg-sync`` on a
    primary with a synchronous standby."""
    if ctx.backend == POSTGRES_HA:
        return f"{bench}-pg-sync"
    return f"{bench}-pg" if ctx.on_postgres else bench


def backend_title(ctx: Context) -> str:
    """The row title's suffix naming the database."""
    if ctx.backend == POSTGRES_HA:
        return " (PostgreSQL, synchronous standby)"
    return " (PostgreSQL)" if ctx.on_postgres else ""


class RawApplier:
    """The baseline: the site's ``apply_task_report`` on a raw connection,
    round-robin over the nodes, one report per transaction.

    ``fsync=False`` (SQLite ``synchronous=OFF``, PostgreSQL
    ``synchronous_commit=off``) is not a baseline but a ceiling: the same
    statements with no commit cost at all, i.e. the most any group commit
    could reach with one writer thread doing these statements."""

    def __init__(
        self, target: str, tasks: dict[int, list[tuple[int, str]]], *, fsync: bool = True
    ) -> None:
        from tasknet.site.storage.engine.database import connect, is_postgres

        self.tasks = tasks
        self.connection = connect(target)
        if is_postgres(target):
            if not fsync:
                self.connection.execute("SET synchronous_commit = off")
            self.commit_setting = f"synchronous_commit={synchronous_commit_of(self.connection)}"
        else:
            if not fsync:
                self.connection.execute("PRAGMA synchronous=OFF")
            self.commit_setting = (
                f"synchronous={synchronous_of(self.connection)}, "  # type: ignore[arg-type]
                f"journal={journal_mode_of(self.connection)}"  # type: ignore[arg-type]
            )
        self.seq = 0
        self.revision = int(time.time() * 1000)

    def run(self, seconds: float) -> dict[str, Any]:
        """Apply reports for ``seconds``; their rate and per-transaction latencies."""
        from tasknet.protocol.messages import ACK_APPLIED, TaskReport
        from tasknet.site.storage.engine.database import run_write
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


def check_applied(target: str, tasks: dict[int, list[tuple[int, str]]]) -> int:
    """Every seeded task must have had a report applied (its last_revision set)."""
    from tasknet.site.storage.engine.database import Cursor, connect, run_read
    from tasknet.site.storage.views import operation_row

    def missing_gids(cursor: Cursor) -> list[int]:
        return [
            gid
            for held in tasks.values()
            for gid, _ in held
            if (row := operation_row(cursor, gid)) is None or row["last_revision"] is None
        ]

    connection = connect(target)
    try:
        missing = run_read(connection, missing_gids)
    finally:
        connection.close()
    if missing:
        raise BenchError(
            f"{len(missing)} seeded tasks never got a report applied, e.g. {missing[:5]}"
        )
    return sum(len(h) for h in tasks.values())


@dataclass
class ReportSeed:
    """A database seeded for the report load: each node's tasks, the file
    the load nodes read them from, and the (admin) bench user's token."""

    tasks: dict[int, list[tuple[int, str]]]
    tasks_file: Path
    token: str


def seed_reports(target: str, directory: Path, nodes: int, entries: int) -> ReportSeed:
    """Seed ``target`` with ``nodes`` node keys and ``entries`` tasks each."""
    assigned = {i: plan.node_gids(i, entries) for i in range(nodes)}
    seeded = seed_site(target, node_count=nodes, assigned=assigned)
    tasks = node_tasks(seeded.operation_ids, nodes, entries)
    tasks_file = directory / "tasks.json"
    write_tasks(str(tasks_file), tasks)
    return ReportSeed(tasks, tasks_file, seeded.token)


def drive_reports(
    directory: Path,
    *,
    ports: Sequence[int],
    tasks_file: Path,
    size: dict[str, Any],
    entries: int,
    watch: dict[str, Proc],
    pg: BenchPostgres | None = None,
    during_load: Callable[[], list[str]] | None = None,
) -> dict[str, Any]:
    """B1's load from ``size["processes"]`` load processes (process ``n`` to
    ``ports[n % len(ports)]``) over one measured window: ACKed reports/s,
    latencies, and CPU per process in fractions of one core (``watch``:
    the sites by name; the load processes; ``postgres``: the server's
    processes together).  ``during_load`` runs after the window while the
    load goes on (a profile); its lines come back as ``profile``."""
    nodes = size["nodes"]
    with LoadFleet(
        directory,
        ports=ports,
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
        logged0 = {name: _failures_logged(proc) for name, proc in watch.items()}
        fleet.broadcast("go")
        time.sleep(size["warmup"])
        loads = {p.proc.name: p.proc for p in fleet.processes}
        procs = {**watch, **loads}
        cpu0 = {name: proc.cpu_seconds() for name, proc in procs.items()}
        pg0 = pg.cpu_seconds() if pg is not None else {}
        t0 = time.monotonic()
        fleet.broadcast("mark")
        time.sleep(size["window"])
        fleet.broadcast("snapshot")
        elapsed = time.monotonic() - t0
        cpu = {name: (proc.cpu_seconds() - cpu0[name]) / elapsed for name, proc in procs.items()}
        if pg is not None:
            cpu["postgres"] = cpu_delta(pg0, pg.cpu_seconds()) / elapsed
        windows = [p.wait_event("window", 30) for p in fleet.processes]
        profile = during_load() if during_load is not None else []
        results = fleet.results()
    for proc in watch.values():
        if not proc.alive:
            raise proc.died("under the report load")

    problems = [
        f"{r['dropped']} dropped, errors {r['errors']}"
        for r in results
        if r["dropped"] or r["errors"]
    ]
    if problems:
        raise BenchError(f"load nodes saw failures: {problems}")
    acked = sum(w["applied"] + w["duplicate"] for w in windows)
    window = sum(w["window_s"] for w in windows) / len(windows)
    return {
        "rate": acked / window,
        "acked": acked,
        "duplicates": sum(w["duplicate"] for w in windows),
        "resent": sum(w.get("resent", 0) for w in windows),
        "site_failures": {
            name: {key: count - logged0[name][key] for key, count in _failures_logged(proc).items()}
            for name, proc in watch.items()
        },
        "latencies": [x for w in windows for x in w["latencies_ms"]],
        "cpu": cpu,
        "profile": profile,
    }


def _failures_logged(proc: Proc) -> dict[str, int]:
    """How often the site's log (so far) says a report failed and a write
    lost every retry to conflicts."""
    text = proc.log_text()
    return {
        "reports_failed": text.count(REPORT_FAILED),
        "conflicts_exhausted": text.count(CONFLICTS_EXHAUSTED),
    }


def failures_text(result: dict[str, Any]) -> str:
    """One note on the reports that failed under the load (warm-up and
    window) and the resends of the window, or "" when there were none."""
    failed = {
        name: counts
        for name, counts in result["site_failures"].items()
        if counts["reports_failed"] or counts["conflicts_exhausted"]
    }
    if not failed and not result["resent"]:
        return ""
    per_site = "; ".join(
        f"{name} logged {c['reports_failed']} failed report(s), {c['conflicts_exhausted']} "
        "write(s) out of conflict retries"
        for name, c in failed.items()
    )
    return (
        f"{result['resent']} report(s) resent in the window after no ACK in the node's ACK "
        f"timeout (the site failed their transaction){'; ' + per_site if per_site else ''}"
    )


def _run_site(
    ctx: Context, directory: Path, nodes: int, entries: int, size: dict[str, Any]
) -> dict[str, Any]:
    """The site under the load nodes: ACKed reports in the window, latencies, CPU."""
    target = ctx.database(directory, "site")
    seed = seed_reports(target, directory, nodes, entries)
    site = start_site(directory, target, upstream_url=f"http://127.0.0.1:{free_port()}")

    def profile() -> list[str]:
        seconds = 5.0 if ctx.quick else 10.0
        recorder = Recorder(site.proc.pid, seconds, directory / "b1-site.collapsed")
        return format_summary(recorder.finish(timeout=seconds + 60))

    try:
        ours = drive_reports(
            directory,
            ports=[site.nodes_port],
            tasks_file=seed.tasks_file,
            size=size,
            entries=entries,
            watch={"site": site.proc},
            pg=ctx.postgres if ctx.on_postgres else None,
            during_load=profile if ctx.profile else None,
        )
        ours["rss"] = site.proc.memory().get("VmHWM")
    finally:
        site.proc.stop()
    ours["tasks_checked"] = check_applied(target, seed.tasks)
    return ours


def _baseline(
    ctx: Context, directory: Path, name: str, nodes: int, entries: int, *, fsync: bool = True
) -> RawApplier:
    target = ctx.database(directory, name)
    assigned = {i: plan.node_gids(i, entries) for i in range(nodes)}
    seeded = seed_site(target, node_count=nodes, assigned=assigned)
    return RawApplier(target, node_tasks(seeded.operation_ids, nodes, entries), fsync=fsync)


def run(ctx: Context) -> Row:
    size = _sizes(ctx.quick)
    nodes, entries = size["nodes"], size["entries"]
    directory = ctx.scratch(row_id(ctx, "b1").lower())
    backend = "PostgreSQL (psycopg)" if ctx.on_postgres else "sqlite3"

    # The baseline runs half before and half after the site, and the faster
    # half counts: commit (fsync) times on a shared disk drift within a run,
    # and the ratio should not flatter the site when they do.
    baseline = _baseline(ctx, directory, "baseline", nodes, entries)
    ceiling_applier = _baseline(ctx, directory, "ceiling", nodes, entries, fsync=False)
    try:
        base_before = baseline.run(size["window"] / 2)
        ceiling = ceiling_applier.run(size["window"] / 2)
        ours = _run_site(ctx, directory, nodes, entries, size)
        base_after = baseline.run(size["window"] / 2)
    finally:
        baseline.close()
        ceiling_applier.close()
    base = max(base_before, base_after, key=lambda b: float(b["rate"]))
    base_latencies = base_before["latencies"] + base_after["latencies"]

    row = Row(
        bench=row_id(ctx, "B1"),
        title="report apply" + backend_title(ctx),
        unit="reports/s",
        figure=ours["rate"],
        baseline=base["rate"],
        baseline_label=(
            f"raw {backend}, storage.reports.apply_task_report, one report per transaction, "
            f"{baseline.commit_setting}; faster of two half-windows, before and after the site"
        ),
        p50_ms=percentile(ours["latencies"], 50),
        p99_ms=percentile(ours["latencies"], 99),
        target=f">= {TARGET_RATIO}x at 50 nodes, or >= {TARGET_CEILING_SHARE} of the ceiling",
    )
    # The ceiling: the baseline's statements with no commit cost, which no
    # group commit in one writer thread can pass; the site's share of it
    # says how much of what batching can win it has won.
    ceiling_ratio = ceiling["rate"] / base["rate"] if base["rate"] else None
    share = ours["rate"] / ceiling["rate"] if ceiling["rate"] else None
    if ceiling_ratio is not None and share is not None:
        row.ratio_note = f"(ceiling {ceiling_ratio:.2f}x; site at {100 * share:.0f}% of it)"
    row.met = nodes >= 50 and (
        (row.ratio or 0) >= TARGET_RATIO or (share or 0) >= TARGET_CEILING_SHARE
    )
    cpu = ours["cpu"]
    server_cpu = f", PostgreSQL server {100 * cpu['postgres']:.0f}%" if "postgres" in cpu else ""
    row.notes.append(
        f"{nodes} nodes x {entries} entries ({min(CHANGING, entries)} changing per snapshot), "
        f"{size['processes']} load process(es), {size['window']:g}s window after "
        f"{size['warmup']:g}s warm-up; site CPU {100 * cpu['site']:.0f}% of one core"
        f"{server_cpu}; baseline {base_before['rate']:.0f} before / {base_after['rate']:.0f} "
        f"after, p50/p99 {percentile(base_latencies, 50):.1f}/"
        f"{percentile(base_latencies, 99):.1f} ms per transaction"
    )
    off = "synchronous_commit=off" if ctx.on_postgres else "synchronous=OFF"
    row.notes.append(
        f"ceiling: the same statements with {off} (no commit cost) reach "
        f"{ceiling['rate']:.0f} reports/s = {ceiling['rate'] / base['rate']:.2f}x the baseline: "
        "no group commit in one writer thread can pass that"
    )
    if failures := failures_text(ours):
        row.notes.append(failures)
    row.notes.extend(ours["profile"])
    row.details = {
        **size,
        "backend": ctx.backend,
        "changing": min(CHANGING, entries),
        "acked": ours["acked"],
        "duplicates": ours["duplicates"],
        "resent": ours["resent"],
        "site_failures": ours["site_failures"],
        "site_cpu_fraction": cpu["site"],
        "cpu_fraction_by_process": cpu,
        "site_peak_rss_bytes": ours["rss"],
        "tasks_checked": ours["tasks_checked"],
        "baseline_before_rate": base_before["rate"],
        "baseline_after_rate": base_after["rate"],
        "baseline_commit_setting": baseline.commit_setting,
        "ceiling_no_fsync_rate": ceiling["rate"],
        "ceiling_ratio": ceiling_ratio,
        "share_of_ceiling": share,
        "baseline_p50_ms": percentile(base_latencies, 50),
        "baseline_p99_ms": percentile(base_latencies, 99),
        "profile": ours["profile"],
    }
    return row
