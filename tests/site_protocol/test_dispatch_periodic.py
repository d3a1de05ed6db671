"""The periodic dispatch pass and deletes of tasks with no known node.

A task resolved by ``tasknet-admin`` (another process: no in-process trigger)
reaches a connected node through the periodic pass, once.  A pending delete
of a pre-migration task that shows a node status but no node goes to no
node until one claims the row by reporting it; then to that node only, and
only its confirmation completes it.
"""

from __future__ import annotations

import pytest_twisted

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.site.storage import delete, reconcile
from tasknet.site.storage.engine import database as dbmod
from tests.site_protocol.harness import Site, add_task, add_user, row

POLL = 0.05


@pytest_twisted.ensureDeferred
async def test_task_resolved_by_another_process_is_dispatched_once(db_target: str) -> None:
    site = await Site(db_target).start(dispatch_poll_interval=POLL)
    try:
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        add_task(conn, 3, uid, "UNKNOWN", url="")
        node = await site.connect("n1")
        await site.dispatch_passes(2)
        assert node.messages == []  # UNKNOWN: never sent

        # tasknet-admin resolves it on its own connection: the site hears nothing.
        other = dbmod.connect(site.path)
        dbmod.run_write(
            other,
            lambda c: reconcile.resolve_unknown(
                c, 3, "submitted", "admin", "x", None, "http://u/3"
            ),
        )
        other.close()

        command = await node.next(TaskCommand)
        assert command == TaskCommand("op-3", "DOWNLOAD", 3, "gallery 3", "http://u/3")
        assert row(conn, 3)["node_id"] == "n1" and row(conn, 3)["dispatched"] == 1
        # Later passes resend nothing (resending is for logins).
        await site.dispatch_passes(5)
        assert len(node.messages) == 1
        conn.close()
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_pending_delete_reaches_a_connected_node_whose_trigger_was_lost(
    db_target: str,
) -> None:
    site = await Site(db_target).start(dispatch_poll_interval=POLL)
    try:
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        add_task(conn, 4, uid, node_id="n1", status=4)
        node = await site.connect("n1")
        await site.side.dispatcher.idle()
        assert node.messages == []  # completed: nothing to resend
        # DELETE_PENDING committed without telling the dispatcher.
        started = await site.db.write(delete.request_delete, 4, None)
        command = await node.next(TaskCommand)
        assert command == TaskCommand(started.delete_operation_id, "DELETE", 4, "gallery 4", "")
        await site.dispatch_passes(5)
        assert len(node.messages) == 1
        conn.close()
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_delete_of_a_task_with_no_known_node_waits_for_its_claim(db_target: str) -> None:
    site = await Site(db_target).start(dispatch_poll_interval=POLL)
    try:
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        # Pre-migration rows a node reported, the old site never said which.
        add_task(conn, 5, uid, None, status=2)
        add_task(conn, 6, uid, None, status=4, url="")  # no URL
        first = await site.db.write(delete.request_delete, 5, None)
        assert not first.completed and first.node is None  # some node may hold it
        await site.side.dispatcher.task_changed(5)

        n1 = await site.connect("n1")
        n2 = await site.connect("n2")
        second = await site.db.write(delete.request_delete, 6, None)
        assert not second.completed and second.node is None
        await site.side.dispatcher.task_changed(6)

        # Nobody gets a DELETE (nor a DOWNLOAD) of a row no node has claimed.
        await site.dispatch_passes(5)
        assert [n.messages for n in (n1, n2)] == [[], []]
        assert row(conn, 5)["state"] == row(conn, 6)["state"] == "DELETE_PENDING"

        # n2 holds gid 5 and reports it: it claims the row, and the next pass
        # sends it (only it) the DELETE, which it confirms.
        n2.report("r1", 1000, [(5, 2, 0.5)], {5: row(conn, 5)["operation_id"]})
        assert (await n2.next(TaskReportAck)).result == "APPLIED"
        assert row(conn, 5)["node_id"] == "n2"
        delete5 = TaskCommand(first.delete_operation_id, "DELETE", 5, "gallery 5", "")
        assert await n2.next(TaskCommand) == delete5
        # A confirmation from n1 (it never had it) changes nothing ...
        n1.report("r2", 1000, [], deleted=[(5, first.delete_operation_id, "NOT_FOUND", "")])
        assert (await n1.next(TaskReportAck)).result == "APPLIED"
        assert row(conn, 5)["state"] == "DELETE_PENDING"
        # ... the claimer's does.
        n2.report("r3", 1001, [], deleted=[(5, first.delete_operation_id, "DELETED", "")])
        assert (await n2.next(TaskReportAck)).result == "APPLIED"
        assert row(conn, 5)["state"] == "DELETED"
        await site.dispatch_passes(3)
        assert n1.messages == [TaskReportAck("r2", "APPLIED")]
        assert row(conn, 6)["state"] == "DELETE_PENDING"  # still waits (or an operator)
        conn.close()
    finally:
        await site.stop()
