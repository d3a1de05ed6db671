"""B5 connections: 10,000 concurrent node connections logged in and heartbeating.

``twistd -n tasknet-site`` with 10,000 node keys; load nodes (four processes
of 2,500 connections) log in with Hello + Login and send a Heartbeat every
15 s, as real nodes do.  Every child the bench starts has its soft
RLIMIT_NOFILE raised to the hard limit (``bench.procs``: one fd per
connection on both sides).  Then, for a window longer than the site's 45 s
idle timeout, we read the CPU time of the site and of each load process
from ``/proc/<pid>/stat``: the figure is site CPU in % of one core while
idle.  Met when it is under 20 %, the site's RSS under 1 GiB, every
connection logged in, the site lists all of them (``/api/admin/nodes``) at
the end of the window and none was dropped.
"""

from __future__ import annotations

import os
import time

from bench.harness import Context, Row
from bench.load import LoadFleet
from bench.procs import BenchError
from bench.seed import seed_site
from bench.services import http_json, start_site
from tasknet.process import free_port

TARGET_CPU_PERCENT = 20.0
TARGET_RSS_MIB = 1024.0
#: A diagnostic: the number of connections of a full-size run (default 10,000).
NODES_ENV = "TASKNET_BENCH_B5_NODES"


def run(ctx: Context) -> Row:
    if ctx.quick:
        nodes, processes, window, heartbeat = 40, 2, 2.0, 0.5
    else:
        # 50 s: longer than the site's 45 s idle timeout, so a connection whose
        # heartbeats the site did not count would be dropped inside the window.
        nodes, processes, window, heartbeat = 10_000, 4, 50.0, 15.0
        nodes = int(os.environ.get(NODES_ENV) or 0) or nodes
    directory = ctx.scratch("b5")
    db = directory / "site.sqlite"
    seeded = seed_site(db, node_count=nodes)
    site = start_site(directory, db, upstream_url=f"http://127.0.0.1:{free_port()}")
    try:
        soft, hard = site.proc.open_files_limit()
        if soft < nodes + 64:
            raise BenchError(
                f"the site's open-files limit is {soft} (hard {hard}): too low for {nodes} "
                "connections; raise the hard limit (ulimit -Hn) before starting the bench"
            )
        with LoadFleet(
            directory,
            port=site.nodes_port,
            nodes=nodes,
            processes=processes,
            mode="idle",
            heartbeat=heartbeat,
        ) as fleet:
            loads = {p.proc.name: p.proc for p in fleet.processes}
            procs = {"site": site.proc, **loads}
            login_cpu0 = {name: proc.cpu_seconds() for name, proc in procs.items()}
            login_started = time.monotonic()
            ready = fleet.wait_ready(600)
            login_seconds = time.monotonic() - login_started
            login_cpu = {
                name: (proc.cpu_seconds() - login_cpu0[name]) / login_seconds
                for name, proc in procs.items()
            }
            logged_in = sum(r["logged_in"] for r in ready)
            if logged_in != nodes:
                failures = [f for r in ready for f in r["login_failures"] + r["connect_failures"]]
                raise BenchError(
                    f"only {logged_in} of {nodes} nodes logged in, e.g. {failures[:5]}"
                )
            time.sleep(1.0)  # let the last logins' re-dispatch and bookkeeping settle
            cpu0 = {name: proc.cpu_seconds() for name, proc in procs.items()}
            t0 = time.monotonic()
            time.sleep(window)
            elapsed = time.monotonic() - t0
            cpu = {
                name: (proc.cpu_seconds() - cpu0[name]) / elapsed for name, proc in procs.items()
            }
            listed_started = time.monotonic()
            listed = http_json("GET", f"{site.http_url}/api/admin/nodes", token=seeded.token)
            listed_ms = (time.monotonic() - listed_started) * 1000
            fds = site.proc.open_fds()
            memory = site.proc.memory()
            load_rss = {name: proc.memory().get("VmRSS", 0) for name, proc in loads.items()}
            results = fleet.results()
    finally:
        site.proc.stop()

    rss_mib = memory.get("VmRSS", 0) / 2**20
    peak_mib = memory.get("VmHWM", 0) / 2**20
    dropped = sum(r["dropped"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    # Connected ones: the list keeps recently seen nodes too ("connected": false).
    site_sees = sum(1 for n in listed.get("nodes", []) if n.get("connected", True))
    row = Row(
        bench="B5",
        title="connections",
        unit="% CPU",
        figure=100 * cpu["site"],
        target=f"CPU < {TARGET_CPU_PERCENT:.0f}%, RSS < 1 GiB, no drops",
    )
    row.met = (
        row.figure is not None
        and row.figure < TARGET_CPU_PERCENT
        and peak_mib < TARGET_RSS_MIB
        and dropped == 0
        and site_sees == nodes
        and not errors
    )

    def shares(values: dict[str, float]) -> str:
        return ", ".join(f"{name} {100 * value:.1f}%" for name, value in values.items())

    row.notes.append(
        f"{nodes} v2 connections from {processes} load processes logged in in "
        f"{login_seconds:.1f}s, heartbeat every {heartbeat:g}s; site CPU over {window:g}s idle; "
        f"dropped {dropped}; site lists {site_sees} (/api/admin/nodes in {listed_ms:.0f} ms); "
        f"site fds {fds} (limit {soft}); site RSS {rss_mib:.0f} MiB (peak {peak_mib:.0f} MiB)"
    )
    row.notes.append(f"CPU of one core, idle window: {shares(cpu)}")
    row.notes.append(f"CPU of one core, during the logins: {shares(login_cpu)}")
    if errors:
        row.notes.append(f"errors seen by load nodes: {errors[:3]}")
    row.details = {
        "nodes": nodes,
        "processes": processes,
        "window_s": window,
        "heartbeat_s": heartbeat,
        "login_seconds": login_seconds,
        "dropped": dropped,
        "site_listed": site_sees,
        "admin_nodes_ms": listed_ms,
        "site_fds": fds,
        "site_fd_limit": [soft, hard],
        "site_rss_bytes": memory.get("VmRSS"),
        "site_peak_rss_bytes": memory.get("VmHWM"),
        "load_rss_bytes": load_rss,
        "cpu_fraction_by_process": cpu,
        "login_cpu_fraction_by_process": login_cpu,
    }
    return row
