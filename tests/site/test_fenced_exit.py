"""A fenced site exits promptly whatever its writer had queued or was
retrying (SCALE.md "Database failover" 3), on a real PostgreSQL made
unreachable the way a dead primary is (the database refuses connections,
the site's sessions ended), the lease judged on ``task.Clock``.

Before, a write refused by the lost lease on a connection that was also
broken was taken for a dead connection: rerun three times with pauses, then
failed ``DatabaseUnavailable`` ("busy"), which ``write_retrying`` tries
again for ever; the writer never drained and the site never exited.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import Clock, LoopingCall

from tasknet.protocol.messages import TaskReportAck
from tasknet.site.instance_service import INTERVAL, InstanceService
from tasknet.site.storage.engine.database import Database, Retry, connect, open_pool
from tasknet.site.storage.engine.errors import DatabaseUnavailable
from tasknet.site.storage.instances import LeaseLost
from tasknet.site.storage.lease import PostgresLease, application_name, take_lease
from tasknet.upstream.testing import start_upstream
from tests.eventually import eventually
from tests.runtime import lease_runtime, site_runtime

#: What "promptly" means here (seconds of real time, on a loaded machine).
PROMPTLY = 3.0


def _sql(url: str, statement: str, *params: Any) -> list[Any]:
    connection = connect(url)
    try:
        return list(connection.execute(statement, params).fetchall())
    finally:
        connection.close()


def _admin_url(url: str) -> tuple[str, str]:
    database = url.rsplit("/", 1)[1].split("?")[0]
    return url.replace(f"/{database}", "/postgres", 1), database


@asynccontextmanager
async def _unreachable(url: str, writer: str, lease_pid: int) -> AsyncIterator[None]:
    """The database refuses new connections, and the writer's session and
    the lease session end (a primary that died, as its clients see it)."""
    admin_url, database = _admin_url(url)
    _sql(admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    try:
        _sql(
            admin_url,
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE application_name = ? OR pid = ?",
            writer,
            lease_pid,
        )
        yield
    finally:
        _sql(admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')


def _note(cursor: Any, name: str) -> None:
    cursor.execute("INSERT INTO site_setting (name, value) VALUES (?, '1')", (name,))


def _notes(cursor: Any, names: list[str]) -> list[None]:
    for name in names:
        _note(cursor, name)
    return [None] * len(names)


@pytest_twisted.ensureDeferred
async def test_a_fenced_sites_writes_on_a_dead_connection_fail_at_once_with_lease_lost(
    pg_url: str,
) -> None:
    clock = Clock()
    lease = take_lease(
        pg_url, "fenced", flock=None, **(lease_runtime() | {"monotonic": clock.seconds})
    )
    assert isinstance(lease, PostgresLease)
    db: Database = open_pool(
        pg_url,
        **site_runtime(),
        fence=lease,
        application_name=application_name(lease.instance_id, "writer"),
    )

    async def nothing() -> None:
        return None

    service = InstanceService(lease, db, lambda: Deferred.fromCoroutine(nothing()), clock=clock)
    fenced: list[str] = []
    service.fenced.addCallback(fenced.append)
    try:
        service.startService()
        await eventually(lambda: service.ticks == 1)
        await db.write(_note, "before")
        async with _unreachable(
            pg_url, application_name(lease.instance_id, "writer"), lease.lease_pid
        ):
            # The writer meets the dead server first (its connection is
            # now broken, and reopening it fails), then the lease is lost.
            try:
                await db.write(_note, "during")
            except DatabaseUnavailable:
                pass
            reconnects = db.reconnects
            clock.advance(INTERVAL)
            await eventually(lambda: bool(fenced))
            started = time.monotonic()
            # Queued together: plain writes, coalesced items, and a write
            # retried "while busy" for ever, as the lifecycle's SUBMITTING is.
            writes = [db.write(_note, f"plain-{i}") for i in range(3)]
            writes += [db.write_joined(_notes, f"item-{i}") for i in range(3)]
            writes.append(
                db.write_retrying(Retry("SUBMITTING", math.inf, lambda _: 0.1), _note, "retried")
            )
            # Bounded, so that a regression fails here rather than hangs.
            results = await DeferredList(writes, consumeErrors=True).addTimeout(10, reactor)
            took = time.monotonic() - started
        assert all(not ok for ok, _ in results)
        assert {type(failure.value) for _, failure in results} == {LeaseLost}
        assert took < PROMPTLY
        assert db.reconnects == reconnects  # never rerun on a fresh connection
        await service.stopService()
    finally:
        if service.running:
            await service.stopService()
        db.close()
        lease.release()
    names = {row[0] for row in _sql(pg_url, "SELECT name FROM site_setting")}
    assert "before" in names and not any(n.startswith(("plain", "item", "retried")) for n in names)


@pytest_twisted.ensureDeferred
async def test_a_site_fenced_while_a_node_keeps_resending_stops_at_once_without_acks(
    pg_url: str,
) -> None:
    """The whole site: a node keeps (re)sending reports while the database
    is gone and the site's own lease check fences it.  The site closes the
    node's connection without waiting for ACKs that cannot come, and stops."""
    from tests.site.helpers import running_site, site_options
    from tests.site_protocol.harness import ScriptedNode, secret_of

    upstream = await start_upstream()
    try:
        options = site_options(pg_url, upstream.base_url, "--node-key", f"n1:{secret_of('n1')}")
        async with running_site(options) as site:
            service = site.service
            node = ScriptedNode("n1")
            port = service.nodes_port.getHost().port
            await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), node)
            assert await node.logged_in
            fenced: list[str] = []
            site.site.instance.fenced.addCallback(fenced.append)
            lease = site.site.instance.lease
            assert isinstance(lease, PostgresLease)
            # A SUBMITTING-like write retried "while busy" for ever.
            retried = site.site.db.write_retrying(
                Retry("SUBMITTING", math.inf, lambda _: 0.1), _note, "retried"
            )
            retried.addErrback(lambda _: None)
            reports = 0

            def resend() -> None:
                nonlocal reports
                reports += 1
                node.report(f"r{reports}", reports, [(91, 1, 0.5)])

            sending = LoopingCall(resend)
            sending.start(0.05)
            try:
                async with _unreachable(
                    pg_url, application_name(lease.instance_id, "writer"), lease.lease_pid
                ):
                    # The site's own lease check (every few seconds) fences it.
                    await eventually(lambda: bool(fenced), timeout=15.0)
                    started = time.monotonic()
                    await node.lost.addTimeout(10, reactor)
                    await service.stopService().addTimeout(10, reactor)
                    took = time.monotonic() - started
            finally:
                if sending.running:
                    sending.stop()
            assert took < PROMPTLY
            assert not node.pending(TaskReportAck)
            # The retried write ends too (at its next attempt, if it was
            # waiting out a backoff when the site stopped).
            await eventually(lambda: retried.called, timeout=PROMPTLY)
    finally:
        await upstream.stop()
