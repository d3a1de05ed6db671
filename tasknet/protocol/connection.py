"""What both ends of a connection share: decoding, the login gate, liveness.

:class:`PeerProtocol` turns frames into messages (strict or tolerant), answers
malformed ones with ``Error`` + close, keeps unauthenticated peers to the
pre-login types, sends a Heartbeat every ``heartbeat_interval`` seconds and
drops a connection that has sent no frame for ``idle_timeout`` seconds.
The site session and the node link subclass it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.protocols.policies import TimeoutMixin
from twisted.python.failure import Failure

from tasknet.protocol.frames import FrameProtocol
from tasknet.protocol.messages import (
    FEATURE_RELIABLE,
    PROTOCOL_VERSION,
    Heartbeat,
    Message,
    ProtocolError,
    ProtocolHello,
    UnknownMessageType,
    decode,
)

__all__ = ["PRE_LOGIN_TYPES", "PeerProtocol", "hello_is_v2"]

#: Types a peer may send before login; anything else is ``unauthenticated``.
PRE_LOGIN_TYPES = frozenset({0, 1, 2, 3, 8, 9, 10})


def hello_is_v2(hello: ProtocolHello | None) -> bool:
    """Whether a received Hello puts v2 in force (PROTOCOL.md, negotiation)."""
    return (
        hello is not None
        and hello.protocol_version >= PROTOCOL_VERSION
        and FEATURE_RELIABLE in hello.features
    )


class PeerProtocol(FrameProtocol, TimeoutMixin):
    """Decoded messages, login gate, heartbeats and idle timeout.

    Subclasses implement :meth:`messageReceived` and set ``authenticated``
    once login succeeded.  ``strict`` selects the legacy reader.
    """

    strict = False
    authenticated = False
    heartbeat_interval = 15.0
    idle_timeout = 45.0

    def __init__(self, clock: IReactorTime) -> None:
        super().__init__()
        # Any: zope interfaces are opaque to mypy without its plugin.
        self.clock: Any = clock
        self._heartbeat: LoopingCall | None = None

    # -- liveness

    def callLater(self, period: float, func: Any) -> IDelayedCall:  # TimeoutMixin hook
        return self.clock.callLater(period, func)

    def connectionMade(self) -> None:
        self.setTimeout(self.idle_timeout)
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = self.clock
        self._heartbeat.start(self.heartbeat_interval, now=False)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closing = True
        self.setTimeout(None)
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        self._heartbeat = None

    def _beat(self) -> None:
        self.sendMessage(Heartbeat(int(self.clock.seconds() * 1000)))

    def timeoutConnection(self) -> None:
        self.log.warn(
            "no frame from {peer} for {timeout} s, dropping the connection",
            peer=self._peer(),
            timeout=self.idle_timeout,
        )
        self.closing = True
        transport: Any = self.transport
        if transport is not None:
            # abort: a silent peer may never drain what we still have buffered.
            transport.abortConnection()

    # -- decoding

    def frameReceived(self, type_: int, payload: bytes) -> None:
        self.resetTimeout()
        if not self.authenticated and type_ not in PRE_LOGIN_TYPES:
            self.sendError("unauthenticated", f"message type {type_} before login")
            return
        try:
            message = decode(type_, payload, strict=self.strict)
        except UnknownMessageType:
            self.log.info(
                "ignoring a frame of unknown type {type} from {peer}", type=type_, peer=self._peer()
            )
            return
        except ProtocolError as e:
            self.sendError(e.code, e.message)
            return
        try:
            self.messageReceived(message)
        except Exception:
            # A bug above us must not leave the peer guessing: say so and close.
            self.log.failure("handling {message!r} failed", message=message)
            self.sendError("internal", "internal error")

    def messageReceived(self, message: Message) -> None:
        raise NotImplementedError
