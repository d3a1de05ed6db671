"""The load node: many simulated v2 storage nodes in one process.

``python -m bench.loadnode --port P --first I --count N --mode MODE [...]``

Each connection behaves like the real node on the wire: on ``Identity`` it
sends ``ProtocolHello`` then ``Login`` (HMAC of the site's nonce), heartbeats
every ``--heartbeat`` seconds, and in ``reports`` mode sends snapshot
``TaskReport`` s of the tasks ``--tasks`` gives it, one in flight, the next only after the
ACK of the previous one, the same report again when no ACK came within
``--ack-timeout`` (as ``tasknet.node.reporter`` does: the site answers a report
whose transaction failed with no ACK at all).  It does no
downloading: the site is what is measured.

Control is by lines on stdin and JSON lines on stdout, so a parent can drive
several load processes over one measured window:

* stdout ``{"event": "ready", ...}`` once every connection is logged in;
* stdin ``go`` starts the reports (``reports`` mode), ``mark`` starts the
  measured window (after a warm-up), ``snapshot`` ends it and prints
  ``{"event": "window", ...}`` while the load goes on (for a profile);
* stdout ``{"event": "commands", ...}`` at most every 0.1 s while commands arrive;
* stdin ``stop`` ends the window: ``{"event": "result", ...}`` then exit.

* stdin ``storm T`` (B10): the site was killed at unix time ``T``; from
  then on each connection's next login and its first report ACKed after
  that login are recorded (``relogin_s``/``reported_s``: seconds after
  ``T``), and ``{"event": "storm", ...}`` is printed every 0.5 s.

Modes: ``reports`` (B1, B10), ``idle`` (B5: log in and heartbeat only),
``commands`` (B4: count the TaskCommands the site dispatches).

``--reconnect`` (B10): each node reconnects the way the real node does, by
Twisted's ``ClientService`` with the real node's retry policy
(``tasknet.node.link``: ``backoffPolicy(initialDelay=0.5, maxDelay=5.0)``,
jitter included, under ``login_backoff``, which also counts a connection
that ended before its login succeeded), and resends its report in flight on
the new connection (``tasknet.node.reporter``).  Only each node's first
connection is paced (``MAX_PENDING_LOGINS``, setting the fleet up); after
that nothing holds a reconnecting node back but its backoff.
``--report-every S``: after an ACK the node's next report goes S seconds
later (0: at once, B1's saturating load); after a re-login a node is
"dirty", as a real one whose tasks moved meanwhile, and reports again
``DEBOUNCE`` after each ACK until a fresh report of it was applied.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from twisted.application.internet import ClientService
from twisted.internet import protocol, reactor, stdio, task
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.protocols.basic import LineReceiver
from twisted.python.failure import Failure

from bench import plan
from tasknet.node.link import login_backoff, retry_policy_of
from tasknet.protocol import messages as m
from tasknet.protocol.connection import LOGIN_TIMEOUT
from tasknet.runtime import SystemEntropy

REACTOR: Any = reactor
# At most this many connections between connect and LoginResult at once,
# below the listen backlog of the bench's own --nodes endpoint (B5 gives
# none: Twisted's default, 50; the site's default endpoint has
# node_listener.NODES_BACKLOG, which B10 passes on): a larger burst
# overflows the accept queue, and a connection whose handshake the kernel
# dropped can stall past the bench's wait, which would measure the kernel,
# not the site.
MAX_PENDING_LOGINS = 32
#: The real node's connect timeout (``clientFromString``'s TCP default).
NODE_CONNECT_TIMEOUT = 30
#: The real reporter's debounce (``tasknet.node.reporter.DEBOUNCE``).
DEBOUNCE = 0.3


def now_ms() -> int:
    return int(time.time() * 1000)


class Fleet:
    """All connections of this process and what they measured."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = uuid.uuid4().hex[:8]
        self.tasks = load_tasks(args.tasks) if args.tasks else {}
        self.retry_until = time.monotonic() + args.retry_for
        self.nodes: list[LoadNode] = []
        self.pending = list(range(args.first, args.first + args.count))
        self.connecting = 0
        self.logged_in = 0
        self.login_failures: list[str] = []
        self.connect_failures: list[str] = []
        self.dropped: list[str] = []
        self.errors: list[str] = []
        self.running = False
        self.stopping = False
        self.window_start = 0.0
        self.window_end = 0.0
        self.acks = {m.ACK_APPLIED: 0, m.ACK_DUPLICATE: 0}
        self.resent = 0
        self.latencies_ms: list[float] = []
        self.commands = 0
        self.command_gids: set[int] = set()
        self.last_command_at = 0.0
        self.first_command_at = 0.0
        self._progress_call: Any = None
        self.ready_sent = False
        self.out: Callable[[dict[str, Any]], None] = lambda _doc: None
        self.factories: dict[int, NodeFactory] = {}
        self.services: list[ClientService] = []
        # B10: the moment the site was killed, and what each node did after it.
        self.storm_at = 0.0
        self.relogin_s: dict[int, float] = {}
        self.reported_s: dict[int, float] = {}
        self.storm_refusals: Counter[str] = Counter()
        self.storm_errors: Counter[str] = Counter()
        self.disconnects = 0
        self.reconnect_attempts = 0
        self.connect_failed_count = 0
        self.login_timeouts = 0
        self._storm_call: task.LoopingCall | None = None

    # ------------------------------------------------------------ connecting

    def connect_more(self) -> None:
        while self.pending and self.connecting < self.args.max_pending:
            index = self.pending.pop(0)
            self.connecting += 1
            factory = NodeFactory(self, index)
            self.factories[index] = factory
            if self.args.reconnect:
                self.start_service(factory)
            else:
                REACTOR.connectTCP("127.0.0.1", self.args.port, factory, timeout=30)

    def start_service(self, factory: NodeFactory) -> None:
        """The real node's reconnecting ClientService for one node."""
        # The real node's policy, jitter included (tasknet.node.link).
        policy = retry_policy_of(SystemEntropy())
        if self.args.backoff_scale != 1.0:
            scale = self.args.backoff_scale

            def scaled(attempt: int, real: Callable[[int], float] = policy) -> float:
                return scale * real(attempt)

            policy = scaled
        endpoint = TCP4ClientEndpoint(
            REACTOR, "127.0.0.1", self.args.port, timeout=NODE_CONNECT_TIMEOUT
        )
        retry = login_backoff(policy, factory)  # type: ignore[arg-type]

        def counted(attempt: int) -> float:
            # Consulted once per retry the ClientService schedules: after a
            # lost connection (attempt 1) or a failed connect (attempt > 1).
            self.reconnect_attempts += 1
            if attempt > 1:
                self.connect_failed_count += 1
            return retry(attempt)

        service = ClientService(endpoint, factory, retryPolicy=counted)
        self.services.append(service)
        service.startService()

    def login_settled(self, node_id: str, accepted: bool, reason: str = "") -> None:
        self.connecting -= 1
        if accepted:
            self.logged_in += 1
        else:
            self.login_failures.append(f"{node_id}: {reason}")
        self.connect_more()
        self.maybe_ready()

    def connect_failed(self, index: int, reason: str) -> None:
        self.connecting -= 1
        self.connect_failures.append(f"{plan.node_id(index)}: {reason}")
        self.connect_more()
        self.maybe_ready()

    def maybe_ready(self) -> None:
        settled = self.logged_in + len(self.login_failures) + len(self.connect_failures)
        if not self.ready_sent and settled == self.args.count:
            self.ready_sent = True
            self.out({"event": "ready", **self.summary()})

    # ------------------------------------------------------------ window

    def go(self) -> None:
        self.running = True
        self.window_start = time.monotonic()
        spread = self.args.report_every
        for factory in self.factories.values():
            if factory.link is not None and factory.link.logged_in:
                if spread > 0:
                    factory.schedule_report(random.random() * spread)
                else:
                    factory.send_report()

    def mark(self) -> None:
        """Start the measured window here (after a warm-up)."""
        self.window_start = time.monotonic()
        self.window_end = 0.0
        self.acks = dict.fromkeys(self.acks, 0)
        self.resent = 0
        self.latencies_ms = []

    def snapshot(self) -> None:
        """End the measured window here, keep the load running (for a profile)."""
        self.window_end = time.monotonic()
        self.out({"event": "window", **self.summary()})

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.running = False
        self.window_end = self.window_end or time.monotonic()
        self.report_progress()
        if self._storm_call is not None and self._storm_call.running:
            self._storm_call.stop()
        self.out({"event": "result", **self.summary()})
        for node in self.nodes:
            node.closing = True
        for service in self.services:
            service.stopService()
        for node in self.nodes:
            transport: Any = node.transport
            if transport is not None:
                transport.loseConnection()
        REACTOR.callLater(0.2, REACTOR.stop)

    def storm(self, killed_at: float) -> None:
        """B10: the site was killed at ``killed_at`` (unix time)."""
        self.storm_at = killed_at
        self.relogin_s.clear()
        self.reported_s.clear()
        self.storm_refusals.clear()
        self.storm_errors.clear()
        if self._storm_call is None:
            self._storm_call = task.LoopingCall(lambda: self.out(self.storm_summary()))
            self._storm_call.start(0.5, now=False)

    def storm_summary(self) -> dict[str, Any]:
        return {
            "event": "storm",
            "count": self.args.count,
            "relogged": len(self.relogin_s),
            "reported": len(self.reported_s),
            "connected": sum(
                1
                for f in self.factories.values()
                if f.link is not None and f.link.logged_in and f.link.connected
            ),
        }

    def logged_in_again(self, index: int) -> None:
        if self.storm_at and index not in self.relogin_s:
            self.relogin_s[index] = time.time() - self.storm_at

    def reported_again(self, index: int) -> None:
        if self.storm_at and index in self.relogin_s and index not in self.reported_s:
            self.reported_s[index] = time.time() - self.storm_at

    def command_received(self, gid: int) -> None:
        self.commands += 1
        self.command_gids.add(gid)
        self.last_command_at = time.time()
        if not self.first_command_at:
            self.first_command_at = self.last_command_at
        if self._progress_call is None or not self._progress_call.active():
            self._progress_call = REACTOR.callLater(0.1, self.report_progress)

    def report_progress(self) -> None:
        if self.commands:
            self.out(
                {
                    "event": "commands",
                    "commands": self.commands,
                    "distinct_gids": len(self.command_gids),
                    "first_at": self.first_command_at,
                    "last_at": self.last_command_at,
                }
            )

    def summary(self) -> dict[str, Any]:
        return {
            "count": self.args.count,
            "logged_in": self.logged_in,
            "login_failures": self.login_failures[:5],
            "connect_failures": self.connect_failures[:5],
            "dropped": len(self.dropped),
            "dropped_examples": self.dropped[:5],
            "errors": self.errors[:5],
            "window_s": (self.window_end or time.monotonic()) - self.window_start
            if self.window_start
            else 0.0,
            "applied": self.acks[m.ACK_APPLIED],
            "duplicate": self.acks[m.ACK_DUPLICATE],
            "resent": self.resent,
            "latencies_ms": [round(x, 3) for x in self.latencies_ms],
            "commands": self.commands,
            "distinct_gids": len(self.command_gids),
            "nodes_with_commands": sum(1 for f in self.factories.values() if f.commands),
            "first_command_at": self.first_command_at,
            "last_command_at": self.last_command_at,
            "disconnects": self.disconnects,
            "reconnect_attempts": self.reconnect_attempts,
            "connects_failed": self.connect_failed_count,
            "login_timeouts": self.login_timeouts,
            "storm_at": self.storm_at,
            "relogin_s": sorted(round(x, 3) for x in self.relogin_s.values()),
            "reported_s": sorted(round(x, 3) for x in self.reported_s.values()),
            "storm_refusals": dict(self.storm_refusals),
            "storm_errors": dict(self.storm_errors),
        }


class LoadNode(protocol.Protocol):
    """One simulated v2 node connection.  What outlives a connection (the
    report in flight, revisions, the login backoff's count) is the node's
    :class:`NodeFactory`: a reconnecting node resends its report in flight
    on the next connection, as the real reporter does."""

    def __init__(self, fleet: Fleet, node: NodeFactory) -> None:
        self.fleet = fleet
        self.args = fleet.args
        self.node = node
        self.index = node.index
        self.node_id = node.node_id
        self.buffer = bytearray()
        self.logged_in = False
        self.settled = False
        self.closing = False
        self.heartbeat: task.LoopingCall | None = None
        self.login_deadline: Any = None
        self.pre_login_beat: task.LoopingCall | None = None

    @property
    def gids(self) -> list[int]:
        return self.node.gids

    @property
    def commands(self) -> int:
        return self.node.commands

    # ------------------------------------------------------------ wire

    def send(self, message: m.Message) -> None:
        transport: Any = self.transport
        transport.write(m.encode(message))

    def connectionMade(self) -> None:
        self.node.connected_once = True
        # As the real node's PeerProtocol: heartbeats from the start, and a
        # login that has not completed within LOGIN_TIMEOUT closes the
        # connection (a failed login for the backoff).  A half-open
        # connection (the site's accept queue dropped it) ends that way.
        self.login_deadline = REACTOR.callLater(self.args.login_timeout, self._login_timed_out)
        self.pre_login_beat = task.LoopingCall(lambda: self.send(m.Heartbeat(now_ms())))
        self.pre_login_beat.start(self.args.heartbeat, now=False)

    def _end_pre_login(self) -> None:
        if self.login_deadline is not None and self.login_deadline.active():
            self.login_deadline.cancel()
        self.login_deadline = None
        if self.pre_login_beat is not None and self.pre_login_beat.running:
            self.pre_login_beat.stop()
        self.pre_login_beat = None

    def _login_timed_out(self) -> None:
        self.login_deadline = None
        self.fleet.login_timeouts += 1
        if self.fleet.storm_at:
            self.fleet.storm_refusals["no LoginResult within the login timeout"] += 1
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        size = m.HEADER.size
        while len(buf) >= size:
            type_, length = m.HEADER.unpack_from(buf)
            if len(buf) < size + length:
                return
            payload = bytes(buf[size : size + length])
            del buf[: size + length]
            try:
                message = m.decode(type_, payload)
            except m.UnknownMessageType:
                continue
            except m.ProtocolError as e:
                self.fleet.errors.append(f"{self.node_id}: undecodable frame: {e}")
                continue
            self.message_received(message)

    def message_received(self, message: m.Message) -> None:
        if isinstance(message, m.Identity):
            # Hello first: the site decides v2 when Login arrives (PROTOCOL.md).
            self.send(m.ProtocolHello())
            signature = m.sign_login(plan.SECRET, message.nonce, self.node_id)
            self.send(m.Login(self.node_id, signature))
        elif isinstance(message, m.LoginResult):
            self.login_result(message)
        elif isinstance(message, m.TaskReportAck):
            self.node.ack(self, message)
        elif isinstance(message, (m.TaskCommand, m.DownloadPost)):
            self.node.commands += 1
            self.fleet.command_received(message.gid)
        elif isinstance(message, m.Goodbye):
            # "site busy, try again" or "replaced by a newer connection": the
            # site closes next; a reconnecting node comes back by its backoff.
            if self.fleet.storm_at:
                self.fleet.storm_refusals[f"goodbye: {message.reason}"] += 1
            else:
                self.fleet.errors.append(f"{self.node_id}: goodbye: {message.reason}")
        elif isinstance(message, m.Error):
            if self.fleet.storm_at:
                self.fleet.storm_errors[message.code] += 1
            else:
                self.fleet.errors.append(f"{self.node_id}: {message.code}: {message.message}")

    def login_result(self, message: m.LoginResult) -> None:
        if self.settled:
            return
        self.settled = True
        self._end_pre_login()
        self.logged_in = message.accepted
        first = not self.node.logged_in_once
        if first:
            self.node.logged_in_once = message.accepted or not self.args.reconnect
            if message.accepted or not self.args.reconnect:
                self.fleet.login_settled(self.node_id, message.accepted, message.reason)
        if not message.accepted:
            if self.fleet.storm_at:
                self.fleet.storm_refusals[message.reason or "refused"] += 1
            return
        self.node.failed_logins = 0
        if not first:
            self.fleet.logged_in_again(self.index)
            self.node.dirty = True
        self.heartbeat = task.LoopingCall(lambda: self.send(m.Heartbeat(now_ms())))
        # Spread the heartbeats of many connections over the interval.
        interval = self.args.heartbeat
        offset = (self.index % 97) / 97 * interval
        REACTOR.callLater(offset, self._start_heartbeat)
        self.node.link_up(self, first)

    def _start_heartbeat(self) -> None:
        if self.heartbeat is not None and self.connected and not self.heartbeat.running:
            self.heartbeat.start(self.args.heartbeat, now=True)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._end_pre_login()
        if self.heartbeat is not None and self.heartbeat.running:
            self.heartbeat.stop()
        self.node.link_down(self)
        if not self.settled:
            self.settled = True
            # The real node counts it as a failed login for its backoff.
            self.node.failed_logins += 1
            if not self.node.logged_in_once and not self.args.reconnect:
                why = f"closed before login: {reason.value}"
                self.fleet.login_settled(self.node_id, False, why)
        elif self.logged_in and not self.closing:
            self.fleet.disconnects += 1
            if not self.args.reconnect:
                self.fleet.dropped.append(f"{self.node_id}: {reason.value}")


class NodeFactory(protocol.Factory):
    """One node: its connections' factory, and what outlives a connection."""

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet = fleet
        self.args = fleet.args
        self.index = index
        self.node_id = plan.node_id(index)
        held = fleet.tasks.get(index, [])
        self.gids = [gid for gid, _ in held]
        self.operation_ids = dict(held)
        # login_backoff reads it: connections in a row that ended before login.
        self.failed_logins = 0
        self.connected_once = False
        self.logged_in_once = False
        self.link: LoadNode | None = None
        self.commands = 0
        self.seq = 0
        self.revision = 0
        self.in_flight: str | None = None
        self.in_flight_report: m.TaskReport | None = None
        self.ack_call: Any = None
        self.next_call: Any = None
        self.sent_at = 0.0
        # After a re-login (B10): report again soon after each ACK until a
        # report sent on this link (``fresh``) was applied.
        self.dirty = False
        self.fresh = False

    def buildProtocol(self, addr: Any) -> LoadNode:
        node = LoadNode(self.fleet, self)
        self.fleet.nodes.append(node)
        return node

    # ``connectTCP`` (every mode but --reconnect) needs these of a ClientFactory.
    def startedConnecting(self, connector: Any) -> None:
        pass

    def clientConnectionLost(self, connector: Any, reason: Failure) -> None:
        pass

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        # B4 starts its load nodes with the site: refused until the node
        # listener is up (after recovery), so retry for a bounded time.
        if time.monotonic() < self.fleet.retry_until:
            REACTOR.callLater(0.02, connector.connect)
            return
        self.fleet.connect_failed(self.index, str(reason.value))

    # ------------------------------------------------------------ the link

    def link_up(self, link: LoadNode, first: bool) -> None:
        self.link = link
        if self.in_flight_report is not None:
            self.send_in_flight()  # the reporter resends its report in flight
        elif self.fleet.running:
            self.send_report()

    def link_down(self, link: LoadNode) -> None:
        if link is self.link:
            self.link = None
            self.cancel(self.ack_call)
            self.ack_call = None
            self.cancel(self.next_call)
            self.next_call = None

    @staticmethod
    def cancel(call: Any) -> None:
        if call is not None and call.active():
            call.cancel()

    # ------------------------------------------------------------ reports

    def schedule_report(self, delay: float) -> None:
        self.cancel(self.next_call)
        self.next_call = REACTOR.callLater(delay, self.send_report)

    def send_report(self) -> None:
        self.next_call = None
        if not self.gids or self.in_flight is not None or not self.fleet.running:
            return
        link = self.link
        if link is None or not link.connected or not link.logged_in:
            return
        self.seq += 1
        # As the real node: strictly increasing, and never behind the clock.
        self.revision = max(self.revision + 1, now_ms())
        report_id = f"{self.node_id}-{self.fleet.run_id}-{self.seq}"
        self.in_flight = report_id
        self.in_flight_report = m.TaskReport(
            report_id=report_id,
            revision=self.revision,
            gallery_tasks=plan.snapshot_entries(self.gids, self.seq, self.args.changing),
            operation_ids=self.operation_ids,
            deleted=(),
        )
        self.fresh = self.dirty
        self.sent_at = time.monotonic()
        self.send_in_flight()

    def send_in_flight(self) -> None:
        link = self.link
        if self.in_flight_report is None or link is None or not link.connected:
            return
        link.send(self.in_flight_report)
        self.cancel(self.ack_call)
        self.ack_call = REACTOR.callLater(self.args.ack_timeout, self.ack_timed_out)

    def ack_timed_out(self) -> None:
        self.ack_call = None
        if self.in_flight_report is not None and self.fleet.running:
            self.fleet.resent += 1
            self.send_in_flight()

    def ack(self, link: LoadNode, message: m.TaskReportAck) -> None:
        if message.report_id != self.in_flight:
            self.fleet.errors.append(f"{self.node_id}: ACK for {message.report_id}, not in flight")
            return
        self.in_flight = None
        self.in_flight_report = None
        self.cancel(self.ack_call)
        self.ack_call = None
        # B10: the first report of this node applied after its re-login.
        if self.dirty and self.fresh and message.result == m.ACK_APPLIED:
            self.dirty = False
            self.fleet.reported_again(self.index)
        if not self.fleet.running:
            return
        self.fleet.acks[message.result] += 1
        self.fleet.latencies_ms.append((time.monotonic() - self.sent_at) * 1000)
        if self.dirty:
            self.schedule_report(DEBOUNCE)
        elif self.args.report_every > 0:
            self.schedule_report(self.args.report_every)
        else:
            self.send_report()


class Control(LineReceiver):
    """stdin commands in, JSON events out."""

    delimiter = b"\n"

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def connectionMade(self) -> None:
        self.fleet.out = self.emit
        self.fleet.connect_more()
        self.fleet.maybe_ready()  # --count 0

    def emit(self, document: dict[str, Any]) -> None:
        transport: Any = self.transport
        transport.write(json.dumps(document).encode() + b"\n")

    def lineReceived(self, line: bytes) -> None:
        command = line.strip().decode()
        if command == "go":
            self.fleet.go()
        elif command == "mark":
            self.fleet.mark()
        elif command == "snapshot":
            self.fleet.snapshot()
        elif command == "stop":
            self.fleet.stop()
        elif command.startswith("storm"):
            _, _, at = command.partition(" ")
            self.fleet.storm(float(at) if at else time.time())

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        # The parent went away: stop rather than linger as an orphan.
        self.fleet.stop()


def load_tasks(path: str) -> dict[int, list[tuple[int, str]]]:
    """``{"<node index>": [[gid, operationId], ...]}`` as written by the bench."""
    with open(path) as f:
        raw = json.load(f)
    return {int(index): [(int(g), str(op)) for g, op in held] for index, held in raw.items()}


def write_tasks(path: str, tasks: dict[int, list[tuple[int, str]]]) -> None:
    with open(path, "w") as f:
        json.dump({str(index): held for index, held in tasks.items()}, f)


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit: 500 connections need 500 fds."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.loadnode", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True, help="the site's node port on 127.0.0.1")
    p.add_argument("--first", type=int, default=0, help="index of the first node")
    p.add_argument("--count", type=int, required=True, help="connections in this process")
    p.add_argument("--mode", choices=("reports", "idle", "commands"), required=True)
    p.add_argument("--tasks", help="JSON file of each node's [gid, operationId] (reports mode)")
    p.add_argument(
        "--changing", type=int, default=4, help="tasks whose progress moves in each snapshot"
    )
    p.add_argument("--retry-for", type=float, default=0.0, help="retry refused connects this long")
    p.add_argument("--heartbeat", type=float, default=15.0, help="seconds between heartbeats")
    p.add_argument(
        "--reconnect",
        action="store_true",
        help="reconnect as the real node does (ClientService, its backoff with jitter)",
    )
    p.add_argument(
        "--backoff-scale",
        type=float,
        default=1.0,
        help="--reconnect: the real backoff times this (quick runs only)",
    )
    p.add_argument(
        "--report-every",
        type=float,
        default=0.0,
        help="seconds from an ACK to the node's next report (0: at once)",
    )
    p.add_argument(
        "--login-timeout",
        type=float,
        default=LOGIN_TIMEOUT,
        help="close a connection with no LoginResult after this many seconds (the node's)",
    )
    p.add_argument(
        "--max-pending",
        type=int,
        default=MAX_PENDING_LOGINS,
        help="first connections between connect and LoginResult at once",
    )
    p.add_argument(
        "--ack-timeout",
        type=float,
        default=10.0,
        help="resend the report in flight after this many seconds without its ACK (the node's)",
    )
    args = p.parse_args(argv)
    if args.mode == "reports" and not args.tasks:
        p.error("--mode reports needs --tasks")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    limit = raise_fd_limit()
    if limit < args.count + 32:
        sys.exit(f"open-files limit {limit} is too low for {args.count} connections")
    fleet = Fleet(args)
    stdio.StandardIO(Control(fleet))
    REACTOR.run()


if __name__ == "__main__":
    main()
