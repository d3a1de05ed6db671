"""B5 connections: 1,000 concurrent node connections logged in and heartbeating.

``twistd -n tasknet-site`` with 1,000 node keys; load nodes (two processes of
500 connections, their fd limit raised with ``setrlimit``) log in with
Hello + Login and send a Heartbeat every 15 s, as real nodes do.  Then, for a
window longer than the site's 45 s idle timeout, we read the site's CPU time
from ``/proc/<pid>/stat``: the figure is site CPU in % of one core while idle.
Met when it is under 20 %, every connection logged in, the site lists all of
them (``/api/admin/nodes``) at the end of the window and none was dropped.
"""

from __future__ import annotations

import time

from bench.harness import Context, Row
from bench.load import LoadFleet
from bench.procs import BenchError
from bench.seed import seed_site
from bench.services import http_json, start_site
from tasknet.process import free_port

TARGET_CPU_PERCENT = 20.0


def run(ctx: Context) -> Row:
    if ctx.quick:
        nodes, processes, window, heartbeat = 40, 1, 2.0, 0.5
    else:
        # 50 s: longer than the site's 45 s idle timeout, so a connection whose
        # heartbeats the site did not count would be dropped inside the window.
        nodes, processes, window, heartbeat = 1000, 2, 50.0, 15.0
    directory = ctx.scratch("b5")
    db = directory / "site.sqlite"
    seeded = seed_site(db, node_count=nodes)
    site = start_site(directory, db, upstream_url=f"http://127.0.0.1:{free_port()}")
    try:
        soft, hard = site.proc.open_files_limit()
        if soft < nodes + 64:
            raise BenchError(
                f"the site's open-files limit is {soft} (hard {hard}): too low for {nodes} "
                "connections; raise it (ulimit -n) before starting the site"
            )
        with LoadFleet(
            directory,
            port=site.nodes_port,
            nodes=nodes,
            processes=processes,
            mode="idle",
            heartbeat=heartbeat,
        ) as fleet:
            login_started = time.monotonic()
            ready = fleet.wait_ready(120)
            login_seconds = time.monotonic() - login_started
            logged_in = sum(r["logged_in"] for r in ready)
            if logged_in != nodes:
                raise BenchError(f"only {logged_in} of {nodes} nodes logged in: {ready}")
            time.sleep(1.0)  # let the last logins' re-dispatch and bookkeeping settle
            cpu0, t0 = site.proc.cpu_seconds(), time.monotonic()
            time.sleep(window)
            cpu = (site.proc.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            listed = http_json("GET", f"{site.http_url}/api/admin/nodes", token=seeded.token)
            fds = site.proc.open_fds()
            memory = site.proc.memory()
            results = fleet.results()
    finally:
        site.proc.stop()

    rss_mib = memory.get("VmRSS", 0) / 2**20
    dropped = sum(r["dropped"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    # Connected ones: the list keeps recently seen nodes too ("connected": false).
    site_sees = sum(1 for n in listed.get("nodes", []) if n.get("connected", True))
    row = Row(
        bench="B5",
        title="connections",
        unit="% CPU",
        figure=100 * cpu,
        target=f"CPU < {TARGET_CPU_PERCENT:.0f}%, no drops",
    )
    row.met = (
        row.figure is not None
        and row.figure < TARGET_CPU_PERCENT
        and dropped == 0
        and site_sees == nodes
        and not errors
    )
    row.notes.append(
        f"{nodes} v2 connections logged in in {login_seconds:.1f}s, heartbeat every "
        f"{heartbeat:g}s; site CPU over {window:g}s idle; dropped {dropped}; site lists "
        f"{site_sees}; site fds {fds} (limit {soft}); site RSS {rss_mib:.0f} MiB"
    )
    if errors:
        row.notes.append(f"errors seen by load nodes: {errors[:3]}")
    row.details = {
        "nodes": nodes,
        "window_s": window,
        "heartbeat_s": heartbeat,
        "login_seconds": login_seconds,
        "dropped": dropped,
        "site_listed": site_sees,
        "site_fds": fds,
        "site_fd_limit": [soft, hard],
        "site_rss_bytes": memory.get("VmRSS"),
    }
    return row
