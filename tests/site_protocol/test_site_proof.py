"""The real site's node side (database, dispatcher, listener) and mutual
authentication: a node that asks for the site's proof is sent no command,
and is not counted by the dispatcher, before the site has proved itself; a
node of the previous release (no ``site-proof``) is served as before.
Commands carry the archive size the site learned from ``prepare``.
"""

from __future__ import annotations

import pytest_twisted

from tasknet.protocol.messages import SiteProof, TaskCommand, TaskReportAck
from tests.eventually import eventually
from tests.site_protocol.harness import ScriptedNode, Site, add_task, add_user, row

SIZE = 632_255


def _world(site: Site) -> None:
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1")  # assigned: resent at login
        add_task(conn, 2, uid, "DELETE_PENDING", node_id="n1", status=1)
        add_task(conn, 3, uid)  # unassigned: for the least loaded ready node
        conn.execute("UPDATE gallery SET size = ? WHERE gid = 1", (SIZE,))
        conn.commit()
    finally:
        conn.close()


def _commands(node: ScriptedNode) -> list[TaskCommand]:
    return [m for m in node.messages if isinstance(m, TaskCommand)]


@pytest_twisted.ensureDeferred
async def test_the_site_sends_no_command_before_its_proof(db_target: str) -> None:
    site = await Site(db_target).start(dispatch_poll_interval=0.05)
    try:
        _world(site)
        node = await site.connect("n1", site_proof=True)  # LoginResult{true} is in
        # Another node, ready: the periodic passes run (they skip a site
        # without nodes) and a changed task is handed out.
        other = await site.connect("n2")
        await site.side.dispatcher.task_changed(3)
        await site.dispatch_passes(3)
        assert "n1" not in site.factory.nodes  # not ready: counted by no pass
        assert _commands(node) == []
        # (Once or twice: the login pass and task_changed may both send it.)
        assert {c.gid for c in _commands(other)} == {3}

        assert await node.challenge()  # the right SiteProof
        await eventually(lambda: len(_commands(node)) == 2)
        commands = {m.gid: m for m in _commands(node)}
        assert (commands[1].action, commands[1].size) == ("DOWNLOAD", SIZE)
        assert (commands[2].action, commands[2].size) == ("DELETE", 0)
        # On the wire, the proof came before the first command.
        types = [t for t, _ in node.frames]
        assert types.index(SiteProof.TYPE) < types.index(TaskCommand.TYPE)
        assert "n1" in site.factory.nodes
        assert _commands(other)[0].size == 0  # no size known for task 3
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_node_of_the_previous_release_still_works(site: Site) -> None:
    _world(site)
    node = await site.connect("n1")  # Hello ["reliable-task-v2"]: no site-proof
    await eventually(lambda: len(_commands(node)) == 3)
    assert SiteProof.TYPE not in [t for t, _ in node.frames]
    assert {c.gid: c.size for c in _commands(node)} == {1: SIZE, 2: 0, 3: 0}
    conn = site.sql()
    try:
        node.report("r-1", 1000, [(1, 1, 0.5)], {1: row(conn, 1)["operation_id"]})
        assert (await node.next(TaskReportAck)).result == "APPLIED"
        assert (row(conn, 1)["status"], row(conn, 1)["progress"]) == (1, 0.5)
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_reports_carrying_queued_and_detail_are_applied(site: Site) -> None:
    _world(site)
    node = await site.connect("n1", site_proof=True)
    assert await node.challenge()
    await eventually(lambda: len(_commands(node)) == 3)
    conn = site.sql()
    try:
        op1, op3 = row(conn, 1)["operation_id"], row(conn, 3)["operation_id"]
    finally:
        conn.close()
    node.report(
        "r-2",
        2000,
        [(1, 1, 0.0, True, ""), (3, 1, 0.25, False, "retrying in 8 s: connection refused")],
        {1: op1, 3: op3},
    )
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    conn = site.sql()
    try:
        assert (row(conn, 1)["status"], row(conn, 1)["last_revision"]) == (1, 2000)
        assert (row(conn, 3)["status"], row(conn, 3)["progress"]) == (1, 0.25)
    finally:
        conn.close()
