"""``tasknet-demo``: upstream + site + three nodes on loopback, one command.

Starts real ``twistd -n`` children (the mock upstream, a site with ``--demo``
on an embedded SQLite file, and three nodes: ``node-1`` (v2) serves its
archives with ``--serve`` and ``--public-url``, so a user's Download is a
303 to it; ``node-2`` speaks the legacy ``--protocol 1`` and serves nothing
(the known boundary: its archives answer ``archive_not_served``); ``node-3``
(v2) serves without a public URL, so its archives come through the site) on
free loopback ports, waits until they are ready, prints the URL, the demo
token and a file holding it, how to fetch an archive (browser, tasknet-get,
aria2c), the database (for ``tasknet-admin --db``) and where the logs are,
and stops them all (nodes first, upstream last) on Ctrl-C or SIGTERM.

``--postgres``: a throwaway PostgreSQL server (``tasknet.drill.pgserver``)
in the data directory and two sites on one database of it (``site-1``,
``site-2``: own ``--name``, HTTP and node ports), each node given both sites
with ``--connect`` (node-1 and node-3 site-1 first, node-2 site-2 first), so
each site holds a node and each site's node list shows them all; the server
stops last.

``--postgres --ha``: instead of one server, a pg_auto_failover cluster
(``tasknet.drill.pgcluster``: its monitor, a primary and a synchronous
standby, in a fresh directory under the data directory, removed at the
end), two sites on its multi-host URL and two nodes (``node-1``,
``node-3``); a site that exits (its lease died with the primary) is started
again as with ``--restart-children``.  The banner says how to watch the
formation, kill the primary and see the sites come back.

A child that dies does not end the demo (:class:`Supervisor`): one line
says which, its exit status and its log, the others keep running (the
site shows a dead node offline by itself), and nothing is restarted unless
``--restart-children`` (then with backoff, 1 s doubling to 30 s, saying so).

``--data DIR`` keeps everything across runs, on both backends: the SQLite
database, the PostgreSQL cluster (``DIR/postgres``, started again as it
is), the nodes' queues and archives, the logs; nothing under it is deleted.
Without it a new temporary directory is used and removed at the end.

:class:`DemoStack` is plain synchronous code (subprocess + blocking HTTP, no
reactor), so tests that must not run a reactor in-process (the Playwright
browser test) start the same stack with it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from tasknet.cli.jsonhttp import request
from tasknet.drill.pgserver import PostgresFailed, PostgresNotInstalled, ThrowawayPostgres
from tasknet.logging import twistd_logger_args
from tasknet.process import LOOPBACK, Child, free_port, port_is_free, twistd_command
from tasknet.version import version_line

DEMO_TOKEN = "demo"
#: The database the ``--postgres`` demo's sites share.
POSTGRES_DATABASE = "tasknet"
STOP_TIMEOUT = 15.0
# One readiness probe; the waits around it have their own, longer deadline.
PROBE_TIMEOUT = 5.0
#: ``--restart-children``: the first delay, doubled per death up to the cap;
#: a child that stayed up this long since its restart starts again at the first.
RESTART_DELAY = 1.0
RESTART_DELAY_MAX = 30.0
RESTART_STABLE = 60.0


class DemoError(Exception):
    """The demo could not start (a child died, a wait timed out)."""


#: How a node of the demo serves its archives (``NodeSpec.serve``).
SERVES_NOTHING = ""
#: ``--serve`` and ``--public-url``: users get a 303 to the node.
SERVES_USERS = "users"
#: ``--serve`` only: the site streams the archive from the node to users.
SERVES_SITE = "site"
#: The file beside the data holding the demo token, for ``tasknet-get --token-file``.
TOKEN_FILE = "demo-token"


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    protocol: int
    secret: str
    serve: str = SERVES_NOTHING


DEFAULT_NODES = (
    NodeSpec("node-1", 2, "demo-secret-node-1", SERVES_USERS),
    NodeSpec("node-2", 1, "demo-secret-node-2"),
    NodeSpec("node-3", 2, "demo-secret-node-3", SERVES_SITE),
)
#: ``--postgres --ha``: two nodes, both v2 (one serving users, one through the site).
HA_NODES = (DEFAULT_NODES[0], DEFAULT_NODES[2])


@dataclass
class SiteSpec:
    """One site process of the stack: its ``--name``, ports and directory."""

    name: str
    http_port: int
    nodes_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}/"

    @property
    def nodes_endpoint(self) -> str:
        return f"tcp:{LOOPBACK}:{self.nodes_port}"


@dataclass
class DemoStack:
    """Upstream, site(s) and nodes as real processes under ``data_dir``.

    ``postgres``: two sites on one throwaway PostgreSQL database instead of
    one site on a SQLite file; ``second_http_port`` is the second site's
    (0: a free one)."""

    data_dir: Path
    http_port: int = 0
    bandwidth: int | None = 150_000
    nodes: Sequence[NodeSpec] = DEFAULT_NODES
    upstream_timeout: float | None = None
    ready_timeout: float = 60.0
    postgres: bool = False
    #: ``postgres`` on a failover cluster (monitor, primary, synchronous standby).
    ha: bool = False
    second_http_port: int = 0
    children: list[Child] = field(default_factory=list)
    sites: list[SiteSpec] = field(default_factory=list)
    upstream_port: int = 0
    nodes_port: int = 0
    server: ThrowawayPostgres | None = None
    #: The failover cluster of ``ha`` (a :class:`~tasknet.drill.pgcluster.PgCluster`).
    cluster: Any = None
    database_url: str | None = None
    #: node id -> the loopback port its ``--serve`` listens on.
    serve_ports: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The (first) site's URL."""
        return f"http://{LOOPBACK}:{self.http_port}/"

    @property
    def urls(self) -> list[str]:
        return [site.url for site in self.sites]

    @property
    def upstream_url(self) -> str:
        return f"http://{LOOPBACK}:{self.upstream_port}"

    def child(self, name: str) -> Child:
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(name)

    def _twistd(self, name: str, plugin: str, args: list[str]) -> Child:
        argv = [*twistd_command(), "-n", "--pidfile=", *twistd_logger_args(), plugin, *args]
        logs = self.log_dir
        logs.mkdir(parents=True, exist_ok=True)
        child = Child(name, argv, logs / f"{name}.log", cwd=self.data_dir / name)
        self.children.append(child)
        child.start()
        return child

    def start(self) -> None:
        """Start everything and wait until it is ready; on failure stop what started."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.http_port == 0:
            self.http_port = free_port()
        if not self.upstream_port:
            self.upstream_port = free_port()
        self.nodes_port = free_port()
        self.serve_ports = {n.node_id: free_port() for n in self.nodes if n.serve}
        self._write_token_file()
        self.sites = [SiteSpec("site-1" if self.postgres else "", self.http_port, self.nodes_port)]
        if self.postgres:
            self.sites.append(SiteSpec("site-2", self.second_http_port or free_port(), free_port()))
        try:
            if self.postgres:
                self._start_postgres()
            self._start_upstream()
            for site in self.sites:
                self._spawn_site(site)
            for site in self.sites:
                self._wait_site(site)
            for n, spec in enumerate(self.nodes):
                self._start_node(spec, self.connect_order(n))
            self._wait_nodes()
        except BaseException:
            self.stop()
            raise

    def _start_postgres(self) -> None:
        if os.geteuid() == 0:
            # The server then runs as the postgres user: it must be able to
            # pass through the data directory (not list it).
            self.data_dir.chmod(self.data_dir.stat().st_mode | 0o111)
        if self.ha:
            self._start_cluster()
            return
        # The cluster lives in DATA/postgres and outlives the server: a
        # second run on the same --data starts it again with its database.
        server = ThrowawayPostgres(directory=str(self.postgres_dir))
        try:
            server.start()
            self.server = server
            self.database_url = server.ensure_database(POSTGRES_DATABASE)
        except (PostgresNotInstalled, PostgresFailed) as error:
            raise DemoError(f"--postgres: {error}") from error

    def _start_cluster(self) -> None:
        from tasknet.drill.pgcluster import PgCluster

        # A fresh cluster each run (pg_autoctl's nodes are not reused across
        # --data runs): its directory under the data directory goes at stop.
        cluster = PgCluster(base_dir=str(self.data_dir))
        try:
            cluster.start()
        except (PostgresNotInstalled, PostgresFailed) as error:
            raise DemoError(f"--postgres --ha: {error}") from error
        self.cluster = cluster
        self.database_url = cluster.uri

    @property
    def token_file(self) -> Path:
        """The demo token in a file of its own (``tasknet-get --token-file``)."""
        return self.data_dir / TOKEN_FILE

    def _write_token_file(self) -> None:
        # Created private, as a real token file should be.
        descriptor = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(DEMO_TOKEN + "\n")

    def serve_url(self, spec: NodeSpec) -> str:
        """Where ``spec``'s ``--serve`` listens ("" when it serves nothing)."""
        port = self.serve_ports.get(spec.node_id)
        return f"http://{LOOPBACK}:{port}/" if port else ""

    @property
    def postgres_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def sqlite_path(self) -> Path:
        """The SQLite site's database (without ``postgres``)."""
        return self.data_dir / "site" / "tasknet-site.sqlite"

    @property
    def database(self) -> str:
        """What ``tasknet-admin --db`` needs: the SQLite file, or the
        PostgreSQL URL (no password: the throwaway server trusts loopback)."""
        if self.postgres:
            return self.database_url or f"(PostgreSQL in {self.postgres_dir})"
        return str(self.sqlite_path)

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    def _wait_site(self, site: SiteSpec) -> None:
        self._wait(
            f"{site.name or 'the site'}'s /healthz",
            lambda: self.health(site.url) is not None,
            self.child(self._site_child_name(site)),
        )

    def connect_order(self, index: int) -> list[str]:
        """Node ``index`` dials the sites starting with site ``index``, so
        the nodes spread over the sites and each lists every site."""
        endpoints = [site.nodes_endpoint for site in self.sites]
        start = index % len(endpoints)
        return endpoints[start:] + endpoints[:start]

    @staticmethod
    def _site_child_name(site: SiteSpec) -> str:
        return site.name or "site"

    def _start_upstream(self) -> None:
        args = ["--http", f"tcp:{self.upstream_port}:interface={LOOPBACK}"]
        if self.bandwidth:
            args += ["--bandwidth", str(self.bandwidth)]
        upstream = self._twistd("upstream", "tasknet-upstream", args)
        self._wait(
            "the mock upstream to answer",
            lambda: request("GET", f"{self.upstream_url}/_drill/stats", timeout=PROBE_TIMEOUT).ok,
            upstream,
        )

    def _spawn_site(self, site: SiteSpec) -> None:
        name = self._site_child_name(site)
        if self.database_url is not None:
            database = self.database_url
        else:
            database = str(self.sqlite_path)
        args = [
            "--db",
            database,
            "--http",
            f"tcp:{site.http_port}:interface={LOOPBACK}",
            "--nodes",
            f"tcp:{site.nodes_port}:interface={LOOPBACK}",
            "--upstream",
            self.upstream_url,
            "--demo",
        ]
        if site.name:
            args += ["--name", site.name]
        for spec in self.nodes:
            args += ["--node-key", f"{spec.node_id}:{spec.secret}"]
        if self.upstream_timeout is not None:
            args += ["--upstream-timeout", str(self.upstream_timeout)]
        self._twistd(name, "tasknet-site", args)

    def _start_node(self, spec: NodeSpec, endpoints: Sequence[str]) -> None:
        args = [
            *(arg for endpoint in endpoints for arg in ("--connect", endpoint)),
            "--node-id",
            spec.node_id,
            "--secret",
            spec.secret,
            "--data",
            str(self.data_dir / spec.node_id / "data"),
            "--protocol",
            str(spec.protocol),
        ]
        if spec.serve:
            port = self.serve_ports[spec.node_id]
            args += ["--serve", f"tcp:{port}:interface={LOOPBACK}"]
            if spec.serve == SERVES_USERS:
                args += ["--public-url", self.serve_url(spec)]
        self._twistd(spec.node_id, "tasknet-node", args)

    def _wait_nodes(self) -> None:
        wanted = {spec.node_id for spec in self.nodes}
        self._wait(
            f"nodes {', '.join(sorted(wanted))} to log in",
            lambda: all(wanted <= self.connected_nodes(site.url) for site in self.sites),
            *self.children,
        )

    def health(self, url: str | None = None) -> dict[str, Any] | None:
        reply = request("GET", f"{url or self.url}healthz", timeout=PROBE_TIMEOUT)
        return reply.body if reply.status == 200 and isinstance(reply.body, dict) else None

    def connected_nodes(self, url: str | None = None) -> set[str]:
        """The nodes a site lists as connected (on PostgreSQL: to any site)."""
        reply = request(
            "GET", f"{url or self.url}api/admin/nodes", token=DEMO_TOKEN, timeout=PROBE_TIMEOUT
        )
        if reply.status != 200 or not isinstance(reply.body, dict):
            return set()
        # The list keeps recently seen nodes too ("connected": false).
        nodes = reply.body.get("nodes", [])
        return {str(node.get("id")) for node in nodes if node.get("connected", True)}

    def _wait(self, what: str, ready: Callable[[], bool], *watch: Child) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not ready():
            for child in watch:
                if not child.alive:
                    code = child.returncode
                    raise DemoError(
                        f"{child.name} exited (code {code}) while waiting for {what}; "
                        f"its log ({child.log_path}) ends with:\n{child.log_tail()}"
                    )
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {self.ready_timeout:.0f}s waiting for {what}")
            time.sleep(0.1)

    def dead_children(self) -> list[Child]:
        return [child for child in self.children if not child.alive]

    def server_died(self) -> bool:
        return self.server is not None and not self.server.running

    def stop(self) -> None:
        """Stop nodes first, then the sites, then the upstream, then the
        PostgreSQL server (its cluster stays in ``DATA/postgres``)."""
        for child in reversed(self.children):
            child.stop(STOP_TIMEOUT)
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.stop()

    def __enter__(self) -> DemoStack:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def exit_status(code: int | None) -> str:
    """A child's end in words: ``exit status 1``, ``killed by SIGKILL``."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@dataclass
class _Watch:
    """What the supervisor knows of one child."""

    #: The pid whose death was reported (a new one is a new death).
    reported: int | None = None
    #: Deaths in a row (reset once it has run RESTART_STABLE seconds).
    deaths: int = 0
    #: When the pending restart is due (None: none pending).
    restart_at: float | None = None
    #: When it was last restarted.
    restarted_at: float | None = None


@dataclass
class Supervisor:
    """Watches the demo's children while it runs (:meth:`poll`, twice a
    second).  A child that died is reported once, in one line (which, its
    exit status, its log); the others keep running.  With ``restart`` it is
    started again after a backoff (``RESTART_DELAY`` doubling up to
    ``RESTART_DELAY_MAX``), each step said.  The PostgreSQL server of
    ``--postgres`` is watched the same way."""

    stack: DemoStack
    restart: bool = False
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    clock: Callable[[], float] = time.monotonic
    delay: float = RESTART_DELAY
    max_delay: float = RESTART_DELAY_MAX
    stable: float = RESTART_STABLE
    _watch: dict[str, _Watch] = field(default_factory=dict)

    def poll(self) -> None:
        now = self.clock()
        for child in self.stack.children:
            self._poll_one(
                child.name,
                now,
                child.alive,
                child.pid,
                child.returncode,
                str(child.log_path),
                functools.partial(self._restart_child, child),
            )
        server = self.stack.server
        if server is not None:
            self._poll_one(
                "postgres",
                now,
                server.running,
                server.pid,
                None,
                str(self.stack.postgres_dir / "server.log"),
                self._restart_server,
            )

    def _poll_one(
        self,
        name: str,
        now: float,
        alive: bool,
        pid: int | None,
        code: int | None,
        log_path: str,
        restart: Callable[[], int | None],
    ) -> None:
        watch = self._watch.setdefault(name, _Watch())
        if alive:
            if watch.restarted_at is not None and now - watch.restarted_at >= self.stable:
                watch.deaths, watch.restarted_at = 0, None
            return
        if watch.reported != pid:
            watch.reported = pid
            what = (
                "the PostgreSQL server exited"
                if name == "postgres"
                else f"{name} exited ({exit_status(code)})"
            )
            if not self.restart:
                self.say(
                    f"tasknet-demo: {what}; the rest keeps running, nothing is restarted"
                    f" (--restart-children would); its log: {log_path}"
                )
                return
            watch.deaths += 1
            wait = min(self.delay * 2 ** (watch.deaths - 1), self.max_delay)
            watch.restart_at = now + wait
            self.say(
                f"tasknet-demo: {what}; restarting it in {wait:g} s (restart {watch.deaths});"
                f" its log: {log_path}"
            )
            return
        if watch.restart_at is not None and now >= watch.restart_at:
            watch.restart_at = None
            try:
                new_pid = restart()
            except Exception as error:  # the next poll sees it dead again
                self.say(f"tasknet-demo: restarting {name} failed: {error}")
                return
            watch.restarted_at = now
            self.say(f"tasknet-demo: {name} restarted (pid {new_pid})")

    def _restart_child(self, child: Child) -> int | None:
        child.start(banner="--- restarted by tasknet-demo --restart-children\n")
        return child.pid

    def _restart_server(self) -> int | None:
        server = self.stack.server
        assert server is not None
        server.restart()
        return server.pid


class _Stop(Exception):
    """Raised by the SIGTERM handler so the main loop unwinds like Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tasknet-demo",
        description="Run the mock upstream, a site and three nodes (two v2 nodes serving"
        " archives, one legacy) on loopback.",
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="two sites on one throwaway PostgreSQL database (started in the data directory,"
        " which the postgres user must be able to reach when run as root), each node"
        " connected with both; the second site's port is --port + 1 when that is free",
    )
    parser.add_argument(
        "--ha",
        action="store_true",
        help="with --postgres: a failover cluster instead of one server (pg_auto_failover's"
        " monitor, a primary and a synchronous standby; Debian's postgresql-15-auto-failover),"
        " two sites and two nodes; a site that exits is restarted; prints how to kill the"
        " primary and watch the sites come back",
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="directory for everything (databases, the PostgreSQL cluster, node queues,"
        " logs), kept across runs and never deleted; default: a new temp dir, removed on exit",
    )
    parser.add_argument(
        "--restart-children",
        action="store_true",
        help="restart a child that dies (with backoff, 1 s doubling to 30 s); default:"
        " say so and keep the others running",
    )
    parser.add_argument(
        "--port", type=int, default=8080, help="web UI port (default 8080; 0 = any free port)"
    )
    parser.add_argument(
        "--bandwidth",
        type=int,
        default=150_000,
        help="upstream archive bandwidth in bytes/s, so progress is visible (0 = unlimited)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    parser.add_argument("--version", action="version", version=version_line("tasknet-demo"))
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be 0..65535")
    if args.bandwidth < 0:
        parser.error("--bandwidth must be >= 0")
    if args.ha and not args.postgres:
        parser.error("--ha needs --postgres (a failover cluster of PostgreSQL servers)")
    return args


def _banner(stack: DemoStack, temporary: bool = False) -> str:
    if not stack.postgres:
        nodes = ", ".join(f"{n.node_id} (protocol {n.protocol})" for n in stack.nodes)
        lines = [
            "tasknet demo is ready",
            f"  URL: {stack.url}",
            f"  token: {DEMO_TOKEN}",
            f"  database: {stack.database}  (tasknet-admin --db {stack.database} ...)",
            f"  upstream: {stack.upstream_url}",
            f"  nodes: {nodes}",
        ]
    else:
        order = {spec.node_id: stack.connect_order(n) for n, spec in enumerate(stack.nodes)}
        by_endpoint = {site.nodes_endpoint: site.name for site in stack.sites}
        nodes = ", ".join(
            f"{n.node_id} (protocol {n.protocol}; "
            f"{' then '.join(by_endpoint[e] for e in order[n.node_id])})"
            for n in stack.nodes
        )
        what = (
            "a PostgreSQL primary with a synchronous standby (pg_auto_failover)"
            if stack.ha
            else "one PostgreSQL database"
        )
        lines = [
            f"tasknet demo is ready: two sites on {what}",
            *(f"  URL: {site.url}  ({site.name})" for site in stack.sites),
            f"  token: {DEMO_TOKEN}",
            f"  database: {stack.database}  (tasknet-admin --db {stack.database} ...)",
            f"  upstream: {stack.upstream_url}",
            f"  nodes: {nodes}",
        ]
    lines += _fetching(stack)
    if stack.cluster is not None:
        lines += _failover_lines(stack)
    kept = "removed at the end" if temporary else "kept: start again with the same --data"
    lines += [
        f"  logs: {stack.log_dir}",
        f"  data: {stack.data_dir}  ({kept})",
        "Press Ctrl-C to stop.",
    ]
    return "\n".join(lines)


def _failover_lines(stack: DemoStack) -> list[str]:
    """How to watch the formation, kill the primary and see the sites come back."""
    cluster = stack.cluster
    primary = cluster.primary()
    kills = []
    for name in cluster.node_names:
        group = _process_group(Path(cluster.directory) / name / "postmaster.pid")
        role = "primary now" if name == primary else "standby now"
        if group is not None:
            kills.append(f"    {name} ({role}): kill -KILL -- -{group}")
    health = " ".join(f"{site.url}healthz" for site in stack.sites)
    return [
        "  failover (pg_auto_failover; a site that exits is restarted):",
        f"    the formation: pg_autoctl show state --monitor '{cluster.monitor_uri}'",
        "    kill a node as a machine dies (its postmaster and its keeper):",
        *kills,
        f"    the sites: watch -n1 curl -s {health}",
        "    (database: failing, then ok again within about 45 s on the promoted standby;"
        " replication: async until the killed node comes back)",
    ]


def _process_group(pid_file: Path) -> int | None:
    """The process group of the postmaster named in ``pid_file`` (its
    pg_autoctl keeper's: one kill ends both)."""
    try:
        pid = int(pid_file.read_text(encoding="utf-8").split("\n", 1)[0])
        return os.getpgid(pid)
    except (OSError, ValueError):
        return None


def _fetching(stack: DemoStack) -> list[str]:
    """How a user fetches a completed task's archive, with this run's URL and token."""
    url = stack.url
    lines = ["  archives:"]
    for spec in stack.nodes:
        if spec.serve == SERVES_USERS:
            how = f"serves at {stack.serve_url(spec)} (--public-url: Download is a 303 to it)"
        elif spec.serve == SERVES_SITE:
            how = f"serves at {stack.serve_url(spec)}, no --public-url: through the site"
        else:
            how = "legacy protocol, serves nothing: its archives answer archive_not_served"
        lines.append(f"    {spec.node_id} {how}")
    links = (
        f"curl -fsS -H 'Authorization: Bearer {DEMO_TOKEN}' -H 'Accept: text/plain'"
        f" -H 'Content-Type: application/json' -d '{{\"gids\": [GID]}}'"
        f" {url}api/tasks/archive-links > links.txt"
    )
    lines += [
        "  fetch a completed task's archive (GID: its gid):",
        "    browser: Download on its row",
        f"    tasknet-get --site {url} --token-file {stack.token_file} GID",
        f"    {links}",
        "    aria2c -i links.txt   (fetches and checks each SHA-256)",
    ]
    return lines


#: In a kept data directory: the upstream's port of the last run.  Archive
#: URLs name it (the site stores the URL the upstream answered), so tasks of
#: a last run not yet downloaded need the same port on the next one.
PORTS_FILE = "demo-ports.json"


def remembered_upstream_port(data_dir: Path) -> int:
    """The last run's upstream port if it is free now, else 0 (any)."""
    try:
        port = int(json.loads((data_dir / PORTS_FILE).read_text(encoding="utf-8"))["upstream"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    if not 0 < port < 65536:
        return 0
    if port_is_free(port):
        return port
    print(
        f"tasknet-demo: the upstream's port {port} of the last run is taken: downloads"
        " of the last run not finished yet will fail until it is free",
        file=sys.stderr,
    )
    return 0


def remember_upstream_port(data_dir: Path, port: int) -> None:
    (data_dir / PORTS_FILE).write_text(json.dumps({"upstream": port}) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    temp = args.data is None
    data_dir = Path(tempfile.mkdtemp(prefix="tasknet-demo-")) if temp else args.data.resolve()
    port = args.port
    if port and not port_is_free(port):
        print(f"port {port} is busy; using a free port instead", file=sys.stderr)
        port = 0
    second_port = 0
    if args.postgres and port and port < 65535 and port_is_free(port + 1):
        second_port = port + 1
    stack = DemoStack(
        data_dir,
        http_port=port,
        bandwidth=args.bandwidth or None,
        ready_timeout=args.timeout,
        postgres=args.postgres,
        ha=args.ha,
        nodes=HA_NODES if args.ha else DEFAULT_NODES,
        second_http_port=second_port,
        upstream_port=0 if temp else remembered_upstream_port(data_dir),
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Ctrl-C must stop the demo even when started from a shell that made
    # SIGINT ignored for it (a background job of a script inherits SIG_IGN).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    again = not temp and any(data_dir.iterdir()) if data_dir.is_dir() else False
    print(
        f"starting tasknet demo in {data_dir}"
        f"{' (again: what it holds is kept)' if again else ''} ...",
        flush=True,
    )
    # --ha: a site whose lease died with the primary exits; it is started
    # again, as its supervisor would in a deployment.
    supervisor = Supervisor(stack, restart=args.restart_children or args.ha)
    try:
        stack.start()
        if not temp:
            remember_upstream_port(data_dir, stack.upstream_port)
        print(_banner(stack, temporary=temp), flush=True)
        while True:
            supervisor.poll()
            time.sleep(0.5)
    except DemoError as error:
        print(f"tasknet-demo: {error}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Stop):
        print("stopping ...", flush=True)
        return 0
    finally:
        # Ignore further Ctrl-C while the children shut down in order.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
        if temp:
            shutil.rmtree(data_dir, ignore_errors=True)
        print("stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
