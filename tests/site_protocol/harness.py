"""Test harness for the site's protocol side: a real database, the real node
listener and a scripted node peer speaking the wire protocol over real TCP."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredQueue
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.web import server
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from tasknet.protocol.frames import FrameProtocol
from tasknet.protocol.messages import (
    FEATURE_RELIABLE,
    FEATURE_SITE_PROOF,
    DeletedEntry,
    Heartbeat,
    Identity,
    Login,
    LoginResult,
    NodeChallenge,
    ProtocolHello,
    SiteProof,
    TaskEntry,
    TaskReport,
    decode,
    sign_login,
    verify_site_proof,
)
from tasknet.site.node_listener import NodeListenerFactory
from tasknet.site.root import Tuning, build_node_side
from tasknet.site.service import NodeSide
from tasknet.site.storage import users
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.web.events import events_resource
from tests.eventually import eventually
from tests.runtime import site_runtime

TIMEOUT = 5.0


def secret_of(node_id: str) -> str:
    return f"secret-{node_id}"


class NodeKeys(dict[str, str]):
    """Every node id is known, with the secret :func:`secret_of` gives."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return secret_of(key)


class ScriptedNode(FrameProtocol):
    """A node peer driven by the test: logs in (v2 or legacy), records
    every frame, and queues decoded messages by type.  ``site_proof``: its
    Hello asks the site to prove itself; the test sends the challenge
    (:meth:`challenge`), and the SiteProof is queued like any message."""

    def __init__(self, node_id: str, *, v2: bool = True, site_proof: bool = False) -> None:
        super().__init__()
        self.node_id = node_id
        self.v2 = v2
        self.site_proof = site_proof
        self.site_nonce = ""
        self.frames: list[tuple[int, bytes]] = []
        self.messages: list[Any] = []
        self.queues: dict[type, DeferredQueue[Any]] = defaultdict(DeferredQueue)
        self.logged_in: Deferred[bool] = Deferred()
        self.lost: Deferred[None] = Deferred()

    def frameReceived(self, type_: int, payload: bytes) -> None:
        self.frames.append((type_, payload))
        if not self.v2 and type_ > 9:
            return  # a legacy node ignores types it does not know
        # A legacy node reads strictly: an unknown field raises here.
        message = decode(type_, payload, strict=not self.v2)
        if isinstance(message, Identity):
            self.site_nonce = message.nonce
            if self.v2:
                features = (FEATURE_RELIABLE, FEATURE_SITE_PROOF) if self.site_proof else None
                self.sendMessage(ProtocolHello(features=features) if features else ProtocolHello())
            self.sendMessage(
                Login(
                    self.node_id, sign_login(secret_of(self.node_id), message.nonce, self.node_id)
                )
            )
        elif isinstance(message, LoginResult):
            self.logged_in.callback(message.accepted)
        elif isinstance(message, Heartbeat | ProtocolHello):
            pass
        else:
            self.messages.append(message)
            self.queues[type(message)].put(message)

    def connectionLost(self, reason: Any = None) -> None:
        self.closing = True
        if not self.lost.called:
            self.lost.callback(None)

    def challenge(self, nonce: str = "ffeeddccbbaa99887766554433221100") -> Deferred[bool]:
        """Send NodeChallenge; fires with whether the SiteProof that comes back is right."""
        self.sendMessage(NodeChallenge(nonce))

        def check(proof: SiteProof) -> bool:
            secret = secret_of(self.node_id)
            return verify_site_proof(secret, nonce, self.site_nonce, self.node_id, proof.signature)

        return self.next(SiteProof).addCallback(check)

    def next(self, cls: type, timeout: float = TIMEOUT) -> Deferred[Any]:
        """The next message of type ``cls`` (fails after ``timeout``)."""
        return self.queues[cls].get().addTimeout(timeout, reactor)

    def pending(self, cls: type) -> list[Any]:
        return list(self.queues[cls].pending)

    def report(
        self,
        report_id: str,
        revision: int,
        tasks: list[tuple[int, int, float]] = (),  # type: ignore[assignment]
        operation_ids: dict[int, str] | None = None,
        deleted: list[tuple[int, str, str, str]] = (),  # type: ignore[assignment]
    ) -> TaskReport:
        message = TaskReport(
            report_id,
            revision,
            tuple(TaskEntry(*t) for t in tasks),
            operation_ids or {},
            tuple(DeletedEntry(*d) for d in deleted),
        )
        self.sendMessage(message)
        return message

    async def disconnect(self) -> None:
        transport: Any = self.transport
        if transport is not None and not self.lost.called:
            transport.loseConnection()
        await self.lost


class Site:
    """The site's node side, as the composition root builds it
    (``root.build_node_side``), over a real database (a SQLite file or a
    PostgreSQL URL: ``db_target``), with its real node listener on a
    loopback port; no upstream, lifecycle or HTTP."""

    def __init__(self, target: str | Path) -> None:
        self.path = str(target)
        self.db: dbmod.Database
        self.side: NodeSide
        self.port: Any = None
        self.nodes: list[ScriptedNode] = []

    @property
    def factory(self) -> NodeListenerFactory:
        return self.side.listener

    async def start(
        self, *, dispatch: bool = True, webhook_url: str | None = None, **tuning: Any
    ) -> Site:
        """Start in the site's order: outbox, node listener, dispatch
        (``dispatch=False``: not started, as after a failed recovery).
        ``tuning``: :class:`~tasknet.site.root.Tuning` fields."""
        prepare_database(self.path)
        self.db = dbmod.open_pool(self.path, **site_runtime())
        self.side = build_node_side(
            self.db,
            reactor,
            entropy=site_runtime()["entropy"],
            node_keys=NodeKeys(),
            site_name="test-site",
            webhook_url=webhook_url,
            tuning=Tuning(
                **({"outbox_poll_interval": None, "dispatch_assign_delay": 0.0} | tuning)
            ),
        )
        self.side.outbox.startService()
        await self.side.outbox.wake()
        self.side.ownership.startService()  # the site's order: its watch, then the listener
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self.factory)
        if dispatch:
            self.side.dispatcher.startService()
            await self.side.dispatcher.idle()
        return self

    async def connect(
        self, node_id: str, *, v2: bool = True, site_proof: bool = False
    ) -> ScriptedNode:
        node = ScriptedNode(node_id, v2=v2, site_proof=site_proof)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port)
        await connectProtocol(endpoint, node)
        assert await node.logged_in.addTimeout(TIMEOUT, reactor)
        self.nodes.append(node)
        return node

    async def stop(self) -> None:
        for node in self.nodes:
            await node.disconnect()
        if self.port is not None:
            await self.port.stopListening()
            self.port = None
        await self.side.stop()
        self.db.close()

    def sql(self) -> dbmod.Connection:
        """A plain connection to the same database (reads and test setup)."""
        return dbmod.connect(self.path)

    async def dispatch_passes(self, count: int) -> None:
        """Wait until ``count`` more periodic dispatch passes have completed."""
        target = self.side.dispatcher.polls + count
        await eventually(lambda: self.side.dispatcher.polls >= target)


# ------------------------------------------------------------------ fixtures data


def add_user(conn: dbmod.Connection, name: str, *, admin: bool = False) -> tuple[int, str]:
    user, token = dbmod.run_write(conn, lambda c: users.create_user(c, name, admin=admin))
    return user.id, token


def add_task(
    conn: dbmod.Connection,
    gid: int,
    user_id: int,
    state: str | None = "SUBMITTED",
    *,
    node_id: str | None = None,
    status: int | None = None,
    dispatched: int = 1,
    url: str = "http://upstream.test/files/f.bin",
    progress: float = 0.0,
) -> dict[str, Any]:
    """Write a task in ``state`` through allowed transitions only (the
    trigger checks them).  ``state=None`` is a legacy row without an
    operation.  Returns its ids."""
    op = f"op-{gid}"
    delete_op = f"del-{gid}"

    def body(c: dbmod.Cursor) -> None:
        c.execute(
            "INSERT INTO gallery (gid, user_id, name, token, url, status, progress, node_id, cost)"
            " VALUES (?, ?, ?, 'tok', ?, ?, ?, ?, 10)",
            (gid, user_id, f"gallery {gid}", url, status, progress, node_id),
        )
        if state is None:
            return
        first = "RESERVED" if state in ("RESERVED", "SUBMITTING", "UNKNOWN") else "SUBMITTED"
        c.execute(
            "INSERT INTO task_operation (gid, operation_id, state, user_id, cost, metered,"
            " dispatched) VALUES (?, ?, ?, ?, 10, ?, ?)",
            (gid, op, first, user_id, int(first == "SUBMITTED"), dispatched),
        )
        path = {
            "RESERVED": [],
            "SUBMITTING": ["SUBMITTING"],
            "UNKNOWN": ["SUBMITTING", "UNKNOWN"],
            "SUBMITTED": [],
            "DELETE_PENDING": ["DELETE_PENDING"],
            "DELETED": ["DELETE_PENDING", "DELETED"],
        }[state]
        for step in path:
            extra = ", delete_operation_id = ?" if step == "DELETE_PENDING" else ""
            args = (step, delete_op, gid) if extra else (step, gid)
            c.execute(f"UPDATE task_operation SET state = ?{extra} WHERE gid = ?", args)
        if state == "DELETED":
            c.execute("DELETE FROM gallery WHERE gid = ?", (gid,))

    dbmod.run_write(conn, body)
    return {"operation_id": op if state else None, "delete_operation_id": delete_op}


def row(conn: dbmod.Connection, gid: int) -> Any:
    """The joined task row of ``gid`` as a dict, or None."""
    r = conn.execute(
        "SELECT g.status, g.progress, g.node_id, o.state, o.operation_id, o.last_revision,"
        " o.legacy, o.dispatched, o.delete_operation_id, o.delete_result"
        " FROM task_operation AS o LEFT JOIN gallery AS g ON g.gid = o.gid WHERE o.gid = ?"
        " UNION ALL SELECT g.status, g.progress, g.node_id, NULL, NULL, NULL, NULL, NULL, NULL,"
        " NULL FROM gallery AS g WHERE g.gid = ?"
        " AND NOT EXISTS (SELECT 1 FROM task_operation WHERE gid = ?)",
        (gid, gid, gid),
    ).fetchone()
    return None if r is None else dict(r)


def outbox_count(conn: dbmod.Connection, gid: int | None = None) -> int:
    if gid is None:
        return int(conn.execute("SELECT COUNT(*) FROM notification_outbox").fetchone()[0])
    return int(
        conn.execute("SELECT COUNT(*) FROM notification_outbox WHERE gid = ?", (gid,)).fetchone()[0]
    )


# ------------------------------------------------------------------ HTTP side


class WebhookReceiver(Resource):
    """A webhook endpoint: records every POST; answers with the next of
    ``statuses`` (then 200), after ``delay`` seconds if set.  A delayed answer
    is cancelled when the client goes away, so nothing is left on the reactor."""

    isLeaf = True

    def __init__(self, *, delay: float = 0.0, statuses: list[int] | None = None) -> None:
        super().__init__()
        self.delay = delay
        self.statuses = list(statuses or [])
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.answered = 0

    def render_POST(self, request: Request) -> bytes | int:
        content: Any = request.content
        self.bodies.append(json.loads(content.read()))
        self.headers.append(
            {k.decode(): v[0].decode() for k, v in request.requestHeaders.getAllRawHeaders()}
        )
        status = self.statuses.pop(0) if self.statuses else 200
        if not self.delay:
            request.setResponseCode(status)
            self.answered += 1
            return b"{}"
        clock: Any = reactor
        call = clock.callLater(self.delay, self._answer, request, status)

        def gone(_: object) -> None:
            if call.active():
                call.cancel()

        request.notifyFinish().addErrback(gone)
        return NOT_DONE_YET

    def _answer(self, request: Request, status: int) -> None:
        request.setResponseCode(status)
        request.write(b"{}")
        request.finish()
        self.answered += 1


async def listen_http(resource: Resource) -> Any:
    """Serve ``resource`` on a loopback port (``port.getHost().port``)."""
    return await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(server.Site(resource))


def events_root(site: Site) -> Resource:
    """``/api/events`` over the site's event hub, as the root mounts it."""
    root: Any = Resource()
    api: Any = Resource()
    root.putChild(b"api", api)
    authenticate = lambda token: site.db.read(users.user_by_token, token)  # noqa: E731
    api.putChild(b"events", events_resource(site.side.hub, authenticate, clock=reactor))
    return root


class EventsClient(WebSocketClientProtocol):
    """A WebSocket client of ``/api/events`` that queues the pushes."""

    def __init__(self) -> None:
        super().__init__()
        self.pushes: DeferredQueue[dict[str, Any]] = DeferredQueue()
        self.received: list[dict[str, Any]] = []
        self.opened: Deferred[None] = Deferred()
        self.closed: Deferred[int | None] = Deferred()

    def onOpen(self) -> None:
        self.opened.callback(None)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        message = json.loads(payload)
        self.received.append(message)
        self.pushes.put(message)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if not self.opened.called:
            self.opened.errback(ConnectionError(f"refused: {code} {reason}"))
        if not self.closed.called:
            self.closed.callback(code)

    def next(self, timeout: float = TIMEOUT) -> Deferred[dict[str, Any]]:
        return self.pushes.get().addTimeout(timeout, reactor)

    async def shut(self) -> None:
        if not self.closed.called:
            self.sendClose()
        await self.closed


async def events_client(
    port: int, token: str | None = None, headers: dict[str, str] | None = None
) -> EventsClient:
    """An open /api/events socket, authenticated by ``?token=`` or by ``headers``."""
    query = f"?token={token}" if token is not None else ""
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/api/events{query}", headers=headers)
    factory.protocol = EventsClient
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    client = await endpoint.connect(factory)  # type: ignore[arg-type]
    try:
        await client.opened.addTimeout(TIMEOUT, reactor)
    except Exception:
        await client.closed
        raise
    return client


def dropped_entries(cursor: Any) -> dict[str, dict[str, int]]:
    """The report entries and deletions the site dropped, per node and reason,
    as it keeps them (``node_dropped_entry``; ``droppedEntries`` of
    ``/api/admin/nodes``)."""
    found: dict[str, dict[str, int]] = {}
    for node_id, reason, count in cursor.execute(
        "SELECT node_id, reason, count FROM node_dropped_entry"
    ).fetchall():
        found.setdefault(node_id, {})[reason] = int(count)
    return found
