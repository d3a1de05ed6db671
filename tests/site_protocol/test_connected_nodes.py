"""The site's one registry of connected nodes (``connected_nodes.py``).

The node listener fills it (newest wins), the dispatcher sends to what it
holds and ``/api/admin/nodes`` lists it: all over real TCP, one registry.
"""

from __future__ import annotations

import json

import pytest_twisted
from twisted.internet import reactor

from tasknet.protocol.messages import Goodbye, TaskCommand
from tasknet.protocol.session import INodeSession
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.session_states import SessionInput, SessionState
from tasknet.site.storage.node_sessions import Holding
from tasknet.site.storage.reports import ReportOutcome
from tasknet.site.web.admin_nodes import nodes_view
from tests.eventually import eventually
from tests.site.helpers import RecordingSession
from tests.site_protocol.harness import Site, add_task, add_user

POLL = 0.05


async def _connected(site: Site) -> dict[str, bool]:
    listed = json.loads(await nodes_view(site.db, site.side.nodes, reactor))
    return {n["id"]: n["connected"] for n in listed}


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
        await eventually(lambda: "n1" not in site.side.nodes)
        await eventually(lambda: not site.side.dispatcher._deletes_sent)
        assert await _connected(site) == {"n1": False}
    finally:
        await site.stop()


def test_the_registry_is_newest_wins_and_detaches_only_the_current() -> None:
    """The registry's own rules; the sessions' lives move by their table."""
    old, n2, new = RecordingSession("n1"), RecordingSession("n2"), RecordingSession("n1")
    registry = ConnectedNodes()
    assert registry.attach(old) is None and registry.attach(old) is None
    assert old.life.state is SessionState.CURRENT
    assert registry.attach(n2) is None
    assert registry.attach(new) is old  # fed REPLACED: its life closes it
    assert old.life.state is SessionState.REPLACED and new.life.state is SessionState.CURRENT
    assert registry == {"n1": new, "n2": n2} and registry.ids() == ["n1", "n2"]
    assert not registry.is_current(old) and registry.is_current(new)
    assert registry.detach(old) is False  # a replaced one is already gone
    assert old.life.state is SessionState.REPLACED
    assert registry["n1"] is new

    # Held once its take committed; only a current session can be.
    holding = Holding("n1", 3, None)
    old.life.handle(SessionInput.TAKE_COMMITTED, Holding("n1", 2, None))
    assert old.life.state is SessionState.REPLACED and registry.holding_of(old) is None
    assert registry.holding_of(new) is None and registry.holdings() == {}
    new.life.handle(SessionInput.TAKE_COMMITTED, holding)
    assert new.life.state is SessionState.HELD
    assert registry.holding_of(new) == holding and registry.holdings() == {holding: new}
    new.life.handle(SessionInput.TAKEN_ELSEWHERE)
    assert registry.detach(new) is True
    assert registry.detach(new) is False
    assert new.life.state is SessionState.MOVED and registry.holding_of(new) is None
    assert registry == {"n2": n2} and len(registry) == 1 and "n1" not in registry

    # The last revision applied goes down only with a new revision epoch.
    assert registry.last_revision("n2") is None
    registry.report_applied(n2, ReportOutcome("APPLIED", revision=2000))
    registry.report_applied(n2, ReportOutcome("APPLIED", revision=1000))
    assert registry.last_revision("n2") == 2000
    registry.report_applied(n2, ReportOutcome("APPLIED", revision=10, new_epoch=True))
    registry.report_applied(n2, ReportOutcome("APPLIED", revision=None))
    assert registry.last_revision("n2") == 10


@pytest_twisted.ensureDeferred
async def test_the_listeners_sessions_are_what_the_registry_holds(db_target: str) -> None:
    """Over real TCP: a session the registry holds says it is attached,
    one it replaced says so, and a closed one is closed."""
    site = await Site(db_target).start()
    try:
        first = await site.connect("n1")
        old = site.side.nodes["n1"]
        assert INodeSession.providedBy(old) and old.life.attached
        await eventually(lambda: old.life.state is SessionState.HELD)
        await site.connect("n1")
        new = site.side.nodes["n1"]
        await first.lost
        # Replaced, then its connection went.
        await eventually(lambda: old.life.state is SessionState.CLOSED)
        await eventually(lambda: new.life.state is SessionState.HELD)
        assert site.side.nodes.holding_of(new) is not None
    finally:
        await site.stop()
