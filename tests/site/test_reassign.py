"""A node that is gone (DELIVERY.md "A node that is gone"): the site's
``--reassign-after`` timer, on a ``task.Clock``, over the real node
listener, a real database (both backends) and scripted nodes on real TCP.

A gone node's unfinished tasks move with the same operationId to a
connected node (or wait for one); the old node is sent ``CANCEL`` when it
returns and its late reports about them are ``not_owner``; a node back a
second before the limit keeps its tasks; ``0`` never moves anything; a
node connected at another site (its ``node_session`` row) is not gone.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.task import Clock
from twisted.python import usage

from tasknet.protocol.messages import (
    DownloadPost,
    ReleasedEntry,
    StatusReport,
    TaskCommand,
    TaskEntry,
    TaskReport,
    TaskReportAck,
)
from tasknet.site import metrics
from tasknet.site.dispatcher import reassign_check_interval
from tasknet.site.root import Tuning, build_node_side
from tasknet.site.storage import reassign
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import prepare_database
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import site_options
from tests.site_protocol.harness import (
    NodeKeys,
    ScriptedNode,
    Site,
    add_task,
    add_user,
    dropped_entries,
    row,
)

LIMIT = 60.0


class ClockedSite(Site):
    """The harness's site with its node side on a ``task.Clock`` (the
    reassignment timer, the dispatcher's poll) and ``--reassign-after``."""

    def __init__(self, target: str, reassign_after: float) -> None:
        super().__init__(target)
        self.clock = Clock()
        self.reassign_after = reassign_after

    async def start(
        self, *, dispatch: bool = True, webhook_url: str | None = None, **_: Any
    ) -> Site:
        prepare_database(self.path)
        self.db = dbmod.open_pool(self.path, **site_runtime())
        self.side = build_node_side(
            self.db,
            self.clock,
            reactor=reactor,
            entropy=site_runtime()["entropy"],
            node_keys=NodeKeys(),
            site_name="test-site",
            tuning=Tuning(outbox_poll_interval=None, dispatch_assign_delay=0.0),
            reassign_after=self.reassign_after,
        )
        # The scripted nodes send no heartbeats: the clock jumps minutes
        # here, which would drop every connection for silence.
        self.side.listener.idle_timeout = 10.0**9
        self.side.outbox.startService()
        await self.side.outbox.wake()
        self.side.ownership.startService()
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self.factory)
        self.side.dispatcher.startService()
        await self.side.dispatcher.idle()
        return self

    async def advance(self, seconds: float) -> None:
        """Move the site's clock on and wait for what it started."""
        self.clock.advance(seconds)
        await self.side.dispatcher.idle()


async def _clocked(db_target: str, reassign_after: float = LIMIT) -> ClockedSite:
    site = ClockedSite(db_target, reassign_after)
    await site.start()
    return site


async def _gone(site: ClockedSite, node: ScriptedNode) -> None:
    """``node`` disconnects and the site has recorded it (no site holds it)."""
    await node.disconnect()
    site.nodes.remove(node)
    conn = site.sql()
    try:
        await eventually(
            lambda: (
                conn.execute(
                    "SELECT connected_at FROM node_session WHERE node_id = ?", (node.node_id,)
                ).fetchone()[0]
                is None
            )
        )
    finally:
        conn.close()
    await site.side.dispatcher.idle()


async def _sync(node: ScriptedNode, report_id: str, revision: int) -> None:
    """A report round trip: every command sent before its ACK has arrived."""
    node.report(report_id, revision)
    await node.next(TaskReportAck)


def _cancels(conn: Any) -> list[tuple[str, int, str]]:
    return [
        (r[0], int(r[1]), r[2])
        for r in conn.execute(
            "SELECT node_id, gid, operation_id FROM node_cancel ORDER BY node_id, gid"
        ).fetchall()
    ]


def _reassigned(cause: str) -> float:
    value = metrics.REGISTRY.get_sample_value("tasknet_tasks_reassigned_total", {"cause": cause})
    return value or 0.0


@pytest_twisted.ensureDeferred
async def test_a_node_gone_past_the_limit_loses_its_unfinished_tasks_to_a_connected_node(
    db_target: str,
) -> None:
    site = await _clocked(db_target)
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=1, progress=0.4)
        add_task(conn, 2, uid, node_id="n1", status=4, progress=1.0)  # completed: stays
        add_task(conn, 3, uid, "DELETE_PENDING", node_id="n1", status=1)  # being deleted: stays
        n1 = await site.connect("n1")
        assert (await n1.next(TaskCommand)).operation_id == "op-1"
        n2 = await site.connect("n2")
        await site.side.dispatcher.idle()
        before = _reassigned("timeout")

        await _gone(site, n1)
        await site.advance(LIMIT - 1)
        assert row(conn, 1)["node_id"] == "n1"  # not yet
        await site.advance(1)

        # Moved, same generation: no new operationId, so no POST upstream.
        command = await n2.next(TaskCommand)
        assert (command.action, command.gid, command.operation_id) == ("DOWNLOAD", 1, "op-1")
        moved = row(conn, 1)
        assert (moved["node_id"], moved["status"], moved["progress"]) == ("n2", None, 0.0)
        assert (moved["operation_id"], moved["state"], moved["dispatched"]) == (
            "op-1",
            "SUBMITTED",
            1,
        )
        assert (row(conn, 2)["node_id"], row(conn, 2)["status"]) == ("n1", 4)
        assert row(conn, 3)["node_id"] == "n1"
        assert _cancels(conn) == [("n1", 1, "op-1")]
        assert _reassigned("timeout") - before == 1

        # The old node comes back: a CANCEL of that generation first; its
        # late completion of the moved task is dropped not_owner.
        n1 = await site.connect("n1")
        cancel = await n1.next(TaskCommand)
        assert (cancel.action, cancel.gid, cancel.operation_id) == ("CANCEL", 1, "op-1")
        n1.report("late", 5000, [(1, 4, 1.0)], {1: "op-1"})
        assert await n1.next(TaskReportAck) == TaskReportAck("late", "APPLIED")
        assert row(conn, 1)["node_id"] == "n2" and row(conn, 1)["status"] is None
        assert dropped_entries(conn.cursor())["n1"] == {"not_owner": 1}
        # It cancels and releases the generation CANCELLED: what it owed is settled.
        n1.sendMessage(
            TaskReport("released", 5001, (), {}, (), (ReleasedEntry(1, "op-1", "CANCELLED"),))
        )
        assert await n1.next(TaskReportAck) == TaskReportAck("released", "APPLIED")
        assert _cancels(conn) == []
        assert row(conn, 1)["node_id"] == "n2"

        # The new node's completion applies (its revisions are its own).
        n2.report("done", 1, [(1, 4, 1.0)], {1: "op-1"})
        assert await n2.next(TaskReportAck) == TaskReportAck("done", "APPLIED")
        assert (row(conn, 1)["status"], row(conn, 1)["node_id"]) == (4, "n2")
    finally:
        conn.close()
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_legacy_node_is_never_sent_cancel_and_its_late_report_is_not_owner(
    db_target: str,
) -> None:
    site = await _clocked(db_target)
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="old", status=1, progress=0.4)
        old = await site.connect("old", v2=False)
        assert isinstance(await old.next(DownloadPost), DownloadPost)
        n2 = await site.connect("n2")
        await _gone(site, old)
        await site.advance(LIMIT)
        assert (await n2.next(TaskCommand)).operation_id == "op-1"
        # The CANCEL owed to it waits (for a v2 login of that node, if ever).
        assert _cancels(conn) == [("old", 1, "op-1")]
        old = await site.connect("old", v2=False)
        old.sendMessage(StatusReport((TaskEntry(1, 4, 1.0),)))
        await eventually(lambda: dropped_entries(conn.cursor()).get("old") == {"not_owner": 1})
        assert row(conn, 1)["node_id"] == "n2" and row(conn, 1)["status"] is None
        assert site.side.dispatcher.cancels_sent == 0
        assert [t for t, _ in old.frames if t == TaskCommand.TYPE] == []
    finally:
        conn.close()
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_node_back_a_second_before_the_limit_keeps_its_tasks(db_target: str) -> None:
    site = await _clocked(db_target)
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=1, progress=0.4)
        n1 = await site.connect("n1")
        await n1.next(TaskCommand)
        n2 = await site.connect("n2")
        await _gone(site, n1)
        await site.advance(LIMIT - 1)
        n1 = await site.connect("n1")
        assert (await n1.next(TaskCommand)).action == "DOWNLOAD"  # its own task, resent
        await site.side.dispatcher.idle()
        await site.advance(1)
        await site.advance(10 * LIMIT)
        await _sync(n2, "sync", 1)
        assert row(conn, 1)["node_id"] == "n1"
        assert (row(conn, 1)["status"], row(conn, 1)["progress"]) == (1, 0.4)
        assert _cancels(conn) == []
        assert n2.pending(TaskCommand) == []
    finally:
        conn.close()
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_with_no_node_connected_the_tasks_wait_and_go_to_the_next_node(
    db_target: str,
) -> None:
    site = await _clocked(db_target)
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=2, progress=0.9)
        # n1 never connects after the site started: gone from the first check.
        await site.advance(reassign_check := 6.0)
        await site.advance(LIMIT - reassign_check - 1)
        assert row(conn, 1)["node_id"] == "n1"
        await site.advance(reassign_check + 1)
        waiting = row(conn, 1)
        assert (waiting["node_id"], waiting["status"], waiting["dispatched"]) == (None, None, 0)
        assert _cancels(conn) == [("n1", 1, "op-1")]
        n2 = await site.connect("n2")
        command = await n2.next(TaskCommand)
        assert (command.action, command.gid, command.operation_id) == ("DOWNLOAD", 1, "op-1")
        assert row(conn, 1)["node_id"] == "n2"
        # Given back to n1 one day, the CANCEL owed to it would be forgotten;
        # here n1 returns and is told to cancel.
        n1 = await site.connect("n1")
        assert (await n1.next(TaskCommand)).action == "CANCEL"
    finally:
        conn.close()
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_task_given_back_to_its_old_node_comes_after_the_cancel_and_is_not_owed(
    db_target: str,
) -> None:
    site = await _clocked(db_target)
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=1, progress=0.4)
        await site.advance(6.0)
        await site.advance(LIMIT)
        assert row(conn, 1)["node_id"] is None and _cancels(conn) == [("n1", 1, "op-1")]
        # n1 is the only node when it returns: CANCEL, then the same
        # generation's DOWNLOAD again (the node starts it again), nothing owed.
        n1 = await site.connect("n1")
        first, second = await n1.next(TaskCommand), await n1.next(TaskCommand)
        assert [(c.action, c.operation_id) for c in (first, second)] == [
            ("CANCEL", "op-1"),
            ("DOWNLOAD", "op-1"),
        ]
        assert row(conn, 1)["node_id"] == "n1"
        assert _cancels(conn) == []
    finally:
        conn.close()
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_reassign_after_zero_never_moves_anything(db_target: str) -> None:
    site = await _clocked(db_target, reassign_after=0)
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=1, progress=0.4)
        n1 = await site.connect("n1")
        await n1.next(TaskCommand)
        n2 = await site.connect("n2")
        await _gone(site, n1)
        for _ in range(5):
            await site.advance(365 * 86400)
        await _sync(n2, "sync", 1)
        assert row(conn, 1)["node_id"] == "n1"
        assert n2.pending(TaskCommand) == []
        assert _cancels(conn) == []
    finally:
        conn.close()
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_node_held_by_another_site_is_not_gone(db_target: str) -> None:
    site = await _clocked(db_target)
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=1, progress=0.4)
        n1 = await site.connect("n1")
        await n1.next(TaskCommand)
        await site.connect("n2")
        await _gone(site, n1)
        # Another site took n1's connection (a login there: a new epoch, held).
        dbmod.run_write(
            conn,
            lambda c: c.execute(
                "UPDATE node_session SET epoch = epoch + 1, connected_at = changed_at,"
                " site_name = 'other-site' WHERE node_id = 'n1'"
            ),
        )
        await site.advance(LIMIT)
        await site.advance(10 * LIMIT)
        assert row(conn, 1)["node_id"] == "n1"
        # It leaves that site too: gone from then on, and moved a limit later.
        dbmod.run_write(
            conn,
            lambda c: c.execute("UPDATE node_session SET connected_at = NULL WHERE node_id = 'n1'"),
        )
        await site.advance(6)
        assert row(conn, 1)["node_id"] == "n1"
        await site.advance(LIMIT)
        assert row(conn, 1)["node_id"] == "n2"
    finally:
        conn.close()
        await site.stop()


def test_the_check_interval_follows_the_limit() -> None:
    assert reassign_check_interval(LIMIT) == 6.0
    assert reassign_check_interval(900) == 30.0
    assert reassign_check_interval(2) == 1.0


def test_stranded_nodes_is_only_nodes_with_unfinished_work(db_target: str) -> None:
    prepare_database(db_target)
    conn = dbmod.connect(db_target)
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="open", status=1)
        add_task(conn, 2, uid, node_id="done", status=4, progress=1.0)
        add_task(conn, 3, uid, "DELETE_PENDING", node_id="deleting", status=1)
        assert dbmod.run_read(conn, reassign.stranded_nodes) == {"open": None}
    finally:
        conn.close()


def test_the_option_is_a_duration_and_zero_means_never() -> None:
    assert site_options("x.db", "http://127.0.0.1:9")["reassign-after"] == 900.0
    assert (
        site_options("x.db", "http://127.0.0.1:9", "--reassign-after", "90s")["reassign-after"]
        == 90.0
    )
    assert (
        site_options("x.db", "http://127.0.0.1:9", "--reassign-after", "0")["reassign-after"] == 0.0
    )
    for bad in ("soon", "-5m", "nan"):
        with pytest.raises(usage.UsageError, match="--reassign-after"):
            site_options("x.db", "http://127.0.0.1:9", "--reassign-after", bad)


def test_a_task_moved_back_to_how_it_was_last_announced_is_not_announced_again(
    db_target: str,
) -> None:
    """A dispatch is not announced: a task whose node went for good before
    reporting anything, moved to nobody, reads as its last notification,
    and a second one just like it would repeat it (DRILLS.md D7).  A
    visible change is still announced."""
    from tasknet.site.storage import outbox

    prepare_database(db_target)
    conn = dbmod.connect(db_target)
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id=None, status=None)

        def count() -> int:
            return int(conn.execute("SELECT COUNT(*) FROM notification_outbox").fetchone()[0])

        assert dbmod.run_write(conn, outbox.enqueue_task_changes, [1]) == 1
        conn.execute("UPDATE gallery SET node_id = 'n1' WHERE gid = 1")
        conn.execute("UPDATE gallery SET node_id = NULL WHERE gid = 1")
        conn.commit()
        assert dbmod.run_write(conn, outbox.enqueue_visible_task_changes, [1]) == 0
        assert count() == 1
        conn.execute("UPDATE gallery SET node_id = 'n2' WHERE gid = 1")
        conn.commit()
        assert dbmod.run_write(conn, outbox.enqueue_visible_task_changes, [1]) == 1
        assert count() == 2
    finally:
        conn.close()
