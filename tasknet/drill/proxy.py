"""A TCP fault proxy for the site ⇄ node link.

The proxy listens on a loopback port and, for every client (node) connection,
dials the target (the site's node listener) and relays bytes both ways.  It
understands just enough of the wire format (the 5-byte frame header
``[type:1][length:4 BE]``) to act on whole frames, so faults are real TCP
faults on the real protocol rather than mocks:

* ``delay(ms)``: every forwarded chunk is held ``ms`` milliseconds (order kept);
* ``drop(type, direction, count)``: whole frames of a message type vanish;
* ``cut_after(n, direction, msg_type)``: forward ``n`` more bytes (counted from
  the start of the next frame of ``msg_type`` when given), then cut the
  connection: the receiver gets a truncated stream and a close;
* ``blackhole()``: accept and read, forward nothing either way (a partition);
* ``forsake()``: close the client's (node's) side of every relayed connection
  and keep the target's (site's) side open and silent, as when the node's
  host vanished: the node dials again (its next site), while the site still
  holds a connection that leads nowhere until it closes it itself;
* ``heal()``: back to plain pass-through.  Connections that lost bytes while
  black-holed are aborted on heal: their framing can no longer be trusted
  (the peers will reconnect, as they would after a real partition timeout).

Every frame is counted by (direction, type); frames of interesting types are
recorded with their decoded JSON payload as drill evidence.

All methods must be called in the reactor thread (the drill runner uses
``blockingCallFromThread``).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.protocol.messages import (
    HEADER,
    DeleteGallery,
    DeleteResult,
    DownloadPost,
    StatusReport,
    TaskCommand,
    TaskReport,
    TaskReportAck,
)

TO_SERVER = "to_server"  # client -> target: node -> site
TO_CLIENT = "to_client"  # target -> client: site -> node
DIRECTIONS = (TO_SERVER, TO_CLIENT)

# Message types worth keeping with their payload: commands, reports, ACKs.
DEFAULT_CAPTURE = frozenset(
    cls.TYPE
    for cls in (
        DownloadPost,
        DeleteGallery,
        StatusReport,
        DeleteResult,
        TaskCommand,
        TaskReport,
        TaskReportAck,
    )
)
MAX_RECORDS = 20_000

_log = Logger()


def _t(side: protocol.Protocol) -> Any:
    """The side's transport, typed Any: a TCP transport, with more than ITransport declares."""
    return side.transport


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")


class FrameSplitter:
    """Incremental splitter of ``[type:1][len:4 BE][payload]`` frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add bytes; return the frames now complete as ``(type, whole frame bytes)``."""
        self._buf += data
        frames: list[tuple[int, bytes]] = []
        while len(self._buf) >= HEADER.size:
            type_, length = HEADER.unpack_from(self._buf)
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append((type_, bytes(self._buf[:end])))
            del self._buf[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)


@dataclass
class FrameRecord:
    """One frame seen by the proxy (evidence for drill reports)."""

    seq: int
    link: int
    direction: str
    type: int
    length: int
    at: float
    action: str  # "forwarded" | "dropped" | "cut"
    payload: Any = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Match = Callable[[Any], bool]


def _payload(frame: bytes) -> Any:
    try:
        return json.loads(frame[HEADER.size :].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"undecodable": len(frame) - HEADER.size}


@dataclass
class _DropRule:
    msg_type: int
    direction: str
    remaining: int | None  # None: until heal
    match: Match | None = None  # only frames whose decoded payload satisfies it


@dataclass
class _CutRule:
    direction: str
    n_bytes: int
    msg_type: int | None
    match: Match | None = None
    armed: bool = False  # counting started (msg_type seen, or no msg_type)
    sent: int = 0


@dataclass
class _Faults:
    delay_ms: float = 0.0
    drops: list[_DropRule] = field(default_factory=list)
    cuts: list[_CutRule] = field(default_factory=list)
    blackhole: bool = False


class _Link:
    """One relayed connection: a client transport and its target transport."""

    def __init__(self, proxy: FaultProxy, link_id: int) -> None:
        self.proxy = proxy
        self.id = link_id
        self.client: _ClientSide | None = None
        self.server: _ServerSide | None = None
        self.splitters = {d: FrameSplitter() for d in DIRECTIONS}
        self.not_before = dict.fromkeys(DIRECTIONS, 0.0)
        self.early: list[bytes] = []  # client bytes before the target answered
        self.timers: list[Any] = []  # IDelayedCall
        self.tainted = False  # lost bytes in a black hole
        self.closed = False
        self.connecting: defer.Deferred[Any] | None = None
        self.forsaken_at: float | None = None  # forsake(): the client side is gone

    # -- input -------------------------------------------------------------

    def receive(self, direction: str, data: bytes) -> None:
        if self.closed:
            return
        if self.forsaken_at is not None:
            self.proxy.forsaken_bytes[direction] += len(data)
            return
        if direction == TO_SERVER and self.server is None:
            self.early.append(data)
            return
        faults = self.proxy.faults
        if faults.blackhole:
            self.tainted = True
            self.proxy.blackholed_bytes[direction] += len(data)
            return
        for type_, frame in self.splitters[direction].feed(data):
            self._frame(direction, type_, frame)
            if self.closed:
                return

    def server_connected(self, server: _ServerSide) -> None:
        self.server = server
        if self.closed:  # the client left while we were dialling
            if server.transport is not None:
                _t(server).loseConnection()
            return
        early, self.early = self.early, []
        for chunk in early:
            self.receive(TO_SERVER, chunk)

    def _frame(self, direction: str, type_: int, frame: bytes) -> None:
        proxy = self.proxy
        if proxy.take_drop(direction, type_, frame):
            proxy.record(self, direction, type_, frame, "dropped")
            return
        cut = proxy.cut_allowance(direction, type_, frame)
        if cut is not None:
            proxy.record(self, direction, type_, frame, "cut")
            self._emit(direction, frame[:cut], then_cut=True)
            return
        proxy.record(self, direction, type_, frame, "forwarded")
        self._emit(direction, frame)

    # -- output ------------------------------------------------------------

    def _emit(self, direction: str, data: bytes, then_cut: bool = False) -> None:
        clock = self.proxy.clock
        delay = self.proxy.faults.delay_ms / 1000.0
        now = clock.seconds()
        due = max(now + delay, self.not_before[direction])
        if due <= now:
            self._write(direction, data, then_cut)
            return
        self.not_before[direction] = due
        timer = clock.callLater(due - now, self._delayed, direction, data, then_cut)
        self.timers.append(timer)

    def _delayed(self, direction: str, data: bytes, then_cut: bool) -> None:
        self.timers = [t for t in self.timers if t.active()]
        self._write(direction, data, then_cut)

    def _write(self, direction: str, data: bytes, then_cut: bool) -> None:
        if self.closed:
            return
        side = self.server if direction == TO_SERVER else self.client
        other = self.client if direction == TO_SERVER else self.server
        if side is not None and side.transport is not None and data:
            _t(side).write(data)
        if then_cut:
            self.proxy.cuts_done += 1
            # The receiver gets the truncated bytes, then a FIN; the sender is reset.
            self.closed = True
            if side is not None and side.transport is not None:
                _t(side).loseConnection()
            if other is not None and other.transport is not None:
                _t(other).abortConnection()
            self._cancel_timers()

    # -- teardown ----------------------------------------------------------

    def abort(self) -> None:
        self.closed = True
        self._cancel_timers()
        for side in (self.client, self.server):
            if side is not None and side.transport is not None:
                _t(side).abortConnection()

    @property
    def open(self) -> bool:
        """The target's side is connected and the link not closed."""
        return not self.closed and self.server is not None and self.server.transport is not None

    def forsake(self) -> bool:
        """Close the client side only; the target side stays open, silent."""
        if not self.open or self.forsaken_at is not None:
            return False
        self.forsaken_at = time.time()
        self._cancel_timers()
        if self.client is not None and self.client.transport is not None:
            _t(self.client).loseConnection()
        return True

    def side_lost(self, client_side: bool) -> None:
        """Either side went away: close the other one (after flushing what it has)."""
        if self.forsaken_at is not None:
            if client_side:
                return  # forsaken: the target's side stays open until the target closes it
            self.proxy.forsaken_closed.append(round(time.time() - self.forsaken_at, 3))
        self._cancel_timers()
        self.closed = True
        if self.connecting is not None:
            self.connecting.cancel()
        for side in (self.client, self.server):
            if side is not None and side.transport is not None:
                _t(side).loseConnection()
        self.proxy.links.pop(self.id, None)

    def _cancel_timers(self) -> None:
        for t in self.timers:
            if t.active():
                t.cancel()
        self.timers = []


class _ServerSide(protocol.Protocol):
    def __init__(self, link: _Link) -> None:
        self.link = link

    def connectionMade(self) -> None:
        self.link.server_connected(self)

    def dataReceived(self, data: bytes) -> None:
        self.link.receive(TO_CLIENT, data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.link.side_lost(client_side=False)


class _ClientSide(protocol.Protocol):
    link: _Link

    def connectionMade(self) -> None:
        proxy: FaultProxy = self.factory.proxy  # type: ignore[attr-defined]
        self.link = proxy.new_link(self)
        endpoint = TCP4ClientEndpoint(proxy.reactor, proxy.target_host, proxy.target_port, 5)
        d = connectProtocol(endpoint, _ServerSide(self.link))
        self.link.connecting = d
        d.addBoth(self._dialled)

    def _dialled(self, result: Any) -> None:
        self.link.connecting = None
        if isinstance(result, Failure):
            if not result.check(defer.CancelledError):
                # The target is down (e.g. the site was SIGKILLed): the client sees a
                # close, exactly as if it had dialled the dead site itself.
                self.link.proxy.target_failures += 1
            if self.transport is not None:
                _t(self).loseConnection()

    def dataReceived(self, data: bytes) -> None:
        self.link.receive(TO_SERVER, data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.link.side_lost(client_side=True)


class _ProxyFactory(protocol.ServerFactory):
    protocol = _ClientSide

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy


class FaultProxy:
    """A fault-injecting relay from a loopback port to ``target_host:target_port``."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        reactor: IReactorTCP,
        capture: frozenset[int] = DEFAULT_CAPTURE,
    ) -> None:
        # The drill's reactor thread's (or a test's): it listens and dials
        # on its TCP and holds delayed chunks on its time, the same object.
        self.reactor: IReactorTCP = reactor
        self.clock: IReactorTime = IReactorTime(reactor)
        self.target_host = target_host
        self.target_port = target_port
        self.capture = capture
        self.faults = _Faults()
        self.links: dict[int, _Link] = {}
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self._listening: Any = None  # IListeningPort
        self.port = 0
        self.counts: Counter[tuple[str, int]] = Counter()
        self.dropped: Counter[tuple[str, int]] = Counter()
        self.records: list[FrameRecord] = []
        self.blackholed_bytes: Counter[str] = Counter()
        self.connections = 0
        self.cuts_done = 0
        self.target_failures = 0
        self.forsaken = 0
        self.forsaken_bytes: Counter[str] = Counter()
        # Seconds from each forsake() until the target closed its side.
        self.forsaken_closed: list[float] = []

    # -- lifecycle ---------------------------------------------------------

    def start(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        """Listen (synchronously, in the reactor thread); return the bound port."""
        self._listening = self.reactor.listenTCP(port, _ProxyFactory(self), interface=interface)
        self.port = self._listening.getHost().port
        return self.port

    def stop(self) -> defer.Deferred[None]:
        """Stop listening and abort every relayed connection."""
        self.disconnect_all()
        listening, self._listening = self._listening, None
        if listening is None:
            return defer.succeed(None)
        return defer.maybeDeferred(listening.stopListening)  # type: ignore[no-any-return]

    def new_link(self, client: _ClientSide) -> _Link:
        link = _Link(self, next(self._ids))
        link.client = client
        self.links[link.id] = link
        self.connections += 1
        return link

    # -- faults ------------------------------------------------------------

    def delay(self, ms: float) -> None:
        """Hold every forwarded chunk ``ms`` milliseconds (order is preserved)."""
        if ms < 0:
            raise ValueError("delay must be >= 0 ms")
        self.faults.delay_ms = float(ms)

    def drop(
        self,
        msg_type: int,
        direction: str,
        count: int | None = None,
        match: Match | None = None,
    ) -> None:
        """Drop the next ``count`` frames (all, if None) of ``msg_type`` going ``direction``.

        With ``match``, only frames whose decoded JSON payload satisfies it are
        dropped (e.g. the ACK of one particular report).
        """
        _check_direction(direction)
        if not 0 <= msg_type <= 255:
            raise ValueError("message type is one byte (0..255)")
        if count is not None and count < 1:
            raise ValueError("count must be >= 1 or None")
        self.faults.drops.append(_DropRule(msg_type, direction, count, match))

    def cut_after(
        self,
        n_bytes: int,
        direction: str,
        msg_type: int | None = None,
        match: Match | None = None,
    ) -> None:
        """Forward ``n_bytes`` more bytes going ``direction``, then cut the connection.

        With ``msg_type``, counting starts at the first byte of the next frame of
        that type, so ``cut_after(20, TO_SERVER, 12)`` truncates the next
        TaskReport after 20 bytes; with ``match`` as well, only a frame whose
        decoded payload satisfies it arms the rule.  The rule fires once.
        """
        _check_direction(direction)
        if n_bytes < 0:
            raise ValueError("n_bytes must be >= 0")
        if match is not None and msg_type is None:
            raise ValueError("match needs msg_type")
        self.faults.cuts.append(_CutRule(direction, n_bytes, msg_type, match))

    def blackhole(self) -> None:
        """Accept and read everything, forward nothing, both ways."""
        self.faults.blackhole = True

    def heal(self) -> None:
        """Clear every fault; abort connections that lost bytes in the black hole."""
        self.faults = _Faults()
        for link in list(self.links.values()):
            if link.tainted:
                link.abort()

    def forsake(self) -> int:
        """Forsake every open relayed connection (see the module doc): the
        client sees a close, the target nothing.  How many were forsaken."""
        count = sum(link.forsake() for link in list(self.links.values()))
        self.forsaken += count
        return count

    def open_links(self) -> int:
        """Relayed connections whose target side is open (forsaken ones too)."""
        return sum(1 for link in self.links.values() if link.open)

    def disconnect_all(self) -> None:
        """Abort every relayed connection now (both sides see a reset)."""
        for link in list(self.links.values()):
            link.abort()

    # -- decisions used by links --------------------------------------------

    def take_drop(self, direction: str, type_: int, frame: bytes) -> bool:
        for rule in self.faults.drops:
            if rule.direction == direction and rule.msg_type == type_:
                if rule.match is not None and not rule.match(_payload(frame)):
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self.faults.drops.remove(rule)
                self.dropped[(direction, type_)] += 1
                return True
        return False

    def cut_allowance(self, direction: str, type_: int, frame: bytes) -> int | None:
        """How many bytes of this frame to forward before cutting, or None (no cut)."""
        length = len(frame)
        for rule in self.faults.cuts:
            if rule.direction != direction:
                continue
            if not rule.armed:
                if rule.msg_type is not None and rule.msg_type != type_:
                    continue
                if rule.match is not None and not rule.match(_payload(frame)):
                    continue
                rule.armed = True
            left = rule.n_bytes - rule.sent
            if left < length:
                self.faults.cuts.remove(rule)
                return max(left, 0)
            rule.sent += length
        return None

    # -- evidence ------------------------------------------------------------

    def record(self, link: _Link, direction: str, type_: int, frame: bytes, action: str) -> None:
        if action == "forwarded":
            self.counts[(direction, type_)] += 1
        if type_ not in self.capture or len(self.records) >= MAX_RECORDS:
            return
        payload = _payload(frame)
        self.records.append(
            FrameRecord(
                next(self._seq),
                link.id,
                direction,
                type_,
                len(frame) - HEADER.size,
                time.time(),
                action,
                payload,
            )
        )

    def frames(
        self, msg_type: int | None = None, direction: str | None = None
    ) -> list[FrameRecord]:
        """Recorded frames, optionally of one type and/or direction."""
        return [
            r
            for r in self.records
            if (msg_type is None or r.type == msg_type)
            and (direction is None or r.direction == direction)
        ]

    def stats(self) -> dict[str, Any]:
        """Counters as JSON-able data."""

        def flat(counter: Counter[tuple[str, int]]) -> dict[str, int]:
            return {f"{d}:{t}": n for (d, t), n in sorted(counter.items())}

        return {
            "port": self.port,
            "target": f"{self.target_host}:{self.target_port}",
            "connections": self.connections,
            "open_links": self.open_links(),
            "forwarded": flat(self.counts),
            "dropped": flat(self.dropped),
            "cuts": self.cuts_done,
            "blackholed_bytes": dict(self.blackholed_bytes),
            "target_failures": self.target_failures,
            "forsaken": self.forsaken,
            "forsaken_bytes": dict(self.forsaken_bytes),
            "forsaken_closed_after": list(self.forsaken_closed),
        }
