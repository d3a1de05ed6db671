"""``GET /api/events``: the WebSocket that pushes task changes after commit.

A client authenticates with its API token as ``?token=`` (browsers cannot set
an ``Authorization`` header on a WebSocket).  It receives
``{"type": "task", "task": {...}}`` text messages for its own tasks; an admin
receives every task's.  Pushes come from the outbox executor
(:mod:`tasknet.site.notify`) through :class:`EventHub`, only for committed
changes: at-least-once to the clients connected at delivery time, no replay
of older rows (a client loads the current state over HTTP first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.internet.defer import Deferred
from twisted.logger import Logger

log = Logger()


class Viewer(Protocol):
    """Who is connected (``tasknet.site.storage.users.User`` fits)."""

    id: int
    is_admin: bool


Authenticate = Callable[[str], Deferred[Any]]


class EventsProtocol(WebSocketServerProtocol):
    """One authenticated WebSocket client."""

    factory: EventsFactory
    viewer: Viewer | None = None

    def onConnect(self, request: ConnectionRequest) -> Deferred[None]:  # type: ignore[override]
        tokens = request.params.get("token") or [""]
        token = tokens[0]
        if not token:
            raise ConnectionDeny(401, "token required: /api/events?token=...")
        d = self.factory.authenticate(token)

        def decided(viewer: Viewer | None) -> None:
            if viewer is None:
                raise ConnectionDeny(401, "invalid token")
            self.viewer = viewer

        d.addCallback(decided)
        return d

    def onOpen(self) -> None:
        self.factory.hub.add(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        pass  # a client has nothing to say; pushes go one way

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.hub.discard(self)

    def wants(self, user_id: int | None) -> bool:
        viewer = self.viewer
        return viewer is not None and (viewer.is_admin or viewer.id == user_id)


class EventHub:
    """The open ``/api/events`` connections; the outbox executor publishes here."""

    def __init__(self) -> None:
        self.clients: set[EventsProtocol] = set()

    def add(self, client: EventsProtocol) -> None:
        self.clients.add(client)

    def discard(self, client: EventsProtocol) -> None:
        self.clients.discard(client)

    def listening(self) -> bool:
        return bool(self.clients)

    def publish(self, user_id: int | None, payload: str) -> int:
        """Send ``payload`` (a JSON text) to the owner's and the admins'
        connections; return how many got it."""
        data = payload.encode("utf-8")
        sent = 0
        for client in list(self.clients):
            if client.wants(user_id):
                client.sendMessage(data, isBinary=False)
                sent += 1
        return sent

    def close_all(self) -> None:
        """Close every connection (site shutdown)."""
        for client in list(self.clients):
            client.sendClose(code=1001, reason="site shutting down")


class EventsFactory(WebSocketServerFactory):
    protocol = EventsProtocol  # type: ignore[assignment]

    def __init__(self, hub: EventHub, authenticate: Authenticate) -> None:
        super().__init__()
        self.hub = hub
        self.authenticate = authenticate


def events_resource(hub: EventHub, authenticate: Authenticate) -> WebSocketResource:
    """The resource to mount at ``/api/events``.  ``authenticate(token)``
    fires with the viewer (``.id``, ``.is_admin``) or ``None``."""
    return WebSocketResource(EventsFactory(hub, authenticate))
