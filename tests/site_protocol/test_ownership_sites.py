"""A node is held by one site at a time, the newest connection wins across
sites (SCALE.md 5, DRILLS.md D10): two sites' node sides on one real
PostgreSQL database, scripted nodes over real TCP.

The site holding the older connection closes it when it hears of the newer
login (``NOTIFY tasknet_node_taken``) or, should that be lost, at its
periodic check; a report that reaches a connection that no longer holds its
node is not applied; ``/api/admin/nodes`` lists each node once, with the
site holding it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater

from tasknet.protocol.messages import Goodbye, TaskCommand, TaskReportAck
from tasknet.site.storage.engine.listen import NoWakeups
from tasknet.site.web.admin_nodes import nodes_view
from tests.eventually import eventually
from tests.site_protocol.harness import ScriptedNode, add_task, add_user, row
from tests.site_protocol.sites import SharedSite, TwoSites, pg_target, sites

__all__ = ["pg_target", "sites"]

REPLACED = "replaced by a newer connection"


def holds(site: SharedSite, node_id: str) -> bool:
    """``site`` has a connection of ``node_id`` whose take has committed."""
    session = site.side.nodes.get(node_id)
    return session is not None and site.side.nodes.holding_of(session) is not None


async def connect_held(site: SharedSite, node_id: str) -> ScriptedNode:
    node = await site.connect(node_id)
    await eventually(lambda: holds(site, node_id))
    return node


async def listed(site: SharedSite, node_id: str) -> list[dict[str, Any]]:
    listed = json.loads(await nodes_view(site.db, site.side.nodes, reactor))
    return [n for n in listed if n["id"] == node_id]


def holder_rows(site: SharedSite) -> list[tuple[str, str]]:
    conn = site.sql()
    try:
        return [
            (r[0], r[1])
            for r in conn.execute(
                "SELECT node_id, site_name FROM node_session WHERE connected_at IS NOT NULL"
                " ORDER BY node_id"
            )
        ]
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_a_login_at_another_site_closes_the_older_connection_there(
    sites: TwoSites,
) -> None:
    # No periodic check: only the notification can tell site A.
    a = await sites.site("site-a", node_check_interval=None)
    b = await sites.site("site-b", node_check_interval=None)
    first = await connect_held(a, "n1")
    assert [(n["connected"], n["site"]) for n in await listed(b, "n1")] == [(True, "site-a")]

    second = await connect_held(b, "n1")
    assert (await first.next(Goodbye)).reason == REPLACED
    await first.lost
    await eventually(lambda: "n1" not in a.side.nodes)
    assert a.side.listener.ownership is not None
    assert a.side.listener.ownership.taken_elsewhere == 1
    assert not second.lost.called and second.pending(Goodbye) == []

    # Listed once, by either site, as held by site B.
    for site in (a, b):
        (node,) = await listed(site, "n1")
        assert (node["connected"], node["site"], node["protocol"]) == (True, "site-b", 2)
    assert holder_rows(a) == [("n1", "site-b")]

    await second.disconnect()
    await eventually(lambda: holder_rows(a) == [])
    for site in (a, b):
        (node,) = await listed(site, "n1")
        assert (node["connected"], node["site"], node["connectedAt"]) == (False, None, None)


@pytest_twisted.ensureDeferred
async def test_a_report_on_a_connection_that_lost_its_node_is_not_applied(
    sites: TwoSites,
) -> None:
    # Site A hears nothing (no notification, no check): only the report's
    # own confirmation can stop it.
    a = await sites.site("site-a", wakeups=NoWakeups(), node_check_interval=None)
    b = await sites.site("site-b")
    conn = a.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    try:
        first = await connect_held(a, "n1")
        assert await first.next(TaskCommand)  # its DOWNLOAD
        first.report("r1", 1000, [(1, 1, 0.2)], {1: "op-1"})
        assert (await first.next(TaskReportAck)).result == "APPLIED"
        assert row(conn, 1)["progress"] == 0.2

        second = await connect_held(b, "n1")
        assert not first.lost.called  # site A has not noticed
        first.report("r2", 2000, [(1, 1, 0.5)], {1: "op-1"})
        assert (await first.next(Goodbye)).reason == REPLACED
        await first.lost
        assert first.pending(TaskReportAck) == []
        assert row(conn, 1)["progress"] == 0.2 and row(conn, 1)["last_revision"] == 1000
        receipts = conn.execute("SELECT report_id FROM report_receipt ORDER BY report_id")
        assert [r[0] for r in receipts] == ["r1"]
        assert a.side.listener.handler.refused_reports == 1  # type: ignore[attr-defined]

        # The node sends it again on its newer connection: applied there.
        second.report("r2", 2000, [(1, 1, 0.5)], {1: "op-1"})
        assert (await second.next(TaskReportAck)).result == "APPLIED"
        assert row(conn, 1)["progress"] == 0.5
        (node,) = await listed(a, "n1")
        assert (node["connected"], node["site"]) == (True, "site-b")
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_the_periodic_check_closes_it_when_the_notification_is_lost(
    sites: TwoSites,
) -> None:
    a = await sites.site("site-a", wakeups=NoWakeups(), node_check_interval=0.2)
    b = await sites.site("site-b")
    first = await connect_held(a, "n1")
    await connect_held(b, "n1")
    assert (await first.next(Goodbye, timeout=3.0)).reason == REPLACED
    await first.lost
    assert a.side.listener.ownership is not None
    assert a.side.listener.ownership.taken_elsewhere == 1
    assert holder_rows(a) == [("n1", "site-b")]


@pytest_twisted.ensureDeferred
async def test_the_check_runs_every_check_interval_on_the_sites_clock(sites: TwoSites) -> None:
    clock = Clock()
    a = await sites.site("site-a", wakeups=NoWakeups(), node_check_interval=5.0, clock=clock)
    b = await sites.site("site-b")
    first = await connect_held(a, "n1")
    await connect_held(b, "n1")
    ownership = a.side.ownership
    # Its first check ran at its start (a TimerService child), when it held nothing.
    assert ownership.checks == 1
    clock.advance(4.9)
    await deferLater(reactor, 0.3, lambda: None)
    assert ownership.checks == 1 and not first.lost.called
    clock.advance(0.1)
    await eventually(lambda: ownership.checks == 2)
    assert (await first.next(Goodbye)).reason == REPLACED
    await first.lost


@pytest_twisted.ensureDeferred
async def test_a_node_flapping_between_sites_ends_held_once_by_its_last_connection(
    sites: TwoSites,
) -> None:
    a = await sites.site("site-a", node_check_interval=0.5)
    b = await sites.site("site-b", node_check_interval=0.5)
    connections = []
    for site in (a, b, a, b, a):
        connections.append(await connect_held(site, "n1"))
    last = connections[-1]
    for older in connections[:-1]:
        await older.lost.addTimeout(5.0, reactor)
        assert REPLACED in [m.reason for m in older.messages if isinstance(m, Goodbye)]
    assert not last.lost.called
    assert holder_rows(a) == [("n1", "site-a")]
    assert "n1" in a.side.nodes and "n1" not in b.side.nodes
    for site in (a, b):
        assert [(n["connected"], n["site"]) for n in await listed(site, "n1")] == [(True, "site-a")]
