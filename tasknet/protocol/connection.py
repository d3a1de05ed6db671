"""What both ends of a connection share: decoding, the login gate, routing, liveness.

:class:`PeerProtocol` turns frames into messages (strict or tolerant), answers
malformed ones with ``Error`` + close, keeps unauthenticated peers to the
pre-login types, routes messages after login by the same rules on both sides,
sends a Heartbeat every ``heartbeat_interval`` seconds and drops a connection
that has sent no frame for ``idle_timeout`` seconds.  Before login a frame may
carry at most ``pre_login_max_payload`` bytes and the login must complete
within ``login_timeout`` seconds of connecting, whatever the peer sends
meanwhile (PROTOCOL.md, "Bounds").  The site session and the node link
subclass it.

Every line a peer can cause (its ``Error`` or ``Goodbye``, a protocol error,
an unknown frame type, a Hello after login, its silence, a message our
handler failed on) is rate-limited per peer (:class:`RateLimitedLog`: its
host, and who it logged in as) and carries the peer's text clipped
(:func:`~tasknet.protocol.ratelog.clip`): no stream of connections can fill
a disk through the log (issue 38).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger, LogLevel
from twisted.protocols.policies import TimeoutMixin
from twisted.python.failure import Failure

from tasknet.protocol.frames import FrameProtocol
from tasknet.protocol.messages import (
    FEATURE_RELIABLE,
    MAX_PAYLOAD,
    PRE_LOGIN_MAX_PAYLOAD,
    PRE_LOGIN_TYPES,
    PROTOCOL_VERSION,
    Error,
    Goodbye,
    Heartbeat,
    Message,
    ProtocolError,
    ProtocolHello,
    UnknownMessageType,
    decode,
)
from tasknet.protocol.ratelog import RateLimitedLog, clip

__all__ = ["LOGIN_TIMEOUT", "PRE_LOGIN_TYPES", "PeerFactory", "PeerProtocol", "hello_is_v2"]

#: Seconds from connecting by which the login must be complete (PROTOCOL.md, "Bounds").
LOGIN_TIMEOUT = 30.0


def hello_is_v2(hello: ProtocolHello | None) -> bool:
    """Whether a received Hello puts v2 in force (PROTOCOL.md, negotiation)."""
    return (
        hello is not None
        and hello.protocol_version >= PROTOCOL_VERSION
        and FEATURE_RELIABLE in hello.features
    )


class PeerFactory(Factory):
    """What each side's factory hands every connection: its clock and limits.

    ``clock`` (required: the root's) runs every connection's timers.
    ``log_interval`` is how often events that a peer can repeat at will (a
    refused login, a peer that never logs in) are logged per peer; the
    repeats in between are counted (:class:`RateLimitedLog`).
    """

    # No "Starting factory" / "Stopping factory" lines: the roles log their
    # own line when they listen or dial.
    noisy = False

    def __init__(
        self,
        *,
        clock: IReactorTime,
        max_payload: int = MAX_PAYLOAD,
        pre_login_max_payload: int = PRE_LOGIN_MAX_PAYLOAD,
        heartbeat_interval: float = 15.0,
        idle_timeout: float = 45.0,
        login_timeout: float = LOGIN_TIMEOUT,
        log_interval: float = 60.0,
    ) -> None:
        self.clock: IReactorTime = clock  # the root's, never the global reactor
        self.max_payload = max_payload
        self.pre_login_max_payload = min(pre_login_max_payload, max_payload)
        self.heartbeat_interval = heartbeat_interval
        self.idle_timeout = idle_timeout
        self.login_timeout = login_timeout
        # Logged under the namespace of the side (tasknet.site.node_listener, tasknet.node.link).
        self.repeated_log = RateLimitedLog(
            Logger(namespace=type(self).__module__), self.clock, interval=log_interval
        )


class PeerProtocol(FrameProtocol, TimeoutMixin):
    """Decoded messages, login gate, routing, heartbeats and idle timeout.

    Subclasses implement :meth:`beforeLogin` and :meth:`loggedInMessage`, set
    ``authenticated`` (and ``protocol_version``) once login succeeded, and
    name the types their peer may send after login in ``incoming_legacy``
    (on any connection) and ``incoming_v2`` (only where v2 is in force).
    ``strict`` selects the legacy reader.
    """

    factory: PeerFactory
    strict = False
    authenticated = False
    #: The wire version in force: 1 (legacy) until login decides on 2.
    protocol_version = 1
    #: What the peer may send once logged in; anything else known is a violation.
    incoming_legacy: ClassVar[frozenset[int]] = frozenset()
    incoming_v2: ClassVar[frozenset[int]] = frozenset()
    #: Who is at the other end, for log lines ("node", "site").
    peer_role: ClassVar[str] = "peer"

    def __init__(self, factory: PeerFactory) -> None:
        super().__init__()
        self.factory = factory
        self.clock: IReactorTime = factory.clock
        # An unauthenticated peer gets the small pre-login frame limit; loggedIn() lifts it.
        self.max_payload = (
            factory.max_payload if self.authenticated else factory.pre_login_max_payload
        )
        self.heartbeat_interval = factory.heartbeat_interval
        self.idle_timeout = factory.idle_timeout
        self._heartbeat: LoopingCall | None = None
        self._login_deadline: Any = None  # an IDelayedCall

    # -- liveness

    def callLater(self, period: float, func: Any) -> IDelayedCall:  # TimeoutMixin hook
        return self.clock.callLater(period, func)

    def connectionMade(self) -> None:
        self.setTimeout(self.idle_timeout)
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = self.clock
        self._heartbeat.start(self.heartbeat_interval, now=False)
        if not self.authenticated:
            # Fixed at connect: no frame before login moves it (the idle timeout
            # alone would let a heartbeating peer stay unauthenticated forever).
            self._login_deadline = self.clock.callLater(
                self.factory.login_timeout, self._loginTimedOut
            )

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closing = True
        self.setTimeout(None)
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        self._heartbeat = None
        self._cancelLoginDeadline()

    def loggedIn(self) -> None:
        """Login succeeded: the configured frame limit applies and the deadline is off."""
        self.authenticated = True
        self.max_payload = self.factory.max_payload
        self._cancelLoginDeadline()

    def _cancelLoginDeadline(self) -> None:
        if self._login_deadline is not None and self._login_deadline.active():
            self._login_deadline.cancel()
        self._login_deadline = None

    def _loginTimedOut(self) -> None:
        self._login_deadline = None
        if self.authenticated or self.closing:
            return
        self.factory.repeated_log.emit(
            ("login timeout", self._peerHost()),
            "no login from {peer} within {timeout} s of connecting, closing",
            peer=self.describePeer(),
            timeout=self.factory.login_timeout,
        )
        self.sendMessage(
            Error("unauthenticated", f"no login within {self.factory.login_timeout:g} s")
        )
        self.closeConnection()

    def _peerHost(self) -> str:
        """The peer's host without its port (which changes on every connection)."""
        transport: Any = self.transport
        try:
            return str(transport.getPeer().host)
        except Exception:  # not an IP transport (unix:, a test transport)
            return self._peer()

    def _logKey(self, event: str) -> tuple[str, str, str]:
        """The rate-limit key of a line a peer caused: per host (a new
        connection's port is new, its host is not) and, once logged in, per
        who it is (several nodes may share a host)."""
        return (event, self._peerHost(), self.describePeer() if self.authenticated else "")

    def _beat(self) -> None:
        self.sendMessage(Heartbeat(int(self.clock.seconds() * 1000)))

    def timeoutConnection(self) -> None:
        self.factory.repeated_log.emit(
            self._logKey("idle"),
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
            # A v2 peer's Hello before login is what a legacy reader expects
            # to ignore (negotiation): debug.  Anything else is worth a line.
            expected = not self.authenticated and type_ == ProtocolHello.TYPE
            self.factory.repeated_log.emit(
                self._logKey("unknown type"),
                "ignoring a frame of unknown type {type} from {peer}",
                level=LogLevel.debug if expected else LogLevel.info,
                type=type_,
                peer=self._peer(),
            )
            return
        except ProtocolError as e:
            self.sendError(e.code, e.message)
            return
        try:
            self.messageReceived(message)
        except Exception:
            # A bug above us must not leave the peer guessing: say so and close.
            self.factory.repeated_log.emit(
                self._logKey("handler failed"),
                "handling {message} failed",
                level=LogLevel.critical,
                log_failure=Failure(),
                message=clip(repr(message)),
            )
            self.sendError("internal", "internal error")

    # -- routing

    def messageReceived(self, message: Message) -> None:
        """Route one decoded message by the rules both sides share."""
        kind = type(message)
        if kind is Heartbeat:
            return  # its frame already reset the idle timeout
        if kind is Error or kind is Goodbye:
            self.factory.repeated_log.emit(
                self._logKey("says"),
                "{peer} says {message}; closing",
                level=LogLevel.info,
                peer=self.describePeer(),
                message=clip(repr(message)),
            )
            self.closeConnection()
        elif not self.authenticated:
            self.beforeLogin(message)
        elif kind is ProtocolHello:
            self.factory.repeated_log.emit(
                self._logKey("hello after login"),
                "{peer} sent a Hello after login; ignored",
                level=LogLevel.info,
                peer=self.describePeer(),
            )
        elif message.TYPE in self.incoming_legacy or (
            message.TYPE in self.incoming_v2 and self.protocol_version >= 2
        ):
            self.loggedInMessage(message)
        else:
            self.sendError(
                "protocol_violation",
                f"{kind.__name__} is not a {self.peer_role} message on a "
                f"protocol {self.protocol_version} connection",
            )

    def sendError(self, code: str, message: str) -> None:
        """Send ``Error{code, message}``, then close; the line rate-limited per
        peer and code (a peer can provoke it at will), the text clipped (it
        may quote the peer)."""
        self.factory.repeated_log.emit(
            self._logKey(f"protocol error {code}"),
            "protocol error {code} ({message}), closing {peer}",
            code=code,
            message=clip(message),
            peer=self._peer(),
        )
        self.sendMessage(Error(code, message))
        self.closeConnection()

    def describePeer(self) -> str:
        """The other end, for log lines."""
        return f"{self.peer_role} at {self._peer()}"

    @abstractmethod
    def beforeLogin(self, message: Message) -> None:
        """A pre-login message other than Heartbeat, Error and Goodbye."""

    @abstractmethod
    def loggedInMessage(self, message: Message) -> None:
        """A message the peer may send on this connection once logged in."""
