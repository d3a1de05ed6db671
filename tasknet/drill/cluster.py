"""One drill's system under test: upstream, site(s), nodes, fault proxies, webhook.

Everything is a real process on loopback ports in a directory of its own
under the drill's root.  The sites share one database: a SQLite file (one
site; a second one is refused) or a PostgreSQL database (several sites,
SCALE.md), given as :class:`SiteDatabase`.  Each node dials its sites (one
``--connect`` per site, in the order the scenario chooses) through a
:class:`FaultProxy` per (node, site) (run on the drill's reactor thread), so
a fault can hit one link of one node without touching the others.  All
calls here are blocking and bounded.

A site can be started with extra environment variables (``env=``): the
site's fault points (:mod:`tasknet.site.fault_points`) are armed that way.
S23's helpers wait for a site to stop itself at one
(:meth:`Cluster.wait_paused`), end its lease by hand
(:meth:`Cluster.end_lease`), log every row the sites write with the session
that wrote it (:meth:`Cluster.log_writes`), and continue it
(:meth:`Cluster.continue_site`).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasknet.cli.jsonhttp import Reply, request
from tasknet.drill import reactor_thread
from tasknet.drill.invariants import Ledger, World
from tasknet.drill.netns import SITE_ADDR, Netns
from tasknet.drill.procs import (
    DrillError,
    Proc,
    TcpConnection,
    address_in_use,
    tcp_connections,
    wait_for,
)
from tasknet.drill.proxy import FaultProxy
from tasknet.drill.snapshot import read_node, read_site, site_rows
from tasknet.drill.webhook import WebhookSink
from tasknet.process import free_port
from tasknet.site.fault_points import PAUSE_BEFORE_POST
from tasknet.site.storage.engine.database import POSTGRESQL, SQLITE, backend_of
from tasknet.site.storage.lease import application_name

ADMIN_TOKEN = "demo"  # created by `tasknet-site --demo` on a fresh database
NODE_IDS = ("n1", "n2", "n3", "n4")
START_TIMEOUT = 30.0
ARCHIVE_POST = "/api/galleries/*/archive"
START_ATTEMPTS = 3
#: The --name of the first site a scenario starts (the one every call
#: without ``site=`` talks to).
PRIMARY = "drill-site"
#: Where :meth:`Cluster.log_writes` logs the rows the sites write (a schema
#: of its own: the sites' table listings never see it).
WRITE_LOG = "drill_audit.write_log"


def node_secret(node_id: str) -> str:
    return f"drill-secret-{node_id}"


@dataclass
class SiteDatabase:
    """The database the sites of one run share.

    ``target``: the sites' ``--db`` (a SQLite path or a PostgreSQL URL).
    ``admin``: runs one SQL statement on that database with more rights
    than the sites have (PostgreSQL; S15 takes the sites' privileges away),
    None when there is no such role."""

    target: str
    admin: Callable[[str], None] | None = None
    #: The role the sites connect as (PostgreSQL), for GRANT/REVOKE.
    role: str | None = None
    #: The failover cluster behind ``target`` (``--db postgres-ha``: a
    #: :class:`~tasknet.drill.pgcluster.PgCluster`), None on one server.
    failover: Any = None

    @property
    def backend(self) -> str:
        return backend_of(self.target)


@dataclass
class Site:
    """One ``tasknet-site`` process of the run (restartable on its ports)."""

    name: str  # its --name
    proc: Proc
    http_port: int
    nodes_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def alive(self) -> bool:
        return self.proc.alive


@dataclass
class Node:
    id: str
    proc: Proc
    # site --name -> the proxy this node dials that site through, in dialling order.
    proxies: dict[str, FaultProxy]
    data: Path
    protocol: int
    sites: tuple[str, ...] = field(default=())

    @property
    def proxy(self) -> FaultProxy:
        """The proxy to the node's first site."""
        return self.proxies[self.sites[0]]

    def call(self, method: str | Callable[..., Any], *args: Any, site: str | None = None) -> Any:
        """Run a proxy method (by name: delay, drop, cut_after, blackhole,
        forsake, heal...) of the proxy to ``site`` (default: the first), or
        any function, on the reactor thread, where the proxies live."""
        if isinstance(method, str):
            fn = getattr(self.proxies[site or self.sites[0]], method)
        else:
            fn = method
        return reactor_thread.call(fn, *args)

    def open_links(self) -> dict[str, int]:
        """site --name -> connections open through its proxy."""
        return reactor_thread.call(lambda: {s: p.open_links() for s, p in self.proxies.items()})

    def linked_site(self) -> str | None:
        """The one site this node has an open connection to (None: none, or several)."""
        linked = [s for s, n in self.open_links().items() if n]
        return linked[0] if len(linked) == 1 else None


class Cluster:
    def __init__(
        self, root: Path, netns: Netns | None = None, database: SiteDatabase | None = None
    ) -> None:
        self.root = root
        self.netns = netns
        # Where the upstream and the node listener bind: loopback, or the site
        # namespace's veth address so that nodes in the other namespace reach them.
        self.site_host = SITE_ADDR if netns else "127.0.0.1"
        self.root.mkdir(parents=True, exist_ok=True)
        self.database = database or SiteDatabase(str(self.root / "site" / "site.sqlite"))
        self.upstream: Proc | None = None
        self.upstream_port = 0
        self.sites: dict[str, Site] = {}
        self.nodes: dict[str, Node] = {}
        self.webhook: WebhookSink | None = None
        self.ledger = Ledger()
        self.helpers: list[subprocess.Popen[bytes]] = []
        #: Called first at :meth:`shutdown`, whatever the scenario did: a
        #: drill's own threads that act on the processes (a supervisor
        #: restarting sites) stop before the processes do.
        self.stoppers: list[Callable[[], None]] = []

    # -- the database -----------------------------------------------------------

    @property
    def db(self) -> str:
        """The sites' ``--db`` (a SQLite path or a PostgreSQL URL)."""
        return self.database.target

    @property
    def backend(self) -> str:
        return self.database.backend

    @property
    def site_db(self) -> Path:
        """The SQLite file (SQLite only: a scenario's file-level fault)."""
        if self.backend != SQLITE:
            raise DrillError(f"the site database is {self.backend}, not a SQLite file")
        return Path(self.db)

    def db_exists(self) -> bool:
        return self.backend == POSTGRESQL or Path(self.db).exists()

    # -- processes -----------------------------------------------------------

    def _proc(
        self,
        name: str,
        plugin: str,
        args: list[str],
        *,
        site_side: bool,
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        proc = Proc(name, plugin, args, self.root / name, env=env)
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
        name: str | None = None,
        *,
        upstream_timeout: float = 3.0,
        webhook: bool = True,
        extra: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Site:
        """Start a site on the run's database (keys for n1..n4, admin token
        ``demo``): the first is :data:`PRIMARY`, a later one (PostgreSQL:
        several sites on one database) has ports and ``--name`` of its own.
        ``env``: variables added to its environment (a fault point)."""
        name = name or (PRIMARY if not self.sites else f"drill-site-{len(self.sites) + 1}")
        if name in self.sites:
            raise DrillError(f"site {name} was already started")
        if self.webhook is None and webhook:
            if self.netns is not None:  # the receiver must live where the site is
                self.webhook = self.netns.in_site(lambda: WebhookSink().start())
            else:
                self.webhook = WebhookSink().start()
        # The first site keeps the directory (and log name) "site".
        directory = "site" if not self.sites else name
        for attempt in range(START_ATTEMPTS):
            http_port, nodes_port = free_port(), free_port()
            args = [
                "--db",
                self.db,
                "--http",
                f"tcp:{http_port}:interface=127.0.0.1",
                "--nodes",
                f"tcp:{nodes_port}:interface={self.site_host}",
                "--upstream",
                self.upstream_url,
                "--upstream-timeout",
                str(upstream_timeout),
                "--name",
                name,
                "--demo",
                *extra,
            ]
            for node_id in NODE_IDS:
                args += ["--node-key", f"{node_id}:{node_secret(node_id)}"]
            if self.webhook is not None:
                args += ["--webhook", self.webhook.url]
            proc = self._proc(directory, "tasknet-site", args, site_side=True, env=env)
            site = Site(name, proc, http_port, nodes_port)
            self.sites[name] = site
            try:
                self._start(proc, functools.partial(self._healthy, name), "/healthz")
                return site
            except DrillError:
                if attempt + 1 < START_ATTEMPTS and address_in_use(site.proc):
                    del self.sites[name]
                    continue
                raise
        raise DrillError(f"site {name} did not start")  # pragma: no cover - loop returns/raises

    def _healthy(self, name: str) -> bool:
        return self.healthz(name).status == 200

    def _site_named(self, name: str | None) -> Site:
        if name is None:
            if PRIMARY in self.sites:
                return self.sites[PRIMARY]
            if not self.sites:
                raise DrillError("the site was never started")
            return next(iter(self.sites.values()))
        try:
            return self.sites[name]
        except KeyError:
            raise DrillError(f"no site {name} (started: {', '.join(self.sites)})") from None

    def restart_site(
        self, *, kill: bool = True, wait_ready: bool = True, name: str | None = None
    ) -> None:
        """SIGKILL (or SIGTERM) a site and start it again on the same ports and database."""
        self.stop_site(name, kill=kill)
        self.resume_site(name, wait_ready=wait_ready)

    def stop_site(self, name: str | None = None, *, kill: bool = True) -> Site:
        """SIGKILL (or SIGTERM) one site (default: the primary)."""
        site = self._site_named(name)
        if kill:
            site.proc.kill()
        else:
            site.proc.terminate()
        return site

    def resume_site(
        self,
        name: str | None = None,
        *,
        wait_ready: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> Site:
        """Start a stopped site again, on its ports and the same database
        (``env``: its extra environment from now on, else the last one)."""
        site = self._site_named(name)
        if env is not None:
            site.proc.env = dict(env)
        site.proc.start()
        if wait_ready:
            site.proc.wait_ready(
                lambda: self.healthz(site.name).status == 200, START_TIMEOUT, "/healthz"
            )
        return site

    def live_sites(self) -> list[Site]:
        return [s for s in self.sites.values() if s.alive]

    @property
    def site(self) -> Proc | None:
        """The primary site's process (None before it is started)."""
        return self._site_named(None).proc if self.sites else None

    @property
    def http_port(self) -> int:
        return self._site_named(None).http_port if self.sites else 0

    @property
    def nodes_port(self) -> int:
        return self._site_named(None).nodes_port if self.sites else 0

    def start_node(
        self,
        node_id: str,
        *,
        protocol: int = 2,
        ack_timeout: float = 1.0,
        downloads: int = 4,
        wait: bool = True,
        sites: Iterable[str] | None = None,
        extra: Iterable[str] = (),
    ) -> Node:
        """Start a node dialling ``sites`` in that order (default: the
        primary), each through a fault proxy of its own; ``extra``: more
        options (``--disk-budget``, ``--serve``, ...)."""
        if node_id not in NODE_IDS:
            raise DrillError(f"node id must be one of {NODE_IDS}")
        order = tuple(sites) if sites is not None else (self._site_named(None).name,)
        if not order or len(set(order)) != len(order):
            raise DrillError(f"sites to dial must be distinct and at least one: {order}")
        proxies: dict[str, FaultProxy] = {}
        for site_name in order:
            site = self._site_named(site_name)
            proxy = FaultProxy(self.site_host, site.nodes_port, reactor=reactor_thread.reactor)
            reactor_thread.call(proxy.start)
            proxies[site_name] = proxy
        data = self.root / node_id / "data"
        args: list[str] = []
        for proxy in proxies.values():
            args += ["--connect", f"tcp:127.0.0.1:{proxy.port}"]
        args += [
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
            *extra,
        ]
        proc = self._proc(node_id, "tasknet-node", args, site_side=False)
        node = Node(node_id, proc, proxies, data, protocol, order)
        self.nodes[node_id] = node
        proc.start()
        if wait:
            self.wait_connected(node_id)
        return node

    def wait_connected(
        self, *node_ids: str, timeout: float = START_TIMEOUT, site: str | None = None
    ) -> None:
        """Wait until the nodes are logged in (at ``site``, when given;
        anywhere otherwise)."""
        procs = [self.nodes[n].proc for n in node_ids] + [s.proc for s in self.live_sites()]

        def ready() -> bool:
            held = self.holders()
            return all(n in held and (site is None or held[n] == site) for n in node_ids)

        where = f"at {site}" if site else "at the site"
        wait_for(ready, timeout, f"node(s) {', '.join(node_ids)} logged in {where}", procs=procs)

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
        return self._site_named(None).url

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 30,
        site: str | None = None,
    ) -> Reply:
        """A request as the admin to ``site`` (default: the primary)."""
        url = self._site_named(site).url + path
        return self._request(method, url, body, token=ADMIN_TOKEN, timeout=timeout)

    def healthz(self, site: str | None = None) -> Reply:
        return self._request("GET", self._site_named(site).url + "/healthz", timeout=2)

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

    def create(self, gid: int, timeout: float = 30, site: str | None = None) -> Reply:
        return self.api("POST", "/api/tasks", {"gid": gid, "token": "drill"}, timeout, site)

    def create_with_headers(
        self, gid: int, timeout: float = 30, site: str | None = None
    ) -> tuple[Reply, dict[str, str]]:
        """:meth:`create`, and the answer's headers (lower-case names:
        ``retry-after`` of a ``503``), for the failover drills' load."""
        url = self._site_named(site).url + "/api/tasks"
        body = {"gid": gid, "token": "drill"}
        if self.netns is not None:
            return self.netns.in_site(_request_with_headers, "POST", url, body, timeout=timeout)  # type: ignore[no-any-return]
        return _request_with_headers("POST", url, body, timeout=timeout)

    def metrics_text(self, site: str | None = None) -> str | None:
        """``/metrics`` of ``site`` (None: no answer)."""
        url = self._site_named(site).url + "/metrics"
        reply = self._request("GET", url, token=ADMIN_TOKEN, timeout=3)
        return reply.text if reply.status == 200 else None

    def task(self, gid: int, site: str | None = None) -> dict[str, Any] | None:
        reply = self.api("GET", f"/api/tasks/{gid}", site=site)
        if reply.status == 404:
            return None
        if not reply.ok:
            raise DrillError(f"GET /api/tasks/{gid}: {reply.brief()}")
        return dict(reply.body["task"])

    def delete(self, gid: int, site: str | None = None) -> Reply:
        reply = self.api("DELETE", f"/api/tasks/{gid}", site=site)
        if reply.ok:
            self.ledger.delete_answered_at.setdefault(gid, time.time())
        return reply

    def resolve(self, gid: int, verdict: str, site: str | None = None) -> Reply:
        return self.api("POST", f"/api/admin/tasks/{gid}/resolve", {"verdict": verdict}, site=site)

    def resolve_with_headers(
        self, gid: int, verdict: str, site: str | None = None
    ) -> tuple[Reply, dict[str, str]]:
        """:meth:`resolve`, and the answer's headers (lower-case names:
        ``retry-after`` of a ``verdict_too_early``)."""
        url = self._site_named(site).url + f"/api/admin/tasks/{gid}/resolve"
        body = {"verdict": verdict}
        if self.netns is not None:
            return self.netns.in_site(_request_with_headers, "POST", url, body)  # type: ignore[no-any-return]
        return _request_with_headers("POST", url, body)

    def node_listing(self, site: str | None = None) -> list[dict[str, Any]] | None:
        """The ``nodes`` of ``/api/admin/nodes`` at ``site`` (None: no answer)."""
        reply = self.api("GET", "/api/admin/nodes", timeout=3, site=site)
        if not reply.ok or not isinstance(reply.body, dict):
            return None
        return list(reply.body.get("nodes", []))

    def holders(self, site: str | None = None) -> dict[str, str | None]:
        """Connected node id -> the ``--name`` of the site holding it, as
        ``site`` (default: the primary, or else any live site) lists them."""
        asked = site
        if asked is None:
            live = self.live_sites()
            primary = self.sites.get(PRIMARY)
            if primary is not None and primary.alive:
                asked = PRIMARY
            elif live:
                asked = live[0].name
            else:
                return {}
        nodes = self.node_listing(asked) or []
        # The list keeps recently seen nodes too ("connected": false).
        return {str(n.get("id")): n.get("site") for n in nodes if n.get("connected", True)}

    def connected_nodes(self, site: str | None = None) -> set[str]:
        """Node ids logged in at any site of the database (``/api/admin/nodes``)."""
        return set(self.holders(site))

    def holder_of(self, node_id: str, site: str | None = None) -> str | None:
        """The ``--name`` of the site holding ``node_id`` (None: not connected)."""
        return self.holders(site).get(node_id)

    def site_state(self, gid: int) -> str | None:
        """The ``task_operation.state`` straight from the database (read-only)."""
        rows = site_rows(self.db, "SELECT state FROM task_operation WHERE gid = ?", (gid,))
        return str(rows[0]["state"]) if rows else None

    def completed_gids(self, gids: Iterable[int]) -> set[int]:
        """Those of ``gids`` the site's database shows 下载完成 (one read-only look)."""
        rows = site_rows(self.db, "SELECT gid FROM gallery WHERE status = 4")
        done = {int(r["gid"]) for r in rows}
        return {g for g in gids if g in done}

    def instances(self) -> list[dict[str, Any]]:
        """The ``site_instance`` rows, oldest first (schema v4)."""
        return site_rows(self.db, "SELECT * FROM site_instance ORDER BY id")

    def instance_of(self, name: str | None = None) -> int | None:
        """The instance id of the running process of site ``name``."""
        site = self._site_named(name)
        mine = [r for r in self.instances() if r["name"] == site.name and r["pid"] == site.proc.pid]
        return int(mine[-1]["id"]) if mine else None

    def reaps(self) -> list[dict[str, Any]]:
        """The ``instance_reap`` rows (the D9 evidence), in order."""
        return site_rows(self.db, "SELECT * FROM instance_reap ORDER BY id")

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

    def wait_status(self, gid: int, status: str, timeout: float, site: str | None = None) -> None:
        last: list[Any] = [None]

        def check() -> bool:
            body = self.api("GET", f"/api/tasks/{gid}", timeout=3, site=site).body
            last[0] = body
            task = body.get("task") if isinstance(body, dict) else None
            return isinstance(task, dict) and task.get("status") == status

        try:
            wait_for(check, timeout, f"gid {gid} shown {status} at the site")
        except DrillError as err:
            raise DrillError(f"{err} (last answer {json.dumps(last[0])[:300]})") from None

    # -- a site stopped at a fault point, fenced by hand (S23) -------------------------

    def pause_before_post(self, label: str) -> tuple[Path, dict[str, str]]:
        """Arm the site fault point "pause before the POST"
        (:data:`~tasknet.site.fault_points.PAUSE_BEFORE_POST`): a fresh
        marker path under the run's directory and the environment that
        names it, for :meth:`start_site` or :meth:`resume_site`.  The site
        stops itself (``SIGSTOP``) the first time a POST's upstream
        connection is up, having written its pid to the marker."""
        marker = self.root / f"{label}.paused"
        if marker.exists():
            raise DrillError(f"marker {marker} exists already: it would never pause")
        return marker, {PAUSE_BEFORE_POST: str(marker)}

    def wait_paused(self, name: str, marker: Path, timeout: float) -> int:
        """Wait until site ``name`` has written its pid to ``marker`` and is
        stopped; its pid (the process the drill started, or DrillError)."""
        site = self._site_named(name)

        def paused() -> bool:
            text = marker.read_text().strip() if marker.exists() else ""
            return text.isdigit() and site.proc.stopped

        wait_for(paused, timeout, f"{name} to stop itself at its fault point", procs=[site.proc])
        pid = int(marker.read_text().strip())
        if pid != site.proc.pid:
            raise DrillError(f"{marker} names pid {pid}, but {name} runs as {site.proc.pid}")
        return pid

    def upstream_connections(self, name: str) -> list[TcpConnection]:
        """The TCP connections site ``name``'s process has established to the upstream."""
        pid = self._site_named(name).proc.pid
        if pid is None:
            return []
        return [
            conn
            for conn in tcp_connections(pid)
            if conn.remote[1] == self.upstream_port and conn.state == "ESTABLISHED"
        ]

    def continue_site(self, name: str) -> None:
        """SIGCONT a site that stopped itself: it resumes where it stopped."""
        self._site_named(name).proc.cont()

    def instance_row(self, instance_id: int) -> dict[str, Any] | None:
        rows = site_rows(self.db, "SELECT * FROM site_instance WHERE id = ?", (instance_id,))
        return rows[0] if rows else None

    def _require_postgres_admin(self, what: str) -> Callable[[str], None]:
        if self.backend != POSTGRESQL or self.database.admin is None:
            raise DrillError(f"{what} needs PostgreSQL with an administrative role")
        return self.database.admin

    def sessions_of(self, instance_id: int) -> list[dict[str, Any]]:
        """The PostgreSQL sessions of site instance ``instance_id`` (each
        site names its own ``tasknet-site#ID ROLE``: lease, writer, reader)."""
        return site_rows(
            self.db,
            "SELECT pid, application_name, state FROM pg_stat_activity"
            " WHERE application_name LIKE ? ORDER BY pid",
            (application_name(instance_id, "%"),),
        )

    def end_lease(self, name: str) -> dict[str, Any]:
        """The documented hand fence of a site's lease (PostgreSQL):
        ``pg_terminate_backend`` of the session that holds it (the
        instance's ``site_instance.lease_pid``, named ``tasknet-site#ID
        lease``), waiting until it is gone; any other site may then judge
        the instance gone and reap it.  The site's process run is noted
        fenced from just before (D9).  Returns the evidence: instance,
        lease pid, the instance's sessions before."""
        admin = self._require_postgres_admin("ending a lease")
        site = self._site_named(name)
        instance = self.instance_of(name)
        row = None if instance is None else self.instance_row(instance)
        if instance is None or row is None or row.get("lease_pid") is None:
            raise DrillError(f"{name} has no open instance with a lease session: {row}")
        lease_pid = int(row["lease_pid"])
        sessions = self.sessions_of(instance)
        lease_name = application_name(instance, "lease")
        named = [s["pid"] for s in sessions if s["application_name"] == lease_name]
        if named != [lease_pid]:
            raise DrillError(
                f"instance {instance}'s lease session is not pid {lease_pid}: {sessions}"
            )
        site.proc.note_fenced()  # from now on another site may take the lease
        admin(f"SELECT pg_terminate_backend({lease_pid}, 10000)")
        wait_for(
            lambda: all(s["pid"] != lease_pid for s in self.sessions_of(instance)),
            15,
            f"the lease session (pid {lease_pid}) of instance {instance} to end",
        )
        return {"instance": instance, "lease_pid": lease_pid, "sessions": sessions}

    def log_writes(self) -> None:
        """From now on, log every row written to the site database's tables
        (and every TRUNCATE) in :data:`WRITE_LOG`, with the session that
        wrote it (``application_name``, backend pid, transaction id).  The
        log row is written by a trigger in the writer's own transaction, so
        it exists exactly when that write committed: the evidence of
        "nothing a fenced site writes commits" (S23).  PostgreSQL only, with
        the administrative role; done once the sites have made the schema."""
        admin = self._require_postgres_admin("logging writes")
        role = self.database.role
        statements = [
            "CREATE SCHEMA drill_audit",
            f"CREATE TABLE {WRITE_LOG} ("
            " id BIGSERIAL PRIMARY KEY,"
            " at TEXT NOT NULL DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC',"
            ' \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'),'
            " application_name TEXT NOT NULL DEFAULT current_setting('application_name'),"
            " backend_pid INTEGER NOT NULL DEFAULT pg_backend_pid(),"
            " xid BIGINT NOT NULL DEFAULT txid_current(),"
            " table_name TEXT NOT NULL,"
            " op TEXT NOT NULL)",
            "CREATE FUNCTION drill_audit.log_write() RETURNS trigger LANGUAGE plpgsql"
            " SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $log$"
            " BEGIN INSERT INTO drill_audit.write_log (table_name, op)"
            " VALUES (TG_TABLE_NAME, TG_OP); RETURN NULL; END $log$",
            "DO $triggers$ DECLARE t text; BEGIN"
            " FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() LOOP"
            " EXECUTE format('CREATE TRIGGER drill_write_log AFTER INSERT OR UPDATE OR DELETE"
            " ON %I FOR EACH ROW EXECUTE FUNCTION drill_audit.log_write()', t);"
            " EXECUTE format('CREATE TRIGGER drill_write_log_truncate AFTER TRUNCATE"
            " ON %I FOR EACH STATEMENT EXECUTE FUNCTION drill_audit.log_write()', t);"
            " END LOOP; END $triggers$",
        ]
        if role:
            statements += [
                f'GRANT USAGE ON SCHEMA drill_audit TO "{role}"',
                f'GRANT SELECT ON {WRITE_LOG} TO "{role}"',
            ]
        for statement in statements:
            admin(statement)

    def write_mark(self) -> int:
        """The id of the last row of :data:`WRITE_LOG` (0: none yet)."""
        rows = site_rows(self.db, f"SELECT COALESCE(MAX(id), 0) AS id FROM {WRITE_LOG}")  # noqa: S608
        return int(rows[0]["id"])

    def write_counts(self, upto: int) -> dict[str, int]:
        """How many rows of :data:`WRITE_LOG` up to ``upto`` each session
        name wrote (the log's own sanity: it sees every site)."""
        rows = site_rows(
            self.db,
            f"SELECT application_name, COUNT(*) AS n FROM {WRITE_LOG}"  # noqa: S608
            " WHERE id <= ? GROUP BY application_name ORDER BY application_name",
            (upto,),
        )
        return {str(r["application_name"]): int(r["n"]) for r in rows}

    def writes_after(self, mark: int) -> list[dict[str, Any]]:
        """The rows of :data:`WRITE_LOG` after ``mark``: every committed write since."""
        return site_rows(
            self.db,
            f"SELECT * FROM {WRITE_LOG} WHERE id > ? ORDER BY id",  # noqa: S608
            (mark,),
        )

    # -- node state ---------------------------------------------------------------

    def node_snapshot(self, node_id: str) -> Any:
        return read_node(node_id, self.nodes[node_id].data)

    # -- database faults (S6, S15) ----------------------------------------------------

    SABOTAGE = "drill_sabotage_recovery"

    def sabotage_recovery(self, on: bool) -> None:
        """Make the start's recovery fail (S15), or repair it.

        SQLite: a trigger that makes any write to UNKNOWN abort (recovery's
        first write is ``SUBMITTING`` -> ``UNKNOWN``).  PostgreSQL: the
        sites' role loses (or gets back) its UPDATE privilege on
        ``task_operation``.  Only done while every site is stopped: the drill
        never changes a database a live site is using."""
        if any(s.alive for s in self.sites.values()):
            raise DrillError("refusing to edit the site database while a site runs")
        if self.backend == POSTGRESQL:
            if self.database.admin is None or self.database.role is None:
                raise DrillError("no administrative role to take the sites' privileges away")
            verb = (
                "REVOKE UPDATE ON task_operation FROM"
                if on
                else "GRANT UPDATE ON task_operation TO"
            )
            self.database.admin(f'{verb} "{self.database.role}"')
            return
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
        """Start ``tasknet.drill.dblock`` on the site database (SQLite: the
        write lock; PostgreSQL: a conflicting table lock from another
        session); return once it holds the lock."""
        ready = self.root / f"dblock-{len(self.helpers)}.ready"
        helper = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tasknet.drill.dblock",
                "--db",
                self.db,
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

    def site_runs(self) -> list[dict[str, Any]]:
        """Every run of every site process: {"site", "pid", "started", "ended", "how"}."""
        runs = []
        for site in self.sites.values():
            site.proc.alive  # noqa: B018 - notes the end of a run that exited by itself
            runs += [{"site": site.name, **run.to_json()} for run in site.proc.runs]
        return sorted(runs, key=lambda r: r["started"])

    def observe(self) -> World:
        frames: list[dict[str, Any]] = []
        links: dict[str, dict[str, int]] = {}
        for node in self.nodes.values():
            for site_name, proxy in node.proxies.items():
                records = reactor_thread.call(lambda p=proxy: [r.to_json() for r in p.records])
                frames += [{**r, "node": node.id, "site": site_name} for r in records]
            links[node.id] = node.open_links()
        listings: dict[str, list[dict[str, Any]]] = {}
        for site in self.live_sites():
            listed = self.node_listing(site.name)
            if listed is not None:
                listings[site.name] = listed
        self.ledger.site_runs = self.site_runs()
        return World(
            site=read_site(self.db),
            nodes={n.id: read_node(n.id, n.data) for n in self.nodes.values()},
            node_dirs={n.id: n.data for n in self.nodes.values()},
            upstream_stats=self.upstream_stats(),
            journal=self.upstream_journal(),
            frames=frames,
            webhook=self.webhook.bodies() if self.webhook is not None else None,
            ledger=self.ledger,
            site_listings=listings,
            node_links=links,
            live_nodes={n.id for n in self.nodes.values() if n.proc.alive},
        )

    def proxy_stats(self) -> dict[str, Any]:
        """The proxies' counters: by node id, or ``node->site`` for a node with several."""
        stats: dict[str, Any] = {}
        for node in self.nodes.values():
            for site_name, proxy in node.proxies.items():
                key = node.id if len(node.proxies) == 1 else f"{node.id}->{site_name}"
                stats[key] = reactor_thread.call(proxy.stats)
        return stats

    def logs(self) -> dict[str, str]:
        procs = [p for p in (self.upstream,) if p is not None]
        procs += [s.proc for s in self.sites.values()]
        procs += [n.proc for n in self.nodes.values()]
        return {p.name: str(p.log) for p in procs}

    def shutdown(self) -> None:
        """Stop everything this cluster started (processes, proxies, helpers, webhook)."""
        for stop in self.stoppers:
            stop()
        self.heal_partition()
        for helper in self.helpers:
            if helper.poll() is None:
                helper.kill()
                helper.wait(5)
            if helper.stderr is not None:
                helper.stderr.close()
        for node in self.nodes.values():
            node.proc.terminate(5)
        for site in self.sites.values():
            site.proc.terminate(5)
        if self.upstream is not None:
            self.upstream.terminate(5)
        for node in self.nodes.values():
            for proxy in node.proxies.values():
                reactor_thread.call(proxy.stop)
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None


def _request_with_headers(
    method: str, url: str, body: Any = None, *, timeout: float = 30
) -> tuple[Reply, dict[str, str]]:
    """One request as the admin, like :func:`tasknet.cli.jsonhttp.request`,
    with the answer's headers (lower-case names)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as err:
        status, raw, headers = err.code, err.read(), err.headers
    except OSError as err:
        return Reply(0, None, "", error=f"{type(err).__name__}: {err}"), {}
    text = raw.decode("utf-8", errors="replace")
    try:
        parsed: Any = json.loads(text) if text else None
    except ValueError:
        parsed = None
    return Reply(status, parsed, text), {k.lower(): v for k, v in headers.items()}
