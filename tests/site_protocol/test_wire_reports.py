"""Reports over real TCP: ACK after commit, duplicates, group commit."""

from __future__ import annotations

import time

import pytest
import pytest_twisted
from twisted.internet.defer import gatherResults

from tasknet.protocol.messages import StatusReport, TaskEntry, TaskReportAck
from tasknet.site.storage.engine.database import is_postgres
from tests.backends import busy_timeout_sql, write_lock
from tests.eventually import eventually
from tests.site_protocol.harness import Site, add_task, add_user, outbox_count, row


@pytest_twisted.ensureDeferred
async def test_report_is_acked_applied_after_commit(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    node = await site.connect("n1")
    node.report("r1", 1000, [(1, 1, 0.5)], {1: "op-1"})
    ack = await node.next(TaskReportAck)
    assert ack == TaskReportAck("r1", "APPLIED")
    # The ACK left after the commit: the row is visible to another connection now.
    assert row(conn, 1)["status"] == 1
    conn.close()


@pytest_twisted.ensureDeferred
async def test_failed_commit_sends_no_ack_and_redelivery_applies_once(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    node = await site.connect("n1")
    await site.side.dispatcher.idle()  # its login pass must not meet the lock
    # Shorten the writer's busy wait so the test does not sit out 5 s; the
    # failure itself is the database's own (SQLITE_BUSY, a lock timeout).
    await site.db.write(lambda c: c.execute(busy_timeout_sql(site.path, 300)))
    with write_lock(site.path):
        node.report("r1", 1000, [(1, 4, 1.0)], {1: "op-1"})
        await eventually(lambda: site.side.reports.reports_failed == 1)
        assert site.side.reports.transactions == 0
    assert row(conn, 1)["status"] is None
    assert conn.execute("SELECT COUNT(*) FROM report_receipt").fetchone()[0] == 0
    # The node redelivers the same report unchanged.
    node.report("r1", 1000, [(1, 4, 1.0)], {1: "op-1"})
    ack = await node.next(TaskReportAck)
    # APPLIED (not DUPLICATE): the first attempt committed nothing; and it is
    # the only ACK (TCP keeps order: an ACK of the first would be ahead of it).
    assert ack == TaskReportAck("r1", "APPLIED")
    assert node.pending(TaskReportAck) == []
    assert row(conn, 1)["status"] == 4
    assert outbox_count(conn, 1) == 1
    conn.close()


@pytest_twisted.ensureDeferred
async def test_duplicate_report_is_acked_duplicate_and_notifies_once(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    node = await site.connect("n1")
    node.report("r1", 1000, [(1, 2, 0.8)], {1: "op-1"})
    assert (await node.next(TaskReportAck)).result == "APPLIED"
    node.report("r1", 1000, [(1, 2, 0.8)], {1: "op-1"})
    assert (await node.next(TaskReportAck)) == TaskReportAck("r1", "DUPLICATE")
    await site.side.outbox.wake()
    assert outbox_count(conn, 1) == 1
    conn.close()


@pytest_twisted.ensureDeferred
async def test_legacy_status_report_is_applied_and_never_acked(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="old-1")
    node = await site.connect("old-1", v2=False)
    node.sendMessage(StatusReport((TaskEntry(1, 3, 0.9),)))
    await eventually(lambda: (row(conn, 1) or {}).get("status") == 3)
    await site.side.reports.idle()
    # Only the site's opening Hello (type 10, ignored by a legacy node) may
    # be beyond the legacy types: no TaskReportAck, no TaskCommand.
    assert [t for t, _ in node.frames if t > 9] == [10]
    conn.close()


@pytest_twisted.ensureDeferred
async def test_group_commit_shares_transactions_and_acks_every_report(site: Site) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    nodes_count, per_node = 6, 10
    for n in range(nodes_count):
        for k in range(per_node):
            add_task(conn, 1000 * (n + 1) + k, uid, node_id=f"n{n}")
    nodes = [await site.connect(f"n{n}") for n in range(nodes_count)]
    before = site.side.reports.transactions
    started = time.monotonic()
    # Every node sends all its reports at once (each about its own task).
    for n, node in enumerate(nodes):
        for k in range(per_node):
            gid = 1000 * (n + 1) + k
            node.report(f"n{n}-r{k}", 5000 + k, [(gid, 4, 1.0)], {gid: f"op-{gid}"})
    acks = await gatherResults(
        [node.next(TaskReportAck) for node in nodes for _ in range(per_node)]
    )
    total = nodes_count * per_node
    assert len(acks) == total and {a.result for a in acks} == {"APPLIED"}
    assert {a.report_id for a in acks} == {
        f"n{n}-r{k}" for n in range(nodes_count) for k in range(per_node)
    }
    transactions = site.side.reports.transactions - before
    assert 1 <= transactions < total, transactions
    done = conn.execute("SELECT COUNT(*) FROM gallery WHERE status = 4").fetchone()[0]
    assert done == total
    assert conn.execute("SELECT COUNT(*) FROM report_receipt").fetchone()[0] == total
    print(f"{total} reports in {transactions} transactions, {time.monotonic() - started:.3f} s")
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_report_after_the_writer_session_ended_on_the_server_is_applied_once(
    site: Site,
) -> None:
    # SCALE.md "Fencing" 4: a dead pool connection is replaced and the
    # transaction run again whole; the node gets its ACK on the first delivery.
    if not is_postgres(site.path):
        pytest.skip("PostgreSQL only: a server ending a session")
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    node = await site.connect("n1")
    await site.side.dispatcher.idle()
    ended = conn.execute(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
        "WHERE application_name = 'tasknet-site' AND pid <> pg_backend_pid()"
    ).fetchall()
    assert ended
    node.report("r1", 1000, [(1, 4, 1.0)], {1: "op-1"})
    ack = await node.next(TaskReportAck)
    assert ack == TaskReportAck("r1", "APPLIED")
    assert row(conn, 1)["status"] == 4
    assert site.db.reconnects >= 1
    assert site.side.reports.reports_failed == 0
    conn.close()
