"""``tasknet-demo``: upstream + site + two nodes on loopback, one command.

Starts real ``twistd -n`` children (the mock upstream, a site with ``--demo``
on an embedded SQLite file, a v2 node ``node-1`` and a legacy ``--protocol 1``
node ``node-2``) on free loopback ports, waits until they are ready, prints
the URL and the demo token, and stops them all (nodes first, upstream last)
on Ctrl-C or SIGTERM.

``--postgres``: a throwaway PostgreSQL server (``tasknet.drill.pgserver``)
in the data directory and two sites on one database of it (``site-1``,
``site-2``: own ``--name``, HTTP and node ports), each node given both sites
with ``--connect`` (node-1 site-1 first, node-2 site-2 first), so each site
holds one node and each site's node list shows both; the server stops last.

:class:`DemoStack` is plain synchronous code (subprocess + blocking HTTP, no
reactor), so tests that must not run a reactor in-process (the Playwright
browser test) start the same stack with it.
"""

from __future__ import annotations

import argparse
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

DEMO_TOKEN = "demo"
#: The database the ``--postgres`` demo's sites share.
POSTGRES_DATABASE = "tasknet"
STOP_TIMEOUT = 15.0
# One readiness probe; the waits around it have their own, longer deadline.
PROBE_TIMEOUT = 5.0


class DemoError(Exception):
    """The demo could not start (a child died, a wait timed out)."""


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    protocol: int
    secret: str


DEFAULT_NODES = (
    NodeSpec("node-1", 2, "demo-secret-node-1"),
    NodeSpec("node-2", 1, "demo-secret-node-2"),
)


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
    second_http_port: int = 0
    children: list[Child] = field(default_factory=list)
    sites: list[SiteSpec] = field(default_factory=list)
    upstream_port: int = 0
    nodes_port: int = 0
    server: ThrowawayPostgres | None = None
    database_url: str | None = None

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
        logs = self.data_dir / "logs"
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
        self.upstream_port = free_port()
        self.nodes_port = free_port()
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
        server = ThrowawayPostgres(base_dir=str(self.data_dir / "postgres"))
        try:
            server.start()
        except (PostgresNotInstalled, PostgresFailed) as error:
            raise DemoError(f"--postgres: {error}") from error
        self.server = server
        self.database_url = server.create_database(POSTGRES_DATABASE)

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
            database = str(self.data_dir / name / "tasknet-site.sqlite")
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
        PostgreSQL server (which removes its directory)."""
        for child in reversed(self.children):
            child.stop(STOP_TIMEOUT)
        server, self.server = self.server, None
        if server is not None:
            server.stop()

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


class _Stop(Exception):
    """Raised by the SIGTERM handler so the main loop unwinds like Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tasknet-demo",
        description="Run the mock upstream, a site and two nodes (v2 and legacy) on loopback.",
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="two sites on one throwaway PostgreSQL database (started in the data directory,"
        " which the postgres user must be able to reach when run as root), each node"
        " connected with both; the second site's port is --port + 1 when that is free",
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="directory for databases and logs (default: a new temp dir, removed on exit)",
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
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be 0..65535")
    if args.bandwidth < 0:
        parser.error("--bandwidth must be >= 0")
    return args


def _banner(stack: DemoStack) -> str:
    if not stack.postgres:
        nodes = ", ".join(f"{n.node_id} (protocol {n.protocol})" for n in stack.nodes)
        lines = [
            "tasknet demo is ready",
            f"  URL: {stack.url}",
            f"  token: {DEMO_TOKEN}",
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
        lines = [
            "tasknet demo is ready: two sites on one PostgreSQL database",
            *(f"  URL: {site.url}  ({site.name})" for site in stack.sites),
            f"  token: {DEMO_TOKEN}",
            f"  database: {stack.database_url}",
            f"  upstream: {stack.upstream_url}",
            f"  nodes: {nodes}",
        ]
    lines += [f"  logs: {stack.data_dir / 'logs'}", "Press Ctrl-C to stop."]
    return "\n".join(lines)


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
        second_http_port=second_port,
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Ctrl-C must stop the demo even when started from a shell that made
    # SIGINT ignored for it (a background job of a script inherits SIG_IGN).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"starting tasknet demo in {data_dir} ...", flush=True)
    try:
        stack.start()
        print(_banner(stack), flush=True)
        while True:
            if stack.server_died():
                print("the PostgreSQL server exited unexpectedly", file=sys.stderr)
                return 1
            dead = stack.dead_children()
            if dead:
                for child in dead:
                    print(
                        f"{child.name} exited unexpectedly; its log ends with:\n{child.log_tail()}",
                        file=sys.stderr,
                    )
                return 1
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
