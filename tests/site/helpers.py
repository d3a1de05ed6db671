"""Shared helpers of the site lifecycle tests: real databases (a SQLite file
or a PostgreSQL database, ``db_target``), the real mock upstream on loopback,
the real site service over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool
from zope.interface import implementer

from tasknet.runtime import SystemEntropy
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.root import Tuning, build_site
from tasknet.site.service import Options, SiteParts, SiteService
from tasknet.site.session_states import ITrackedSession, SessionInput, SessionLife
from tasknet.site.storage import node_panel as panel
from tasknet.site.storage import users
from tasknet.site.storage.engine.database import (
    Connection,
    Cursor,
    Database,
    connect,
    open_pool,
    run_read,
    run_write,
)
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.upstream_client import UpstreamClient
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.backends import add_failing_trigger
from tests.runtime import site_runtime

POST_ARCHIVE = "/api/galleries/*/archive"


def fault(kind: str, method: str = "POST", path: str = POST_ARCHIVE, **params: Any) -> dict:
    return {"method": method, "path": path, "fault": kind, "params": params, "times": None}


def dispatch_row(cursor: Cursor, gid: int) -> Any:
    """The joined row dispatch judges ``gid`` by: every key
    ``eligibility.is_dispatchable`` reads, plus the command's columns."""
    row: Any = cursor.execute(
        "SELECT g.gid, g.name, g.token, g.url, g.status, g.node_id, g.user_id, "
        "o.state, o.operation_id, o.legacy, o.dispatched "
        "FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid WHERE g.gid = ?",
        (gid,),
    ).fetchone()
    return row


def raw(path: str) -> Connection:
    """A plain connection for checking the database from the test (``path``:
    a SQLite file or a PostgreSQL URL, as everywhere here)."""
    return connect(path)


def query(path: str, sql: str, *args: Any) -> list[Any]:
    connection = raw(path)
    try:
        return connection.execute(sql, args).fetchall()
    finally:
        connection.close()


def one(path: str, sql: str, *args: Any) -> Any:
    rows = query(path, sql, *args)
    return rows[0] if rows else None


def add_user(path: str, name: str, *, admin: bool = False, quota: int = 5000) -> tuple[int, str]:
    connection = raw(path)
    try:
        user, token = run_write(
            connection, lambda c: users.create_user(c, name, admin=admin, quota=quota)
        )
    finally:
        connection.close()
    return user.id, token


@dataclass
class Env:
    """An initialised database, an upstream client and a lifecycle."""

    path: str
    db: Database
    upstream: RunningUpstream
    client: UpstreamClient
    lifecycle: Lifecycle
    user_id: int

    def posts(self, gid: int) -> int:
        return int(self.upstream.app.journal.posts.get(gid, 0))


@asynccontextmanager
async def lifecycle_env(
    target: str, *, timeout: float = 0.5, quota: int = 5000
) -> AsyncIterator[Env]:
    """``target``: an empty database (``db_target``), prepared here."""
    path = target
    prepare_database(path)
    user_id, _ = add_user(path, "alice", quota=quota)
    upstream = await start_upstream()
    client = UpstreamClient(
        upstream.base_url, reactor=reactor, persistent=False, prepare_timeout=timeout
    )
    db = open_pool(path, **site_runtime())
    env = Env(
        path,
        db,
        upstream,
        client,
        Lifecycle(db, client, upstream_timeout=timeout, clock=reactor, entropy=SystemEntropy()),
        user_id,
    )
    try:
        yield env
    finally:
        await client.close()
        db.close()
        await upstream.stop()


def fail_usage_writes(path: str, message: str = "simulated disk failure") -> None:
    """Make every later ``weekly_usage`` insert fail (a real database error,
    from trigger ``usage_fails``): the persist transaction of a create then fails."""
    add_failing_trigger(path, "usage_fails", "weekly_usage", message)


class SiteWithUsers:
    """A running site with its upstream, the demo admin and two users, alice and bob."""

    def __init__(self, site: RunningSite, path: str, upstream: RunningUpstream) -> None:
        self.site = site
        self.path = path
        self.upstream = upstream
        self.admin = "demo"
        _, self.alice = add_user(path, "alice")
        _, self.bob = add_user(path, "bob")


def assert_error(answer: tuple[int, Any], status: int, code: str) -> None:
    """``answer`` is ``status`` with the error envelope of ``code`` and a message."""
    got_status, document = answer
    assert got_status == status, document
    assert document["error"]["code"] == code, document
    assert isinstance(document["error"]["message"], str) and document["error"]["message"]


def site_options(path: str, upstream_url: str, *extra: str) -> Options:
    options = Options()
    options.parseOptions(
        [
            "--db",
            path,
            "--http",
            "tcp:0:interface=127.0.0.1",
            "--nodes",
            "tcp:0:interface=127.0.0.1",
            "--upstream",
            upstream_url,
            "--upstream-timeout",
            "0.5",
            *extra,
        ]
    )
    return options


@dataclass
class RunningSite:
    service: SiteService
    base_url: str
    pool: HTTPConnectionPool

    @property
    def site(self) -> SiteParts:
        return self.service.parts

    async def request(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        body: Any = None,
        data: bytes | None = None,
        headers: dict[str, list[str]] | None = None,
    ) -> tuple[int, Any]:
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = [f"Bearer {token}"]
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = ["application/json"]
        response = await treq.request(
            method, self.base_url + path, data=data, headers=all_headers, pool=self.pool
        )
        content = await treq.content(response)
        try:
            document = json.loads(content)
        except ValueError:
            document = content
        return response.code, document


@asynccontextmanager
async def running_site(options: Options, tuning: Tuning = Tuning()) -> AsyncIterator[RunningSite]:
    """The real site, built by the composition root and started."""
    service = build_site(options, tuning=tuning)
    service.startService()
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        await service.ready
        port = service.http_port.getHost().port
        yield RunningSite(service, f"http://127.0.0.1:{port}", pool)
    finally:
        await service.stopService()
        await pool.closeCachedConnections()


def settle() -> Deferred[None]:
    return deferLater(reactor, 0, lambda: None)


class HeldWriter:
    """A write whose function blocks the writer thread until released."""

    def __init__(self, db: Database) -> None:
        self._started: Deferred[None] = Deferred()
        self._release = threading.Event()
        self.done = db.write(self._block)

    def _block(self, cursor: Any) -> str:
        reactor.callFromThread(self._started.callback, None)
        if not self._release.wait(10):
            raise RuntimeError("the test never released the writer")
        return "held"

    async def started(self) -> None:
        await self._started

    def release(self) -> None:
        self._release.set()


class RecordedOutputs:
    """Stands for the session a life's table runs its outputs on: runs
    none, records their names (a fake session's life, the table's test)."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def __getattr__(self, name: str) -> Callable[[object], None]:
        if not name.startswith("_") or name.startswith("__"):
            raise AttributeError(name)
        return lambda event: self.ran.append(name)


@implementer(ITrackedSession)
class RecordingSession:
    """A logged-in v2 node connection (``CURRENT``, not yet in a registry)
    that records what the site sends it: downloads, deletes, ACKs and
    closes; what its life's table would run is in ``outputs.ran``."""

    protocol_version = 2
    features: tuple[str, ...] = ()
    archive_url = ""
    serve_url = ""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.connected_at = 0.0
        self.outputs = RecordedOutputs()
        self.life = SessionLife(self.outputs)
        self.life.handle(SessionInput.LOGIN)
        self.life.handle(SessionInput.LOGIN_ACCEPTED)
        self.downloads: list[tuple[str, int]] = []
        self.deletes: list[tuple[str, int]] = []
        self.acks: list[tuple[str, str]] = []
        self.closed: list[str] = []

    def send_download(
        self, operation_id: str, gid: int, token: str, name: str, url: str, size: int = 0
    ) -> None:
        self.downloads.append((operation_id, gid))

    def send_delete(self, delete_operation_id: str, gid: int, name: str) -> None:
        self.deletes.append((delete_operation_id, gid))

    def send_ack(self, report_id: str, result: str) -> None:
        self.acks.append((report_id, result))

    def close(self, reason: str) -> None:
        self.closed.append(reason)


def lease_timeout_passed(target: str, instance_id: int, *, seconds: float = 9.0) -> None:
    """Date gone instance ``instance_id``'s last lease confirmation
    ``seconds`` back (past the 8 s lease timeout): the wait a reaper owes a
    gone instance before it settles what it left (SCALE.md "Fencing"),
    without sitting it out in a test."""
    from tasknet.site.storage.engine.sql import offset, sql

    connection = raw(target)
    try:
        connection.execute(
            sql("UPDATE instance_lease SET confirmed_at = {now_offset} WHERE instance_id = ?"),
            (offset(-seconds), instance_id),
        )
    finally:
        connection.close()


def node_panel(connection: Any, now: float, connected: Sequence[str] = ()) -> dict[str, Any]:
    """``/api/admin/nodes``'s nodes as the storage renders them at ``now``,
    by id in their order, with ``connected`` the ids connected to this
    (SQLite) site."""
    registry = panel.Registry(
        "site",
        None,
        False,
        tuple(panel.Registered(n, None, 2, (), iso(now), None) for n in connected),
    )
    text = run_read(connection, panel.node_panel, now, registry)
    return {node["id"]: node for node in json.loads(text)}
