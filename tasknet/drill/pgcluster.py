"""A throwaway PostgreSQL failover cluster on loopback: pg_auto_failover's
monitor, a primary and a synchronous standby (SCALE.md "Database failover").

Debian's ``postgresql-15-auto-failover`` package provides ``pg_autoctl``; it
is the failover manager: it watches the nodes, elects and promotes.  Nothing
here decides who is primary; this module only starts the three
``pg_autoctl run`` services, asks the monitor what it sees, and breaks things
on purpose (the drills S24-S26, the failover tests, ``scripts/demo --ha``).

* Everything lives in one temporary directory: each node's PGDATA and log,
  and pg_autoctl's own configuration and state files (``XDG_CONFIG_HOME``,
  ``XDG_DATA_HOME`` and ``XDG_RUNTIME_DIR`` point into it, so nothing is read
  from or written to the ``postgres`` user's home).
* When we are root every command runs as the ``postgres`` user (PostgreSQL
  refuses root), as :mod:`tasknet.drill.pgserver` does for one server.  Each
  ``pg_autoctl run`` is a :class:`~tasknet.process.Child` in a session of its
  own with a parent-death signal, so no node outlives the run that started it.
* Loopback only: every server listens on 127.0.0.1; authentication is
  ``trust`` (test data, this machine only).  The primary's cluster is made by
  our own ``initdb`` (locale C, as :mod:`~tasknet.drill.pgserver`, and our
  settings, e.g. ``max_connections``) before pg_autoctl takes it over; the
  standby is pg_autoctl's ``pg_basebackup`` of it, settings included.
* ``primary_netns`` (``tasknet-drill --db postgres-ha --netns``, root only):
  the primary (``node1``) runs in a network namespace of its own
  (:class:`~tasknet.drill.netns.HostNetns`) and listens on and is known to
  the monitor and the sites as 10.232.0.2; the monitor and the standby
  listen on the root side of its veth, 10.232.0.1, reachable from both
  namespaces; ``trust`` is extended to that /30.
  :meth:`PgCluster.cut_off_primary` then cuts that host off the network.
* The database the sites use (``tasknet``) is owned by a role of that name
  (LOGIN, no superuser; member of ``pg_signal_backend`` to end a reaped
  site's sessions and ``pg_read_all_stats`` to read ``pg_stat_replication``).
  :attr:`PgCluster.uri` is the multi-host URL ``pg_autoctl show uri`` prints,
  with that user in it.

Timings (the 45 s bound of SCALE.md rule 3): pg_auto_failover's defaults
but one, ``primary_demote_timeout`` (see :data:`DEFAULT_TIMINGS`, why and
the rule it keeps).  The monitor checks each node every ``pgautofailover.health_check_period``
(5 s; a failed check is retried ``health_check_max_retries`` = 2 times,
``health_check_retry_delay`` = 2 s apart) and declares a node unhealthy when
its check fails and its keeper has not reported for
``pgautofailover.node_considered_unhealthy_timeout`` (20 s); then the standby
is promoted once the old primary confirmed its demotion or
``pgautofailover.primary_demote_timeout`` passed (its keeper's loop runs
every second).  docs/operations.md gives the measured figures.

Killing "the primary": :meth:`PgCluster.kill_primary` SIGKILLs the primary's
node, i.e. its postmaster *and* its ``pg_autoctl`` keeper (the machine's
death).  Killing only the postmaster tests the keeper, not failover: the
keeper starts Postgres again within a second or two and nobody is promoted
(``keeper_too=False`` does exactly that).

Use it as a context manager or call :meth:`PgCluster.start` /
:meth:`PgCluster.stop`::

    with PgCluster() as cluster:
        url = cluster.uri     # postgres://tasknet@127.0.0.1:P1,127.0.0.1:P2/tasknet?...
        cluster.kill_primary()
        cluster.wait_primary(60)
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from tasknet.drill.netns import HOST_ADDR, HOST_NETWORK, HOST_ROOT_ADDR, HostNetns
from tasknet.drill.pgserver import (
    DEFAULT_SETTINGS,
    START_ATTEMPTS,
    SYSTEM_USER,
    PostgresFailed,
    PostgresNotInstalled,
    find_bindir,
)
from tasknet.process import LOOPBACK, Child, free_port

#: The database and role the sites use.
DATABASE = "tasknet"
ROLE = "tasknet"
FORMATION = "default"
#: Set to 1 (CI does) to make a missing pg_autoctl a failure of the tests and
#: drills that need it rather than a skip.
REQUIRE_ENV = "TASKNET_REQUIRE_PG_AUTO_FAILOVER"
INSTALL_HINT = (
    "install Debian's postgresql-15-auto-failover package"
    " (apt-get install postgresql-15-auto-failover), which provides pg_autoctl"
)

#: pg_auto_failover's own defaults for the monitor's timings that bound a
#: failover (its GUCs; milliseconds, or a count).
PG_AUTO_FAILOVER_DEFAULTS: Mapping[str, int] = {
    "pgautofailover.health_check_period": 5000,
    "pgautofailover.health_check_timeout": 5000,
    "pgautofailover.health_check_max_retries": 2,
    "pgautofailover.health_check_retry_delay": 2000,
    "pgautofailover.node_considered_unhealthy_timeout": 20000,
    "pgautofailover.primary_demote_timeout": 30000,
    "pgautofailover.startup_grace_period": 10000,
}

#: The timings this cluster runs with (SCALE.md rule 3's 45 s bound): the
#: defaults but ``primary_demote_timeout``.  A dead primary never confirms
#: its demotion, so the monitor promotes the standby only when that timeout
#: ends, counted from when it declared the primary unhealthy (its keeper
#: silent for ``node_considered_unhealthy_timeout``, 20 s): 20 + 30 s with
#: the defaults, measured 50 s after a kill -9 of the node, before any site
#: reconnects.  10 s instead: the standby is promoted about 30 s after the
#: primary's last report, still 10 s after a primary cut off from the monitor
#: and the standby has demoted itself (its keeper's
#: ``timeout.network_partition_timeout``, 20 s), which is what the demote
#: timeout waits for.  The rule: node_considered_unhealthy_timeout +
#: primary_demote_timeout > network_partition_timeout, with margin.
DEFAULT_TIMINGS: Mapping[str, int] = {
    **PG_AUTO_FAILOVER_DEFAULTS,
    "pgautofailover.primary_demote_timeout": 10000,
}

#: Settings of the data nodes over :data:`~tasknet.drill.pgserver.DEFAULT_SETTINGS`.
#: ``checkpoint_completion_target`` 0: pg_autoctl's ``pg_basebackup`` (a
#: standby's first copy, an old primary that cannot be rewound) asks for a
#: spread checkpoint, which otherwise makes it wait 0.9 x
#: ``checkpoint_timeout`` (over four minutes) on a quiet server.
NODE_SETTINGS: Mapping[str, str] = {"checkpoint_completion_target": "0"}

#: Settings of the data nodes when the primary's host can be cut off
#: (``primary_netns``).  A primary cut off from the monitor demotes itself
#: only when it has lost its standby too (its keeper's partition check:
#: ``pg_stat_replication``), and the standby's replication session, cut
#: without a FIN or RST, lingers there until ``wal_sender_timeout`` (60 s by
#: default): past the promotion, about 30 s after the cut.  Measured: the
#: old primary still "primary", its keeper saying "still have a standby:
#: we're not in a network partition", 50 s after the cut.  The keeper's
#: partition clock starts at the last sight of the standby, so the old
#: primary demotes itself ``wal_sender_timeout`` + ``network_partition_timeout``
#: (20 s) after the cut, and the standby is promoted about 30 s after it:
#: 5 s keeps the demotion first (10 s, measured: 1.5 s after the promotion).
CUT_OFF_SETTINGS: Mapping[str, str] = {"wal_sender_timeout": "5s"}

START_TIMEOUT = 120.0
COMMAND_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
POLL = 0.1

#: The states pg_auto_failover reports (``pgautofailover.replication_state``)
#: that mean "this node accepts writes".
WRITABLE_STATES = frozenset({"single", "primary", "wait_primary", "join_primary", "apply_settings"})


class _PortTaken(PostgresFailed):
    """A server of the cluster found its port taken (the start is tried again)."""


class AutoFailoverNotInstalled(PostgresNotInstalled):
    """pg_autoctl (or the PostgreSQL binaries) is not on this machine."""


def find_pg_autoctl() -> Path:
    """``pg_autoctl``'s path; raises :class:`AutoFailoverNotInstalled`."""
    found = shutil.which("pg_autoctl") or (
        "/usr/bin/pg_autoctl" if os.access("/usr/bin/pg_autoctl", os.X_OK) else None
    )
    if found is None:
        raise AutoFailoverNotInstalled(f"pg_autoctl is not installed: {INSTALL_HINT}")
    return Path(found)


def installed() -> bool:
    """Whether a cluster can be started here (pg_autoctl, the server
    binaries and the ``pgautofailover`` extension exist)."""
    try:
        find_pg_autoctl()
        bindir = find_bindir()
    except PostgresNotInstalled:
        return False
    sharedir = _pg_config(bindir, "--sharedir")
    return sharedir is not None and (Path(sharedir) / "extension/pgautofailover.control").is_file()


@dataclass(frozen=True)
class NodeState:
    """One node as the monitor sees it (``pg_autoctl show state``)."""

    name: str
    port: int
    #: The state the node's keeper last reported (e.g. ``primary``,
    #: ``secondary``, ``wait_primary``, ``catchingup``, ``demoted``).
    reported: str
    #: The state the monitor assigned it (the goal the keeper works towards).
    assigned: str
    #: The monitor's health check: ``1`` good, ``0`` bad, ``-1`` unknown.
    health: int

    @property
    def is_primary(self) -> bool:
        """Reported and assigned a writable state: the monitor and the node
        agree that it takes writes."""
        return self.reported in WRITABLE_STATES and self.assigned in WRITABLE_STATES


@dataclass(frozen=True)
class Event:
    """One event of the monitor (``pgautofailover.event``)."""

    #: When (Unix time, the monitor's clock: this machine's).
    at: float
    node: str
    reported: str
    goal: str
    description: str


@dataclass
class _Node:
    name: str
    port: int
    pgdata: Path
    log_path: Path
    child: Child | None = None
    #: The address it listens on and is registered with the monitor as.
    host: str = LOOPBACK


class PgCluster:
    """pg_auto_failover's monitor, a primary and a synchronous standby on
    loopback, for as long as the object is started.

    ``base_dir``: where the cluster's directory is created (a fresh
    temporary one under /tmp when None).  ``settings``: extra
    ``postgresql.conf`` settings of the data nodes (over
    :data:`~tasknet.drill.pgserver.DEFAULT_SETTINGS`).  ``monitor_settings``:
    the monitor's GUCs over :data:`DEFAULT_TIMINGS` (e.g. pg_auto_failover's
    own :data:`PG_AUTO_FAILOVER_DEFAULTS`).

    Call :meth:`start` from a thread that lives as long as the cluster: its
    processes are stopped when the thread that started them ends."""

    def __init__(
        self,
        base_dir: str | None = None,
        *,
        settings: Mapping[str, object] | None = None,
        monitor_settings: Mapping[str, object] | None = None,
        primary_netns: bool = False,
    ) -> None:
        self.base_dir = base_dir
        #: ``primary_netns``: node1's host in a network namespace of its own
        #: (:class:`~tasknet.drill.netns.HostNetns`, root only), so that
        #: :meth:`cut_off_primary` can cut it off the network.
        self.primary_netns = primary_netns
        self.host_netns: HostNetns | None = None
        self.settings = {
            **DEFAULT_SETTINGS,
            **NODE_SETTINGS,
            **(CUT_OFF_SETTINGS if primary_netns else {}),
            **{k: str(v) for k, v in (settings or {}).items()},
        }
        self.monitor_settings = {
            **{k: str(v) for k, v in DEFAULT_TIMINGS.items()},
            **{k: str(v) for k, v in (monitor_settings or {}).items()},
        }
        self.directory: Path | None = None
        self.bindir: Path | None = None
        self.pg_autoctl: Path | None = None
        self._as_system_user = os.geteuid() == 0
        self._monitor: _Node | None = None
        self._nodes: dict[str, _Node] = {}
        #: Seconds :meth:`start` took (the monitor, both nodes, in sync).
        self.start_seconds: float | None = None
        self._uri: str | None = None

    # ------------------------------------------------------------ URLs

    @property
    def monitor_uri(self) -> str:
        """The monitor's libpq URL (``pg_autoctl show uri --monitor``)."""
        monitor = self._require_monitor()
        return (
            f"postgres://autoctl_node@{monitor.host}:{monitor.port}/pg_auto_failover?sslmode=prefer"
        )

    @property
    def uri(self) -> str:
        """The sites' ``--db``: the formation's multi-host URL as ``pg_autoctl
        show uri --formation default`` prints it
        (``postgres://HOST:P1,HOST:P2/tasknet?target_session_attrs=read-write&sslmode=prefer``)
        with the ``tasknet`` user in it."""
        if self._uri is None:
            raise PostgresFailed("the failover cluster is not running")
        return self._uri

    def node_uri(self, name: str, dbname: str = DATABASE, user: str = ROLE) -> str:
        """One node's own URL (no failover: e.g. to look at a given server)."""
        node = self._require_node(name)
        return f"postgresql://{user}@{node.host}:{node.port}/{dbname}"

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(self._nodes)

    def node_port(self, name: str) -> int:
        return self._require_node(name).port

    # ------------------------------------------------------------ start and stop

    def start(self) -> PgCluster:
        """Start the monitor, the primary (``node1``) and the standby
        (``node2``), wait until the primary replicates synchronously to the
        standby, and create the sites' role and database.  Raises
        :class:`AutoFailoverNotInstalled` or :class:`PostgresFailed` (with
        the failing log's tail), leaving nothing running."""
        if self.directory is not None:
            raise PostgresFailed("the failover cluster is already started")
        began = time.monotonic()
        self.pg_autoctl = find_pg_autoctl()
        self.bindir = find_bindir()
        if not installed():
            raise AutoFailoverNotInstalled(
                f"the pgautofailover extension is not installed: {INSTALL_HINT}"
            )
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once()
                break
            except _PortTaken:
                # A port free when chosen may be taken before its server
                # binds it (another process's connection, on a busy
                # machine): start again on new ports.
                if attempt == START_ATTEMPTS:
                    raise
        self.start_seconds = time.monotonic() - began
        return self

    def _start_once(self) -> None:
        self.directory = self._make_directory()
        try:
            if self.primary_netns:
                self.host_netns = HostNetns()
                atexit.register(self.host_netns.destroy)
                self.host_netns.create()
            primary = self._add_node("node1")
            # The primary's initdb runs while pg_autoctl makes the monitor.
            initdb = self._start_initdb(primary)
            self._start_monitor()
            self._finish_initdb(primary, initdb)
            self._create_node(primary)
            self._wait(
                lambda: self._reported("node1") in {"single", "wait_primary", "primary"},
                "node1 to become the primary",
            )
            standby = self._add_node("node2")
            self._create_node(standby)
            self._wait(self.in_sync, "the standby to be in sync with the primary")
            self._create_role_and_database()
            self._uri = self._formation_uri()
        except BaseException as failed:
            taken = isinstance(failed, PostgresFailed) and self._a_port_was_taken()
            self.stop()
            if taken:
                raise _PortTaken(str(failed)) from failed
            raise

    def _a_port_was_taken(self) -> bool:
        """Whether a server of the cluster could not bind its port."""
        nodes = [*self._nodes.values(), *([self._monitor] if self._monitor else [])]
        for node in nodes:
            logs = [node.log_path, *node.pgdata.glob("log/*.log")]
            for log in logs:
                try:
                    if "Address already in use" in log.read_text(errors="replace"):
                        return True
                except OSError:
                    continue
        return False

    def stop(self) -> None:
        """Stop every node and the monitor (immediately: this is test data)
        and remove the directory.  Idempotent."""
        nodes = [*self._nodes.values(), *([self._monitor] if self._monitor else [])]
        for node in nodes:
            if node.child is not None and node.child.alive:
                # SIGQUIT: pg_autoctl stops its Postgres in immediate mode.
                node.child.signal(signal.SIGQUIT)
        for node in nodes:
            self._reap(node)
        self._nodes = {}
        self._monitor = None
        self._uri = None
        directory, self.directory = self.directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        host_netns, self.host_netns = self.host_netns, None
        if host_netns is not None:
            host_netns.destroy()
            atexit.unregister(host_netns.destroy)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ what the monitor sees

    def nodes(self) -> list[NodeState]:
        """Every data node as the monitor sees it, in node order."""
        output = self._run_autoctl(
            ["show", "state", "--json", "--pgdata", str(self._monitor_pgdata())]
        )
        return sorted(
            (_node_state(row) for row in json.loads(output or "[]")), key=lambda n: n.name
        )

    def state(self) -> dict[str, str]:
        """Each node's reported state, by name (``{"node1": "primary",
        "node2": "secondary"}``)."""
        return {node.name: node.reported for node in self.nodes()}

    def primary(self) -> str | None:
        """The name of the node the monitor and the node agree is primary."""
        for node in self.nodes():
            if node.is_primary:
                return node.name
        return None

    def standby(self) -> str | None:
        """The name of a node that is not the primary (the standby, in any
        state, or the dead old primary)."""
        primary = self.primary()
        for name in self._nodes:
            if name != primary:
                return name
        return None

    def in_sync(self) -> bool:
        """Whether the formation is healthy and commits wait for the
        standby: the monitor says one node is ``primary`` and another
        ``secondary`` (reported and assigned), and that primary itself has
        ``synchronous_standby_names`` set and a standby whose
        ``sync_state`` is ``sync`` or ``quorum`` (the monitor alone lags a
        standby that stopped and came back before it noticed)."""
        nodes = self.nodes()
        states = {(n.reported, n.assigned) for n in nodes}
        if ("primary", "primary") not in states or ("secondary", "secondary") not in states:
            return False
        primary = next(n.name for n in nodes if (n.reported, n.assigned) == ("primary", "primary"))
        node = self._require_node(primary)
        answer = self._psql(
            node.port,
            "SELECT current_setting('synchronous_standby_names') <> ''"
            " AND EXISTS (SELECT 1 FROM pg_stat_replication"
            " WHERE sync_state IN ('sync', 'quorum'))",
            dbname="postgres",
            timeout=10,
            host=node.host,
        )
        return answer.strip() == "t"

    def writable(self, name: str) -> bool:
        """Whether node ``name`` accepts a write now (asked of the server,
        not the monitor)."""
        node = self._require_node(name)
        try:
            answer = self._psql(
                node.port,
                "SELECT pg_is_in_recovery()",
                dbname="postgres",
                timeout=5,
                host=node.host,
            )
        except PostgresFailed:
            return False
        return answer.strip() == "f"

    def events(self, since: float | None = None) -> list[Event]:
        """The monitor's events (``pg_autoctl show events``: each state it
        assigned, each state a node reported, each health change), oldest
        first; ``since``: only those at or after that time (``time.time()``)."""
        monitor = self._require_monitor()
        where = "" if since is None else f" WHERE eventtime >= to_timestamp({float(since)!r})"
        columns = (
            "extract(epoch FROM eventtime), nodename, reportedstate, goalstate,"
            " replace(replace(description, E'\\n', ' '), '|', '/')"
        )
        query = f"SELECT {columns} FROM pgautofailover.event{where} ORDER BY eventid"  # noqa: S608
        output = self._psql(
            monitor.port, query, dbname="pg_auto_failover", timeout=10, host=monitor.host
        )
        events = []
        for line in output.splitlines():
            parts = line.split("|", 4)
            if len(parts) == 5:
                at, node, reported, goal, description = parts
                events.append(Event(float(at), node, reported, goal, description))
        return events

    def failover_timeline(self, since: float, old_primary: str) -> dict[str, float]:
        """When, after ``since``, the monitor found ``old_primary``
        unhealthy (``unhealthy``), set another node on its way to promotion
        (``promotion_started``), and that node reported a writable state
        (``promoted``); each a ``time.time()``, missing if it did not
        happen.  Detection is ``unhealthy - since``, promotion
        ``promoted - unhealthy`` (a switchover has no ``unhealthy``)."""
        timeline: dict[str, float] = {}
        for event in self.events(since):
            if (
                "unhealthy" not in timeline
                and event.node == old_primary
                and "unhealthy" in event.description
            ):
                timeline["unhealthy"] = event.at
            elif (
                "promotion_started" not in timeline
                and event.node != old_primary
                and event.goal in ("prepare_promotion", "stop_replication")
            ):
                timeline["promotion_started"] = event.at
            elif (
                "promoted" not in timeline
                and event.node != old_primary
                and event.reported in WRITABLE_STATES
                and "promotion_started" in timeline
            ):
                timeline["promoted"] = event.at
        return timeline

    # ------------------------------------------------------------ faults and changes

    def kill_primary(self, *, keeper_too: bool = True) -> float:
        """SIGKILL the primary's node: its postmaster and, unless
        ``keeper_too`` is False, its pg_autoctl keeper (the machine dies; a
        keeper left alive restarts Postgres and nobody is promoted).  The
        time of the kill (``time.time()``).  Raises :class:`PostgresFailed`
        when no node is primary."""
        name = self.primary()
        if name is None:
            raise PostgresFailed("no node is primary: nothing to kill")
        return self.kill_node(name, keeper_too=keeper_too)

    def kill_node(self, name: str, *, keeper_too: bool = True) -> float:
        """SIGKILL node ``name`` (see :meth:`kill_primary`); the time."""
        node = self._require_node(name)
        postmaster = _postmaster_pid(node.pgdata)
        when = time.time()
        if keeper_too and node.child is not None and node.child.pid is not None:
            # The node's pg_autoctl services and its Postgres share the
            # session the Child started: one signal to the process group.
            try:
                os.killpg(node.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if postmaster is not None:
            try:
                os.kill(postmaster, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if keeper_too:
            self._reap(node)
        return when

    def cut_off_primary(self) -> float:
        """Cut the primary's host off the network (``primary_netns`` only:
        every packet to and from it vanishes, see
        :meth:`~tasknet.drill.netns.HostNetns.cut_off`; its processes live
        on, unreachable, and its
        keeper, alone, demotes it after ``network_partition_timeout``).
        The time of the cut (``time.time()``)."""
        if self.host_netns is None:
            raise PostgresFailed("the primary's host is not in a namespace (primary_netns=False)")
        name = self.primary()
        if name is None or self._require_node(name).host != HOST_ADDR:
            raise PostgresFailed(f"the primary ({name}) is not the namespaced host")
        when = time.time()
        self.host_netns.cut_off()
        return when

    def reconnect_host(self) -> None:
        """The cut-off host's network is back (it rejoins as the monitor says)."""
        if self.host_netns is not None:
            self.host_netns.reconnect()

    def start_node(self, name: str) -> None:
        """Start node ``name``'s pg_autoctl again (after :meth:`kill_node` or
        :meth:`stop_standby`); it rejoins as the monitor says (an old primary
        is rewound and becomes the standby).  Returns once it is started; use
        :meth:`wait_in_sync` to wait for the formation.  As for
        :meth:`start`: call it from a thread that outlives the node (the
        parent-death signal is the calling thread's; a reactor's thread pool
        thread is fine until the reactor stops)."""
        node = self._require_node(name)
        if node.child is not None and node.child.alive:
            return
        self._run_node(node, ["run", "--pgdata", str(node.pgdata)])

    def switchover(self) -> float:
        """``pg_autoctl perform switchover``: the monitor demotes the primary
        and promotes the standby; returns when done (the time it returned)."""
        self._run_autoctl(
            [
                "perform",
                "switchover",
                "--formation",
                FORMATION,
                "--pgdata",
                str(self._monitor_pgdata()),
            ],
            timeout=COMMAND_TIMEOUT,
        )
        return time.time()

    def stop_standby(self) -> str:
        """Stop the standby's node (its pg_autoctl and Postgres, cleanly);
        the primary goes to ``wait_primary`` (writes no longer wait for a
        standby) once the monitor sees it gone.  The standby's name."""
        name = self.standby()
        if name is None:
            raise PostgresFailed("no standby to stop")
        node = self._require_node(name)
        if node.child is not None and node.child.alive:
            node.child.signal(signal.SIGINT)  # fast shutdown
        self._reap(node)
        return name

    def start_standby(self) -> None:
        """Start the stopped standby's node again."""
        for name, node in self._nodes.items():
            if node.child is None or not node.child.alive:
                self.start_node(name)

    def wait_primary(self, timeout: float) -> float:
        """Wait until some node is primary (monitor and node agree) and
        accepts a write; the time (``time.time()``) it was seen so.  Raises
        :class:`PostgresFailed` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            name = self._poll_primary()
            if name is not None and self.writable(name):
                return time.time()
            if time.monotonic() > deadline:
                raise PostgresFailed(
                    f"no writable primary within {timeout:.0f} s: {self._describe()}"
                )
            time.sleep(POLL)

    def wait_in_sync(self, timeout: float) -> float:
        """Wait until the formation is primary + secondary again; the time."""
        self._wait(self.in_sync, "the standby to be in sync", timeout=timeout)
        return time.time()

    def wait_state(self, name: str, states: Sequence[str], timeout: float) -> float:
        """Wait until node ``name`` reports one of ``states``; the time."""
        self._wait(
            lambda: self._reported(name) in states,
            f"{name} to reach {list(states)}",
            timeout=timeout,
        )
        return time.time()

    def psql(self, sql: str, *, node: str | None = None, dbname: str = DATABASE) -> str:
        """Run ``sql`` as the superuser on ``node`` (the primary when None);
        the output (unaligned, tuples only)."""
        name = node or self.primary()
        if name is None:
            raise PostgresFailed("no node is primary")
        target = self._require_node(name)
        return self._psql(target.port, sql, dbname=dbname, host=target.host)

    # ------------------------------------------------------------ internals

    def _require_monitor(self) -> _Node:
        if self._monitor is None:
            raise PostgresFailed("the failover cluster is not running")
        return self._monitor

    def _require_node(self, name: str) -> _Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise PostgresFailed(f"no node {name!r} in the failover cluster") from None

    def _monitor_pgdata(self) -> Path:
        return self._require_monitor().pgdata

    def _require_directory(self) -> Path:
        if self.directory is None:
            raise PostgresFailed("the failover cluster was never started")
        return self.directory

    def _make_directory(self) -> Path:
        base = self.base_dir or "/tmp"  # noqa: S108 -- the postgres user must reach it
        Path(base).mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="tasknet-pgha-", dir=base))
        for sub in ("config", "share", "run"):
            (directory / sub).mkdir(mode=0o700)
        if self._as_system_user:
            try:
                for path in (directory, *(directory / s for s in ("config", "share", "run"))):
                    shutil.chown(path, user=SYSTEM_USER, group=SYSTEM_USER)
            except LookupError as e:
                shutil.rmtree(directory, ignore_errors=True)
                raise AutoFailoverNotInstalled(
                    f"no {SYSTEM_USER!r} system user to run the servers as: {INSTALL_HINT}"
                ) from e
            reach = subprocess.run(
                self._as_user(["test", "-w", str(directory)]), capture_output=True, timeout=30
            )
            if reach.returncode != 0:
                shutil.rmtree(directory, ignore_errors=True)
                raise PostgresFailed(
                    f"the {SYSTEM_USER!r} user cannot reach {directory}: give a base_dir it can"
                    " reach, e.g. under /tmp"
                )
        return directory

    def _env(self) -> dict[str, str]:
        directory = self._require_directory()
        assert self.bindir is not None
        # No libpq or locale settings of the caller; pg_autoctl's files in
        # our directory; Debian's pg_config of the server we run.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_", "XDG_"))}
        env.update(
            LANG="C",
            XDG_CONFIG_HOME=str(directory / "config"),
            XDG_DATA_HOME=str(directory / "share"),
            XDG_RUNTIME_DIR=str(directory / "run"),
            PG_CONFIG=str(self.bindir / "pg_config"),
            PATH=f"{self.bindir}:{env.get('PATH', '/usr/bin:/bin')}",
        )
        if self._as_system_user:
            env["HOME"] = str(directory)
        return env

    def _as_user(self, argv: Sequence[str]) -> list[str]:
        if not self._as_system_user:
            return list(argv)
        return ["runuser", "-u", SYSTEM_USER, "--", *argv]

    def _run(
        self,
        argv: Sequence[str],
        *,
        what: str,
        timeout: float = COMMAND_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> str:
        try:
            result = subprocess.run(
                self._as_user(argv),
                capture_output=True,
                text=True,
                cwd=self._require_directory(),
                env={**self._env(), **(env or {})},
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise PostgresFailed(f"{what} did not finish within {timeout:.0f} s") from e
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip()
            raise PostgresFailed(f"{what} failed (exit {result.returncode}): {output[-2000:]}")
        return result.stdout

    def _run_autoctl(self, args: Sequence[str], *, timeout: float = 30.0) -> str:
        assert self.pg_autoctl is not None
        return self._run(
            [str(self.pg_autoctl), *args], what=f"pg_autoctl {' '.join(args[:2])}", timeout=timeout
        )

    def _psql(
        self,
        port: int,
        sql: str,
        *,
        dbname: str,
        timeout: float = COMMAND_TIMEOUT,
        host: str = LOOPBACK,
    ) -> str:
        assert self.bindir is not None
        argv = [
            str(self.bindir / "psql"),
            "--no-psqlrc",
            "--quiet",
            "--tuples-only",
            "--no-align",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            host,
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            dbname,
            "-c",
            sql,
        ]
        # A host cut off answers nothing: the connection attempt gives up
        # before the command's timeout (a psql left behind would hold the
        # pipes, and the call, open).
        return self._run(
            argv,
            what=f"psql {sql!r}",
            timeout=timeout,
            env={"PGCONNECT_TIMEOUT": str(max(2, min(10, int(timeout) - 1)))},
        )

    def _start_monitor(self) -> None:
        directory = self._require_directory()
        monitor = _Node(
            "monitor",
            free_port(),
            directory / "monitor",
            directory / "monitor.log",
            host=self._shared_host,
        )
        self._monitor = monitor
        assert self.pg_autoctl is not None
        # pg_autoctl makes the monitor's cluster (listening on '*' while it
        # sets it up; its pg_hba admits loopback only), then we pin it to
        # loopback and add our timings before it runs for good.
        self._run_autoctl(
            [
                "create",
                "monitor",
                "--pgdata",
                str(monitor.pgdata),
                "--pgport",
                str(monitor.port),
                "--hostname",
                monitor.host,
                "--auth",
                "trust",
                "--no-ssl",
            ],
            timeout=START_TIMEOUT,
        )
        if self.host_netns is not None:
            self._admit_host_network(monitor.pgdata)
        self._run_autoctl(
            [
                "config",
                "set",
                "--pgdata",
                str(monitor.pgdata),
                "postgresql.listen_addresses",
                monitor.host,
            ]
        )
        if self.monitor_settings:
            self._append_settings(monitor.pgdata, self.monitor_settings)
        self._run_node(monitor, ["run", "--pgdata", str(monitor.pgdata)])

    def _add_node(self, name: str) -> _Node:
        directory = self._require_directory()
        host = HOST_ADDR if self.host_netns is not None and name == "node1" else self._shared_host
        node = _Node(name, free_port(), directory / name, directory / f"{name}.log", host=host)
        self._nodes[name] = node
        return node

    def _start_initdb(self, node: _Node) -> subprocess.Popen[str]:
        assert self.bindir is not None
        argv = [
            str(self.bindir / "initdb"),
            "-D",
            str(node.pgdata),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]
        return subprocess.Popen(
            self._as_user(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self._require_directory(),
            env=self._env(),
        )

    def _finish_initdb(self, node: _Node, initdb: subprocess.Popen[str]) -> None:
        try:
            output, _ = initdb.communicate(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            initdb.kill()
            initdb.communicate()
            raise PostgresFailed(f"initdb did not finish within {COMMAND_TIMEOUT:.0f} s") from e
        if initdb.returncode != 0:
            raise PostgresFailed(f"initdb failed (exit {initdb.returncode}): {output[-2000:]}")
        self._append_settings(node.pgdata, self.settings)
        if self.host_netns is not None:
            # node2's pg_basebackup copies it.
            self._admit_host_network(node.pgdata, replication=True)

    @property
    def _shared_host(self) -> str:
        """Where the monitor and node2 listen: loopback, or with the
        primary's host in a namespace the root side of its link (reachable
        from both namespaces)."""
        return HOST_ROOT_ADDR if self.host_netns is not None else LOOPBACK

    def _admit_host_network(self, pgdata: Path, *, replication: bool = False) -> None:
        """``trust`` for the two ends of the primary's link (pg_autoctl's own
        entries name the nodes it knows; the sites connect from the root
        side too)."""
        lines = [f"host all all {HOST_NETWORK} trust"]
        if replication:
            lines.append(f"host replication all {HOST_NETWORK} trust")
        with (pgdata / "pg_hba.conf").open("a", encoding="utf-8") as f:
            f.write("\n# tasknet.drill.pgcluster: the primary's link\n" + "\n".join(lines) + "\n")

    def _append_settings(self, pgdata: Path, settings: Mapping[str, str]) -> None:
        conf = pgdata / "postgresql.conf"
        lines = [f"{name} = {_quote_setting(value)}" for name, value in settings.items()]
        with conf.open("a", encoding="utf-8") as f:
            f.write("\n# tasknet.drill.pgcluster\n" + "\n".join(lines) + "\n")

    def _create_node(self, node: _Node) -> None:
        self._run_node(
            node,
            [
                "create",
                "postgres",
                "--pgdata",
                str(node.pgdata),
                "--pgport",
                str(node.port),
                "--listen",
                node.host,
                "--hostname",
                node.host,
                "--name",
                node.name,
                "--formation",
                FORMATION,
                "--dbname",
                DATABASE,
                "--monitor",
                self.monitor_uri,
                "--auth",
                "trust",
                "--no-ssl",
                "--run",
            ],
        )

    def _run_node(self, node: _Node, args: Sequence[str]) -> None:
        assert self.pg_autoctl is not None
        # setpriv execs (the pid we signal is pg_autoctl's) and sets the
        # parent-death signal after the change of user: SIGQUIT, pg_autoctl's
        # immediate stop, if we die.
        argv = []
        if self.host_netns is not None and node.host == HOST_ADDR:
            argv += self.host_netns.exec_prefix()  # ip execs: the pid is still pg_autoctl's
        argv += ["setpriv", "--pdeathsig=SIGQUIT"]
        if self._as_system_user:
            argv += [f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups"]
        argv += ["--", str(self.pg_autoctl), *args]
        child = Child(
            node.name, argv, node.log_path, cwd=self._require_directory(), env=self._env()
        )
        child.start(banner=f"--- pg_autoctl {' '.join(args[:2])} ({node.name}, port {node.port})\n")
        node.child = child

    def _reap(self, node: _Node) -> None:
        child = node.child
        if child is None:
            return
        try:
            child.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            if child.pid is not None:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        child.stop()
        node.child = None
        # Postgres may outlive its pg_autoctl by an instant (or, killed
        # group-wide, leave nothing): make sure the port is free again.
        postmaster = _postmaster_pid(node.pgdata)
        if postmaster is not None and _alive(postmaster):
            try:
                os.kill(postmaster, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reported(self, name: str) -> str | None:
        try:
            return self.state().get(name)
        except PostgresFailed:
            return None

    def _poll_primary(self) -> str | None:
        try:
            return self.primary()
        except PostgresFailed:
            return None

    def _describe(self) -> str:
        try:
            return (
                ", ".join(f"{n.name} {n.reported}/{n.assigned}" for n in self.nodes()) or "no node"
            )
        except PostgresFailed as e:
            return f"the monitor does not answer ({e})"

    def _wait(
        self, ready: Callable[[], bool], what: str, *, timeout: float = START_TIMEOUT
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except PostgresFailed:
                pass
            for node in (*self._nodes.values(), *([self._monitor] if self._monitor else [])):
                if node.child is not None and node.child.popen is not None and not node.child.alive:
                    if node.child.returncode not in (None, 0) or "create" in node.child.argv:
                        raise PostgresFailed(
                            f"pg_autoctl {node.name} exited while waiting for {what};"
                            f" {node.log_path}:\n{node.child.log_tail()}"
                        )
            if time.monotonic() > deadline:
                raise PostgresFailed(f"waited {timeout:.0f} s for {what}: {self._describe()}")
            time.sleep(POLL)

    def _create_role_and_database(self) -> None:
        primary = self._require_node("node1")
        # pg_autoctl created the database (--dbname); the role owns it.
        self._psql(
            primary.port,
            host=primary.host,
            sql=f"CREATE ROLE {ROLE} LOGIN;"
            f" GRANT pg_signal_backend, pg_read_all_stats TO {ROLE};"
            f" ALTER DATABASE {DATABASE} OWNER TO {ROLE};",
            dbname="postgres",
        )
        self._psql(
            primary.port, f"ALTER SCHEMA public OWNER TO {ROLE}", dbname=DATABASE, host=primary.host
        )

    def _formation_uri(self) -> str:
        printed = self._run_autoctl(
            ["show", "uri", "--formation", FORMATION, "--pgdata", str(self._monitor_pgdata())]
        ).strip()
        return with_user(printed, ROLE)


def with_user(url: str, user: str) -> str:
    """``url`` (a libpq URL, one or several hosts) with ``user`` in it."""
    parts = urlsplit(url)
    hosts = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{hosts}"))


def _node_state(row: Mapping[str, object]) -> NodeState:
    health = row.get("health", -1)
    return NodeState(
        name=str(row.get("nodename")),
        port=int(str(row.get("nodeport", 0))),
        reported=str(row.get("current_group_state")),
        assigned=str(row.get("assigned_group_state")),
        health=int(health) if isinstance(health, int) else -1,
    )


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        first = (pgdata / "postmaster.pid").read_text(encoding="utf-8").split("\n", 1)[0]
        return int(first.strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _quote_setting(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _pg_config(bindir: Path, flag: str) -> str | None:
    try:
        answer = subprocess.run(
            [str(bindir / "pg_config"), flag], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return answer.stdout.strip() if answer.returncode == 0 else None


__all__ = [
    "DATABASE",
    "DEFAULT_TIMINGS",
    "Event",
    "PG_AUTO_FAILOVER_DEFAULTS",
    "REQUIRE_ENV",
    "ROLE",
    "AutoFailoverNotInstalled",
    "NodeState",
    "PgCluster",
    "find_pg_autoctl",
    "installed",
    "with_user",
]
