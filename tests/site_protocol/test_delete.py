"""Delete end to end with a scripted node (LIFECYCLE.md invariant 5)."""

from __future__ import annotations

import json

import pytest_twisted

from tasknet.protocol.messages import (
    DeleteGallery,
    DeleteResult,
    StatusReport,
    TaskCommand,
    TaskEntry,
    TaskReportAck,
)
from tasknet.site.storage import delete, views
from tests.eventually import eventually
from tests.site_protocol.harness import Site, add_task, add_user, row


async def _request_delete(site: Site, gid: int) -> delete.DeleteStarted:
    # What the lifecycle does: the delete transaction, then hand it to dispatch.
    started = await site.db.write(delete.request_delete, gid, None)
    await site.side.dispatcher.task_changed(gid)
    return started


def _last_view(site: Site, gid: int) -> dict:
    conn = site.sql()
    payload = conn.execute(
        "SELECT payload FROM notification_outbox WHERE gid = ? ORDER BY id DESC LIMIT 1", (gid,)
    ).fetchone()[0]
    conn.close()
    return json.loads(payload)["task"]


@pytest_twisted.ensureDeferred
async def test_delete_pending_failed_retry_confirmed_tombstone(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 7, uid, node_id="n1", status=4)
    node = await site.connect("n1")
    await site.side.dispatcher.idle()

    started = await _request_delete(site, 7)
    assert not started.completed and started.node == "n1"
    delete_id = started.delete_operation_id
    command = await node.next(TaskCommand)
    assert command == TaskCommand(delete_id, "DELETE", 7, "gallery 7", "")

    # A confirmation with another delete id never completes it.
    node.report("r1", 1000, [], deleted=[(7, "op-7", "DELETED", "")])
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    assert row(conn, 7)["state"] == "DELETE_PENDING"

    # The node could not delete: 删除失败, everything kept.
    node.report("r2", 1001, [], deleted=[(7, delete_id, "FAILED", "disk error")])
    await node.next(TaskReportAck)
    assert row(conn, 7)["delete_result"] == "FAILED" and row(conn, 7)["status"] == 4
    view = await site.db.read(views.task_view, 7)
    assert view is not None
    assert (view["status"], view["statusText"]) == ("DELETE_FAILED", "删除失败")

    # Retry reuses the same delete id and resends it.
    retry = await _request_delete(site, 7)
    assert retry.delete_operation_id == delete_id
    assert (await node.next(TaskCommand)).operation_id == delete_id

    node.report("r3", 1002, [], deleted=[(7, delete_id, "DELETED", "")])
    await node.next(TaskReportAck)
    r = row(conn, 7)
    assert r["state"] == "DELETED" and r["status"] is None
    assert conn.execute("SELECT COUNT(*) FROM gallery WHERE gid = 7").fetchone()[0] == 0
    await site.side.outbox.wake()
    assert _last_view(site, 7)["state"] == "DELETED"

    # The tombstone ignores the node forever, even with the old operationId.
    node.report("r4", 1003, [(7, 4, 1.0)], {7: "op-7"}, deleted=[(7, delete_id, "DELETED", "")])
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    assert row(conn, 7)["state"] == "DELETED"
    conn.close()


@pytest_twisted.ensureDeferred
async def test_legacy_delete_round_trip(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 8, uid, node_id="old-1", status=4)
    node = await site.connect("old-1", v2=False)
    await site.side.dispatcher.idle()
    await _request_delete(site, 8)
    assert await node.next(DeleteGallery) == DeleteGallery(8)
    node.sendMessage(DeleteResult(8, False, "busy"))
    await eventually(lambda: row(conn, 8)["delete_result"] == "FAILED")
    assert row(conn, 8)["state"] == "DELETE_PENDING"
    await _request_delete(site, 8)
    assert await node.next(DeleteGallery) == DeleteGallery(8)
    node.sendMessage(DeleteResult(8, True, ""))
    await eventually(lambda: row(conn, 8)["state"] == "DELETED")
    conn.close()


@pytest_twisted.ensureDeferred
async def test_legacy_delete_of_a_task_with_no_known_node_goes_to_its_claimer(
    site: Site,
) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    # A pre-migration row a node reported; the old site never said which.
    add_task(conn, 9, uid, None, status=2)
    # Deleted while no node is connected.
    started = await _request_delete(site, 9)
    assert not started.completed and started.node is None
    old1 = await site.connect("old-1", v2=False)
    old2 = await site.connect("old-2", v2=False)
    await site.side.dispatcher.idle()
    # Neither gets the DELETE: the delete waits for the row's claim.
    assert old1.messages == [] and old2.messages == []
    # A DeleteResult from a node that never claimed it changes nothing.
    old1.sendMessage(DeleteResult(9, True, ""))
    await eventually(lambda: site.side.reports.reports_committed == 1)
    assert row(conn, 9)["state"] == "DELETE_PENDING"
    # old-2 holds it and says so: its StatusReport claims the row; its next
    # login pass sends it the DELETE, which it confirms.
    old2.sendMessage(StatusReport((TaskEntry(9, 4, 1.0),)))
    await eventually(lambda: row(conn, 9)["node_id"] == "old-2")
    await old2.disconnect()
    old2 = await site.connect("old-2", v2=False)
    assert await old2.next(DeleteGallery) == DeleteGallery(9)
    old2.sendMessage(DeleteResult(9, True, ""))
    await eventually(lambda: row(conn, 9)["state"] == "DELETED")
    assert conn.execute("SELECT COUNT(*) FROM gallery WHERE gid = 9").fetchone()[0] == 0
    conn.close()
