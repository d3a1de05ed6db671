"""Dispatch over real TCP: eligibility (invariant 9), assignment, streaming."""

from __future__ import annotations

import pytest
import pytest_twisted

from tasknet.protocol.messages import DeleteGallery, DownloadPost, TaskCommand
from tasknet.site.storage import eligibility
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, SERIALIZABLE
from tests.eventually import eventually
from tests.site_protocol.harness import Site, add_task, add_user, row


def _ineligible_world(site: Site, node_id: str) -> dict[int, str]:
    """Tasks in every state; returns the expected command per gid."""
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, "UNKNOWN")
    add_task(conn, 2, uid, "RESERVED")
    add_task(conn, 3, uid, "SUBMITTING")
    add_task(conn, 4, uid, "DELETED", node_id=node_id)
    add_task(conn, 5, uid, None, url="")  # legacy row never judged submitted
    # Pending, no known node but dispatched (a pre-migration row that showed a
    # node status): some node may hold its file; the DELETE waits for a claim.
    add_task(conn, 6, uid, "DELETE_PENDING")
    add_task(conn, 7, uid, "UNKNOWN", node_id=node_id)
    add_task(conn, 8, uid, "DELETE_PENDING", node_id=node_id)
    add_task(conn, 9, uid, "RESERVED", node_id=node_id)
    add_task(conn, 10, uid, "SUBMITTING", node_id=node_id)
    add_task(conn, 11, uid, None, node_id=node_id, url="")  # legacy, refused
    # Legacy rows with a node status and no node: some node holds them; they
    # wait for its claim and are never assigned to another (a second download).
    add_task(conn, 12, uid, None, status=1)
    add_task(conn, 13, uid, None, status=2)
    conn.execute(
        "INSERT INTO task_operation (gid, operation_id, state, legacy, dispatched)"
        " VALUES (13, 'op-13', 'SUBMITTED', 1, 1)"
    )
    conn.commit()
    add_task(conn, 101, uid, node_id=node_id, status=4)  # completed: not resent
    add_task(conn, 102, uid, None, node_id=node_id, status=1)  # legacy, truly submitted
    add_task(conn, 200, uid)  # SUBMITTED, unassigned: the last command sent
    conn.close()
    return {8: "DELETE", 102: "DOWNLOAD", 200: "DOWNLOAD"}


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "legacy"])
@pytest_twisted.ensureDeferred
async def test_only_eligible_tasks_reach_a_node(site: Site, v2: bool) -> None:
    expected = _ineligible_world(site, "n1")
    node = await site.connect("n1", v2=v2)
    await site.side.dispatcher.idle()
    await eventually(lambda: len(node.messages) >= len(expected))
    got: dict[int, str] = {}
    for m in node.messages:
        if isinstance(m, TaskCommand):
            assert v2
            got[m.gid] = m.action
        elif isinstance(m, DownloadPost):
            assert not v2
            got[m.gid] = "DOWNLOAD"
        elif isinstance(m, DeleteGallery):
            assert not v2
            got[m.gid] = "DELETE"
        else:
            raise AssertionError(f"unexpected {m!r}")
    assert got == expected
    assert len(node.messages) == len(expected)
    conn = site.sql()
    # The legacy row got its one generation so a command could name it.
    assert row(conn, 102)["state"] == "SUBMITTED" and row(conn, 102)["legacy"] == 1
    assert row(conn, 200)["node_id"] == "n1" and row(conn, 200)["dispatched"] == 1
    for gid in (1, 2, 3, 5, 6):
        assert (row(conn, gid) or {}).get("node_id") is None  # 6 stays unowned
    conn.close()
    if v2:
        by_gid = {m.gid: m for m in node.messages}
        assert by_gid[200] == TaskCommand(
            "op-200", "DOWNLOAD", 200, "gallery 200", "http://upstream.test/files/f.bin"
        )
        assert by_gid[8] == TaskCommand("del-8", "DELETE", 8, "gallery 8", "")
    else:
        # Strict (legacy) decoding of every frame passed; the download carries
        # exactly the legacy fields.
        by_gid = {m.gid: m for m in node.messages}
        assert by_gid[200] == DownloadPost(
            200, "tok", "gallery 200", "http://upstream.test/files/f.bin"
        )
        assert [t for t, _ in node.frames if t > 9] == [10]  # the opening Hello only


@pytest_twisted.ensureDeferred
async def test_new_task_goes_to_the_least_loaded_node_and_sticks(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    add_task(conn, 2, uid, node_id="n1")
    add_task(conn, 3, uid, node_id="n2", status=4)  # completed: no load
    n1 = await site.connect("n1")
    n2 = await site.connect("n2")
    await site.side.dispatcher.idle()
    await eventually(lambda: len(n1.messages) == 2)
    assert n2.messages == []
    add_task(conn, 50, uid, dispatched=0)
    await site.side.dispatcher.task_changed(50)
    command = await n2.next(TaskCommand)
    assert (command.gid, command.operation_id) == (50, "op-50")
    assert row(conn, 50)["node_id"] == "n2" and row(conn, 50)["dispatched"] == 1
    # Reconnecting resends the same operationId to the same node.
    await n2.disconnect()
    n2 = await site.connect("n2")
    again = await n2.next(TaskCommand)
    assert (again.gid, again.operation_id) == (50, "op-50")
    await site.side.dispatcher.idle()
    assert row(conn, 50)["node_id"] == "n2"
    conn.close()


@pytest_twisted.ensureDeferred
async def test_task_changed_for_an_ineligible_task_sends_nothing(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    for gid, state in enumerate(["UNKNOWN", "RESERVED", "SUBMITTING"], start=1):
        add_task(conn, gid, uid, state, dispatched=0)
    node = await site.connect("n1")
    for gid in (1, 2, 3, 99):
        await site.side.dispatcher.task_changed(gid)
    add_task(conn, 4, uid, dispatched=0)
    await site.side.dispatcher.task_changed(4)
    first = await node.next(TaskCommand)
    assert first.gid == 4 and node.messages == [first]
    conn.close()


@pytest_twisted.ensureDeferred
async def test_nothing_is_dispatched_until_enabled(db_target: str) -> None:
    site = await Site(db_target).start(dispatch=False)
    try:
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid)
        node = await site.connect("n1")
        await site.side.dispatcher.task_changed(1)
        await site.side.dispatcher.idle()
        assert node.messages == [] and row(conn, 1)["node_id"] is None
        # Recovery succeeded after all: enabling catches up with connected nodes.
        site.side.dispatcher.startService()
        await site.side.dispatcher.idle()
        assert (await node.next(TaskCommand)).gid == 1
        conn.close()
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_large_sets_are_streamed_in_pages(db_target: str) -> None:
    site = await Site(db_target).start(dispatch_page_size=100)
    try:
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        rows = [(gid, uid, f"g{gid}", "n1") for gid in range(1, 1051)]
        conn.execute(BEGIN_WRITE[SERIALIZABLE])  # one write transaction, either backend
        conn.executemany(
            "INSERT INTO gallery (gid, user_id, name, token, url, node_id)"
            " VALUES (?, ?, ?, 'tok', 'http://u/f', ?)",
            rows,
        )
        conn.executemany(
            "INSERT INTO task_operation (gid, operation_id, state, user_id, dispatched)"
            " VALUES (?, ?, 'SUBMITTED', ?, 1)",
            [(gid, f"op-{gid}", uid) for gid, *_ in rows],
        )
        # Half of them are completed at the site: never resent.
        conn.execute("UPDATE gallery SET status = 4 WHERE gid % 2 = 0")
        conn.execute("COMMIT")
        node = await site.connect("n1")
        await site.side.dispatcher.idle()
        await eventually(lambda: len(node.messages) >= 525)
        gids = [m.gid for m in node.messages]
        assert gids == list(range(1, 1051, 2))
        assert all(m.operation_id == f"op-{m.gid}" for m in node.messages)
        conn.close()
    finally:
        await site.stop()


def test_dispatchable_rule_is_the_lifecycle_one() -> None:
    # The SQL filter of the streamed queries is L's rule, not a copy.
    from tasknet.site.storage import dispatch

    assert eligibility.DISPATCHABLE_SQL in dispatch._UNASSIGNED_PAGE_SQL
