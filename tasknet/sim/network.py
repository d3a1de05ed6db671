"""TCP as in-memory connections between simulated processes.

In the manner of ``twisted.test.iosim``, but scheduled: each connection is a
pair of :class:`SimTransport` (``ITCPTransport``), and each of its two
directions a queue of segments delivered by an event of the world at the
time the link's profile gives (one-way latency drawn from the seed, in
order; optional bandwidth).  What the kernel would do is done here:

* **connect**: a SYN reaches the listener after a latency; no listener
  (loopback or a live host): refused; a cut link: the SYN is lost and sent
  again (1, 2, 4 … s) until the connector's timeout; accepted: the server's
  protocol is built and connected at once, the client's when the answer
  reaches it.
* **close**: ``loseConnection`` waits for a pull producer, or a paused
  streaming one, as Twisted's does, then sends FIN after the data; the peer
  reads the data, then sees ``ConnectionDone`` (``readConnectionLost``
  for an ``IHalfCloseableProtocol``).  ``abortConnection`` drops what has
  not left yet and sends RST: the peer sees ``ConnectionLost``.
  ``SO_LINGER`` (on, 0 s) through ``getHandle().setsockopt`` makes a close
  an RST (the mock upstream's ``reset_mid_body``).
* **flow control**: a streaming producer is paused while more than
  :data:`WINDOW` bytes it wrote are unread by the peer (a paused reader,
  ``transport.pauseProducing()``, reads nothing); a pull producer is asked
  for more each time its writes were taken.
* **a process that dies** (``"kill"``/``"exit"``): its side ends as the
  kernel ends it (FIN, or RST when it left data unread), and data reaching it
  later is answered by RST; ``"power"``: nothing is sent, nothing answered.

Faults, driven by the simulator: :meth:`Network.partition` / :meth:`heal`
(segments across a cut wait, and arrive after the heal; a connection is
not broken by a cut alone: its own timeouts decide), :meth:`set_link`
(latency, bandwidth: a slow link), :meth:`SimConnection.reset`,
:meth:`SimConnection.stall` (a direction delivers ``after`` more bytes,
then nothing until :meth:`SimConnection.unstall`: a connection that stalls
mid-frame).  :attr:`Network.taps` see every byte delivered;
:attr:`Network.rewrites` may change it on its way to the protocol (a
frame a lying node's code never sees).

All processes run on one machine, as in the drills: ``127.0.0.1`` (and
``localhost``) reaches a listener of any process; each process also has an
address of its own (``10.0.0.N``), and a process name resolves to it.
Latency, bandwidth and cuts are per pair of processes, whatever the
address dialled.  Not simulated: IPv6 (an IPv6 literal is an unknown host), TLS
(``tls:`` endpoints are untested here), UNIX sockets, UDP, the kernel's
retransmission timers after a heal, Nagle, segment sizes (a write arrives
whole, unless stalled).
"""

from __future__ import annotations

import ipaddress
import itertools
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.base import BaseConnector
from twisted.internet.error import (
    CannotListenError,
    ConnectionAborted,
    ConnectionDone,
    ConnectionLost,
    ConnectionRefusedError,
    DNSLookupError,
)
from twisted.internet.interfaces import (
    IAddress,
    IConnector,
    IConsumer,
    IHalfCloseableProtocol,
    IHostnameResolver,
    IHostResolution,
    IListeningPort,
    IProducer,
    IProtocol,
    IPushProducer,
    IResolutionReceiver,
    ISystemHandle,
    ITCPTransport,
)
from twisted.internet.protocol import ClientFactory, Protocol, ServerFactory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

if TYPE_CHECKING:
    from tasknet.sim.reactor import SimReactor
    from tasknet.sim.world import World

from tasknet.sim.trace import failure_name

__all__ = [
    "WINDOW",
    "LinkProfile",
    "Network",
    "SimConnection",
    "SimConnector",
    "SimNameResolver",
    "SimPort",
    "SimTransport",
]

log = Logger()

#: Bytes written and not yet read by the peer past which a streaming
#: producer is paused (Twisted's own buffer and the kernel's, together).
WINDOW = 256 * 1024

DATA, ESTABLISH, FIN, RST = "data", "syn-ack", "fin", "rst"

#: Seconds before a lost SYN is sent again, doubled each time.
SYN_RETRY = 1.0


@dataclass(frozen=True)
class LinkProfile:
    """How a link between two processes carries bytes: one-way ``latency``
    (low, high seconds, drawn uniformly per segment, order kept) and
    ``bandwidth`` (bytes per second; None: unlimited)."""

    latency: tuple[float, float] = (0.0001, 0.001)
    bandwidth: float | None = None


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


class Network:
    """The world's one network (see the module doc)."""

    def __init__(self, world: World, default: LinkProfile) -> None:
        self.world = world
        self.default = default
        self._profiles: dict[tuple[str, str], LinkProfile] = {}
        self._cut: set[tuple[str, str]] = set()
        self._ports: dict[tuple[str, int], SimPort] = {}
        self._listen_ports = itertools.count(30000)
        self._client_ports = itertools.count(40000)
        self._ids = itertools.count(1)
        #: Open connections by id, oldest first.
        self.connections: dict[int, SimConnection] = {}
        #: Host names the resolver knows (process names resolve too).
        self.names: dict[str, str] = {"localhost": "127.0.0.1"}
        #: ``tap(connection, receiver, data)`` for every byte delivered.
        self.taps: list[Callable[[SimConnection, SimTransport, bytes], None]] = []
        #: ``send_tap(connection, sender, data)`` for every byte written (at
        #: the instant of the write, before any latency).
        self.send_taps: list[Callable[[SimConnection, SimTransport, bytes], None]] = []
        #: ``rewrite(connection, receiver, data) -> bytes``: what the
        #: receiver's protocol is given of ``data`` (after the taps saw it).
        self.rewrites: list[Callable[[SimConnection, SimTransport, bytes], bytes]] = []
        self.dns_latency = (0.00005, 0.0005)
        self.bytes_delivered = 0
        self.segments_delivered = 0

    # -- links and faults -------------------------------------------------------------

    def profile(self, a: str, b: str) -> LinkProfile:
        return self._profiles.get(_pair(a, b), self.default)

    def set_link(
        self,
        a: str,
        b: str,
        *,
        latency: tuple[float, float] | None = None,
        bandwidth: float | None = None,
    ) -> None:
        """Change the link between processes ``a`` and ``b`` (from now on,
        for new segments): a slow link is a low ``bandwidth`` or a high
        ``latency``."""
        profile = self.profile(a, b)
        if latency is not None:
            profile = replace(profile, latency=latency)
        if bandwidth is not None:
            profile = replace(profile, bandwidth=bandwidth)
        self._profiles[_pair(a, b)] = profile
        self.world.note(
            "fault", f"link {'|'.join(_pair(a, b))} {profile.latency} {profile.bandwidth}"
        )

    def reset_link(self, a: str, b: str) -> None:
        """The link between ``a`` and ``b`` back to the default profile."""
        self._profiles.pop(_pair(a, b), None)
        self.world.note("fault", f"link {'|'.join(_pair(a, b))} default")

    def partition(self, side_a: str | Iterable[str], side_b: str | Iterable[str]) -> None:
        """Cut every link between a process of ``side_a`` and one of
        ``side_b`` (names), until :meth:`heal`."""
        for a in [side_a] if isinstance(side_a, str) else list(side_a):
            for b in [side_b] if isinstance(side_b, str) else list(side_b):
                if a != b:
                    self._cut.add(_pair(a, b))
                    self.world.note("fault", f"partition {'|'.join(_pair(a, b))}")

    def heal(
        self, side_a: str | Iterable[str] | None = None, side_b: str | Iterable[str] | None = None
    ) -> None:
        """Mend the cuts between ``side_a`` and ``side_b`` (all of them when
        neither is given); segments that waited go on."""
        if side_a is None and side_b is None:
            healed = sorted(self._cut)
        else:
            a_names = [] if side_a is None else [side_a] if isinstance(side_a, str) else side_a
            b_names = [] if side_b is None else [side_b] if isinstance(side_b, str) else side_b
            healed = sorted(
                pair
                for pair in self._cut
                if (pair[0] in a_names and (side_b is None or pair[1] in b_names))
                or (pair[1] in a_names and (side_b is None or pair[0] in b_names))
            )
        for pair in healed:
            self._cut.discard(pair)
            self.world.note("fault", f"heal {'|'.join(pair)}")
        for connection in list(self.connections.values()):
            connection.to_server.release()
            connection.to_client.release()

    def is_cut(self, a: str, b: str) -> bool:
        return a != b and _pair(a, b) in self._cut

    def between(self, a: str, b: str) -> list[SimConnection]:
        """The open connections between processes ``a`` and ``b``."""
        return [
            c
            for c in self.connections.values()
            if {c.client.reactor.name, c.server.reactor.name} == {a, b}
            or (a == b == c.client.reactor.name == c.server.reactor.name)
        ]

    # -- names --------------------------------------------------------------------------

    def address_of(self, host: str) -> str | None:
        """The IPv4 address ``host`` names (a literal is itself), or None."""
        if _is_ipv4(host):
            return host
        if host in self.names:
            return self.names[host]
        process = self.world.processes.get(host)
        return process.ip if process is not None else None

    def resolve(self, reactor: SimReactor, name: str) -> defer.Deferred[str]:
        d: defer.Deferred[str] = defer.Deferred()
        address = self.address_of(name)

        def answer() -> None:
            if address is None:
                d.errback(DNSLookupError(f"no such host {name!r}"))
            else:
                d.callback(address)

        self.world.call_later(
            self.world.draw(*self.dns_latency), answer, owner=reactor, what=f"resolve {name}"
        )
        return d

    def _process_at(self, ip: str) -> SimReactor | None:
        for process in self.world.processes.values():
            if process.ip == ip:
                return process
        return None

    # -- listening ----------------------------------------------------------------------

    def listen(
        self,
        reactor: SimReactor,
        port: int,
        factory: ServerFactory,
        backlog: int,
        interface: str,
    ) -> SimPort:
        iface = interface or "0.0.0.0"
        if not (iface == "0.0.0.0" or _is_loopback(iface) or iface == reactor.ip):
            raise CannotListenError(
                interface, port, OSError(f"{iface} is not an address of {reactor.name}")
            )
        if iface == "localhost":
            iface = "127.0.0.1"
        if port == 0:
            port = next(self._listen_ports)
            while any(p == port for _, p in self._ports):
                port = next(self._listen_ports)
        for other_iface, other_port in self._ports:
            overlap = other_iface == iface or "0.0.0.0" in (other_iface, iface)
            if other_port == port and overlap:
                raise CannotListenError(interface, port, OSError("address already in use"))
        listening = SimPort(self, reactor, iface, port, factory, backlog)
        listening.startListening()
        return listening

    def lookup(self, ip: str, port: int) -> SimPort | None:
        """The listener a connection to ``ip:port`` reaches, if any."""
        found = self._ports.get((ip, port))
        if found is not None:
            return found
        wildcard = self._ports.get(("0.0.0.0", port))
        if wildcard is not None and (_is_loopback(ip) or ip == wildcard.reactor.ip):
            return wildcard
        return None

    # -- connecting ---------------------------------------------------------------------

    def dial(self, connector: SimConnector) -> SimTransport:
        """The client side of a new connection; its SYN is on its way."""
        reactor = connector.sim_reactor
        transport = SimTransport(self, reactor, server=False)
        transport.connector = connector
        address = self.address_of(connector.host)
        if address is None:
            self.world.call_later(
                self.world.draw(*self.dns_latency),
                transport.failIfNotConnected,
                DNSLookupError(f"no such host {connector.host!r}"),
                owner=reactor,
                what="dns fail",
            )
            return transport
        self._send_syn(transport, address, connector.port, 0)
        return transport

    def _syn_latency(self, source: SimReactor, ip: str, port: int) -> float:
        listening = self.lookup(ip, port)
        target = listening.reactor.name if listening is not None else source.name
        return self.world.draw(*self.profile(source.name, target).latency)

    def _send_syn(self, client: SimTransport, ip: str, port: int, tries: int) -> None:
        delay = self._syn_latency(client.reactor, ip, port)
        if tries:
            delay += SYN_RETRY * 2 ** (tries - 1)
        self.world._silent(self.world.now + delay, None, self._syn_arrives, client, ip, port, tries)

    def _syn_arrives(self, client: SimTransport, ip: str, port: int, tries: int) -> None:
        source = client.reactor
        if client._attempt_over or not source.alive:
            return
        listening = self.lookup(ip, port)
        target = listening.reactor if listening is not None else self._process_at(ip)
        if target is not None and self.is_cut(source.name, target.name):
            self.world.note("net", f"syn {source.name}>{target.name} lost")
            self._send_syn(client, ip, port, tries + 1)
            return
        if listening is None:
            if target is None and not _is_loopback(ip):
                self.world.note("net", f"syn {source.name}>{ip}:{port} unanswered")
                return  # no such host, or it is down: the connector's timeout decides
            self.world.note("net", f"syn {source.name}>{ip}:{port} refused")
            self.world.call_later(
                self.world.draw(*self.default.latency),
                client.failIfNotConnected,
                ConnectionRefusedError(f"{ip}:{port}"),
                owner=source,
                what="refused",
            )
            return
        server_reactor = listening.reactor
        own = "127.0.0.1" if _is_loopback(ip) else source.ip
        client._host = IPv4Address("TCP", own, next(self._client_ports))
        client._peer = IPv4Address("TCP", ip, port)
        server = SimTransport(self, server_reactor, server=True)
        server._host, server._peer = client._peer, client._host
        connection = SimConnection(self, next(self._ids), client, server)
        self.connections[connection.id] = connection
        self.world.note(
            "net", f"c{connection.id} {source.name}>{server_reactor.name} accept {port}"
        )
        server.outbound.send(ESTABLISH)
        try:
            protocol = listening.factory.buildProtocol(client._host)
        except Exception:
            self.world.errors.append(Failure())
            protocol = None
        server.connected = True
        if protocol is None:
            server.protocol = Protocol()
            server.protocol.makeConnection(server)
            server.loseConnection()
            return
        server.protocol = protocol
        protocol.makeConnection(server)

    # -- bookkeeping ----------------------------------------------------------------------

    def forget(self, transport: SimTransport) -> None:
        transport.reactor.transports.pop(transport, None)
        connection = transport.connection
        if (
            connection is not None
            and connection.client.disconnected
            and connection.server.disconnected
        ):
            self.connections.pop(connection.id, None)

    def process_died(self, reactor: SimReactor, how: str) -> None:
        for listening in list(reactor.ports):
            listening._unregister()
        for connector in list(reactor.connectors):
            transport = getattr(connector, "transport", None)
            if isinstance(transport, SimTransport):
                transport._attempt_over = True
        reactor.connectors.clear()
        for transport in list(reactor.transports):
            transport._die(how)
        reactor.transports.clear()


class _Direction:
    """One direction of a connection: the segments on their way, in order."""

    __slots__ = (
        "conn",
        "dst",
        "held",
        "last_arrival",
        "name",
        "queue",
        "scheduled",
        "src",
        "stall",
        "unread",
        "wire_free",
    )

    def __init__(self, conn: SimConnection, src: SimTransport, dst: SimTransport) -> None:
        self.conn = conn
        self.src = src
        self.dst = dst
        # [arrival, departure, kind, data]
        self.queue: deque[list[Any]] = deque()
        self.last_arrival = 0.0
        self.wire_free = 0.0
        self.scheduled = False
        self.held = False
        self.stall: int | None = None
        self.unread = 0
        self.name = f"c{conn.id} {src.reactor.name}>{dst.reactor.name}"

    def send(self, kind: str, data: bytes = b"") -> None:
        network = self.conn.network
        world = network.world
        now = world.now
        profile = network.profile(self.src.reactor.name, self.dst.reactor.name)
        departure = now
        if kind == DATA and profile.bandwidth:
            departure = max(now, self.wire_free) + len(data) / profile.bandwidth
            self.wire_free = departure
        arrival = max(departure + world.draw(*profile.latency), self.last_arrival)
        self.last_arrival = arrival
        self.queue.append([arrival, departure, kind, data])
        if kind == DATA:
            self.unread += len(data)
        self._schedule()

    def drop_unsent(self) -> None:
        """Forget the data that has not left the sender yet (an RST)."""
        now = self.conn.network.world.now
        kept: deque[list[Any]] = deque()
        for segment in self.queue:
            if segment[2] == DATA and segment[1] > now:
                self.unread -= len(segment[3])
            else:
                kept.append(segment)
        self.queue = kept

    def clear(self) -> None:
        self.queue.clear()
        self.unread = 0

    def _schedule(self) -> None:
        if self.scheduled or self.held or not self.queue:
            return
        self.scheduled = True
        world = self.conn.network.world
        world._silent(self.queue[0][0], None, self._pump)

    def release(self) -> None:
        """Go on after a heal or an unstall: what waited is sent again, at
        the link's bandwidth, from now."""
        if not self.held:
            return
        if self.conn.network.is_cut(self.src.reactor.name, self.dst.reactor.name):
            return
        if self.stall == 0:
            return
        self.held = False
        world = self.conn.network.world
        profile = self.conn.network.profile(self.src.reactor.name, self.dst.reactor.name)
        departure = world.now
        arrival = world.now
        for segment in self.queue:
            if segment[2] == DATA and profile.bandwidth:
                departure += len(segment[3]) / profile.bandwidth
            arrival = max(departure + world.draw(*profile.latency), arrival)
            segment[0], segment[1] = arrival, departure
        self.wire_free = max(self.wire_free, departure)
        self.last_arrival = max(self.last_arrival, arrival)
        self._schedule()

    def _pump(self) -> None:
        self.scheduled = False
        if not self.queue:
            return
        network = self.conn.network
        if network.is_cut(self.src.reactor.name, self.dst.reactor.name) or self.stall == 0:
            self.held = True
            network.world.note("net", f"{self.name} held")
            return
        segment = self.queue[0]
        kind, data = segment[2], segment[3]
        if kind == DATA and self.stall is not None and len(data) > self.stall:
            segment[3] = data[self.stall :]
            data = data[: self.stall]
            self.unread -= len(data)
        else:
            self.queue.popleft()
            if kind == DATA:
                self.unread -= len(data)
        if kind == DATA and self.stall is not None:
            self.stall -= len(data)
        network.world.note(
            "net", f"{self.name} {kind} {len(data)}" if kind == DATA else f"{self.name} {kind}"
        )
        if kind == DATA:
            network.bytes_delivered += len(data)
            network.segments_delivered += 1
            # Bytes the receiver has not read yet still count against the
            # sender's window: they are given back when read.
            self.dst._pending_read += len(data)
        self.dst._arrive(self, kind, data)
        self._schedule()


class SimConnection:
    """One TCP connection: its two transports and two directions."""

    def __init__(
        self, network: Network, id: int, client: SimTransport, server: SimTransport
    ) -> None:
        self.network = network
        self.id = id
        self.client = client
        self.server = server
        self.to_server = _Direction(self, client, server)
        self.to_client = _Direction(self, server, client)
        client.connection = server.connection = self
        client.outbound, client.inbound = self.to_server, self.to_client
        server.outbound, server.inbound = self.to_client, self.to_server
        client.reactor.transports[client] = None
        server.reactor.transports[server] = None

    def __repr__(self) -> str:
        return f"<SimConnection c{self.id} {self.client.reactor.name}>{self.server.reactor.name}>"

    def direction(self, sender: str) -> _Direction:
        """The direction whose bytes ``sender`` (a process name) writes."""
        if self.client.reactor.name == sender:
            return self.to_server
        if self.server.reactor.name == sender:
            return self.to_client
        raise ValueError(f"{sender!r} is neither end of {self!r}")

    def reset(self) -> None:
        """Both ends see the connection reset (``ConnectionLost``); what was
        on its way is lost."""
        world = self.network.world
        world.note("fault", f"reset c{self.id}")
        self.to_server.clear()
        self.to_client.clear()
        for side in (self.client, self.server):
            side.inbox.clear()
            if not side.disconnected:
                world.call_later(
                    0,
                    side._lost,
                    ConnectionLost("Connection reset by peer"),
                    owner=side.reactor,
                    what=f"reset c{self.id}",
                )

    def stall(self, sender: str, after: int = 0) -> None:
        """``sender``'s direction delivers ``after`` more bytes, then nothing
        until :meth:`unstall` (a connection stalled mid-frame)."""
        self.network.world.note("fault", f"stall c{self.id} from {sender} after {after}")
        self.direction(sender).stall = after

    def unstall(self, sender: str | None = None) -> None:
        self.network.world.note("fault", f"unstall c{self.id}")
        for direction in (
            (self.to_server, self.to_client) if sender is None else (self.direction(sender),)
        ):
            direction.stall = None
            direction.release()


class _SimSocket:
    """What ``getHandle()`` gives: only ``SO_LINGER`` means anything."""

    def __init__(self, transport: SimTransport) -> None:
        self._transport = transport

    def setsockopt(self, level: int, option: int, value: Any) -> None:
        if level == socket.SOL_SOCKET and option == socket.SO_LINGER:
            on, seconds = struct.unpack("ii", value)
            self._transport._linger_zero = bool(on) and seconds == 0

    def getsockopt(self, level: int, option: int, buflen: int | None = None) -> int:
        return 0

    def fileno(self) -> int:
        return -1


@implementer(ITCPTransport, ISystemHandle, IConsumer, IPushProducer)
class SimTransport:
    """One end of a simulated TCP connection (see the module doc)."""

    def __init__(self, network: Network, reactor: SimReactor, *, server: bool) -> None:
        self.network = network
        self.reactor = reactor
        self.server = server
        self._host: IPv4Address = IPv4Address("TCP", reactor.ip, 0)
        self._peer: IPv4Address = IPv4Address("TCP", "0.0.0.0", 0)
        self.protocol: IProtocol | None = None
        self.connection: SimConnection | None = None
        self.outbound: _Direction = None  # type: ignore[assignment]  # set by SimConnection
        self.inbound: _Direction = None  # type: ignore[assignment]
        self.connector: SimConnector | None = None
        self.connected = False
        self.disconnecting = False
        self.disconnected = False
        self._reading = True
        self._draining = False
        self._read_closed = False
        self._write_closed = False
        self._aborting = False
        self._attempt_over = False
        self._dead: str | None = None
        self._rst_sent = False
        self._linger_zero = False
        self._pending_read = 0
        self.inbox: deque[tuple[str, bytes]] = deque()
        self.producer: IProducer | None = None
        self.streamingProducer = False
        self._producer_paused = False
        self._pull_asked = False
        self._no_delay = False
        self._keep_alive = False

    def __repr__(self) -> str:
        cid = self.connection.id if self.connection is not None else "-"
        side = "S" if self.server else "C"
        return f"<SimTransport c{cid}{side} {self.reactor.name}>"

    # -- ITransport -------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not isinstance(data, bytes):
            if isinstance(data, bytearray | memoryview):
                data = bytes(data)
            else:
                raise TypeError(f"Data must be bytes, not {type(data).__name__}")
        if not self.connected or self.disconnected or self._write_closed or self._aborting:
            return
        if not data:
            return
        for tap in self.network.send_taps:
            tap(self.connection, self, data)  # type: ignore[arg-type]
        self.outbound.send(DATA, data)
        self._flow()

    def writeSequence(self, data: Iterable[bytes]) -> None:
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        if not self.connected or self.disconnecting or self.disconnected:
            return
        self.disconnecting = True
        self._reading = False
        self._later(self._close_when_flushed, "close")

    def getPeer(self) -> IPv4Address:
        return self._peer

    def getHost(self) -> IPv4Address:
        return self._host

    def logPrefix(self) -> str:
        return type(self.protocol).__name__ if self.protocol is not None else "SimTransport"

    # -- ITCPTransport ------------------------------------------------------------------

    def loseWriteConnection(self) -> None:
        if not self.connected or self._write_closed or self.disconnected:
            return
        self._write_closed = True
        self.outbound.send(FIN)
        if self._read_closed:
            self._later(self._lost, "close", ConnectionDone())
        elif IHalfCloseableProtocol.providedBy(self.protocol):
            self._later(self.protocol.writeConnectionLost, "writeConnectionLost")  # type: ignore[union-attr]

    def abortConnection(self) -> None:
        if self.disconnected or self._aborting:
            return
        self._aborting = True
        self._reading = False
        if self.connected:
            self._send_rst()
        self._later(self._lost, "abort", ConnectionAborted())

    def getTcpNoDelay(self) -> bool:
        return self._no_delay

    def setTcpNoDelay(self, enabled: bool) -> None:
        self._no_delay = bool(enabled)

    def getTcpKeepAlive(self) -> bool:
        return self._keep_alive

    def setTcpKeepAlive(self, enabled: bool) -> None:
        self._keep_alive = bool(enabled)

    # -- ISystemHandle --------------------------------------------------------------------

    def getHandle(self) -> object:
        return _SimSocket(self)

    # -- IConsumer --------------------------------------------------------------------------

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        if self.producer is not None:
            raise RuntimeError(
                f"Cannot register producer {producer!r}, because producer "
                f"{self.producer!r} was never unregistered."
            )
        if self.disconnected:
            producer.stopProducing()
            return
        self.producer = producer
        self.streamingProducer = bool(streaming)
        self._producer_paused = False
        if not streaming:
            producer.resumeProducing()  # type: ignore[attr-defined]
        else:
            self._flow()

    def unregisterProducer(self) -> None:
        self.producer = None
        self._producer_paused = False
        if self.disconnecting and not self.disconnected:
            self._later(self._close_when_flushed, "close")

    # -- IPushProducer (reading) ------------------------------------------------------------

    def pauseProducing(self) -> None:
        self._reading = False

    def resumeProducing(self) -> None:
        if self.disconnected or self.disconnecting:
            return
        self._reading = True
        if self.inbox and not self._draining:
            self._draining = True
            self._later(self._drain, "read")

    def stopProducing(self) -> None:
        self.loseConnection()

    # -- internals ----------------------------------------------------------------------------

    def give(self, data: bytes) -> None:
        """Hand this end's protocol ``data`` that did not cross the network
        (a frame the world held back from it: :mod:`tasknet.sim.liar`), as
        an event of its process at this instant."""

        def hand() -> None:
            if self.protocol is not None and not self.disconnected:
                self._call(self.protocol.dataReceived, data)

        self._later(hand, "given")

    def _later(self, fn: Callable[..., Any], what: str, *args: Any) -> None:
        """``fn(*args)`` as an event of this end's process, at this instant."""
        cid = self.connection.id if self.connection is not None else "-"
        self.reactor.world.call_later(0, fn, *args, owner=self.reactor, what=f"c{cid} {what}")

    def _call(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Call protocol code as the reactor would: an exception is logged
        and counted (an "Unhandled Error"); False then."""
        try:
            fn(*args)
        except Exception:
            failure = Failure()
            self.reactor.world.errors.append(failure)
            self.reactor.world.note("error", failure_name(failure))
            log.failure("Unhandled error in a simulated protocol", failure)
            return False
        return True

    def _flow(self) -> None:
        """Pause or resume this end's producer for the bytes its peer has
        not read yet."""
        producer = self.producer
        if producer is None or self.disconnected or self.outbound is None:
            return
        over = self.outbound.unread + self.outbound.dst._pending_read > WINDOW
        if self.streamingProducer:
            if over and not self._producer_paused:
                self._producer_paused = True
                producer.pauseProducing()  # type: ignore[attr-defined]
            elif not over and self._producer_paused:
                self._later(self._resume_producer, "resumeProducing")
        elif not over and not self._pull_asked:
            self._pull_asked = True
            self._later(self._resume_producer, "resumeProducing")

    def _resume_producer(self) -> None:
        self._pull_asked = False
        producer = self.producer
        if producer is None or self.disconnected:
            return
        if self.outbound.unread + self.outbound.dst._pending_read > WINDOW:
            return
        if self.streamingProducer:
            if not self._producer_paused:
                return
            self._producer_paused = False
        self._call(producer.resumeProducing)  # type: ignore[attr-defined]
        if self.disconnecting and self.streamingProducer:
            self._later(self._close_when_flushed, "close")

    def _read(self, size: int) -> None:
        """``size`` bytes this end received were read: the sender may go on."""
        self._pending_read -= size
        peer = self.inbound.src
        if peer.producer is not None and not peer.disconnected:
            peer._flow()

    def _close_when_flushed(self) -> None:
        if self.disconnected:
            return
        producer = self.producer
        if producer is not None:
            if not self.streamingProducer:
                self._call(producer.resumeProducing)  # type: ignore[attr-defined]
                return  # closed once it unregisters
            if self._producer_paused:
                return  # closed once it is resumed
        if self._linger_zero:
            self._send_rst()
            self._lost(ConnectionLost("Connection closed with SO_LINGER 0"))
            return
        if not self._write_closed:
            self._write_closed = True
            self.outbound.send(FIN)
        self._lost(ConnectionDone())

    def _send_rst(self) -> None:
        if self._rst_sent or self.outbound is None:
            return
        self._rst_sent = True
        self._write_closed = True
        self.outbound.drop_unsent()
        self.outbound.send(RST)

    def _arrive(self, direction: _Direction, kind: str, data: bytes) -> None:
        """A segment reached this end (called by the network)."""
        if self._dead is not None:
            if kind == DATA:
                self._read(len(data))
            if self._dead != "power" and kind in (DATA, FIN, ESTABLISH) and not self._rst_sent:
                self._send_rst()
            return
        if self.disconnected:
            if kind == DATA:
                self._read(len(data))
                if not self._rst_sent and not self._attempt_over:
                    self._send_rst()
            if kind == ESTABLISH and self._attempt_over:
                self._send_rst()  # the answer to a connect given up
                self.network.forget(self)
            return
        if kind == ESTABLISH:
            self._established()
            return
        if kind == RST:
            for queued_kind, queued in self.inbox:
                if queued_kind == DATA:
                    self._read(len(queued))
            self.inbox.clear()
            self._lost(ConnectionLost("Connection reset by peer"))
            return
        if not self._reading or self.inbox:
            self.inbox.append((kind, data))
            return
        self._consume(kind, data)

    def _drain(self) -> None:
        self._draining = False
        if self.disconnected or not self._reading or not self.inbox:
            return
        kind, data = self.inbox.popleft()
        self._consume(kind, data)
        if self.inbox and self._reading and not self.disconnected:
            self._draining = True
            self._later(self._drain, "read")

    def _consume(self, kind: str, data: bytes) -> None:
        if kind == DATA:
            connection = self.connection
            for tap in self.network.taps:
                tap(connection, self, data)  # type: ignore[arg-type]
            self._read(len(data))
            for rewrite in self.network.rewrites:
                data = rewrite(connection, self, data)  # type: ignore[arg-type]
            if not data:
                return
            assert self.protocol is not None
            if not self._call(self.protocol.dataReceived, data):
                # Twisted drops a connection whose protocol raised.
                if not self._write_closed:
                    self._write_closed = True
                    self.outbound.send(FIN)
                self._lost(ConnectionLost("the protocol raised in dataReceived"))
            return
        # FIN: the peer will send no more.
        self._read_closed = True
        if self._write_closed:
            self._lost(ConnectionDone())
        elif IHalfCloseableProtocol.providedBy(self.protocol):
            self._call(self.protocol.readConnectionLost)  # type: ignore[union-attr]
        else:
            self._write_closed = True
            self.outbound.send(FIN)
            self._lost(ConnectionDone())

    def _established(self) -> None:
        """The answer to this (client) end's SYN arrived."""
        if self._attempt_over:
            self._send_rst()
            return
        connector = self.connector
        assert connector is not None
        try:
            protocol = connector.buildProtocol(self._peer)
        except Exception:
            self.reactor.world.errors.append(Failure())
            protocol = None
        self.connected = True
        if protocol is None:
            self.protocol = Protocol()
            self.protocol.makeConnection(self)
            self.loseConnection()
            return
        self.protocol = protocol
        self._call(protocol.makeConnection, self)

    def failIfNotConnected(self, err: Exception) -> None:
        """The connect failed (refused, timed out, given up): tell the connector."""
        if self.connected or self._attempt_over or self.disconnected:
            return
        self._attempt_over = True
        self.disconnected = True
        self.network.forget(self)
        if self.connector is not None:
            self.connector.connectionFailed(Failure(err))

    def _lost(self, reason: Exception | Failure) -> None:
        if self.disconnected:
            return
        self.disconnected = True
        self.connected = False
        self._reading = False
        failure = reason if isinstance(reason, Failure) else Failure(reason)
        producer, self.producer = self.producer, None
        if producer is not None:
            self._call(producer.stopProducing)
        self.network.forget(self)
        if self.protocol is not None:
            self._call(self.protocol.connectionLost, failure)
        if self.connector is not None:
            self._call(self.connector.connectionLost, failure)

    def _die(self, how: str) -> None:
        """This end's process died (see :meth:`SimReactor.die`)."""
        self._dead = how
        if self.disconnected:
            return
        was_connected = self.connected
        self.disconnected = True
        self.connected = False
        self.network.forget(self)
        if self.outbound is None or self._write_closed:
            return
        if how == "power":
            self.outbound.drop_unsent()
            return
        if not was_connected or self.inbox or self._pending_read:
            self._send_rst()
        else:
            self._write_closed = True
            self.outbound.send(FIN)


@implementer(IConnector)
class SimConnector(BaseConnector):
    """``connectTCP``'s connector (Twisted's ``BaseConnector``: the
    timeout, ``stopConnecting``, ``connect`` again from the factory)."""

    def __init__(
        self,
        reactor: SimReactor,
        host: str,
        port: int,
        factory: ClientFactory[Any],
        timeout: float | None,
        bindAddress: tuple[str, int] | None,
    ) -> None:
        super().__init__(factory, timeout, reactor)  # type: ignore[arg-type]
        self.host = host
        self.port = port
        self.bindAddress = bindAddress
        self.sim_reactor = reactor

    def _makeTransport(self) -> Any:
        return self.sim_reactor.world.network.dial(self)

    def connect(self) -> None:
        self.sim_reactor.connectors[self] = None
        super().connect()

    def connectionFailed(self, reason: Failure) -> None:
        self.sim_reactor.connectors.pop(self, None)
        super().connectionFailed(reason)

    def connectionLost(self, reason: Failure) -> None:
        self.sim_reactor.connectors.pop(self, None)
        super().connectionLost(reason)

    def getDestination(self) -> IAddress:
        return IPv4Address("TCP", self.host, self.port)

    def __repr__(self) -> str:
        return f"<SimConnector {self.sim_reactor.name}>{self.host}:{self.port} {self.state}>"


@implementer(IListeningPort)
class SimPort:
    """A listening port of a simulated process."""

    def __init__(
        self,
        network: Network,
        reactor: SimReactor,
        interface: str,
        port: int,
        factory: ServerFactory,
        backlog: int,
    ) -> None:
        self.network = network
        self.reactor = reactor
        self.interface = interface
        self.port = port
        self.factory = factory
        self.backlog = backlog
        self.listening = False

    def __repr__(self) -> str:
        return f"<SimPort {self.reactor.name} {self.interface}:{self.port}>"

    def startListening(self) -> None:
        if self.listening:
            return
        self.network._ports[(self.interface, self.port)] = self
        self.reactor.ports.append(self)
        self.listening = True
        self.network.world.note(self.reactor.name, f"listen {self.interface}:{self.port}")
        self.factory.doStart()

    def stopListening(self) -> defer.Deferred[None]:
        done: defer.Deferred[None] = defer.Deferred()
        if not self.listening:
            done.callback(None)
            return done
        self._unregister()

        def stopped() -> None:
            self.factory.doStop()
            done.callback(None)

        self.network.world.call_later(0, stopped, owner=self.reactor, what="port stopped")
        return done

    def _unregister(self) -> None:
        if self.network._ports.get((self.interface, self.port)) is self:
            del self.network._ports[(self.interface, self.port)]
        if self in self.reactor.ports:
            self.reactor.ports.remove(self)
        self.listening = False

    def getHost(self) -> IPv4Address:
        return IPv4Address("TCP", self.interface, self.port)


@implementer(IHostResolution)
class _Resolution:
    def __init__(self, name: str) -> None:
        self.name = name
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@implementer(IHostnameResolver)
class SimNameResolver:
    """Names of the world's network (``Network.names``, process names, IP
    literals), answered after a latency drawn from the seed; IPv4 only."""

    def __init__(self, network: Network, reactor: SimReactor) -> None:
        self.network = network
        self.reactor = reactor

    def resolveHostName(
        self,
        resolutionReceiver: IResolutionReceiver,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Sequence[type[IAddress]] | None = None,
        transportSemantics: str = "TCP",
    ) -> IHostResolution:
        resolution = _Resolution(hostName)
        resolutionReceiver.resolutionBegan(resolution)
        address = self.network.address_of(hostName)

        def answer() -> None:
            if resolution.cancelled:
                return
            if address is not None and (addressTypes is None or IPv4Address in addressTypes):
                resolutionReceiver.addressResolved(IPv4Address("TCP", address, portNumber))
            resolutionReceiver.resolutionComplete()

        world = self.network.world
        world.call_later(
            world.draw(*self.network.dns_latency),
            answer,
            owner=self.reactor,
            what=f"resolved {hostName}",
        )
        return resolution
