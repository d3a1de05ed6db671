"""The node's connection to the site, kept up by a ClientService.

A v2 node sends its ``ProtocolHello`` before its ``Login``; it decides the
wire version at ``LoginResult`` without a timer: v2 only if the site's Hello
arrived first (a site sends it on accept, so a v2 site's Hello always does).
``protocol=1`` is a faithful legacy node: it never sends a Hello, ignores
types it does not know (10–13 included) and closes the connection on an
unknown field in types 0–9 (the strict reader).
"""

from __future__ import annotations

from typing import Any, cast

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet.endpoints import clientFromString
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.protocol.connection import PeerFactory, PeerProtocol, hello_is_v2
from tasknet.protocol.messages import (
    LEGACY_TYPES,
    MAX_PAYLOAD,
    DeleteGallery,
    DownloadPost,
    Goodbye,
    Identity,
    Login,
    LoginResult,
    Message,
    ProtocolHello,
    TaskCommand,
    TaskReportAck,
    sign_login,
)
from tasknet.protocol.session import ISiteLink

__all__ = ["SiteLink", "SiteLinkFactory", "site_client_service"]

log = Logger()


@implementer(ISiteLink)
class SiteLink(PeerProtocol):
    """One connection to the site; an :class:`ISiteLink` once logged in."""

    factory: SiteLinkFactory
    # What the site may send a logged-in node (commands; v2 adds the ACK).
    incoming_legacy = frozenset({DownloadPost.TYPE, DeleteGallery.TYPE})
    incoming_v2 = frozenset({TaskCommand.TYPE, TaskReportAck.TYPE})
    peer_role = "site"

    def __init__(self, factory: SiteLinkFactory) -> None:
        super().__init__(factory)
        # The legacy node reads strictly; v2 is a tolerant reader.
        self.strict = factory.wire_protocol == 1
        self.node_id = factory.node_id
        self._site_hello: ProtocolHello | None = None
        self._logged_in = False
        self._up = False

    # -- connection

    def connectionMade(self) -> None:
        super().connectionMade()
        if self.factory.wire_protocol >= 2:
            # Before Login, so the site can decide at Login without a timer.
            self.sendMessage(ProtocolHello())

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)
        if self._up:
            self._up = False
            log.info(
                "link to the site lost: {reason}",
                reason=reason.getErrorMessage() if reason is not None else "closed",
            )
            self.factory.handler.link_down(self)

    # -- receiving

    def loggedInMessage(self, message: Message) -> None:
        self.factory.handler.message_received(self, message)

    def beforeLogin(self, message: Message) -> None:
        if type(message) is Identity:
            if self._logged_in:
                self.sendError("protocol_violation", "a second Identity")
                return
            self._logged_in = True
            signature = sign_login(self.factory.secret, message.nonce, self.node_id)
            self.sendMessage(Login(self.node_id, signature))
        elif type(message) is ProtocolHello:
            self._site_hello = message
        elif type(message) is LoginResult:
            self._login_result(message)
        else:  # a Login: not something a site sends
            self.sendError("protocol_violation", f"{type(message).__name__} from the site")

    def _login_result(self, result: LoginResult) -> None:
        if not self._logged_in:
            self.sendError("protocol_violation", "LoginResult before Identity")
            return
        if not result.accepted:
            log.error(
                "the site refused node {node_id}: {reason}",
                node_id=self.node_id,
                reason=result.reason,
            )
            self.closeConnection()
            return
        if self.factory.wire_protocol >= 2 and hello_is_v2(self._site_hello):
            self.protocol_version = 2
        self.authenticated = True
        self._up = True
        log.info(
            "node {node_id} logged in to the site: protocol {protocol_version}",
            node_id=self.node_id,
            protocol_version=self.protocol_version,
            features=list(self._site_hello.features) if self._site_hello else [],
        )
        self.factory.handler.link_up(self)

    # -- ISiteLink

    def send(self, message: Message) -> None:
        if message.TYPE not in LEGACY_TYPES and self.protocol_version < 2:
            raise ValueError(f"{type(message).__name__} cannot go on a legacy (protocol 1) link")
        self.sendMessage(message)

    def close(self, reason: str) -> None:
        self.sendMessage(Goodbye(reason))
        self.closeConnection()

    def __repr__(self) -> str:
        return f"<SiteLink {self.node_id} v{self.protocol_version} up={self._up}>"


class SiteLinkFactory(PeerFactory):
    """Builds a :class:`SiteLink` per connection attempt of the ClientService."""

    def __init__(
        self,
        node_id: str,
        secret: str,
        handler: Any,  # an INodeHandler (Any: mypy cannot see zope's @implementer)
        *,
        protocol: int = 2,
        clock: Any,
        max_payload: int = MAX_PAYLOAD,
        heartbeat_interval: float = 15.0,
        idle_timeout: float = 45.0,
    ) -> None:
        if protocol not in (1, 2):
            raise ValueError(f"protocol must be 1 or 2, got {protocol!r}")
        super().__init__(
            clock=clock,
            max_payload=max_payload,
            heartbeat_interval=heartbeat_interval,
            idle_timeout=idle_timeout,
        )
        self.node_id = node_id
        self.secret = secret
        self.handler: Any = handler  # an INodeHandler
        self.wire_protocol = protocol  # not .protocol: Factory uses that name

    def buildProtocol(self, addr: Any) -> Any:  # Any: Factory's generic typing wants more
        return SiteLink(self)


def site_client_service(
    endpoint: str,
    node_id: str,
    secret: str,
    handler: Any,  # an INodeHandler (Any: mypy cannot see zope's @implementer)
    *,
    protocol: int = 2,
    reactor: Any = None,
    max_payload: int = MAX_PAYLOAD,
    heartbeat_interval: float = 15.0,
    idle_timeout: float = 45.0,
    retry_policy: Any = None,
) -> ClientService:
    """A service that keeps the node connected (and logged in) to the site.

    ``endpoint`` is a Twisted client endpoint string (``tcp:host=...:port=...``,
    ``tls:...``, ``unix:path=...``).  ``retry_policy`` defaults to exponential
    backoff from 0.5 s up to 30 s.
    """
    if reactor is None:
        from twisted.internet import reactor
    factory = SiteLinkFactory(
        node_id,
        secret,
        handler,
        protocol=protocol,
        clock=reactor,
        max_payload=max_payload,
        heartbeat_interval=heartbeat_interval,
        idle_timeout=idle_timeout,
    )
    return ClientService(
        clientFromString(reactor, endpoint),
        cast(Any, factory),
        retryPolicy=retry_policy or backoffPolicy(initialDelay=0.5, maxDelay=30.0),
        clock=reactor,
    )
