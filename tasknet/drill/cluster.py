"""One drill's system under test: upstream, site, nodes, fault proxies, webhook.

Everything is a real process on loopback ports in a directory of its own
under the drill's root.  Each node dials the site through its own
:class:`FaultProxy` (run on the drill's reactor thread), so a fault can hit
one node's link without touching the others.  All calls here are blocking and
bounded.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasknet.cli.jsonhttp import Reply, request
from tasknet.drill import reactor_thread
from tasknet.drill.invariants import Ledger, World
from tasknet.drill.netns import SITE_ADDR, Netns
from tasknet.drill.procs import DrillError, Proc, address_in_use, wait_for
from tasknet.drill.proxy import FaultProxy
from tasknet.drill.snapshot import read_node, read_site
from tasknet.drill.webhook import WebhookSink
from tasknet.process import free_port

ADMIN_TOKEN = "demo"  # created by `tasknet-site --demo` on a fresh database
NODE_IDS = ("n1", "n2", "n3", "n4")
START_TIMEOUT = 30.0
ARCHIVE_POST = "/api/galleries/*/archive"
START_ATTEMPTS = 3


def node_secret(node_id: str) -> str:
    return f"drill-secret-{node_id}"


@dataclass
class Node:
    id: str
    proc: Proc
    proxy: FaultProxy
    data: Path
    protocol: int

    def call(self, method: str | Callable[..., Any], *args: Any) -> Any:
        """Run a proxy method (by name: delay, drop, cut_after, blackhole, heal...) or
        any function on the reactor thread, where the proxy lives."""
        fn = getattr(self.proxy, method) if isinstance(method, str) else method
        return reactor_thread.call(fn, *args)


class Cluster:
    def __init__(self, root: Path, netns: Netns | None = None) -> None:
        self.root = root
        self.netns = netns
        # Where the upstream and the node listener bind: loopback, or the site
        # namespace's veth address so that nodes in the other namespace reach them.
        self.site_host = SITE_ADDR if netns else "127.0.0.1"
        self.root.mkdir(parents=True, exist_ok=True)
        self.upstream: Proc | None = None
        self.upstream_port = 0
        self.site: Proc | None = None
        self.http_port = 0
        self.nodes_port = 0
        self.site_db = self.root / "site" / "site.sqlite"
        self.nodes: dict[str, Node] = {}
        self.webhook: WebhookSink | None = None
        self.ledger = Ledger()
        self.helpers: list[subprocess.Popen[bytes]] = []

    # -- processes -----------------------------------------------------------

    def _proc(self, name: str, plugin: str, args: list[str], *, site_side: bool) -> Proc:
        proc = Proc(name, plugin, args, self.root / name)
        if self.netns is not None:
            ns = self.netns.site if site_side else self.netns.nodes
            proc.prefix = self.netns.exec_prefix(ns)
        return proc

    def _request(self, method: str, url: str, body: Any = None, **kw: Any) -> Reply:
        if self.netns is not None:
            return self.netns.in_site(request, method, url, body, **kw)
        return request(method, url, body, **kw)

    def _start(self, proc: Proc, ready: Callable[[], bool], what: str) -> None:
        proc.start()
        proc.wait_ready(ready, START_TIMEOUT, what)

    def start_upstream(self, bandwidth: int | None = None) -> None:
        for attempt in range(START_ATTEMPTS):
            self.upstream_port = free_port()
            args = ["--http", f"tcp:{self.upstream_port}:interface={self.site_host}"]
            if bandwidth:
                args += ["--bandwidth", str(bandwidth)]
            self.upstream = self._proc("upstream", "tasknet-upstream", args, site_side=True)
            try:
                self._start(self.upstream, lambda: self.up("GET", "/_drill/stats").ok, "HTTP")
                return
            except DrillError:
                if attempt + 1 < START_ATTEMPTS and address_in_use(self.upstream):
                    continue
                raise

    def start_site(
        self,
        *,
        upstream_timeout: float = 3.0,
        webhook: bool = True,
        extra: Iterable[str] = (),
    ) -> None:
        """Start the site on a fresh database (keys for n1..n4, admin token ``demo``)."""
        if self.webhook is None and webhook:
            if self.netns is not None:  # the receiver must live where the site is
                self.webhook = self.netns.in_site(lambda: WebhookSink().start())
            else:
                self.webhook = WebhookSink().start()
        for attempt in range(START_ATTEMPTS):
            self.http_port, self.nodes_port = free_port(), free_port()
            args = [
                "--db",
                str(self.site_db),
                "--http",
                f"tcp:{self.http_port}:interface=127.0.0.1",
                "--nodes",
                f"tcp:{self.nodes_port}:interface={self.site_host}",
                "--upstream",
                self.upstream_url,
                "--upstream-timeout",
                str(upstream_timeout),
                "--name",
                "drill-site",
                "--demo",
                *extra,
            ]
            for node_id in NODE_IDS:
                args += ["--node-key", f"{node_id}:{node_secret(node_id)}"]
            if self.webhook is not None:
                args += ["--webhook", self.webhook.url]
            self.site = self._proc("site", "tasknet-site", args, site_side=True)
            try:
                self._start(self.site, lambda: self.healthz().status == 200, "/healthz")
                return
            except DrillError:
                if attempt + 1 < START_ATTEMPTS and address_in_use(self.site):
                    continue
                raise

    def restart_site(self, *, kill: bool = True, wait_ready: bool = True) -> None:
        """SIGKILL (or SIGTERM) the site and start it again on the same ports and database."""
        site = self._site()
        if kill:
            site.kill()
        else:
            site.terminate()
        site.start()
        if wait_ready:
            site.wait_ready(lambda: self.healthz().status == 200, START_TIMEOUT, "/healthz")

    def start_node(
        self,
        node_id: str,
        *,
        protocol: int = 2,
        ack_timeout: float = 1.0,
        downloads: int = 4,
        wait: bool = True,
    ) -> Node:
        if node_id not in NODE_IDS:
            raise DrillError(f"node id must be one of {NODE_IDS}")
        proxy = FaultProxy(self.site_host, self.nodes_port, reactor=reactor_thread.reactor)
        reactor_thread.call(proxy.start)
        data = self.root / node_id / "data"
        args = [
            "--connect",
            f"tcp:127.0.0.1:{proxy.port}",
            "--node-id",
            node_id,
            "--secret",
            node_secret(node_id),
            "--data",
            str(data),
            "--protocol",
            str(protocol),
            "--downloads",
            str(downloads),
            "--ack-timeout",
            str(ack_timeout),
        ]
        proc = self._proc(node_id, "tasknet-node", args, site_side=False)
        node = Node(node_id, proc, proxy, data, protocol)
        self.nodes[node_id] = node
        proc.start()
        if wait:
            self.wait_connected(node_id)
        return node

    def wait_connected(self, *node_ids: str, timeout: float = START_TIMEOUT) -> None:
        procs = [self.nodes[n].proc for n in node_ids] + [self._site()]
        wait_for(
            lambda: set(node_ids) <= self.connected_nodes(),
            timeout,
            f"node(s) {', '.join(node_ids)} logged in at the site",
            procs=procs,
        )

    def _site(self) -> Proc:
        if self.site is None:
            raise DrillError("the site was never started")
        return self.site

    # -- upstream ---------------------------------------------------------------

    @property
    def upstream_url(self) -> str:
        return f"http://{self.site_host}:{self.upstream_port}"

    def up(self, method: str, path: str, body: Any = None) -> Reply:
        return self._request(method, self.upstream_url + path, body, timeout=5)

    def upstream_fault(self, fault: str, *, times: int | None = 1, **params: Any) -> None:
        """Install one fault rule on the archive POST."""
        rule: dict[str, Any] = {
            "method": "POST",
            "path": ARCHIVE_POST,
            "fault": fault,
            "params": params,
            "times": times,
        }
        self.upstream_rules([rule])

    def upstream_rules(self, rules: list[dict[str, Any]]) -> None:
        reply = self.up("PUT", "/_drill/faults", {"rules": rules})
        if not reply.ok:
            raise DrillError(f"upstream refused fault rules {rules}: {reply.brief()}")

    def upstream_stats(self) -> dict[str, Any]:
        reply = self.up("GET", "/_drill/stats")
        if not reply.ok:
            raise DrillError(f"upstream /_drill/stats: {reply.brief()}")
        return dict(reply.body)

    def upstream_journal(self) -> list[dict[str, Any]]:
        reply = self.up("GET", "/_drill/journal")
        if not reply.ok:
            raise DrillError(f"upstream /_drill/journal: {reply.brief()}")
        return list(reply.body.get("entries", []))

    def posts(self, gid: int) -> int:
        return int(self.upstream_stats().get("posts", {}).get(str(gid), 0))

    # -- site API ---------------------------------------------------------------

    @property
    def site_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def api(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Reply:
        return self._request(method, self.site_url + path, body, token=ADMIN_TOKEN, timeout=timeout)

    def healthz(self) -> Reply:
        return self._request("GET", self.site_url + "/healthz", timeout=2)

    def in_site_namespace(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` where the site's addresses are reachable (a namespace thread)."""
        return self.netns.in_site(fn, *args) if self.netns is not None else fn(*args)

    def partition(self) -> None:
        """Cut the network between site and nodes (``--netns`` only: link down)."""
        if self.netns is None:
            raise DrillError("partitions by link down need --netns")
        self.netns.partition()

    def heal_partition(self) -> None:
        if self.netns is not None:
            self.netns.heal()

    def create(self, gid: int, timeout: float = 30) -> Reply:
        return self.api("POST", "/api/tasks", {"gid": gid, "token": "drill"}, timeout=timeout)

    def task(self, gid: int) -> dict[str, Any] | None:
        reply = self.api("GET", f"/api/tasks/{gid}")
        if reply.status == 404:
            return None
        if not reply.ok:
            raise DrillError(f"GET /api/tasks/{gid}: {reply.brief()}")
        return dict(reply.body["task"])

    def delete(self, gid: int) -> Reply:
        reply = self.api("DELETE", f"/api/tasks/{gid}")
        if reply.ok:
            self.ledger.delete_answered_at.setdefault(gid, time.time())
        return reply

    def resolve(self, gid: int, verdict: str) -> Reply:
        return self.api("POST", f"/api/admin/tasks/{gid}/resolve", {"verdict": verdict})

    def connected_nodes(self) -> set[str]:
        """Node ids logged in at the site (``/api/admin/nodes``)."""
        reply = self.api("GET", "/api/admin/nodes", timeout=3)
        if not reply.ok or not isinstance(reply.body, dict):
            return set()
        # The list keeps recently seen nodes too ("connected": false).
        nodes = reply.body.get("nodes", [])
        return {str(n.get("id")) for n in nodes if n.get("connected", True)}

    def site_state(self, gid: int) -> str | None:
        """The ``task_operation.state`` straight from the database (read-only)."""
        op = read_site(self.site_db).operations.get(gid)
        return None if op is None else str(op["state"])

    def completed_gids(self, gids: Iterable[int]) -> set[int]:
        """Those of ``gids`` the site's database shows 下载完成 (one read-only look)."""
        galleries = read_site(self.site_db).galleries
        return {g for g in gids if (galleries.get(g) or {}).get("status") == 4}

    def wait_state(self, gid: int, states: Iterable[str], timeout: float) -> str | None:
        wanted = set(states)
        seen: list[str | None] = [None]

        def check() -> bool:
            seen[0] = self.site_state(gid)
            return seen[0] in wanted

        try:
            wait_for(check, timeout, f"gid {gid} to reach {sorted(wanted)}", procs=[])
        except DrillError as err:
            raise DrillError(f"{err} (last state {seen[0]})") from None
        return seen[0]

    def wait_status(self, gid: int, status: str, timeout: float) -> None:
        last: list[Any] = [None]

        def check() -> bool:
            body = self.api("GET", f"/api/tasks/{gid}", timeout=3).body
            last[0] = body
            task = body.get("task") if isinstance(body, dict) else None
            return isinstance(task, dict) and task.get("status") == status

        try:
            wait_for(check, timeout, f"gid {gid} shown {status} at the site")
        except DrillError as err:
            raise DrillError(f"{err} (last answer {json.dumps(last[0])[:300]})") from None

    # -- node state ---------------------------------------------------------------

    def node_snapshot(self, node_id: str) -> Any:
        return read_node(node_id, self.nodes[node_id].data)

    # -- database faults (S6, S15) ----------------------------------------------------

    SABOTAGE = "drill_sabotage_recovery"

    def sabotage_recovery(self, on: bool) -> None:
        """Install (or remove) a trigger that makes any write to UNKNOWN abort.

        Recovery's first write (``SUBMITTING`` -> ``UNKNOWN``) then fails, which
        is the "recovery made to fail" of S15.  Only done while the site is
        stopped: the drill never writes to a database a live site is using.
        """
        if self.site is not None and self.site.alive:
            raise DrillError("refusing to edit the site database while the site runs")
        conn = sqlite3.connect(self.site_db, timeout=10)
        try:
            if on:
                conn.execute(
                    f"CREATE TRIGGER IF NOT EXISTS {self.SABOTAGE} BEFORE UPDATE OF state"
                    " ON task_operation WHEN NEW.state = 'UNKNOWN'"
                    " BEGIN SELECT RAISE(ABORT, 'drill: recovery sabotaged (S15)'); END"
                )
            else:
                conn.execute(f"DROP TRIGGER IF EXISTS {self.SABOTAGE}")
            conn.commit()
        finally:
            conn.close()

    # -- the database-lock helper (S6) -----------------------------------------------

    def lock_site_db(self, seconds: float) -> subprocess.Popen[bytes]:
        """Start ``tasknet.drill.dblock`` on the site database; return once it holds the lock."""
        ready = self.root / f"dblock-{len(self.helpers)}.ready"
        helper = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tasknet.drill.dblock",
                "--db",
                str(self.site_db),
                "--seconds",
                str(seconds),
                "--ready-file",
                str(ready),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.helpers.append(helper)

        def locked() -> bool:
            if helper.poll() is not None:
                err = helper.stderr.read().decode() if helper.stderr else ""
                raise DrillError(f"dblock exited early ({helper.returncode}): {err}")
            return ready.exists()

        wait_for(locked, 15, "dblock to hold the site database lock")
        return helper

    # -- evidence ---------------------------------------------------------------------

    def observe(self) -> World:
        frames: list[dict[str, Any]] = []
        for node in self.nodes.values():
            records = reactor_thread.call(lambda p=node.proxy: [r.to_json() for r in p.records])
            frames += [{**r, "node": node.id} for r in records]
        return World(
            site=read_site(self.site_db),
            nodes={n.id: read_node(n.id, n.data) for n in self.nodes.values()},
            node_dirs={n.id: n.data for n in self.nodes.values()},
            upstream_stats=self.upstream_stats(),
            journal=self.upstream_journal(),
            frames=frames,
            webhook=self.webhook.bodies() if self.webhook is not None else None,
            ledger=self.ledger,
        )

    def proxy_stats(self) -> dict[str, Any]:
        return {n.id: reactor_thread.call(n.proxy.stats) for n in self.nodes.values()}

    def logs(self) -> dict[str, str]:
        procs = [p for p in (self.upstream, self.site) if p is not None]
        procs += [n.proc for n in self.nodes.values()]
        return {p.name: str(p.log) for p in procs}

    def shutdown(self) -> None:
        """Stop everything this cluster started (processes, proxies, helpers, webhook)."""
        self.heal_partition()
        for helper in self.helpers:
            if helper.poll() is None:
                helper.kill()
                helper.wait(5)
            if helper.stderr is not None:
                helper.stderr.close()
        for node in self.nodes.values():
            node.proc.terminate(5)
        if self.site is not None:
            self.site.terminate(5)
        if self.upstream is not None:
            self.upstream.terminate(5)
        for node in self.nodes.values():
            reactor_thread.call(node.proxy.stop)
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None
