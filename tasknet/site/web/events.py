"""``GET /api/events``: the WebSocket that pushes task changes after commit.

A client authenticates with an ``Authorization: Bearer`` header, the web
UI's session cookie (``tasknet_session``, sent by the browser with the
opening handshake; it holds a session id, looked up with the ``sessions``
callable), or ``?token=`` (a program that cannot set a header).  The route
in ``web/api.py`` checks the handshake first (a cookie handshake needs the
site's own ``Origin``, as a write does: ``web/auth.py``), then this factory
looks the credentials up again as it accepts.  It receives ``{"type": "task", "task": {...}}`` text
messages for its own tasks; an admin receives every task's.  Pushes come from
the outbox executor (:mod:`tasknet.site.outbox`) through :class:`EventHub`,
only for committed changes: at-least-once to the clients connected at
delivery time, no replay of older rows (a client loads the current state over
HTTP first).

Bounds (INTERFACES.md, "Bounds, failures and secrets"):

* A socket stays open only while its credentials are valid: every
  :data:`TOKEN_CHECK_INTERVAL` seconds (on the factory's clock) the tokens
  and sessions behind the open sockets are looked up again (a re-check is
  not a use: it does not slide a session's idle expiry), so a token rotated
  or revoked by ``tasknet-admin`` in another process, a session signed out,
  expired or ended by an admin, closes its sockets (code 4001) within 5 s:
  at most one interval, plus autobahn's 1 s closing handshake timeout for a
  client that does not answer.
* A client that does not read has a bounded send buffer: once the socket's
  buffer is full (the transport paused its producer), what the site would
  queue on top is counted, and past :data:`SEND_BUFFER_LIMIT` bytes the
  connection is aborted.  A client that does not read (or is gone without a
  FIN) is also found by autobahn's ping: one every :data:`PING_INTERVAL`
  seconds of silence, and no pong within :data:`PING_TIMEOUT` closes it, so
  even a socket that is sent nothing does not stay forever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from tasknet.site.web.http import SECURITY_HEADERS

log = Logger()

SEND_BUFFER_LIMIT = 1024 * 1024
PING_INTERVAL = 15.0
PING_TIMEOUT = 10.0
TOKEN_CHECK_INTERVAL = 2.5
CLOSE_TOKEN_INVALID = 4001
SESSION_COOKIE = "tasknet_session"

_HANDSHAKE_HEADERS = {name.decode(): value.decode() for name, value in SECURITY_HEADERS}


class Viewer(Protocol):
    """Who is connected (``tasknet.site.storage.users.User`` fits)."""

    id: int
    is_admin: bool


#: ``authenticate(token)``: fires with the viewer, or None.
Authenticate = Callable[[str], Deferred[Any]]
#: ``sessions(session_id, slide)``: fires with the viewer, or None.
SessionLookup = Callable[[str, bool], Deferred[Any]]

TOKEN = "token"
SESSION = "session"
#: What a socket authenticated with: ``(TOKEN, token)`` or ``(SESSION, id)``.
Credential = tuple[str, str]


def handshake_credential(request: ConnectionRequest) -> Credential | None:
    """The credential of an opening handshake, in the order ``web.auth``
    reads it: a bearer ``Authorization`` header, else the session cookie,
    else ``?token=``; None if none."""
    headers = request.headers
    authorization = str(headers.get("authorization", "")).strip()
    if authorization:
        scheme, _, value = authorization.partition(" ")
        return (TOKEN, value.strip()) if scheme.lower() == "bearer" and value.strip() else None
    for part in str(headers.get("cookie", "")).split(";"):
        name, _, cookie = part.strip().partition("=")
        if name == SESSION_COOKIE and cookie:
            return (SESSION, cookie)
    tokens = request.params.get("token") or [""]
    return (TOKEN, str(tokens[0])) if tokens[0] else None


@implementer(IPushProducer)
class _SendBufferWatch:
    """The transport's producer for one socket: it says when the socket's
    buffer is full (paused) and when it drained (resumed)."""

    def __init__(self, client: EventsProtocol) -> None:
        self.client = client

    def pauseProducing(self) -> None:
        self.client.send_paused = True

    def resumeProducing(self) -> None:
        self.client.send_paused = False
        self.client.queued_while_paused = 0

    def stopProducing(self) -> None:
        pass


class EventsProtocol(WebSocketServerProtocol):
    """One authenticated WebSocket client."""

    factory: EventsFactory
    viewer: Viewer | None = None
    credential: Credential = (TOKEN, "")
    send_paused = False
    queued_while_paused = 0

    def onConnect(self, request: ConnectionRequest) -> Deferred[Any]:  # type: ignore[override]
        credential = handshake_credential(request)
        if credential is None:
            raise ConnectionDeny(401, "token required: /api/events?token=... or a session")
        d = self.factory.look_up(credential, slide=True)

        def decided(viewer: Viewer | None) -> tuple[None, dict[str, str]]:
            if viewer is None:
                raise ConnectionDeny(401, "invalid token or session")
            self.viewer = viewer
            self.credential = credential
            return None, dict(_HANDSHAKE_HEADERS)

        d.addCallback(decided)
        return d

    def onOpen(self) -> None:
        # Until now the HTTP channel was the transport's producer; from here
        # on this socket's own backlog is watched.
        transport: Any = self.transport
        transport.unregisterProducer()
        transport.registerProducer(_SendBufferWatch(self), True)
        self.factory.opened(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        pass  # a client has nothing to say; pushes go one way

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.closed(self)

    def sendData(self, data: bytes, sync: bool = False, chopsize: int | None = None) -> None:
        if self.send_paused:
            self.queued_while_paused += len(data)
            if self.queued_while_paused > self.factory.send_buffer_limit:
                log.warn(
                    "closing WebSocket {peer}: it does not read ({n} bytes waiting)",
                    peer=self.peer,
                    n=self.queued_while_paused,
                )
                self.factory.hub.discard(self)
                self.dropConnection(abort=True)
                return
        super().sendData(data, sync, chopsize)

    def wants(self, user_id: int | None) -> bool:
        viewer = self.viewer
        return viewer is not None and (viewer.is_admin or viewer.id == user_id)

    def token_checked(self, viewer: Viewer | None) -> None:
        """The credential was looked up again: close the socket unless it
        still names the same user (whose admin flag may have changed)."""
        if self.viewer is None:
            return
        if viewer is not None and viewer.id == self.viewer.id:
            self.viewer = viewer
            return
        self.factory.hub.discard(self)  # no push from now on
        self.viewer = None
        self.sendClose(code=CLOSE_TOKEN_INVALID, reason="token or session no longer valid")


class EventHub:
    """The open ``/api/events`` connections; the outbox executor publishes here."""

    def __init__(self) -> None:
        # In the order they opened (a dict): a push reaches them in that
        # order, never in the order of their addresses.
        self._clients: dict[EventsProtocol, None] = {}

    @property
    def clients(self) -> set[EventsProtocol]:
        """The open connections (a copy)."""
        return set(self._clients)

    def add(self, client: EventsProtocol) -> None:
        self._clients[client] = None

    def discard(self, client: EventsProtocol) -> None:
        self._clients.pop(client, None)

    def listening(self) -> bool:
        return bool(self._clients)

    def publish(self, user_id: int | None, payload: str) -> int:
        """Send ``payload`` (a JSON text) to the owner's and the admins'
        connections; return how many got it."""
        data = payload.encode("utf-8")
        sent = 0
        for client in list(self._clients):
            if client.wants(user_id):
                client.sendMessage(data, isBinary=False)
                sent += 1
        return sent

    def close_all(self) -> None:
        """Close every connection (site shutdown)."""
        for client in list(self._clients):
            client.sendClose(code=1001, reason="site shutting down")


class EventsFactory(WebSocketServerFactory):
    protocol = EventsProtocol  # type: ignore[assignment]

    def __init__(
        self,
        hub: EventHub,
        authenticate: Authenticate,
        *,
        sessions: SessionLookup | None = None,
        clock: IReactorTime,
        token_check_interval: float = TOKEN_CHECK_INTERVAL,
        send_buffer_limit: int = SEND_BUFFER_LIMIT,
    ) -> None:
        super().__init__()
        self.setProtocolOptions(autoPingInterval=PING_INTERVAL, autoPingTimeout=PING_TIMEOUT)
        self.hub = hub
        self.authenticate = authenticate
        self.sessions = sessions
        self.clock: IReactorTime = clock
        self.token_check_interval = token_check_interval
        self.send_buffer_limit = send_buffer_limit
        #: In the order they opened: the re-checks run in that order.
        self.open_clients: dict[EventsProtocol, None] = {}
        self._token_loop: LoopingCall | None = None

    def look_up(self, credential: Credential, *, slide: bool) -> Deferred[Any]:
        """The viewer ``credential`` names now (None: nobody; a session
        without a ``sessions`` lookup is nobody)."""
        kind, secret = credential
        if kind == SESSION:
            if self.sessions is None:
                return succeed(None)
            return self.sessions(secret, slide)
        return self.authenticate(secret)

    def opened(self, client: EventsProtocol) -> None:
        self.open_clients[client] = None
        self.hub.add(client)
        if self._token_loop is None:
            # Runs only while sockets are open (a site at rest has no timer).
            self._token_loop = LoopingCall(self.check_tokens)
            self._token_loop.clock = self.clock
            self._token_loop.start(self.token_check_interval, now=False)

    def closed(self, client: EventsProtocol) -> None:
        self.open_clients.pop(client, None)
        self.hub.discard(client)
        if not self.open_clients and self._token_loop is not None:
            if self._token_loop.running:
                self._token_loop.stop()
            self._token_loop = None

    def check_tokens(self) -> Deferred[None]:
        return Deferred.fromCoroutine(self._check_tokens())

    async def _check_tokens(self) -> None:
        by_credential: dict[Credential, list[EventsProtocol]] = {}
        for client in self.open_clients:
            if client.viewer is not None:
                by_credential.setdefault(client.credential, []).append(client)
        for credential, clients in by_credential.items():
            try:
                # A re-check is not a use: a session's idle expiry stays.
                viewer = await self.look_up(credential, slide=False)
            except Exception:
                # A database hiccup is no reason to drop everyone; next round.
                log.failure("re-checking a WebSocket token or session failed")
                continue
            for client in clients:
                client.token_checked(viewer)


class EventsResource(WebSocketResource):
    """``/api/events``; ``factory`` is public (tests set its clock)."""

    def __init__(self, factory: EventsFactory) -> None:
        super().__init__(factory)
        self.factory = factory


def events_resource(
    hub: EventHub,
    authenticate: Authenticate,
    *,
    clock: IReactorTime,
    sessions: SessionLookup | None = None,
) -> EventsResource:
    """The resource to mount at ``/api/events``.  ``authenticate(token)``
    and ``sessions(session_id, slide)`` fire with the viewer (``.id``,
    ``.is_admin``) or ``None`` (without ``sessions`` no cookie is
    accepted); re-checks run on ``clock``."""
    return EventsResource(EventsFactory(hub, authenticate, sessions=sessions, clock=clock))
