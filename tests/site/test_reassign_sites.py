"""A node that is gone, with two sites on one real PostgreSQL database
(DELIVERY.md "A node that is gone"): gone means gone from every site.

Site A (``--reassign-after`` on a ``task.Clock``) never moves the tasks of
a node connected to site B, however long; once the node leaves B too, A
moves them to its own connected node after the limit, with the same
operationId, and B sends the returning node its ``CANCEL``."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.task import Clock

from tasknet.protocol.messages import TaskCommand
from tasknet.site.root import Tuning, build_node_side
from tasknet.site.storage.engine import database as dbmod
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site_protocol.harness import NodeKeys, add_task, add_user, row
from tests.site_protocol.sites import SharedSite, TwoSites, pg_target, sites

__all__ = ["pg_target", "sites"]  # fixtures

LIMIT = 60.0


class ReassigningSite(SharedSite):
    """A shared site whose node side runs on a ``task.Clock`` with
    ``--reassign-after`` :data:`LIMIT`."""

    async def start(self, **_: Any) -> ReassigningSite:  # type: ignore[override]
        self.clock = Clock()
        self.db = dbmod.open_pool(self.path, **site_runtime())
        self.side = build_node_side(
            self.db,
            self.clock,
            reactor=reactor,
            entropy=site_runtime()["entropy"],
            node_keys=NodeKeys(),
            site_name=self.name,
            tuning=Tuning(outbox_poll_interval=None, dispatch_assign_delay=0.0),
            instance_id=self.instance_id,
            wakeups=self.listener,
            reassign_after=LIMIT,
        )
        # The scripted nodes send no heartbeats and this clock jumps minutes.
        self.side.listener.idle_timeout = 10.0**9
        self.side.outbox.startService()
        await self.side.outbox.wake()
        self.side.ownership.startService()
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self.factory)
        self.side.dispatcher.startService()
        await self.side.dispatcher.idle()
        await self.listener.wait_listening()
        return self

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.side.dispatcher.idle()


@pytest_twisted.ensureDeferred
async def test_a_node_connected_to_another_site_is_not_gone(
    sites: TwoSites, pg_target: str
) -> None:
    a = ReassigningSite(pg_target, "site-a")
    await a.start()
    sites.started.append(a)
    b = await sites.site("site-b")
    conn = a.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=1, progress=0.2)
        n1 = await b.connect("n1")
        assert (await n1.next(TaskCommand)).operation_id == "op-1"
        n2 = await a.connect("n2")
        for _ in range(10):
            await a.advance(LIMIT)
        assert row(conn, 1)["node_id"] == "n1"

        # n1 leaves site B: gone from every site, timed from A's next check.
        await n1.disconnect()
        b.nodes.remove(n1)
        await eventually(
            lambda: (
                conn.execute(
                    "SELECT connected_at FROM node_session WHERE node_id = 'n1'"
                ).fetchone()[0]
                is None
            )
        )
        await a.advance(6)
        await a.advance(LIMIT - 7)
        assert row(conn, 1)["node_id"] == "n1"
        await a.advance(7)
        command = await n2.next(TaskCommand)
        assert (command.action, command.gid, command.operation_id) == ("DOWNLOAD", 1, "op-1")
        assert row(conn, 1)["node_id"] == "n2"

        # n1 returns to site B: B sends it the CANCEL A's move owed it.
        n1 = await b.connect("n1")
        cancel = await n1.next(TaskCommand)
        assert (cancel.action, cancel.gid, cancel.operation_id) == ("CANCEL", 1, "op-1")
    finally:
        conn.close()
