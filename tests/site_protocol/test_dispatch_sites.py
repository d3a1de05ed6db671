"""Dispatch wake-ups between sites (SCALE.md 6): a task changed through
site A whose node is connected to site B is sent by B at once, woken by
``NOTIFY tasknet_dispatch``; without the notification B's poll still sends
it.  Two sites' node sides on one real PostgreSQL database, a scripted node
over real TCP.
"""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet import reactor

from tasknet.protocol.messages import TaskCommand
from tasknet.site.storage.engine.listen import NoWakeups
from tests.eventually import eventually
from tests.site_protocol.harness import add_task, add_user
from tests.site_protocol.sites import TwoSites, pg_target, sites

__all__ = ["pg_target", "sites"]


def downloads(node: Any) -> list[int]:
    return [m.gid for m in node.messages if isinstance(m, TaskCommand) and m.action == "DOWNLOAD"]


@pytest_twisted.ensureDeferred
async def test_a_task_changed_through_one_site_is_sent_at_once_by_the_site_of_its_node(
    sites: TwoSites,
) -> None:
    # Polls far away: only the notification can make site B act in time.
    a = await sites.site("site-a", dispatch_poll_interval=60.0)
    b = await sites.site("site-b", dispatch_poll_interval=60.0)
    node = await b.connect("n1")
    await b.side.dispatcher.idle()
    conn = a.sql()
    try:
        uid, _ = add_user(conn, "alice")
        # Unassigned, and assigned to n1 (offline when it was): both become
        # SUBMITTED through site A, which has no node to send them to.
        add_task(conn, 1, uid, dispatched=0)
        add_task(conn, 2, uid, node_id="n1", dispatched=0)
        started = reactor.seconds()
        for gid in (1, 2):
            await a.side.dispatcher.task_changed(gid)
        await eventually(lambda: sorted(downloads(node)) == [1, 2], timeout=2.0)
        assert reactor.seconds() - started < 2.0
        assert b.side.dispatcher.hints == 2 and a.side.dispatcher.sent == 0
        assert b.side.dispatcher.polls == 0  # not the poll
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_the_poll_sends_it_when_the_notification_is_lost(sites: TwoSites) -> None:
    a = await sites.site("site-a", dispatch_poll_interval=60.0)
    b = await sites.site("site-b", wakeups=NoWakeups(), dispatch_poll_interval=0.3)
    node = await b.connect("n1")
    await b.side.dispatcher.idle()  # its login pass is over: only a poll is left
    polls = b.side.dispatcher.polls
    conn = a.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, dispatched=0)
        await a.side.dispatcher.task_changed(1)
        await eventually(lambda: downloads(node) == [1], timeout=3.0)
        await eventually(lambda: b.side.dispatcher.polls > polls)  # the pass that sent it
        assert b.side.dispatcher.hints == 0
    finally:
        conn.close()
