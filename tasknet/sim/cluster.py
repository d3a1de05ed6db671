"""The real roles in one simulated world: upstream, site(s), nodes, a client.

:class:`SimCluster` builds each role by its own composition root on a
process of a :class:`~tasknet.sim.world.World`, as twistd would build it
from its command line: the mock upstream (``tasknet.upstream.service``),
the site (``tasknet.site.root.build_site``, on real SQLite files or a real
PostgreSQL), the nodes (``tasknet.node.service``, v2 and legacy), each
given the process's :class:`~tasknet.sim.reactor.SimReactor` as reactor,
clock and thread pools and a :class:`~tasknet.runtime.SeededEntropy`
drawn from the world's seed.  A client process speaks the HTTP API.

A crash discards the process's objects and keeps its files (the site's
database, a node's data directory).  The mock upstream keeps its state in
memory; the real upstream is a durable service, so its journal (what was
charged) outlives an upstream crash: the restarted process is given the
old one.

Everything the drill checkers (:mod:`tasknet.drill.invariants`) read is
gathered here: the frames that crossed each node's link (a tap on the
network, in the fault proxy's record format), the upstream's journal, a
:class:`~tasknet.drill.invariants.Ledger` of what the workload did, and
the runs of each site process.
"""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Site as WebSite

from tasknet.drill.invariants import Ledger
from tasknet.drill.invariants import World as Evidence
from tasknet.drill.proxy import FrameSplitter
from tasknet.drill.snapshot import read_node, read_site
from tasknet.runtime import SeededEntropy
from tasknet.sim.network import SimConnection, SimTransport
from tasknet.sim.reactor import SimReactor
from tasknet.sim.world import SimulationError, World
from tasknet.site.storage.engine.database import is_postgres
from tasknet.site.storage.engine.sources import StorageFaults
from tasknet.site.storage.lease import SILENT_CLIENT_NOTICED_WITHIN
from tasknet.site.upstream_client import BytesBody

__all__ = ["ADMIN_TOKEN", "SimCluster", "SiteProcess", "NodeProcess", "site_reassigns"]

#: Created by ``--demo`` on a fresh database (the drills' admin).
ADMIN_TOKEN = "demo"
UPSTREAM_PORT = 7200
WEBHOOK_PORT = 7300
HTTP_PORT = 8080
NODES_PORT = 7100
SERVE_PORT = 7400
#: The API's answer when the request got none (the site died, the link broke).
NO_ANSWER = 0
#: The site's ``--reassign-after`` (DELIVERY.md "A node that is gone"): past
#: every outage the other faults make (a crash's 8 s, a partition's or a
#: stall's 20 s, a paused node's 30 s), so only a node gone for good has its
#: tasks moved, well inside the 240 s a run gives its tasks to settle.
REASSIGN_AFTER = 60.0


#: The sites' ``--upstream-timeout`` (the late-POST check's bound).
SITE_UPSTREAM_TIMEOUT = 5.0


def node_secret(node_id: str) -> str:
    return f"sim-secret-{node_id}"


@dataclass
class SiteProcess:
    name: str
    http_port: int
    nodes_port: int
    reactor: SimReactor | None = None
    service: Any = None
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.reactor is not None and self.reactor.alive


@dataclass
class NodeProcess:
    node_id: str
    protocol: int
    data: Path
    site_ports: tuple[int, ...]
    reactor: SimReactor | None = None
    service: Any = None
    #: Run with ``--public-url`` (its serve address): users get a 303 to it.
    public: bool = False

    @property
    def alive(self) -> bool:
        return self.reactor is not None and self.reactor.alive


class SimCluster:
    """The roles of one simulated run (see the module doc).

    ``db``: the site database (a SQLite path, or a PostgreSQL URL shared by
    every site); ``root``: where the nodes' data directories go."""

    def __init__(self, world: World, root: Path, db: str) -> None:
        self.world = world
        self.root = root
        self.db = db
        self.ledger = Ledger()
        self.sites: dict[str, SiteProcess] = {}
        self.nodes: dict[str, NodeProcess] = {}
        self.upstream: SimReactor | None = None
        self.upstream_app: Any = None
        self._journal: Any = None
        self.frames: list[dict[str, Any]] = []
        #: site -> storage fault kind -> how many write transactions it still fails.
        self._storage_plans: dict[str, dict[str, int]] = {}
        #: The weekly quota of the --demo user (``--default-quota``).
        self.quota = 5000
        self._splitters: dict[tuple[int, str], FrameSplitter] = {}
        self._frame_seq = 0
        self._backups = 0
        #: Called with each frame record as it is delivered (the cheap checks).
        self.on_frame: list[Callable[[dict[str, Any]], None]] = []
        #: Called with (site, the storage functions) right after a write of a site commits.
        self.on_committed: list[Callable[[str, tuple[str, ...]], None]] = []
        #: site -> (which transactions, what then) to run right after one commits.
        self._after_commit: dict[
            str, list[tuple[Callable[[tuple[str, ...]], bool], Callable[[], None]]]
        ] = {}
        self.client = world.add_process("client")
        self.client.startRunning()
        self._agent = Agent(self.client, pool=HTTPConnectionPool(self.client, persistent=False))
        world.network.taps.append(self._tap)
        #: What the webhook receiver got: ``{"id", "body"}`` (D7).
        self.webhook: list[dict[str, Any]] = []
        receiver = world.add_process("webhook")
        sink = WebSite(_WebhookSink(self.webhook), reactor=receiver)
        receiver.listenTCP(WEBHOOK_PORT, sink, interface="127.0.0.1")  # type: ignore[arg-type]
        receiver.startRunning()

    # -- the upstream ----------------------------------------------------------------

    def start_upstream(self) -> None:
        from tasknet.upstream.service import Options, makeService

        reactor = self.world.add_process("upstream")
        options = Options()
        options.parseOptions(
            ["--http", f"tcp:{UPSTREAM_PORT}:interface=127.0.0.1"]
            + ["--seed", str(self.world.rng.getrandbits(32))]
        )
        service = makeService(options, reactor=reactor)
        if self._journal is not None:
            service.app.journal = self._journal  # the durable service's ledger
        self._journal = service.app.journal
        service.privilegedStartService()
        service.startService()
        reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
        reactor.startRunning()
        self.upstream, self.upstream_app = reactor, service.app

    @property
    def journal(self) -> Any:
        """The upstream's journal (what it charged), across its restarts."""
        return self._journal

    @property
    def upstream_alive(self) -> bool:
        return self.upstream is not None and self.upstream.alive

    # -- sites -----------------------------------------------------------------------

    def add_site(self, name: str = "site") -> SiteProcess:
        index = len(self.sites)
        site = SiteProcess(name, HTTP_PORT + index, NODES_PORT + index)
        self.sites[name] = site
        return site

    def start_site(
        self, name: str = "site", *, upstream_timeout: float = SITE_UPSTREAM_TIMEOUT
    ) -> None:
        from tasknet.site.root import Tuning, build_site
        from tasknet.site.service import Options

        site = self.sites[name]
        reactor = self.world.add_process(name)
        options = Options()
        args = ["--db", self.db, "--name", name, "--demo", "--default-quota", str(self.quota)]
        args += ["--http", f"tcp:{site.http_port}:interface=127.0.0.1"]
        args += ["--nodes", f"tcp:{site.nodes_port}:interface=127.0.0.1"]
        args += ["--upstream", f"http://127.0.0.1:{UPSTREAM_PORT}"]
        args += ["--upstream-timeout", str(upstream_timeout)]
        args += ["--webhook", f"http://127.0.0.1:{WEBHOOK_PORT}/hook"]
        for node_id in sorted(self.nodes):
            args += ["--node-key", f"{node_id}:{node_secret(node_id)}"]
        if self.site_reassigns:
            args += ["--reassign-after", f"{REASSIGN_AFTER:g}"]
        options.parseOptions(args)
        service = build_site(
            options,
            reactor,
            # No LISTEN connection (its loop blocks a real thread): the sites
            # of a PostgreSQL run learn of each other's changes by polling.
            tuning=Tuning(
                storage_faults=self._storage_faults(name),
                listen=False,
                # A PostgreSQL server's clock is its own: a site's jumping
                # does not move it (SQLite's "now" is the site's machine's).
                database_clock=self._server_clock if is_postgres(self.db) else None,
            ),
            threads=reactor,
            entropy=SeededEntropy(self.world.rng.getrandbits(64)),
            processes=reactor,
            monotonic=self.world.elapsed,
        )
        _audit_metering(self.db)  # the schema exists once build_site returned
        reactor.at_death(lambda: self._site_died(reactor, service))
        service.parts.instance.fenced.addCallback(lambda _reason: self._exited(name, reactor))
        service.startService()
        reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
        reactor.startRunning()
        site.reactor, site.service = reactor, service
        site.runs.append(
            {
                "site": name,
                # What the lease records in its site_instance row.
                "pid": reactor.pid,
                "started": self.world.now,
                "ended": None,
                "how": None,
                "fenced": None,
            }
        )

    @property
    def site_reassigns(self) -> bool:
        return site_reassigns()

    def _site_died(self, reactor: SimReactor, service: Any) -> None:
        """The kernel closes a dead site's files and sockets: its SQLite
        flock goes at once; a PostgreSQL server ends its sessions (the lease
        lock with them) once it learns of it: at once after a kill (the
        kernel sends FIN), after the lease session's keepalives give up
        when the machine lost power (nothing is sent).  The pool's sessions
        end with it: none holds a transaction across events."""
        if reactor.death == "power" and service.parts.instance.lease.shared:
            self.world.call_later(
                SILENT_CLIENT_NOTICED_WITHIN,
                _end_sessions,
                service,
                what=f"the server ends the sessions of {reactor.name}#{reactor.incarnation}",
            )
        else:
            _end_sessions(service)

    def cut_off(self, name: str, incarnation: int) -> None:
        """Site ``name`` (still incarnation ``incarnation``) is paused and
        its host lost its network (a VM migration): as after a power loss,
        the PostgreSQL server ends its sessions, its lease lock with them, so
        another site may reap it while it is stopped (SCALE.md "Fencing").
        Nothing on SQLite (the flock stays with the living process)."""
        site = self.sites.get(name)
        reactor = site.reactor if site is not None else None
        if site is None or site.service is None or reactor is None or not reactor.alive:
            return
        if reactor.incarnation != incarnation:
            return
        if not site.service.parts.instance.lease.shared:
            return
        self.world.note("fault", f"the server ends the sessions of paused {name}")
        if site.runs and site.runs[-1]["fenced"] is None:
            # D9: its lease ended while it was stopped (as S23's by hand):
            # it counts as dead from now on, and reaping it must happen.
            site.runs[-1]["fenced"] = self.world.now
        _end_sessions(site.service)

    def crash(self, name: str, how: str = "kill") -> None:
        """End process ``name`` (a site, a node, the upstream) at once."""
        process = self.world.processes.get(name)
        if process is None or not process.alive:
            return
        self.world.crash(name, how=how)
        site = self.sites.get(name)
        if site is not None and site.runs and site.runs[-1]["ended"] is None:
            site.runs[-1]["ended"], site.runs[-1]["how"] = self.world.now, how

    def instance_of(self, name: str) -> int | None:
        """The instance id site process ``name`` runs as now (``None``: not
        a site, or not started)."""
        site = self.sites.get(name)
        if site is None or site.service is None:
            return None
        try:
            return int(site.service.parts.instance.lease.instance_id)
        except (AttributeError, TypeError):
            return None  # still starting: no instance yet

    def live_instances(self) -> set[int]:
        """The instance ids of the site processes alive now."""
        return {
            site.service.parts.instance.lease.instance_id
            for site in self.sites.values()
            if site.alive and site.service is not None
        }

    def inject_storage_fault(self, site: str, kind: str, times: int) -> bool:
        """The next ``times`` write transactions of ``site`` fail (``busy``:
        the lock is not granted at BEGIN; ``commit``: an I/O error at
        COMMIT; ``full``: the disk is full at COMMIT), by the driver's own
        errors, through the storage layer's fault point."""
        if kind not in _STORAGE_FAULTS:
            raise ValueError(f"unknown storage fault {kind!r}")
        plan = self._storage_plans.setdefault(site, {})
        plan[kind] = plan.get(kind, 0) + times
        return True

    def _storage_faults(self, site: str) -> StorageFaults:
        postgres = is_postgres(self.db)

        def fault(point: str, connection: Any, functions: tuple[str, ...] = ()) -> None:
            if point == "committed":
                for heard_committed in self.on_committed:
                    heard_committed(site, functions)
                self._committed(site, functions)
                return
            plan = self._storage_plans.get(site) or {}
            for kind in ("busy",) if point == "begin" else ("commit", "full"):
                if plan.get(kind):
                    plan[kind] -= 1
                    self.world.note("fault", f"storage {kind} {site} at {point}")
                    raise _driver_error(kind, postgres)

        return fault

    def _exited(self, name: str, reactor: SimReactor) -> None:
        """A site that lost its lease stops and exits 1 (under twistd);
        its supervisor starts it again ``SUPERVISOR_RESTART`` seconds later
        (deploy/systemd: ``Restart=on-failure``, ``RestartSec=5s``)."""

        def exit_then_restart() -> None:
            if self.sites[name].reactor is reactor and reactor.alive:
                self.crash(name, "kill")
                self.world.call_later(
                    SUPERVISOR_RESTART, self._restart, name, what=f"supervisor restarts {name}"
                )

        # After the stop it began (one event later: its stop runs first).
        self.world.call_later(0.0, exit_then_restart, owner=reactor, what=f"{name} exits 1")

    def _restart(self, name: str) -> None:
        if not self.sites[name].alive:
            self.start_site(name)

    def _server_clock(self) -> float:
        return self.world.now

    def after_commit(
        self, site: str, matches: Callable[[tuple[str, ...]], bool], then: Callable[[], None]
    ) -> None:
        """Run ``then`` once, right after the next write transaction of
        ``site`` whose storage functions ``matches`` commits: in the writer,
        before anything of the site hears of the commit (a crash or a pause
        at the worst instant)."""
        self._after_commit.setdefault(site, []).append((matches, then))

    def forget_after_commit(self) -> None:
        """Drop what :meth:`after_commit` armed and did not run (after the last step)."""
        self._after_commit.clear()

    def _committed(self, site: str, functions: tuple[str, ...]) -> None:
        armed = self._after_commit.get(site) or []
        for entry in list(armed):
            matches, then = entry
            if matches(functions):
                armed.remove(entry)
                then()
                return

    def stop_all(self) -> None:
        """End every process (the run is over; its files are read)."""
        for _, process in sorted(self.world.processes.items()):
            if process.alive:
                process.die("kill")

    # -- nodes -----------------------------------------------------------------------

    def add_node(
        self, node_id: str, protocol: int = 2, sites: tuple[str, ...] = (), *, public: bool = False
    ) -> None:
        """A node (started by :meth:`start_node`); ``public``: users reach
        its archive endpoint directly (``--public-url``)."""
        ports = tuple(self.sites[s].nodes_port for s in (sites or tuple(self.sites)))
        self.nodes[node_id] = NodeProcess(
            node_id, protocol, self.root / node_id, ports, public=public
        )

    def start_node(self, node_id: str, *, wiped: bool = False) -> None:
        from tasknet.node.service import NodeService, Options, makeService

        node = self.nodes[node_id]
        if wiped and node.data.exists():
            shutil.rmtree(node.data)
            self.ledger.wiped_at.setdefault(node_id, []).append(self.world.now)
        reactor = self.world.add_process(node_id)
        options = Options()
        args = ["--node-id", node_id, "--secret", node_secret(node_id), "--data", str(node.data)]
        args += ["--protocol", str(node.protocol)]
        # Its archive endpoint on the world's network (tasknet.sim.fetch).
        serve_port = SERVE_PORT + list(self.nodes).index(node_id)
        args += ["--serve", f"tcp:{serve_port}:interface=127.0.0.1"]
        if node.public:
            # The world has one network: users reach it where the site does.
            args += ["--public-url", f"http://127.0.0.1:{serve_port}/"]
        if node.protocol == 1:
            args += ["--trust-legacy-site"]
        for port in node.site_ports:
            args += ["--connect", f"tcp:127.0.0.1:{port}"]
        options.parseOptions(args)
        service = makeService(
            options,
            reactor=reactor,
            threads=reactor,
            entropy=SeededEntropy(self.world.rng.getrandbits(64)),
        )
        assert isinstance(service, NodeService)
        service.exit_on_failure = False  # a failed start is the run's failure, in-process
        service.startService()
        reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
        reactor.startRunning()
        node.reactor, node.service = reactor, service

    def back_up(self, node_id: str) -> Path | None:
        """A copy of node ``node_id``'s data directory as it is now (its
        store's files, archives and partials), as a backup tool run at this
        instant would take it; ``None`` when there is no directory yet.
        Between two events no transaction of the store is open (a thread's
        job runs whole), so the copy is what a crash now would leave."""
        node = self.nodes[node_id]
        if not node.data.exists():
            return None
        self._backups += 1
        copy = self.root / "backups" / f"{node_id}-{self._backups}"
        shutil.copytree(node.data, copy)
        self.world.note("world", f"backup {copy.name} of {node_id} taken")
        return copy

    def restore(self, node_id: str, backup: Path | None) -> None:
        """Put ``backup`` (from :meth:`back_up`; ``None``: the node had no
        data directory then) in place of node ``node_id``'s data directory
        while the node is down."""
        node = self.nodes[node_id]
        if node.alive:
            raise SimulationError(f"{node_id} is running: a backup is restored while it is down")
        if node.data.exists():
            shutil.rmtree(node.data)
        if backup is not None:
            shutil.copytree(backup, node.data)
        # What the node reported since the backup is forgotten, as after a
        # wipe (D6: its unacknowledged reports were lost with its store).
        self.ledger.wiped_at.setdefault(node_id, []).append(self.world.now)
        source = backup.name if backup is not None else "nothing (no directory then)"
        self.world.note("fault", f"restore_node_backup {node_id} from {source}")

    # -- the client: the HTTP API ----------------------------------------------------

    def api(
        self, method: str, path: str, body: Any = None, *, site: str = "site", timeout: float = 10
    ) -> Deferred[tuple[int, Any]]:
        """``(status, JSON body)`` of one request as the admin; status
        :data:`NO_ANSWER` when none came within ``timeout`` (or the
        connection failed)."""
        port = self.sites[site].http_port
        url = f"http://127.0.0.1:{port}{path}".encode()
        producer = None if body is None else BytesBody(json.dumps(body).encode())
        return Deferred.fromCoroutine(
            _request(self._agent, method.encode(), url, producer, timeout, self.client)
        )

    # -- evidence --------------------------------------------------------------------

    def node_link(self, connection: SimConnection) -> bool:
        """Whether ``connection`` is a node's to a site's node listener."""
        port = connection.server.getHost().port
        return port in {s.nodes_port for s in self.sites.values()}

    def _tap(self, connection: SimConnection, receiver: SimTransport, data: bytes) -> None:
        if not self.node_link(connection):
            return
        server = connection.server
        to_server = receiver is server
        direction = "to_server" if to_server else "to_client"
        key = (connection.id, direction)
        splitter = self._splitters.get(key)
        if splitter is None:
            splitter = self._splitters[key] = FrameSplitter()
        node = connection.client.reactor.name
        site = server.reactor.name
        for type_, frame in splitter.feed(data):
            self._frame_seq += 1
            try:
                payload: Any = json.loads(frame[5:].decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                payload = {"undecodable": len(frame) - 5}
            record = {
                "seq": self._frame_seq,
                "link": connection.id,
                "direction": direction,
                "type": type_,
                "length": len(frame),
                "at": self.world.now,
                "action": "forwarded",
                "payload": payload,
                "node": node,
                "site": site,
            }
            self.frames.append(record)
            for check in self.on_frame:
                check(record)

    def observe(self) -> Evidence:
        """Everything the drill checkers read, now."""
        self.ledger.site_runs = sorted(
            (run for s in self.sites.values() for run in s.runs), key=lambda r: r["started"]
        )
        journal = self._journal
        return Evidence(
            site=read_site(self.db),
            nodes={n.node_id: read_node(n.node_id, n.data) for n in self.nodes.values()},
            node_dirs={n.node_id: n.data for n in self.nodes.values()},
            upstream_stats=journal.stats() if journal is not None else {},
            journal=[e.to_json() for e in journal.entries] if journal is not None else [],
            frames=self.frames,
            webhook=list(self.webhook),
            ledger=self.ledger,
            live_nodes={n.node_id for n in self.nodes.values() if n.alive},
            observed_at=self.world.now,
        )


_STORAGE_FAULTS = ("busy", "commit", "full")
#: Seconds before a site's supervisor starts it again after it exited 1.
SUPERVISOR_RESTART = 5.0

#: The harness's witness of metering (D2's ledger): a row for every
#: generation the moment its ``metered`` flag is set, kept when a re-create
#: replaces the generation, even within one group commit.  Not the site's:
#: the site never reads it.
_AUDIT_SQLITE = (
    "CREATE TABLE IF NOT EXISTS sim_metered (gid INTEGER, operation_id TEXT, cost INTEGER,"
    " PRIMARY KEY (gid, operation_id))",
    "CREATE TRIGGER IF NOT EXISTS sim_metered_on_update AFTER UPDATE OF metered"
    " ON task_operation WHEN NEW.metered = 1 BEGIN INSERT OR IGNORE INTO sim_metered"
    " VALUES (NEW.gid, NEW.operation_id, COALESCE(NEW.cost, 0)); END",
    "CREATE TRIGGER IF NOT EXISTS sim_metered_on_insert AFTER INSERT"
    " ON task_operation WHEN NEW.metered = 1 BEGIN INSERT OR IGNORE INTO sim_metered"
    " VALUES (NEW.gid, NEW.operation_id, COALESCE(NEW.cost, 0)); END",
)
_AUDIT_POSTGRES = (
    "CREATE TABLE IF NOT EXISTS sim_metered (gid BIGINT, operation_id TEXT, cost BIGINT,"
    " PRIMARY KEY (gid, operation_id))",
    "CREATE OR REPLACE FUNCTION sim_metered_note() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN INSERT INTO sim_metered VALUES (NEW.gid, NEW.operation_id, COALESCE(NEW.cost, 0))"
    " ON CONFLICT DO NOTHING; RETURN NEW; END $$",
    "DROP TRIGGER IF EXISTS sim_metered_audit ON task_operation",
    "CREATE TRIGGER sim_metered_audit AFTER INSERT OR UPDATE OF metered ON task_operation"
    " FOR EACH ROW WHEN (NEW.metered = 1) EXECUTE FUNCTION sim_metered_note()",
)
#: Every generation ever metered (the witness above).
METERED_SQL = "SELECT gid, operation_id, cost FROM sim_metered"


@functools.cache
def site_reassigns() -> bool:
    """Whether the site moves a gone node's unfinished tasks
    (``--reassign-after``, issue 34): a node gone for good leaves its tasks
    waiting for ever on a site without it."""
    from tasknet.site.service import Options

    return "reassign-after" in Options() or hasattr(Options, "opt_reassign_after")


def _end_sessions(service: Any) -> None:
    """The database sessions of a site end (what the server does when the
    site's process or host is gone): its lease lock goes with them."""
    service.parts.instance.lease.drop()
    service.parts.db.drop()


def _audit_metering(db: str) -> None:
    """Install the harness's metering witness (idempotent)."""
    from tasknet.site.storage.engine.database import connect

    postgres = is_postgres(db)
    connection = connect(db)
    try:
        if postgres:
            found = connection.execute(
                "SELECT 1 FROM pg_trigger WHERE tgname = 'sim_metered_audit'"
            ).fetchone()
            if found is not None:
                return
        for statement in _AUDIT_POSTGRES if postgres else _AUDIT_SQLITE:
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()


def _driver_error(kind: str, postgres: bool) -> Exception:
    """The error the database driver raises for ``kind``."""
    if postgres:
        import psycopg

        if kind == "busy":
            return psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
        if kind == "full":
            return psycopg.errors.DiskFull("could not extend file: No space left on device")
        return psycopg.errors.IoError("could not write to file: Input/output error")
    if kind == "busy":
        return sqlite3.OperationalError("database is locked")
    if kind == "full":
        return sqlite3.OperationalError("database or disk is full")
    return sqlite3.OperationalError("disk I/O error")


class _WebhookSink(Resource):
    """Records every notification POSTed to it, as the drills' sink does."""

    isLeaf = True

    def __init__(self, received: list[dict[str, Any]]) -> None:
        super().__init__()
        self.received = received

    def render_POST(self, request: Any) -> bytes:  # noqa: N802 - twisted.web's name
        raw = request.content.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = {"undecodable": raw.decode("utf-8", errors="replace")}
        notification = request.getHeader("X-Tasknet-Notification")
        self.received.append({"id": notification, "body": body})
        request.setResponseCode(204)
        return b""


async def _request(
    agent: Agent, method: bytes, url: bytes, body: Any, timeout: float, clock: Any
) -> tuple[int, Any]:
    asked = agent.request(method, url, headers(), body)
    asked.addTimeout(timeout, clock)
    try:
        response = await asked
        with warnings.catch_warnings():
            # Its transport has no abortConnection: never cancel the body's read.
            warnings.simplefilter("ignore", DeprecationWarning)
            reading = readBody(response)
        raw = await reading
    except Exception:  # noqa: BLE001 - no answer: timeout, reset, refused
        return NO_ANSWER, None
    return response.code, _json_body(raw)


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw[:200].decode("utf-8", "replace")}


def headers() -> Headers:
    return Headers(
        {
            b"Authorization": [f"Bearer {ADMIN_TOKEN}".encode()],
            b"Content-Type": [b"application/json"],
        }
    )
