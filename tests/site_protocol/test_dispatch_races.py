"""A delete racing a node's login pass (LIFECYCLE.md invariant 5, drill D5).

The writer thread is held by a write of the test, so the delete and the
login pass queue up behind it in a chosen order and then commit in one
group.  Whatever the order, the node never gets a DOWNLOAD after the DELETE
of the same task, and no DOWNLOAD decided before the delete is sent after it
committed.
"""

from __future__ import annotations

import threading

import pytest
import pytest_twisted

from tasknet.protocol.messages import TaskCommand
from tasknet.site.storage import delete
from tests.eventually import eventually
from tests.site_protocol.harness import Site, add_task, add_user, row


async def _hold_writer(site: Site) -> tuple[threading.Event, object]:
    """Block the writer thread inside a write until the event is set; return
    once it is blocked (so later writes queue behind it, in call order)."""
    running = threading.Event()
    release = threading.Event()

    def hold(cursor: object) -> None:
        running.set()
        release.wait(10)

    held = site.db.write(hold)
    await eventually(running.is_set)
    return release, held


def _commands_for(node, gid: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [m.action for m in node.messages if isinstance(m, TaskCommand) and m.gid == gid]


@pytest.mark.parametrize("delete_first", [True, False], ids=["delete-first", "login-first"])
@pytest_twisted.ensureDeferred
async def test_no_download_follows_a_committed_delete(site: Site, delete_first: bool) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    # Assigned to n1 while it was offline: n1 never got its DOWNLOAD.
    add_task(conn, 10, uid, node_id="n1")
    # A pre-migration row on the same page: its generation is written by the
    # login pass, so the pass cannot be decided by a read alone.
    add_task(conn, 11, uid, None, node_id="n1", status=1)

    release, held = await _hold_writer(site)
    try:
        if delete_first:
            deleted = site.db.write(delete.request_delete, 10, None)
            node = await site.connect("n1")
        else:
            node = await site.connect("n1")
            await eventually(lambda: len(site.db._queue) >= 1)  # the login pass waits
            deleted = site.db.write(delete.request_delete, 10, None)
        await eventually(lambda: len(site.db._queue) >= 2)  # both wait for the writer
    finally:
        release.set()
    await held
    started = await deleted
    assert not started.completed and started.node == "n1"
    # What the lifecycle does after the delete committed.
    await site.side.dispatcher.task_changed(10)
    await site.side.dispatcher.idle()
    await eventually(lambda: "DELETE" in _commands_for(node, 10))
    await eventually(lambda: _commands_for(node, 11) == ["DOWNLOAD"])

    actions = _commands_for(node, 10)
    if delete_first:
        # The pass was decided after the delete committed: it sends the DELETE.
        assert "DOWNLOAD" not in actions, actions
    else:
        # Decided before the delete: its DOWNLOAD went out before the DELETE.
        assert actions[0] == "DOWNLOAD" and "DOWNLOAD" not in actions[1:], actions
    assert row(conn, 10)["state"] == "DELETE_PENDING"
    conn.close()
