"""Test doubles for connection tests: recording handlers and scripted raw peers.

The raw peers parse frames on their own (header + ``decode``) so that a test
sees exactly what went over the wire, including frames our own session
classes would hide (Heartbeat, Hello, Error).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.internet import ClientService
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.node.link import site_client_service
from tasknet.protocol.messages import (
    HEADER,
    Heartbeat,
    Identity,
    Login,
    LoginResult,
    Message,
    ProtocolError,
    ProtocolHello,
    UnknownMessageType,
    decode,
    encode,
    sign_login,
    verify_login,
)
from tasknet.protocol.session import INodeHandler, INodeSession, ISiteHandler, ISiteLink
from tasknet.runtime import SystemEntropy
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.node_listener import NodeListenerFactory
from tests.eventually import eventually

SITE_KEYS = {"node-1": "s3cret", "node-2": "other-secret"}


@implementer(ISiteHandler)
class SiteRecorder:
    """An ISiteHandler that remembers every call."""

    def __init__(self) -> None:
        self.events: list[tuple[str, INodeSession, Any]] = []

    def node_attached(self, session: INodeSession) -> None:
        self.events.append(("attached", session, None))

    def message_received(self, session: INodeSession, message: Message) -> None:
        self.events.append(("message", session, message))

    def node_detached(self, session: INodeSession) -> None:
        self.events.append(("detached", session, None))

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.events]

    def messages(self) -> list[Message]:
        return [m for kind, _, m in self.events if kind == "message"]


@implementer(INodeHandler)
class NodeRecorder:
    """An INodeHandler that remembers every call."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ISiteLink, Any]] = []
        self.link: Any = None

    def link_up(self, link: ISiteLink) -> None:
        self.link = link
        self.events.append(("up", link, None))

    def message_received(self, link: ISiteLink, message: Message) -> None:
        self.events.append(("message", link, message))

    def link_down(self, link: ISiteLink) -> None:
        self.link = None
        self.events.append(("down", link, None))

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.events]

    def messages(self) -> list[Message]:
        return [m for kind, _, m in self.events if kind == "message"]


class RawPeer(Protocol):
    """Records every frame received as ``(type, message or None)``; sends raw bytes."""

    def __init__(self) -> None:
        self.buffer = b""
        self.frames: list[tuple[int, Message | None]] = []
        self.closed: Deferred[None] = Deferred()
        self.is_closed = False

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 5:
            type_, length = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < 5 + length:
                return
            payload, self.buffer = self.buffer[5 : 5 + length], self.buffer[5 + length :]
            try:
                message: Message | None = decode(type_, payload)
            except (ProtocolError, UnknownMessageType):
                message = None
            self.frames.append((type_, message))
            self.frame_received(type_, message)

    def frame_received(self, type_: int, message: Message | None) -> None:
        """Hook for scripted behaviour."""

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.is_closed = True
        self.closed.callback(None)

    def send(self, message: Message) -> None:
        self.send_raw(encode(message))

    def send_raw(self, data: bytes) -> None:
        transport: Any = self.transport
        transport.write(data)

    def messages(self) -> list[Message]:
        return [m for _, m in self.frames if m is not None]

    def of_type(self, cls: type) -> list[Any]:
        return [m for m in self.messages() if type(m) is cls]

    def types(self) -> list[int]:
        return [t for t, _ in self.frames]


async def connect_raw(port: int, peer: RawPeer | None = None) -> RawPeer:
    peer = peer or RawPeer()
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    await endpoint.connect(Factory.forProtocol(lambda: peer))  # type: ignore[arg-type, return-value]
    return peer


class LegacySiteDouble(RawPeer):
    """A scripted legacy site: Identity, never a Hello; checks Login like the real site."""

    nonce = "00112233445566778899aabbccddeeff"

    def __init__(self, keys: dict[str, str], after_login: Callable[[RawPeer], None]) -> None:
        super().__init__()
        self.keys = keys
        self.after_login = after_login

    def connectionMade(self) -> None:
        self.send(Identity("legacy-site", self.nonce))

    def frame_received(self, type_: int, message: Message | None) -> None:
        if isinstance(message, Login):
            secret = self.keys.get(message.node_id, "")
            ok = verify_login(secret, self.nonce, message.node_id, message.signature)
            self.send(LoginResult(ok, "" if ok else "bad signature"))
            if ok:
                self.after_login(self)


class Listener:
    """A real NodeListenerFactory on a loopback port, with cleanup."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory
        self.port: Any = None

    async def start(self, port: int = 0) -> int:
        endpoint = TCP4ServerEndpoint(reactor, port, interface="127.0.0.1")
        self.port = await endpoint.listen(self.factory)
        return int(self.port.getHost().port)

    async def stop(self) -> None:
        if self.port is not None:
            await self.port.stopListening()
            self.port = None
        connections = getattr(self.factory, "connections", None)
        if connections is not None:
            for session in list(connections):
                if session.transport is not None:
                    session.transport.abortConnection()
            await eventually(lambda: not connections)


def site_factory(handler: ISiteHandler, **kwargs: Any) -> NodeListenerFactory:
    kwargs.setdefault("entropy", SystemEntropy())
    kwargs.setdefault("clock", reactor)
    return NodeListenerFactory(handler, ConnectedNodes(), dict(SITE_KEYS), "site-main", **kwargs)


FAST_RETRY = {"retry_policy": lambda attempt: 0.02}


class Harness:
    """Listeners, node services and raw peers of one test, all cleaned up."""

    def __init__(self) -> None:
        self.listeners: list[Listener] = []
        self.services: list[ClientService] = []
        self.peers: list[RawPeer] = []

    async def site(self, handler: SiteRecorder | None = None, **kwargs: Any) -> tuple[Any, int]:
        listener = Listener(site_factory(handler or SiteRecorder(), **kwargs))
        self.listeners.append(listener)
        return listener.factory, await listener.start()

    async def legacy_site(self, after_login: Any = lambda peer: None) -> tuple[Any, int]:
        doubles: list[LegacySiteDouble] = []

        def build() -> LegacySiteDouble:
            double = LegacySiteDouble(dict(SITE_KEYS), after_login)
            doubles.append(double)
            self.peers.append(double)
            return double

        listener = Listener(Factory.forProtocol(build))
        self.listeners.append(listener)
        port = await listener.start()
        return doubles, port

    def node(
        self, port: int, handler: NodeRecorder, node_id: str = "node-1", **kwargs: Any
    ) -> ClientService:
        kwargs = {"reactor": reactor, "entropy": SystemEntropy(), **FAST_RETRY, **kwargs}
        service = site_client_service(
            f"tcp:host=127.0.0.1:port={port}", node_id, SITE_KEYS[node_id], handler, **kwargs
        )
        service.startService()
        self.services.append(service)
        return service

    async def raw(self, port: int) -> RawPeer:
        peer = await connect_raw(port)
        self.peers.append(peer)
        return peer

    async def close(self) -> None:
        for service in self.services:
            if service.running:
                await service.stopService()
        for peer in self.peers:
            if not peer.is_closed and peer.transport is not None:
                peer.transport.abortConnection()
                await peer.closed
        for listener in self.listeners:
            await listener.stop()


async def login_raw(peer: RawPeer, node_id: str = "node-1", *, hello: bool = False) -> None:
    await eventually(lambda: peer.of_type(Identity))
    nonce = peer.of_type(Identity)[0].nonce
    if hello:
        peer.send(ProtocolHello())
    peer.send(Login(node_id, sign_login(SITE_KEYS[node_id], nonce, node_id)))
    await eventually(lambda: peer.of_type(LoginResult))
    assert peer.of_type(LoginResult)[0] == LoginResult(True, "")


def described(data: bytes, describe: Callable[[Message], str]) -> list[str]:
    """The frames in ``data`` (whole frames, as a transport holds what was
    written), each named by ``describe``; heartbeats left out."""
    out = []
    while data:
        type_, length = HEADER.unpack_from(data)
        message = decode(type_, data[HEADER.size : HEADER.size + length])
        data = data[HEADER.size + length :]
        if type(message) is not Heartbeat:
            out.append(describe(message))
    return out
