"""B2 create: (a) open loop at half the baseline's rate, (b) closed loop, 32 clients.

Both against ``twistd -n tasknet-site``, which runs the whole lifecycle
chain per create (reserve, read-only prepare GET, SUBMITTING, the one POST,
persist) against ``twistd -n tasknet-upstream`` on loopback; the clients
are ``bench.createload`` in their own process.

(a) ``B2a``: creates arrive at a fixed rate, half of the same run's
raw-baseline throughput (its first half, measured before the site starts),
each due at its own time whatever happened to the others (open loop, as
wrk2 does it); latency from each request's *intended* start, so a stall
counts for every create that should have started during it (no
coordinated omission).  p50/p99/p99.9 and the rate actually reached.
(b) ``B2b``: creates/s with 32 concurrent closed-loop clients, as before
(its p99 is a queueing figure: Little's law).

Baseline: the same three write transactions per create (the site's own
``storage.create.reserve`` / ``begin_submit`` / ``persist_submitted`` on a
raw connection with the site's PRAGMAs) plus one loopback POST to the same
upstream with ``http.client``, one create after another, no framework.

Both backends (``Context.backend``): rows ``B2a``/``B2b`` on SQLite files,
``B2a-pg``/``B2b-pg`` on the run's throwaway PostgreSQL server
(``synchronous_commit=on``), the baseline then the engine's ``connect`` +
``run_write`` on psycopg, one committed transaction per step as on SQLite.
With ``--profile`` the site is sampled with py-spy under a second open-loop
run at the same rate (never the measured one).
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

from bench.b1_reports import backend_title, row_id
from bench.harness import Context, Row, percentile
from bench.pg_baseline import cpu_delta
from bench.procs import REPO_ROOT, BenchError
from bench.profile import Recorder, format_summary
from bench.seed import seed_site
from bench.services import start_site, start_upstream

TARGET_RATIO = 0.5
TARGET_P99_MS = 50.0
TARGET_P99_MS_PG = 100.0
#: The open loop's arrival rate, as a share of the baseline's throughput.
OPEN_LOOP_SHARE = 0.5
#: "At the full arrival rate": the open loop must reach this share of it.
RATE_REACHED = 0.95
CLIENTS = 32
SITE_GIDS = range(20_000_001, 20_100_000)
OPEN_GIDS = range(21_000_001, 21_500_000)
OPEN_PROFILE_GIDS = range(22_000_001, 22_500_000)
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


def run_clients(
    site_url: str,
    token: str,
    gids: list[int],
    log: Path,
    *,
    rate: float = 0.0,
    warmup: int = 0,
) -> dict[str, Any]:
    """``bench.createload`` over ``gids``: closed loop (``CLIENTS`` clients),
    or open loop at ``rate`` creates/s when ``rate`` is set."""
    argv = [sys.executable, "-m", "bench.createload", f"--url={site_url}", f"--token={token}"]
    if rate:
        argv += [f"--rate={rate}", f"--warmup={warmup}"]
    else:
        argv += [f"--clients={CLIENTS}"]
    argv += [*map(str, gids)]
    with open(log, "wb") as stderr:
        done = subprocess.run(
            argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, timeout=900
        )
    if done.returncode != 0:
        raise BenchError(f"create load failed ({done.returncode}); see {log}")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def _sizes(quick: bool) -> dict[str, float]:
    """Closed-loop creates, the open loop's measured seconds and warm-up."""
    if quick:
        return {"creates": 64, "open_seconds": 1.0, "open_warmup": 0.25, "profile_seconds": 3.0}
    return {"creates": 2000, "open_seconds": 15.0, "open_warmup": 1.0, "profile_seconds": 8.0}


def _open_loop(
    site_url: str, token: str, gids: range, rate: float, seconds: float, warmup_s: float, log: Path
) -> dict[str, Any]:
    warmup = round(rate * warmup_s)
    count = warmup + max(1, round(rate * seconds))
    return run_clients(site_url, token, list(gids[:count]), log, rate=rate, warmup=warmup)


def run(ctx: Context) -> list[Row]:
    directory = ctx.scratch(row_id(ctx, "b2").lower())
    size = _sizes(ctx.quick)
    creates = int(size["creates"])
    pg = ctx.postgres if ctx.on_postgres else None
    upstream = start_upstream(directory)
    try:
        base_db = ctx.database(directory, "baseline")
        base_seed = seed_site(base_db)
        # Half the baseline before the site, half after; the faster half
        # counts for the closed loop's ratio (fsync times drift on a shared
        # disk; never flatter the site).  The open loop's rate is set from
        # the half before: it must be known before the site runs.
        half = max(1, creates // 2)
        base_before = run_baseline(
            base_db, upstream.base_url, base_seed.user_id, list(BASELINE_GIDS[:half])
        )
        rate = round(OPEN_LOOP_SHARE * base_before["rate"], 1)

        site_db = ctx.database(directory, "site")
        seeded = seed_site(site_db)
        site = start_site(directory, site_db, upstream_url=upstream.base_url)
        try:
            cpu0 = site.proc.cpu_seconds()
            pg0 = pg.cpu_seconds() if pg is not None else {}
            t0 = time.monotonic()
            opened = _open_loop(
                site.http_url,
                seeded.token,
                OPEN_GIDS,
                rate,
                size["open_seconds"],
                size["open_warmup"],
                directory / "createload-open.log",
            )
            elapsed = time.monotonic() - t0
            open_cpu = (site.proc.cpu_seconds() - cpu0) / elapsed
            open_server = cpu_delta(pg0, pg.cpu_seconds()) / elapsed if pg else None

            cpu0 = site.proc.cpu_seconds()
            pg0 = pg.cpu_seconds() if pg is not None else {}
            ours = run_clients(
                site.http_url, seeded.token, list(SITE_GIDS[:creates]), directory / "createload.log"
            )
            site_cpu = (site.proc.cpu_seconds() - cpu0) / ours["seconds"]
            server_cpu = cpu_delta(pg0, pg.cpu_seconds()) / ours["seconds"] if pg else None
            profile_lines: list[str] = []
            if ctx.profile:
                # A second open loop on other gids, sampled: sampling slows
                # the site, so the measured run above is never the profiled one.
                seconds = size["profile_seconds"]
                recorder = Recorder(site.proc.pid, seconds, directory / "b2-site.collapsed")
                _open_loop(
                    site.http_url,
                    seeded.token,
                    OPEN_PROFILE_GIDS,
                    rate,
                    seconds + 1.0,
                    0.0,
                    directory / "createload-profile.log",
                )
                profile_lines = format_summary(recorder.finish(timeout=seconds + 60))
            rss = site.proc.memory().get("VmHWM")
        finally:
            site.proc.stop()
        base_after = run_baseline(
            base_db, upstream.base_url, base_seed.user_id, list(BASELINE_GIDS[half : 2 * half])
        )
    finally:
        upstream.proc.stop()
    base = max(base_before, base_after, key=lambda b: float(b["rate"]))
    base_latencies = base_before["latencies"] + base_after["latencies"]
    for name, result in (("open-loop", opened), ("closed-loop", ours)):
        if result["failures"]:
            raise BenchError(
                f"{len(result['failures'])} {name} creates failed, e.g. {result['failures'][:3]}"
            )
    raw = "raw PostgreSQL (psycopg, synchronous_commit=on)" if pg else "raw sqlite3"
    p99_target = TARGET_P99_MS_PG if pg else TARGET_P99_MS
    suffix = backend_title(ctx)
    base_note = (
        f"baseline {base_before['rate']:.0f} before / {base_after['rate']:.0f} after, "
        f"p50/p99 {percentile(base_latencies, 50):.1f}/{percentile(base_latencies, 99):.1f} ms "
        "per create"
    )

    # (a) the open loop
    lat = opened["latencies_ms"]
    measured = len(lat)
    reached = measured / opened["seconds"] if opened["seconds"] > 0 else 0.0
    open_row = Row(
        bench=row_id(ctx, "B2a"),
        title="create, open loop" + suffix,
        unit="creates/s",
        figure=reached,
        baseline=base["rate"],
        baseline_label=(
            f"{raw}: reserve, begin_submit, persist_submitted transactions + one loopback POST "
            f"per create, sequential; faster of two halves; arrival rate {OPEN_LOOP_SHARE} x the "
            f"half before the site = {rate:g}/s"
        ),
        p50_ms=percentile(lat, 50),
        p99_ms=percentile(lat, 99),
        target=f"p99 < {p99_target:.0f} ms at {OPEN_LOOP_SHARE}x baseline rate",
    )
    open_row.met = (open_row.p99_ms or 1e9) < p99_target and reached >= RATE_REACHED * rate
    p999 = percentile(lat, 99.9)
    open_row.notes.append(
        f"open loop: {measured} creates due at {rate:g}/s over {opened['intended_seconds']:.1f}s "
        f"(after {opened['warmup']} warm-up ones), reached {reached:.0f}/s; latency from each "
        f"create's intended start p50/p99/p99.9 {open_row.p50_ms:.1f}/{open_row.p99_ms:.1f}/"
        f"{p999:.1f} ms, max {max(lat):.1f} ms; service time (from the actual send) p99 "
        f"{percentile(opened['service_ms'], 99):.1f} ms; generator lag p99 "
        f"{percentile(opened['lag_ms'], 99):.1f} ms; at most {opened['max_in_flight']} in "
        f"flight; site CPU {100 * open_cpu:.0f}% of one core"
        + (f", PostgreSQL server {100 * open_server:.0f}%" if open_server is not None else "")
    )
    open_row.notes.append(base_note)
    open_row.notes.extend(profile_lines)
    open_row.details = {
        "backend": ctx.backend,
        "arrival_rate": rate,
        "rate_reached": reached,
        "creates_measured": measured,
        "warmup": opened["warmup"],
        "p999_ms": p999,
        "max_ms": max(lat),
        "service_p50_ms": percentile(opened["service_ms"], 50),
        "service_p99_ms": percentile(opened["service_ms"], 99),
        "generator_lag_p99_ms": percentile(opened["lag_ms"], 99),
        "max_in_flight": opened["max_in_flight"],
        "site_cpu_fraction": open_cpu,
        "postgres_cpu_fraction": open_server,
        "site_peak_rss_bytes": rss,
        "baseline_before_rate": base_before["rate"],
        "baseline_after_rate": base_after["rate"],
        "profile": profile_lines,
    }

    # (b) the closed loop
    latencies = ours["latencies_ms"]
    closed_rate = creates / ours["seconds"]
    closed = Row(
        bench=row_id(ctx, "B2b"),
        title="create, closed loop" + suffix,
        unit="creates/s",
        figure=closed_rate,
        baseline=base["rate"],
        baseline_label=(
            f"{raw}: the same transactions + POST per create, sequential; faster of two "
            "halves, before and after the site"
        ),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        target=f">= {TARGET_RATIO}x",
    )
    closed.met = (closed.ratio or 0) >= TARGET_RATIO
    server = f", PostgreSQL server {100 * server_cpu:.0f}%" if server_cpu is not None else ""
    closed.notes.append(
        f"{creates} creates, {CLIENTS} concurrent clients; site CPU {100 * site_cpu:.0f}% of one "
        f"core{server}; {base_note}"
    )
    closed.notes.append(
        f"closed loop: {CLIENTS} clients / {closed_rate:.0f} creates/s = "
        f"{1000 * CLIENTS / closed_rate:.0f} ms mean latency (Little's law): a queueing "
        "figure; the open loop (B2a) is the latency one"
    )
    closed.details = {
        "backend": ctx.backend,
        "creates": creates,
        "clients": CLIENTS,
        "site_cpu_fraction": site_cpu,
        "postgres_cpu_fraction": server_cpu,
        "baseline_before_rate": base_before["rate"],
        "baseline_after_rate": base_after["rate"],
        "baseline_p50_ms": percentile(base_latencies, 50),
        "baseline_p99_ms": percentile(base_latencies, 99),
    }
    return [open_row, closed]
