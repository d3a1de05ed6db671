"""B2 create: creates/s and p50/p99 latency, 32 concurrent HTTP clients.

Ours: ``POST /api/tasks`` from 32 clients (``bench.createload``, its own
process) against ``twistd -n tasknet-site``, which runs the whole lifecycle
chain per create (reserve, read-only prepare GET, SUBMITTING, the one POST,
persist) against ``twistd -n tasknet-upstream`` on loopback.
Baseline: the same three write transactions per create (the site's own
``storage.create.reserve`` / ``begin_submit`` / ``persist_submitted`` on a
raw ``sqlite3`` connection with the site's PRAGMAs) plus one loopback POST to
the same upstream with ``http.client``, one create after another, no framework.

Both backends (``Context.backend``): the row ``B2`` on SQLite files, ``B2-pg``
on the run's throwaway PostgreSQL server (``synchronous_commit=on``), the
baseline then ``storage.db.connect`` + ``run_write`` on psycopg, one
committed transaction per step as on SQLite.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.b1_reports import row_id
from bench.harness import Context, Row, percentile
from bench.pg_baseline import cpu_delta
from bench.procs import REPO_ROOT, BenchError
from bench.profile import Recorder, format_summary
from bench.seed import seed_site
from bench.services import start_site, start_upstream

TARGET_RATIO = 0.5
TARGET_P99_MS = 50.0
CLIENTS = 32
SITE_GIDS = range(20_000_001, 20_100_000)
BASELINE_GIDS = range(30_000_001, 30_100_000)
PROFILE_GIDS = range(50_000_001, 50_100_000)


def run_baseline(db: str, upstream_url: str, user_id: int, gids: list[int]) -> dict[str, Any]:
    from tasknet.site.storage import create, usage
    from tasknet.site.storage.engine.database import connect, run_write

    connection = connect(db)
    parts = urlsplit(upstream_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    latencies = []
    started = time.perf_counter()
    try:
        for gid in gids:
            t0 = time.perf_counter()
            week = usage.iso_week()
            op = run_write(connection, create.reserve, gid, user_id, "", f"bench-{gid}", week)
            run_write(connection, create.begin_submit, gid, op, 1, f"gallery {gid}", week)
            conn.request("POST", f"/api/galleries/{gid}/archive", body=b"{}")
            response = conn.getresponse()
            answer = json.loads(response.read())
            if response.status != 200:
                raise BenchError(f"baseline POST for gid {gid}: HTTP {response.status}")
            run_write(
                connection,
                create.persist_submitted,
                gid,
                op,
                answer["archiveUrl"],
                int(answer["cost"]),
                week,
            )
            latencies.append((time.perf_counter() - t0) * 1000)
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
        connection.close()
    return {"rate": len(gids) / elapsed, "latencies": latencies}


def run_clients(site_url: str, token: str, gids: list[int], log: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.createload", f"--url={site_url}", f"--token={token}"]
    argv += [f"--clients={CLIENTS}", *map(str, gids)]
    with open(log, "wb") as stderr:
        done = subprocess.run(
            argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, timeout=900
        )
    if done.returncode != 0:
        raise BenchError(f"create load failed ({done.returncode}); see {log}")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def run(ctx: Context) -> Row:
    directory = ctx.scratch(row_id(ctx, "b2").lower())
    creates = 64 if ctx.quick else 2000
    pg = ctx.pg if ctx.on_postgres else None
    upstream = start_upstream(directory)
    try:
        base_db = ctx.database(directory, "baseline")
        base_seed = seed_site(base_db)
        # Half the baseline before the site, half after; the faster half
        # counts (fsync times drift on a shared disk; never flatter the site).
        half = max(1, creates // 2)
        base_before = run_baseline(
            base_db, upstream.base_url, base_seed.user_id, list(BASELINE_GIDS[:half])
        )

        site_db = ctx.database(directory, "site")
        seeded = seed_site(site_db)
        site = start_site(directory, site_db, upstream_url=upstream.base_url)
        try:
            cpu0 = site.proc.cpu_seconds()
            pg0 = pg.cpu_seconds() if pg is not None else {}
            ours = run_clients(
                site.http_url, seeded.token, list(SITE_GIDS[:creates]), directory / "createload.log"
            )
            site_cpu = (site.proc.cpu_seconds() - cpu0) / ours["seconds"]
            server_cpu = cpu_delta(pg0, pg.cpu_seconds()) / ours["seconds"] if pg else None
            profile_lines: list[str] = []
            if ctx.profile:
                # A second load on other gids, sampled: sampling slows the site,
                # so the measured run above is never the profiled one.
                seconds = 3.0 if ctx.quick else 8.0
                recorder = Recorder(site.proc.pid, seconds, directory / "b2-site.collapsed")
                run_clients(
                    site.http_url,
                    seeded.token,
                    list(PROFILE_GIDS[: creates * 2]),
                    directory / "createload-profile.log",
                )
                profile_lines = format_summary(recorder.finish(timeout=seconds + 60))
        finally:
            site.proc.stop()
        base_after = run_baseline(
            base_db, upstream.base_url, base_seed.user_id, list(BASELINE_GIDS[half : 2 * half])
        )
    finally:
        upstream.proc.stop()
    base = max(base_before, base_after, key=lambda b: float(b["rate"]))
    base_latencies = base_before["latencies"] + base_after["latencies"]
    if ours["failures"]:
        raise BenchError(
            f"{len(ours['failures'])} of {creates} creates failed, e.g. {ours['failures'][:3]}"
        )

    latencies = ours["latencies_ms"]
    rate = creates / ours["seconds"]
    raw = "raw PostgreSQL (psycopg, synchronous_commit=on)" if pg else "raw sqlite3"
    row = Row(
        bench=row_id(ctx, "B2"),
        title="create" + (" (PostgreSQL)" if pg else ""),
        unit="creates/s",
        figure=rate,
        baseline=base["rate"],
        baseline_label=(
            f"{raw}: reserve, begin_submit, persist_submitted transactions "
            "+ one loopback POST per create, sequential; faster of two halves, before "
            "and after the site"
        ),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        target=f">= {TARGET_RATIO}x, p99 < {TARGET_P99_MS:.0f} ms",
    )
    row.met = (row.ratio or 0) >= TARGET_RATIO and (row.p99_ms or 1e9) < TARGET_P99_MS
    server = f", PostgreSQL server {100 * server_cpu:.0f}%" if server_cpu is not None else ""
    row.notes.append(
        f"{creates} creates, {CLIENTS} concurrent clients; site CPU {100 * site_cpu:.0f}% of one "
        f"core{server}; baseline {base_before['rate']:.0f} before / "
        f"{base_after['rate']:.0f} after, p50/p99 {percentile(base_latencies, 50):.1f}/"
        f"{percentile(base_latencies, 99):.1f} ms per create"
    )
    row.notes.append(
        f"closed loop: {CLIENTS} clients / {rate:.0f} creates/s = "
        f"{1000 * CLIENTS / rate:.0f} ms mean latency (Little's law); p99 < "
        f"{TARGET_P99_MS:.0f} ms needs > {1000 * CLIENTS / TARGET_P99_MS:.0f} creates/s"
    )
    row.notes.extend(profile_lines)
    row.details = {
        "backend": ctx.backend,
        "creates": creates,
        "clients": CLIENTS,
        "site_cpu_fraction": site_cpu,
        "postgres_cpu_fraction": server_cpu,
        "baseline_before_rate": base_before["rate"],
        "baseline_after_rate": base_after["rate"],
        "baseline_p50_ms": percentile(base_latencies, 50),
        "baseline_p99_ms": percentile(base_latencies, 99),
        "profile": profile_lines,
    }
    return row
