"""``tasknet-demo``: upstream + site + two nodes on loopback, one command.

Starts real ``twistd -n`` children (the mock upstream, a site with ``--demo``
on an embedded SQLite file, a v2 node ``node-1`` and a legacy ``--protocol 1``
node ``node-2``) on free loopback ports, waits until they are ready, prints
the URL and the demo token, and stops them all (nodes first, upstream last)
on Ctrl-C or SIGTERM.

:class:`DemoStack` is plain synchronous code (subprocess + blocking HTTP, no
reactor), so tests that must not run a reactor in-process (the Playwright
browser test) start the same stack with it.
"""

from __future__ import annotations

import argparse
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
from tasknet.logging import twistd_logger_args
from tasknet.process import LOOPBACK, Child, free_port, port_is_free, twistd_command

DEMO_TOKEN = "demo"
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
class DemoStack:
    """Upstream, site and nodes as real processes under ``data_dir``."""

    data_dir: Path
    http_port: int = 0
    bandwidth: int | None = 150_000
    nodes: Sequence[NodeSpec] = DEFAULT_NODES
    upstream_timeout: float | None = None
    ready_timeout: float = 60.0
    children: list[Child] = field(default_factory=list)
    upstream_port: int = 0
    nodes_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}/"

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
        try:
            self._start_upstream()
            self._start_site()
            for spec in self.nodes:
                self._start_node(spec)
            self._wait_nodes()
        except BaseException:
            self.stop()
            raise

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

    def _start_site(self) -> None:
        args = [
            "--db",
            str(self.data_dir / "site" / "tasknet-site.sqlite"),
            "--http",
            f"tcp:{self.http_port}:interface={LOOPBACK}",
            "--nodes",
            f"tcp:{self.nodes_port}:interface={LOOPBACK}",
            "--upstream",
            self.upstream_url,
            "--demo",
        ]
        for spec in self.nodes:
            args += ["--node-key", f"{spec.node_id}:{spec.secret}"]
        if self.upstream_timeout is not None:
            args += ["--upstream-timeout", str(self.upstream_timeout)]
        site = self._twistd("site", "tasknet-site", args)
        self._wait("the site's /healthz", lambda: self.health() is not None, site)

    def _start_node(self, spec: NodeSpec) -> None:
        args = [
            "--connect",
            f"tcp:{LOOPBACK}:{self.nodes_port}",
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
            lambda: wanted <= self.connected_nodes(),
            *self.children,
        )

    def health(self) -> dict[str, Any] | None:
        reply = request("GET", f"{self.url}healthz", timeout=PROBE_TIMEOUT)
        return reply.body if reply.status == 200 and isinstance(reply.body, dict) else None

    def connected_nodes(self) -> set[str]:
        reply = request(
            "GET", f"{self.url}api/admin/nodes", token=DEMO_TOKEN, timeout=PROBE_TIMEOUT
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

    def stop(self) -> None:
        """Stop nodes first, then the site, then the upstream."""
        for child in reversed(self.children):
            child.stop(STOP_TIMEOUT)

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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    temp = args.data is None
    data_dir = Path(tempfile.mkdtemp(prefix="tasknet-demo-")) if temp else args.data.resolve()
    port = args.port
    if port and not port_is_free(port):
        print(f"port {port} is busy; using a free port instead", file=sys.stderr)
        port = 0
    stack = DemoStack(
        data_dir, http_port=port, bandwidth=args.bandwidth or None, ready_timeout=args.timeout
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Ctrl-C must stop the demo even when started from a shell that made
    # SIGINT ignored for it (a background job of a script inherits SIG_IGN).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"starting tasknet demo in {data_dir} ...", flush=True)
    try:
        stack.start()
        nodes = ", ".join(f"{n.node_id} (protocol {n.protocol})" for n in stack.nodes)
        print(
            "tasknet demo is ready\n"
            f"  URL: {stack.url}\n"
            f"  token: {DEMO_TOKEN}\n"
            f"  upstream: {stack.upstream_url}\n"
            f"  nodes: {nodes}\n"
            f"  logs: {data_dir / 'logs'}\n"
            "Press Ctrl-C to stop.",
            flush=True,
        )
        while True:
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
