"""B11 archive serving: a node's ``--serve`` endpoint against Debian's nginx, same run.

One archive (1 GiB; ``--quick``: 4 MiB) is generated in the work directory
and registered as a held archive in a real node's store (``bench.serveseed``:
the store's own ``accept_download`` and ``complete``).  The node is
``twistd -n tasknet-node --serve tcp:PORT:interface=127.0.0.1``; the
baseline is ``nginx -c CONF -p PREFIX`` (one process, ``sendfile on``,
``access_log off``) as a child on another loopback port, serving the same
file from the same directory (its root is the node's ``--data``).

Clients (``bench.serveload``, a process of its own: non-blocking sockets,
``recv_into`` one reused buffer): 8, then 64 at once, each asking for the
whole file (again on a new connection when done), then each asking for
random 1 MiB ranges on a kept-alive connection; each phase is timed, and
the servers take turns, three rounds: the figure is the median of the
three.  The node's CPU seconds (``/proc/PID/stat``) per GiB it sent are
reported.

Through the site (``via: site``): a site on B9's database (1,000,000 tasks)
when the bench cache holds it, else on 1,000,000 tasks of its status mix
seeded by SQL (``bench.linkseed``, cached too; ``--quick``: B9's small one),
the node logged in to it as
one of that database's nodes, without ``--public-url``, holding the archive
as one of its completed tasks; the clients fetch ``GET
/api/tasks/{gid}/archive`` with the admin's token (8 clients, whole and
ranges), against nginx again.  Link issue latency: ``GET
/api/tasks/{gid}/archive`` with ``Accept: application/json`` over the
node's completed tasks drawn at random, p50 and p99 (one client).  A site without that
route yet (or that refuses it) leaves those two rows with the reason.

Targets (DELIVERY.md "Performance"): the node >= 0.8x nginx at 8 clients
(whole file, plain HTTP); via the site >= 0.5x; link issue p99 < 20 ms.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import linkseed, plan, viewseed
from bench.harness import Context, Row, percentile
from bench.procs import REPO_ROOT, BenchError, Proc, twistd
from bench.services import spawn_site, wait_site
from tasknet.process import free_port

TARGET_NODE = 0.8
TARGET_SITE = 0.5
TARGET_LINK_P99_MS = 20.0
GIB = 1024**3
MIB = 1024**2
ROUNDS = 3
CLIENT_COUNTS = (8, 64)
SITE_CLIENTS = 8
NODE_ID = plan.node_id(0)  # one of B9's nodes: its key is in that database
OPERATION_ID = "b11-operation"
ARCHIVE_NAME = "B11 archive"
USER_ID = 1
#: How a row that could not be measured in this tree begins its note.
NOT_MEASURED = "not measured: "
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


@dataclass(frozen=True)
class Sizes:
    archive: int
    seconds_whole: float
    seconds_ranges: float
    link_samples: int
    rounds: int = ROUNDS

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        if quick:
            # Long enough for 64 connections to be answered at all on a busy machine.
            return cls(4 * MIB, seconds_whole=2.0, seconds_ranges=2.0, link_samples=20, rounds=1)
        return cls(archive=GIB, seconds_whole=8.0, seconds_ranges=5.0, link_samples=1000)


@dataclass
class Server:
    """One side measured: where the clients go and the process serving."""

    label: str
    url: str
    proc: Proc | None
    headers: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0
    bytes_sent: int = 0


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)


def node_serves() -> bool:
    """Whether this tree's node has ``--serve`` (NODE-SERVE landed)."""
    from tasknet.node.service import Options

    return any(p[0] == "serve" for p in Options.optParameters)


def make_archive(path: Path, size: int) -> str:
    """Write ``size`` incompressible bytes (a random 16 MiB block, repeated);
    return their SHA-256."""
    block = os.urandom(min(size, 16 * MIB))
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        left = size
        while left:
            piece = block[: min(left, len(block))]
            f.write(piece)
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def register(
    data: Path, gid: int, size: int, sha256: str, operation_id: str = OPERATION_ID
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.serveseed",
            f"--data={data}",
            f"--gid={gid}",
            f"--operation-id={operation_id}",
            f"--name={ARCHIVE_NAME}",
            f"--size={size}",
            f"--sha256={sha256}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise BenchError(f"registering the archive failed:\n{done.stderr[-2000:]}")


def start_nginx(binary: str, directory: Path, root: Path) -> tuple[Proc, int]:
    prefix = directory / "nginx"
    shutil.rmtree(prefix, ignore_errors=True)
    (prefix / "logs").mkdir(parents=True)
    port = free_port()
    conf = prefix / "nginx.conf"
    # One process (no master, one worker's work): like the node's one reactor,
    # and its CPU is one /proc entry.  Temp paths under the prefix: nothing
    # of the system's nginx is touched.
    conf.write_text(
        f"""daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    default_type application/zip;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location /archives/ {{ }}
    }}
}}
"""
    )
    proc = Proc(
        "nginx", [binary, "-c", str(conf), "-p", str(prefix)], prefix / "nginx.log", cwd=prefix
    )
    proc.wait_port(port, 30)
    return proc, port


def start_node(
    directory: Path, data: Path, serve_port: int, connect_port: int, *, secret: str
) -> Proc:
    args = [
        f"--connect=tcp:127.0.0.1:{connect_port}",
        f"--node-id={NODE_ID}",
        f"--secret={secret}",
        f"--data={data}",
        f"--serve=tcp:{serve_port}:interface=127.0.0.1",
    ]
    proc = twistd("node", "tasknet-node", args, directory)
    proc.wait_port(serve_port, 60)
    return proc


def signed_url(base: str, gid: int, secret: str, user: int) -> str:
    from tasknet.protocol.archive_links import ArchiveLink, link_key

    exp = int(time.time()) + 3600
    return ArchiveLink.sign(link_key(secret), gid, OPERATION_ID, exp, user).url(base)


def load(server: Server, clients: int, mode: str, size: int, seconds: float) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "bench.serveload",
        f"--url={server.url}",
        f"--clients={clients}",
        f"--mode={mode}",
        f"--size={size}",
        f"--seconds={seconds}",
    ]
    for header in server.headers:
        argv.append(f"--header={header}")
    cpu0 = server.proc.cpu_seconds() if server.proc is not None else 0.0
    done = subprocess.run(
        argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=seconds + 120
    )
    if done.returncode != 0:
        raise BenchError(f"serveload against {server.label} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if server.proc is not None:
        if not server.proc.alive:
            raise server.proc.died(f"serving {clients} clients")
        result["cpu_seconds"] = server.proc.cpu_seconds() - cpu0
        server.cpu_seconds += result["cpu_seconds"]
    server.bytes_sent += result["bytes"]
    if result["bad"]:
        raise BenchError(f"{server.label} answered badly to {mode} x{clients}: {result['bad']}")
    if not result["bytes"]:
        raise BenchError(f"{server.label} sent nothing to {mode} x{clients}")
    result["mib_s"] = result["bytes"] / result["seconds"] / MIB
    return result


def measure(
    servers: list[Server], counts: tuple[int, ...], sizes: Sizes
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``{label: {"whole x8": [round results], ...}}``; the servers take turns
    within each round, so a noisy moment lands on all of them."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {s.label: {} for s in servers}
    for _ in range(sizes.rounds):
        for clients in counts:
            for mode, seconds in (("whole", sizes.seconds_whole), ("ranges", sizes.seconds_ranges)):
                for server in servers:
                    result = load(server, clients, mode, sizes.archive, seconds)
                    out[server.label].setdefault(f"{mode} x{clients}", []).append(result)
    return out


def median_rate(results: list[dict[str, Any]]) -> float:
    return statistics.median(r["mib_s"] for r in results)


def phase_cpu_per_gib(results: list[dict[str, Any]]) -> float | None:
    """CPU seconds per GiB sent over one phase's rounds (None without a process)."""
    sent = sum(r["bytes"] for r in results)
    if not sent or any("cpu_seconds" not in r for r in results):
        return None
    return sum(r["cpu_seconds"] for r in results) / (sent / GIB)


def _fmt_cpu(label: str, rates: dict[str, list[dict[str, Any]]]) -> str:
    parts = []
    for phase, results in rates.items():
        cpu = phase_cpu_per_gib(results)
        if cpu is not None:
            parts.append(f"{phase} {cpu:.2f}")
    return f"{label} CPU s per GiB by phase: " + ", ".join(parts)


def cpu_per_gib(server: Server) -> float | None:
    if server.proc is None or not server.bytes_sent:
        return None
    return server.cpu_seconds / (server.bytes_sent / GIB)


# ------------------------------------------------------------------ via the site


@dataclass
class SitePart:
    rates: dict[str, list[dict[str, Any]]] | None = None
    nginx_rates: dict[str, list[dict[str, Any]]] | None = None
    link_ms: list[float] = field(default_factory=list)
    #: Link requests not answered 200, by status.
    link_refused: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None
    stream_error: str | None = None
    #: The site's database, in words (its size and where it came from).
    database: str = ""
    notes: list[str] = field(default_factory=list)


def completed_gids(path: str, node: str, limit: int, *, at_random: bool = False) -> list[int]:
    """Completed tasks of ``node`` in the seeded database: the first ones by
    gid, or ``at_random`` (the link issue's, spread over the whole table)."""
    order = "random()" if at_random else "gid"
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute(
            "SELECT gid FROM gallery WHERE node_id = ? AND status = 4"  # noqa: S608 (constant)
            f" ORDER BY {order} LIMIT ?",
            (node, limit),
        ).fetchall()
    finally:
        connection.close()
    return [int(r[0]) for r in rows]


#: The link issue's database when B9's million is not in the cache: this
#: many tasks seeded by SQL (bench.linkseed: a few minutes, then cached).
LINK_TASKS = 1_000_000


def link_database(ctx: Context, directory: Path) -> tuple[viewseed.ViewSeed, str]:
    """The site's database for the site part and how it is described: B9's
    (1,000,000 tasks) when the cache holds it (B9 ran before, as in ``python
    -m bench all``) or B9's size is set (``TASKNET_BENCH_B9_TASKS``), or for
    ``--quick`` B9's tiny one; else :data:`LINK_TASKS` tasks of B9's status
    mix copied by SQL from a small template (``bench.linkseed``)."""
    full = viewseed.ViewSizes.of(ctx.quick)
    cached = ctx.cache is not None and (ctx.cache / f"{viewseed.cache_key(full)}.sqlite").exists()
    if ctx.quick or os.environ.get(viewseed.TASKS_ENV) or cached:
        seed = viewseed.prepare(directory, full, ctx.cache)
        where = "from the cache" if seed.from_cache else "seeded now"
        return seed, f"a site on B9's database of {seed.sizes.tasks:,} tasks ({where})"
    seed = linkseed.prepare(directory, LINK_TASKS, ctx.cache)
    where = "from the cache" if seed.from_cache else f"seeded now in {seed.seed_seconds:.0f}s"
    return seed, (
        f"a site on {seed.sizes.tasks:,} tasks of B9's status mix over {seed.sizes.users} users"
        f" and {seed.sizes.nodes} nodes, a {linkseed.TEMPLATE_TASKS:,}-task template copied"
        f" by SQL (bench/linkseed.py; {where})"
    )


def make_held(path: str, gid: int, size: int, sha256: str) -> str:
    """``gid`` (a completed task of the node) gets the archive's size and
    digest, as the node's completion would have recorded them; returns its
    operation id (the node holds the archive under it)."""
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute("UPDATE gallery SET size = ? WHERE gid = ?", (size, gid))
            columns = {r[1] for r in connection.execute("PRAGMA table_info(gallery)")}
            if "archive_sha256" in columns:
                connection.execute(
                    "UPDATE gallery SET archive_size = ?, archive_sha256 = ? WHERE gid = ?",
                    (size, sha256, gid),
                )
            row = connection.execute(
                "SELECT operation_id FROM task_operation WHERE gid = ?", (gid,)
            ).fetchone()
    finally:
        connection.close()
    if row is None:
        raise BenchError(f"gid {gid} has no operation in the seeded database")
    return str(row[0])


def _get(url: str, token: str, accept: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}", "Accept": accept}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def via_site(
    ctx: Context, directory: Path, archive: Path, sha256: str, sizes: Sizes, nginx: Server | None
) -> SitePart:
    part = SitePart()
    seed, part.database = link_database(ctx, directory)
    first = completed_gids(seed.path, NODE_ID, 1)
    if not first:
        part.skipped = f"no completed task of {NODE_ID} in the seeded database"
        return part
    held = first[0]
    gids = [held] + [
        gid
        for gid in completed_gids(seed.path, NODE_ID, sizes.link_samples + 1, at_random=True)
        if gid != held
    ]
    operation_id = make_held(seed.path, held, archive.stat().st_size, sha256)
    from tasknet.node.paths import DataDir

    data = directory / "site-node-data"
    shutil.rmtree(data, ignore_errors=True)
    target = DataDir(data).archive_path(held, operation_id)
    target.parent.mkdir(parents=True)
    try:  # the same bytes under the name this generation's archive has
        os.link(archive, target)
    except OSError:
        shutil.copyfile(archive, target)
    register(data, held, archive.stat().st_size, sha256, operation_id)
    # One user (the admin) runs every client: the per-user stream limit
    # (default 4) would answer most of them 429.
    site = spawn_site(
        directory,
        seed.path,
        upstream_url="http://127.0.0.1:9",
        name="b11-site",
        extra_args=[f"--archive-streams-per-user={max(CLIENT_COUNTS)}"],
    )
    node: Proc | None = None
    try:
        wait_site(site, timeout=600)
        node = start_node(directory, data, free_port(), site.nodes_port, secret=plan.SECRET)
        node.wait_until(lambda: node.log_has("logged in to the site"), 60, "the node's login")
        url = f"{site.http_url}/api/tasks/{held}/archive"
        status, body = _get(url, seed.admin_token, "application/json")
        if status != 200:
            part.skipped = (
                f"GET /api/tasks/{{gid}}/archive answered {status} {body[:200]!r}"
                " (the site's archive route is not there yet, or refused)"
            )
            return part
        answer = json.loads(body)
        if answer.get("via") != "site":
            part.notes.append(f"the site answered via {answer.get('via')!r}, not 'site'")
        # Link issue latency over the node's completed tasks, one client.
        others = gids[1:] or gids
        for n in range(sizes.link_samples):
            gid = others[n % len(others)]
            t0 = time.perf_counter()
            status, _ = _get(
                f"{site.http_url}/api/tasks/{gid}/archive", seed.admin_token, "application/json"
            )
            elapsed = (time.perf_counter() - t0) * 1000
            if status == 200:
                part.link_ms.append(elapsed)
            else:
                part.link_refused[str(status)] = part.link_refused.get(str(status), 0) + 1
        streamed = Server("site", url, site.proc, [f"Authorization: Bearer {seed.admin_token}"])
        sides = [streamed] + ([nginx] if nginx is not None else [])
        try:
            results = measure(sides, (SITE_CLIENTS,), sizes)
        except BenchError as error:  # the link row keeps what it measured
            part.stream_error = str(error)
            return part
        part.rates = results["site"]
        part.nginx_rates = results.get("nginx")
        part.notes.append(
            f"site CPU {cpu_per_gib(streamed) or 0:.2f} s per GiB streamed; {part.database}"
        )
    finally:
        if node is not None:
            node.stop()
        site.proc.stop()
    return part


# ------------------------------------------------------------------ the rows


def _fmt_rates(label: str, rates: dict[str, list[dict[str, Any]]]) -> str:
    return f"{label}: " + ", ".join(
        f"{phase} {median_rate(results):.0f}" for phase, results in rates.items()
    )


def run(ctx: Context) -> list[Row]:
    sizes = Sizes.of(ctx.quick)
    directory = ctx.scratch("b11")
    node_target = f">= {TARGET_NODE}x nginx at 8 clients"
    rows = [
        Row(bench="B11a", title="serving: node", unit="MiB/s", target=node_target),
        Row(bench="B11b", title="serving: via site", unit="MiB/s", target=f">= {TARGET_SITE}x"),
        Row(
            bench="B11c",
            title="serving: link issue",
            unit="ms p99",
            target=f"p99 < {TARGET_LINK_P99_MS:.0f} ms",
        ),
    ]
    node_row, site_row, link_row = rows
    if not node_serves():
        for row in rows:
            row.notes.append(NOT_MEASURED + "this tree's node has no --serve yet")
        return rows

    data = directory / "node-data"
    shutil.rmtree(data, ignore_errors=True)
    gid = 11_000_001
    from tasknet.node.paths import DataDir

    archive = DataDir(data).archive_path(gid, OPERATION_ID)
    sha256 = make_archive(archive, sizes.archive)
    register(data, gid, sizes.archive, sha256)

    binary = nginx_binary()
    nginx: Server | None = None
    nginx_proc: Proc | None = None
    secret = "b11-secret"
    serve_port = free_port()
    # The node dials a port nothing listens on: it serves without a site.
    node = start_node(directory, data, serve_port, free_port(), secret=secret)
    try:
        if binary is not None:
            nginx_proc, nginx_port = start_nginx(binary, directory, data)
            nginx = Server(
                "nginx", f"http://127.0.0.1:{nginx_port}/archives/{archive.name}", nginx_proc
            )
        base = f"http://127.0.0.1:{serve_port}/"
        ours = Server("node", signed_url(base, gid, secret, USER_ID), node)
        results = measure([ours] + ([nginx] if nginx else []), CLIENT_COUNTS, sizes)
    except BaseException:
        if nginx_proc is not None:
            nginx_proc.stop()
        raise
    finally:
        node.stop()

    node_rates = results["node"]
    node_row.figure = median_rate(node_rates["whole x8"])
    node_row.details = {
        "archive_bytes": sizes.archive,
        "rounds": sizes.rounds,
        "node": node_rates,
        "node_cpu_s_per_gib": cpu_per_gib(ours),
    }
    node_row.notes.append(
        f"one {sizes.archive / MIB:.0f} MiB archive, {sizes.rounds} round(s), medians in MiB/s; "
        + _fmt_rates("node", node_rates)
    )
    node_row.notes.append(f"node CPU {cpu_per_gib(ours) or 0:.2f} s per GiB served")
    node_row.notes.append(_fmt_cpu("node", node_rates))
    if nginx is not None:
        nginx_rates = results["nginx"]
        node_row.baseline = median_rate(nginx_rates["whole x8"])
        node_row.baseline_label = (
            "Debian's nginx (one process, sendfile on) serving the same file from the same"
            " directory, same clients, same run"
        )
        node_row.details["nginx"] = nginx_rates
        node_row.details["nginx_cpu_s_per_gib"] = cpu_per_gib(nginx)
        node_row.notes.append(_fmt_rates("nginx", nginx_rates))
        node_row.notes.append(
            "ratio node/nginx: "
            + ", ".join(
                f"{phase} {median_rate(node_rates[phase]) / median_rate(nginx_rates[phase]):.2f}x"
                for phase in node_rates
            )
            + f"; nginx CPU {cpu_per_gib(nginx) or 0:.2f} s per GiB"
        )
        node_row.met = (node_row.ratio or 0) >= TARGET_NODE
    else:
        node_row.notes.append("nginx is not installed: no baseline (apt-get install nginx-light)")

    try:
        part = via_site(ctx, directory, archive, sha256, sizes, nginx)
    except BenchError as error:
        part = SitePart(skipped=f"{error}")
    finally:
        if nginx_proc is not None:
            nginx_proc.stop()
    if part.skipped is not None:
        # Not an error of the benchmark: a part of the feature not in this tree.
        site_row.notes.append(NOT_MEASURED + part.skipped)
        link_row.notes.append(NOT_MEASURED + part.skipped)
        return rows
    _link_row(link_row, part)
    if part.rates is None:
        site_row.error = f"streaming through the site failed: {part.stream_error}"
        return rows
    site_row.figure = median_rate(part.rates[f"whole x{SITE_CLIENTS}"])
    site_row.notes.append(_fmt_rates("via site", part.rates))
    site_row.notes.append(_fmt_cpu("site", part.rates))
    site_row.notes.extend(part.notes)
    site_row.details = {"site": part.rates}
    if part.nginx_rates is not None:
        site_row.baseline = median_rate(part.nginx_rates[f"whole x{SITE_CLIENTS}"])
        site_row.baseline_label = "the same nginx, same clients, same run"
        site_row.details["nginx"] = part.nginx_rates
        site_row.met = (site_row.ratio or 0) >= TARGET_SITE
    else:
        site_row.notes.append("nginx is not installed: no baseline (apt-get install nginx-light)")
    return rows


def _link_row(link_row: Row, part: SitePart) -> None:
    link_row.p50_ms = percentile(part.link_ms, 50)
    link_row.p99_ms = percentile(part.link_ms, 99)
    link_row.figure = link_row.p99_ms
    link_row.lower_is_better = True
    link_row.notes.append(
        f"{len(part.link_ms)} link issues (GET /api/tasks/{{gid}}/archive, Accept:"
        " application/json, admin token) of the node's completed tasks at random, one client,"
        " a new connection each (urllib)"
        + (f"; not answered 200: {part.link_refused}" if part.link_refused else "")
        + f"; {part.database}"
    )
    link_row.met = link_row.figure is not None and link_row.figure < TARGET_LINK_P99_MS
