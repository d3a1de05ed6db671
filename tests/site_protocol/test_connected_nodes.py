"""The site's one registry of connected nodes (``connected_nodes.py``).

The node listener fills it (newest wins), the dispatcher sends to what it
holds and ``/api/admin/nodes`` lists it: all over real TCP, one registry.
"""

from __future__ import annotations

import pytest_twisted

from tasknet.protocol.messages import Goodbye, TaskCommand
from tasknet.protocol.session import INodeSession
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.storage.reports import ReportOutcome
from tasknet.site.web.admin_nodes import nodes_view
from tests.site_protocol.harness import Site, add_task, add_user, wait_until

POLL = 0.05


async def _connected(site: Site) -> dict[str, bool]:
    return {n["id"]: n["connected"] for n in await nodes_view(site.db, site.side.nodes)}


@pytest_twisted.ensureDeferred
async def test_a_reconnect_replaces_the_session_for_dispatch_and_the_admin_view(
    db_target: str,
) -> None:
    site = await Site(db_target).start(dispatch_poll_interval=POLL)
    try:
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        add_task(conn, 8, uid, "DELETE_PENDING", node_id="n1")
        conn.close()
        delete8 = TaskCommand("del-8", "DELETE", 8, "gallery 8", "")

        first = await site.connect("n1")
        assert await first.next(TaskCommand) == delete8
        first_session = site.side.nodes["n1"]
        assert site.factory.nodes is site.side.nodes  # the listener fills the one registry
        # The periodic pass does not resend a delete on the same connection.
        await site.dispatch_passes(3)
        assert first.messages == [delete8]

        second = await site.connect("n1")  # newest wins
        assert (await first.next(Goodbye)).reason == "replaced by a newer connection"
        await first.lost
        new_session = site.side.nodes["n1"]
        assert new_session is not first_session and site.side.nodes.ids() == ["n1"]
        # What was sent on the replaced connection is sent again on the new one, once.
        assert await second.next(TaskCommand) == delete8
        await site.dispatch_passes(3)
        assert second.messages == [delete8]
        assert site.side.nodes["n1"] is new_session  # the old close removed nothing
        assert await _connected(site) == {"n1": True}

        await second.disconnect()
        await wait_until(lambda: "n1" not in site.side.nodes)
        await wait_until(lambda: not site.side.dispatcher._deletes_sent)
        assert await _connected(site) == {"n1": False}
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_the_registry_is_newest_wins_and_detaches_only_the_current(
    db_target: str,
) -> None:
    """The registry's own rules, on the real sessions of two connections."""
    site = await Site(db_target).start()
    try:
        await site.connect("n1")
        old = site.side.nodes["n1"]
        await site.connect("n2")
        n2 = site.side.nodes["n2"]
        await site.connect("n1")
        new = site.side.nodes["n1"]
        assert INodeSession.providedBy(new)

        registry = ConnectedNodes()
        assert registry.attach(old) is None and registry.attach(old) is None
        assert registry.attach(n2) is None
        assert registry.attach(new) is old  # handed back for the listener to close
        assert registry == {"n1": new, "n2": n2} and registry.ids() == ["n1", "n2"]
        assert not registry.is_current(old) and registry.is_current(new)
        assert registry.detach(old) is False  # a replaced session is already gone
        assert registry["n1"] is new
        assert registry.detach(new) is True and registry.detach(new) is False
        assert registry == {"n2": n2} and len(registry) == 1 and "n1" not in registry

        # The last revision applied goes down only with a new revision epoch.
        assert registry.last_revision("n2") is None
        registry.report_applied(n2, ReportOutcome("APPLIED", revision=2000))
        registry.report_applied(n2, ReportOutcome("APPLIED", revision=1000))
        assert registry.last_revision("n2") == 2000
        registry.report_applied(n2, ReportOutcome("APPLIED", revision=10, new_epoch=True))
        registry.report_applied(n2, ReportOutcome("APPLIED", revision=None))
        assert registry.last_revision("n2") == 10
    finally:
        await site.stop()
