"""The connection tests' network in memory: :class:`MemoryNet`.

Sites (the real :class:`NodeListenerFactory`), nodes (the real link
service, dialling through a :class:`MemoryReactorClock`) and raw peers are
joined by :mod:`twisted.test.iosim` pumps instead of loopback TCP, and every
timer of every side (heartbeats, idle and login timeouts, retries) runs on
that one clock.  Nothing waits: :meth:`MemoryNet.flush` moves bytes (and
closes) until no side has anything left to say, :meth:`MemoryNet.advance`
moves the clock through each timer due on the way, flushing after each.  A
test then asserts on what happened; a condition that never comes fails at
once instead of after a timeout.

The same test bodies as over real TCP (tests/protocol/peers.py ``Harness``,
which tests/protocol/test_connections_tcp.py keeps for a set of integration
tests): ``site()``, ``legacy_site()``, ``node()`` and ``raw()`` answer alike,
a dial to a port nobody listens on is refused, and :meth:`MemoryNet.close`
stops everything and fails the test if a timer is left on the clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.application.internet import ClientService
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionRefusedError, UserError
from twisted.internet.protocol import ClientFactory, Factory
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test.iosim import FakeTransport, IOPump, connect

from tasknet.node.link import SiteClientService, site_client_service
from tasknet.runtime import SeededEntropy
from tests.protocol.peers import (
    SITE_KEYS,
    LegacySiteDouble,
    NodeRecorder,
    RawPeer,
    SiteRecorder,
    site_factory,
)

T = TypeVar("T")

HOST = "127.0.0.1"
#: Where the first listener of a test goes (each further one: the next port).
FIRST_PORT = 7100
#: Retries of the node's link a moment apart (on the memory clock).
FAST_RETRY = {"retry_policy": lambda attempt: 0.02}


def result_of(d: Deferred[T]) -> T:
    """What ``d`` fired with; fails the test if it has not fired, re-raises
    its failure (as ``SynchronousTestCase.successResultOf``)."""
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, f"{d!r} has not fired"
    result = results[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result  # type: ignore[no-any-return]


class MemoryNet:
    """Listeners, node services and raw peers of one test, in memory, on
    one clock (``net.clock``, also the reactor the node services dial
    through)."""

    def __init__(self) -> None:
        self.clock = MemoryReactorClock()
        self.pumps: list[IOPump] = []
        self.servers: dict[int, Factory] = {}
        self.services: list[ClientService] = []
        self.peers: list[RawPeer] = []
        self._ports = itertools.count(FIRST_PORT)
        self._client_ports = itertools.count(40_000)

    # ------------------------------------------------------------ the parts
    def site(self, handler: SiteRecorder | None = None, **kwargs: Any) -> tuple[Any, int]:
        """A real site listener (its timers on ``clock``) and its port."""
        kwargs.setdefault("clock", self.clock)
        factory = site_factory(handler or SiteRecorder(), **kwargs)
        return factory, self.listen(factory)

    def legacy_site(
        self, after_login: Callable[[RawPeer], None] = lambda peer: None
    ) -> tuple[list[LegacySiteDouble], int]:
        """A scripted legacy site; its connections in the list, as they come."""
        doubles: list[LegacySiteDouble] = []

        def build() -> LegacySiteDouble:
            double = LegacySiteDouble(dict(SITE_KEYS), after_login)
            doubles.append(double)
            self.peers.append(double)
            return double

        return doubles, self.listen(Factory.forProtocol(build))  # type: ignore[arg-type]

    def listen(self, factory: Any, port: int | None = None) -> int:
        """Serve ``factory`` on ``port`` (the next free one when None)."""
        port = next(self._ports) if port is None else port
        assert port not in self.servers, f"port {port} is taken"
        self.servers[port] = factory
        factory.doStart()
        return port

    def stop_listening(self, port: int) -> None:
        """Stop serving ``port`` and drop the connections it accepted, as
        the TCP harness's ``Listener.stop`` does."""
        factory = self.servers.pop(port)
        for session in list(getattr(factory, "connections", ())):
            if session.transport is not None:
                session.transport.abortConnection()
        self.flush()
        factory.doStop()

    def node(
        self,
        port: int,
        handler: NodeRecorder,
        node_id: str = "node-1",
        *,
        secret: str | None = None,
        **kwargs: Any,
    ) -> SiteClientService:
        """The node's real link service, dialling ``port`` (with the
        ``SITE_KEYS`` secret of ``node_id`` unless ``secret``); started."""
        kwargs = {"entropy": SeededEntropy(0), **FAST_RETRY, **kwargs}
        service = site_client_service(
            f"tcp:host={HOST}:port={port}",
            node_id,
            SITE_KEYS[node_id] if secret is None else secret,
            handler,
            reactor=self.clock,
            **kwargs,
        )
        service.startService()
        self.services.append(service)
        self.flush()
        return service

    def raw(self, port: int, peer: RawPeer | None = None) -> RawPeer:
        """A raw peer connected to ``port`` (the site has greeted it)."""
        peer = peer or RawPeer()
        self.clock.connectTCP(HOST, port, ClientFactory.forProtocol(lambda: peer))  # type: ignore[arg-type]
        self.peers.append(peer)
        self.flush()
        assert peer.transport is not None, f"nothing listens on port {port}"
        return peer

    def dial(self, port: int, factory: Any) -> Any:
        """Connect a protocol of ``factory`` to ``port`` through a client
        endpoint, as a node does; the protocol."""
        connected = TCP4ClientEndpoint(self.clock, HOST, port).connect(factory)
        self.flush()
        return result_of(connected)

    # ------------------------------------------------------------ time and bytes
    def flush(self) -> None:
        """Complete the dials, then move bytes and closes until all is quiet."""
        for _ in range(10_000):
            moved = self._complete_dials()
            for pump in list(self.pumps):
                if pump.pump():
                    moved = True
                elif pump.clientIO.disconnected and pump.serverIO.disconnected:
                    self.pumps.remove(pump)
            if not moved:
                return
        raise AssertionError("the peers never went quiet")

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, firing each timer at its time and
        flushing after it (so a Heartbeat sent at 15 s arrives at 15 s)."""
        self.flush()
        end = self.clock.seconds() + seconds
        while True:
            due = [c.getTime() for c in self.clock.getDelayedCalls() if c.getTime() <= end]
            if not due:
                break
            self.clock.advance(max(0.0, min(due) - self.clock.seconds()))
            self.flush()
        self.clock.advance(end - self.clock.seconds())
        self.flush()

    def _complete_dials(self) -> bool:
        if not self.clock.tcpClients:
            return False
        dials = list(zip(self.clock.tcpClients, self.clock.connectors, strict=True))
        del self.clock.tcpClients[:]
        del self.clock.connectors[:]
        for (host, port, client_factory, _timeout, _bind), connector in dials:
            if connector.stoppedConnecting:  # given up (a cancelled connect), as TCP's does
                client_factory.clientConnectionFailed(connector, Failure(UserError()))
                continue
            server_factory = self.servers.get(port)
            if server_factory is None:
                client_factory.clientConnectionFailed(
                    connector, Failure(ConnectionRefusedError(f"nothing listens on {port}"))
                )
                continue
            client_port = next(self._client_ports)
            server_address = IPv4Address("TCP", host, port)
            client_address = IPv4Address("TCP", HOST, client_port)
            server = server_factory.buildProtocol(client_address)
            client = client_factory.buildProtocol(server_address)
            if server is None or client is None:  # a factory refused the connection
                continue
            server_io = FakeTransport(
                server, isServer=True, hostAddress=server_address, peerAddress=client_address
            )
            client_io = FakeTransport(
                client, isServer=False, hostAddress=client_address, peerAddress=server_address
            )
            self.pumps.append(
                connect(server, server_io, client, client_io, greet=False, clock=self.clock)
            )
        return True

    # ------------------------------------------------------------ the end
    def close(self) -> None:
        """Stop the node services, close the raw peers and the listeners;
        then no timer may be left on the clock (as ``reactor_is_clean``
        demands of the real reactor)."""
        stopping = [s.stopService() for s in self.services if s.running]
        for peer in self.peers:
            transport: Any = peer.transport
            if not peer.is_closed and transport is not None:
                transport.abortConnection()
        self.flush()
        for port in list(self.servers):
            self.stop_listening(port)
        self.flush()
        for d in stopping:
            result_of(d)
        left = [c for c in self.clock.getDelayedCalls() if c.active()]
        assert not left, f"the test left timers on the clock: {left!r}"
