"""B10 restart storm: 2,000 nodes reporting; the site is SIGKILLed and restarted.

``twistd -n tasknet-site`` on a SQLite file seeded as B1's (2,000 node keys,
five tasks each); load nodes (``bench.loadnode --reconnect``, two processes)
log in (paced, as setting the fleet up) and report: a snapshot of their five
tasks every ``REPORT_EVERY`` seconds, one in flight.  Then the site gets
SIGKILL (no shutdown code runs) and is started again at once, on the same
database and the same ports.  Every node reconnects the way the real node
does: Twisted's ``ClientService`` with the real node's retry policy
(``backoffPolicy(initialDelay=0.5, maxDelay=5.0)`` with its jitter, under
``tasknet.node.link.login_backoff``), its report in flight resent on the new
connection, and a fresh report applied after that.

The figure: seconds from the kill until every node has logged in again and
a report it sent after that login has been ACKed as applied (the site
ACKs after the commit).  Throughout, two probe threads of the bench ask
``GET /healthz`` and ``POST /api/tasks`` (a fresh gid each, against the
mock upstream) every ``PROBE_EVERY`` seconds; from the moment the restarted
site answers its first ``/healthz`` on, the worst answer time of each and
any probe that failed are the second part of the target.  Also recorded:
the site's downtime (kill to first ``/healthz``), every login refused or
``Goodbye`` a node got after the kill (by reason; a node that is refused
backs off and comes back, so none is lost), and the CPU of the site and of
each load process over the storm.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.b1_reports import seed_reports
from bench.harness import Context, Row, percentile
from bench.load import LoadFleet
from bench.procs import BenchError
from bench.profile import Recorder, format_summary
from bench.services import Site, spawn_site, start_upstream, wait_site
from tasknet.site.node_listener import NODES_BACKLOG

TARGET_SECONDS = 30.0
TARGET_ANSWER_MS = 1000.0
PROBE_EVERY = 0.15
PROBE_GIDS = range(60_000_001, 61_000_000)
#: A diagnostic: the node listener's listen backlog for both site runs
#: (default: that of the site's default endpoint, which is what is measured).
BACKLOG_ENV = "TASKNET_BENCH_B10_BACKLOG"
#: A diagnostic: the number of nodes of a full-size run (default 2,000).
NODES_ENV = "TASKNET_BENCH_B10_NODES"


def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "nodes": 20,
            "processes": 1,
            "entries": 2,
            "report_every": 0.5,
            "warmup": 1.0,
            "deadline": 60.0,
            "tail": 0.5,
            # The real policy's delays x0.2: a smoke run proves the path, not the figure.
            "backoff_scale": 0.2,
        }
    return {
        "nodes": int(os.environ.get(NODES_ENV) or 0) or 2000,
        "processes": 2,
        "entries": 5,
        "report_every": 5.0,
        "warmup": 10.0,
        "deadline": 180.0,
        "tail": 2.0,
        "backoff_scale": 1.0,
    }


@dataclass
class Probe:
    kind: str
    started: float  # unix time
    ms: float
    ok: bool
    detail: str = ""


@dataclass
class Prober:
    """``/healthz`` and a create, each every ``PROBE_EVERY`` s, in two threads."""

    host: str
    port: int
    token: str
    probes: list[Probe] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    _gids: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._gids = iter(PROBE_GIDS)
        for kind in ("healthz", "create"):
            thread = threading.Thread(target=self._loop, args=(kind,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> list[Probe]:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)
        return sorted(self.probes, key=lambda p: p.started)

    def _loop(self, kind: str) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            probe = self._one(kind)
            with self._lock:
                self.probes.append(probe)
            next_at += PROBE_EVERY
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stopping.wait(delay)
            else:
                next_at = time.monotonic()

    def _one(self, kind: str) -> Probe:
        started, t0 = time.time(), time.perf_counter()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            if kind == "healthz":
                connection.request("GET", "/healthz")
            else:
                with self._lock:
                    gid = next(self._gids)
                body = json.dumps({"gid": gid, "token": f"probe-{gid}"})
                headers = {
                    "Authorization": f"Bearer {self.token}",
                    "Content-Type": "application/json",
                }
                connection.request("POST", "/api/tasks", body=body, headers=headers)
            response = connection.getresponse()
            content = response.read()
            ok = response.status == (200 if kind == "healthz" else 201)
            text = content[:200].decode(errors="replace")
            detail = "" if ok else f"HTTP {response.status}: {text}"
        except OSError as e:
            ok, detail = False, f"{type(e).__name__}: {e}"
        finally:
            connection.close()
        return Probe(kind, started, (time.perf_counter() - t0) * 1000, ok, detail)


def listen_drops() -> dict[str, int]:
    """The kernel's ``TcpExt`` ListenOverflows/ListenDrops so far (a full
    accept queue: connections whose handshake the listener dropped)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=False))
            return {k: table[k] for k in ("ListenOverflows", "ListenDrops") if k in table}
    return {}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _storm_totals(fleet: LoadFleet) -> tuple[int, int]:
    relogged = reported = 0
    for p in fleet.processes:
        event = p.last("storm")
        if event is not None:
            relogged += int(event["relogged"])
            reported += int(event["reported"])
    return relogged, reported


def run(ctx: Context) -> Row:
    size = _sizes(ctx.quick)
    nodes, entries = size["nodes"], size["entries"]
    directory = ctx.scratch("b10")
    db = directory / "site.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    diagnostic_backlog = int(os.environ.get(BACKLOG_ENV) or 0) or None
    # The bench names its own --nodes endpoint: give it the site's default backlog.
    backlog = diagnostic_backlog or NODES_BACKLOG
    upstream = start_upstream(directory)
    restarted: Site | None = None
    profile_lines: list[str] = []
    try:
        seed = seed_reports(str(db), directory, nodes, entries)
        site = spawn_site(directory, db, upstream_url=upstream.base_url, nodes_backlog=backlog)
        wait_site(site)
        http_port = int(site.http_url.rsplit(":", 1)[1])
        try:
            with LoadFleet(
                directory,
                port=site.nodes_port,
                nodes=nodes,
                processes=size["processes"],
                mode="reports",
                tasks=seed.tasks_file,
                changing=min(4, entries),
                reconnect=True,
                report_every=size["report_every"],
                backoff_scale=size["backoff_scale"],
            ) as fleet:
                ready = fleet.wait_ready(600)
                logged_in = sum(r["logged_in"] for r in ready)
                if logged_in != nodes:
                    raise BenchError(f"only {logged_in} of {nodes} nodes logged in: {ready}")
                fleet.broadcast("go")
                fleet.broadcast("mark")
                time.sleep(size["warmup"])
                prober = Prober("127.0.0.1", http_port, seed.token)
                prober.start()
                time.sleep(min(1.0, size["warmup"]))
                fleet.broadcast("snapshot")
                before = [p.wait_event("window", 30) for p in fleet.processes]
                loads = {p.proc.name: p.proc for p in fleet.processes}
                load_cpu0 = {name: proc.cpu_seconds() for name, proc in loads.items()}

                drops0 = listen_drops()
                killed_at = time.time()
                site.proc.kill()
                fleet.broadcast(f"storm {killed_at}")
                restarted = spawn_site(
                    directory,
                    db,
                    upstream_url=upstream.base_url,
                    name="site-restarted",
                    http_port=http_port,
                    nodes_port=site.nodes_port,
                    nodes_backlog=backlog,
                )
                wait_site(restarted, timeout=120)
                recorder = None
                if ctx.profile:
                    seconds = 3.0 if ctx.quick else 10.0
                    recorder = Recorder(
                        restarted.proc.pid, seconds, directory / "b10-site.collapsed"
                    )
                deadline = time.monotonic() + size["deadline"]
                while _storm_totals(fleet)[1] < nodes:
                    if not restarted.proc.alive:
                        raise restarted.proc.died("the nodes reconnected")
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                time.sleep(size["tail"])
                if recorder is not None:
                    profile_lines = format_summary(recorder.finish(timeout=90))
                drops = {k: v - drops0.get(k, 0) for k, v in listen_drops().items()}
                elapsed = time.time() - killed_at
                probes = prober.stop()
                site_cpu = restarted.proc.cpu_seconds()
                cpu = {"site (restarted)": site_cpu / (time.time() - restarted.started_at)}
                cpu.update(
                    {
                        name: (proc.cpu_seconds() - load_cpu0[name]) / elapsed
                        for name, proc in loads.items()
                    }
                )
                rss = restarted.proc.memory()
                results = fleet.results()
        finally:
            site.proc.stop()
            if restarted is not None:
                restarted.proc.stop()
    finally:
        upstream.proc.stop()

    relogin = sorted(x for r in results for x in r["relogin_s"])
    reported = sorted(x for r in results for x in r["reported_s"])
    refusals: dict[str, int] = {}
    errors: dict[str, int] = {}
    for r in results:
        for reason, n in r["storm_refusals"].items():
            refusals[reason] = refusals.get(reason, 0) + n
        for code, n in r["storm_errors"].items():
            errors[code] = errors.get(code, 0) + n
    first_up = min(
        (p.started for p in probes if p.kind == "healthz" and p.ok and p.started > killed_at),
        default=None,
    )
    assert restarted is not None  # the storm ran
    up_at = first_up if first_up is not None else restarted.started_at
    after_up = [p for p in probes if p.started >= up_at]
    worst = {
        kind: max((p.ms for p in after_up if p.kind == kind), default=None)
        for kind in ("healthz", "create")
    }
    failed_after_up = [p for p in after_up if not p.ok]
    down_probes = [p for p in probes if killed_at <= p.started < up_at]
    before_kill = [p for p in probes if p.started < killed_at]
    everyone_back = len(reported) == nodes and len(relogin) == nodes
    figure = reported[-1] if everyone_back else None

    row = Row(
        bench="B10",
        title="restart storm",
        unit="s",
        figure=figure,
        # Per node: seconds from the kill to its first report applied, in ms.
        p50_ms=_ms(percentile(reported, 50)),
        p99_ms=_ms(percentile(reported, 99)),
        target=f"< {TARGET_SECONDS:.0f} s; /healthz, create < 1 s",
    )
    if figure is None:
        row.figure = elapsed
        row.notes.append(
            f"NOT every node came back: {len(relogin)} of {nodes} logged in again, "
            f"{len(reported)} reported, in {elapsed:.1f}s"
        )
    answers_ok = not failed_after_up and all(
        w is not None and w < TARGET_ANSWER_MS for w in worst.values()
    )
    row.met = everyone_back and (figure or 1e9) < TARGET_SECONDS and answers_ok
    example = ""
    if failed_after_up:
        example = f" (e.g. {failed_after_up[0].kind}: {failed_after_up[0].detail})"
    acked_before = sum(w["applied"] + w["duplicate"] for w in before)
    window_before = sum(w["window_s"] for w in before) / len(before)
    row.notes.append(
        f"{nodes} nodes x {entries} tasks, {size['processes']} load processes, a report every "
        f"{size['report_every']:g}s each ({acked_before / window_before:.0f} reports/s ACKed "
        f"before the kill); real node backoff x{size['backoff_scale']:g}"
    )
    row.notes.append(
        f"site down {up_at - killed_at:.1f}s (SIGKILL to the restarted site's first /healthz); "
        f"every node logged in again after {relogin[-1] if relogin else float('nan'):.1f}s "
        f"(p50 {percentile(relogin, 50) or float('nan'):.1f}s) and had a report applied after "
        f"{reported[-1] if reported else float('nan'):.1f}s (p50 "
        f"{percentile(reported, 50) or float('nan'):.1f}s)"
    )
    row.notes.append(
        f"probes every {PROBE_EVERY:g}s: after the site was up, worst /healthz "
        f"{worst['healthz'] or float('nan'):.0f} ms, worst create "
        f"{worst['create'] or float('nan'):.0f} ms, {len(failed_after_up)} failed of "
        f"{len(after_up)}"
        + example
        + f"; {len(down_probes)} while it was down; worst before the kill "
        f"{max((p.ms for p in before_kill), default=float('nan')):.0f} ms"
    )
    row.notes.append(
        "refused or sent away after the kill (each came back by its backoff): "
        + (", ".join(f"{reason} x{n}" for reason, n in sorted(refusals.items())) or "none")
        + (f"; Error frames: {errors}" if errors else "")
        + f"; kernel listen-queue overflows during the storm (machine-wide): {drops}"
        + f"; {sum(r['reconnect_attempts'] for r in results)} retries scheduled, "
        f"{sum(r['connects_failed'] for r in results)} after a failed connect, "
        f"{sum(r['login_timeouts'] for r in results)} connections closed by the node's login "
        "timeout"
    )
    row.notes.append(
        "CPU of one core from the kill on: "
        + ", ".join(f"{name} {100 * value:.0f}%" for name, value in cpu.items())
        + f"; restarted site's peak RSS {rss.get('VmHWM', 0) / 2**20:.0f} MiB"
    )
    if diagnostic_backlog:
        row.notes.append(f"diagnostic run: node listener backlog {backlog} (${BACKLOG_ENV})")
    if nodes != 2000 and not ctx.quick:
        row.notes.append(f"diagnostic run: {nodes} nodes (${NODES_ENV})")
    row.notes.extend(profile_lines)
    row.details = {
        **size,
        "nodes_backlog": backlog,
        "profile": profile_lines,
        "everyone_back": everyone_back,
        "relogin_s": {
            "p50": percentile(relogin, 50),
            "p99": percentile(relogin, 99),
            "max": relogin[-1] if relogin else None,
        },
        "reported_s": {
            "p50": percentile(reported, 50),
            "p99": percentile(reported, 99),
            "max": reported[-1] if reported else None,
        },
        "downtime_s": up_at - killed_at,
        "worst_after_up_ms": worst,
        # When the slow answers came (seconds after the kill): where to look.
        "slow_after_up": [
            (p.kind, round(p.started - killed_at, 2), round(p.ms))
            for p in after_up
            if p.ms >= TARGET_ANSWER_MS / 4
        ],
        "failed_after_up": [p.__dict__ for p in failed_after_up[:20]],
        "probes_after_up": len(after_up),
        "probes_while_down": len(down_probes),
        "refusals": refusals,
        "error_frames": errors,
        "listen_drops": drops,
        "cpu_fraction_by_process": cpu,
        "site_peak_rss_bytes": rss.get("VmHWM"),
        "reports_per_s_before": acked_before / window_before,
    }
    return row
