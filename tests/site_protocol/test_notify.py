"""Notifications: WebSocket pushes after commit, webhook off the commit path,
delivery after a restart (LIFECYCLE.md invariant 8)."""

from __future__ import annotations

import time

import pytest
import pytest_twisted

from tasknet.protocol.messages import TaskReportAck
from tasknet.site.storage import outbox
from tests.backends import NewTarget
from tests.eventually import eventually
from tests.site_protocol.harness import (
    Site,
    WebhookReceiver,
    add_task,
    add_user,
    events_client,
    events_root,
    listen_http,
    row,
)


@pytest_twisted.ensureDeferred
async def test_websocket_pushes_each_change_after_commit_to_its_owner_only(site: Site) -> None:
    conn = site.sql()
    alice, alice_token = add_user(conn, "alice")
    bob, bob_token = add_user(conn, "bob")
    _, admin_token = add_user(conn, "root", admin=True)
    add_task(conn, 1, alice, node_id="n1")
    add_task(conn, 2, bob, node_id="n1")
    http = await listen_http(events_root(site))
    port = http.getHost().port
    clients = []
    try:
        a = await events_client(port, alice_token)
        b = await events_client(port, bob_token)
        admin = await events_client(port, admin_token)
        clients = [a, b, admin]
        node = await site.connect("n1")
        for revision, (status, progress) in enumerate([(1, 0.3), (3, 0.9), (4, 1.0)], 1000):
            node.report(f"r{revision}", revision, [(1, status, progress)], {1: "op-1"})
            push = await a.next()
            assert push["type"] == "task" and push["task"]["gid"] == 1
            assert (push["task"]["progress"], push["task"]["status"]) == (
                progress,
                {1: "DOWNLOADING", 3: "COMPRESSING", 4: "COMPLETED"}[status],
            )
            # Pushed after the commit: another connection already sees it.
            assert row(conn, 1)["status"] == status
            assert (await admin.next())["task"]["gid"] == 1
        assert push["task"]["statusText"] == "下载完成"
        # Bob's own change reaches bob; nothing of alice's came before it.
        node.report("r2000", 2000, [(2, 1, 0.5)], {2: "op-2"})
        assert (await b.next())["task"]["gid"] == 2
        assert [m["task"]["gid"] for m in b.received] == [2]
        assert (await admin.next())["task"]["gid"] == 2
        assert [m["task"]["gid"] for m in a.received] == [1, 1, 1]
        # Marked after the fan-out.
        await eventually(
            lambda: (
                conn.execute(
                    "SELECT COUNT(*) FROM notification_outbox WHERE ws_delivered_at IS NULL"
                ).fetchone()[0]
                == 0
            )
        )
        assert await site.db.read(outbox.fanout_rows, 0, 99) == []
        assert await site.db.read(outbox.webhook_rows, 0, 99) == []
    finally:
        for client in clients:
            await client.shut()
        await http.stopListening()
    conn.close()


@pytest_twisted.ensureDeferred
async def test_websocket_refuses_a_missing_or_wrong_token(site: Site) -> None:
    http = await listen_http(events_root(site))
    try:
        for token in ("", "not-a-token"):
            with pytest.raises(ConnectionError, match="401"):
                await events_client(http.getHost().port, token)
        assert site.side.hub.clients == set()
    finally:
        await http.stopListening()


@pytest_twisted.ensureDeferred
async def test_rows_committed_before_a_crash_are_delivered_after_restart(db_target: str) -> None:
    path = db_target
    first = await Site(path).start()
    try:
        conn = first.sql()
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1")
        # The executor dies before it delivers anything (a crash after commit).
        await first.side.outbox.stopService()
        node = await first.connect("n1")
        node.report("r1", 1000, [(1, 4, 1.0)], {1: "op-1"})
        assert (await node.next(TaskReportAck)).result == "APPLIED"
        pending = conn.execute(
            "SELECT ws_delivered_at, webhook_state FROM notification_outbox WHERE gid = 1"
        ).fetchall()
        assert [tuple(r) for r in pending] == [(None, "pending")]
    finally:
        await first.stop()
    receiver = WebhookReceiver()
    http = await listen_http(receiver)
    second = Site(path)
    try:
        await second.start(webhook_url=f"http://127.0.0.1:{http.getHost().port}/hook")
        await eventually(lambda: len(receiver.bodies) == 1)
        body = receiver.bodies[0]
        assert body["type"] == "task" and body["task"]["gid"] == 1
        assert body["task"]["status"] == "COMPLETED"
        await eventually(
            lambda: (
                conn.execute(
                    "SELECT webhook_state, ws_delivered_at IS NOT NULL FROM notification_outbox"
                ).fetchone()[:]
                == ("delivered", 1)
            )
        )
        assert receiver.headers[0]["X-Tasknet-Notification"] == "1"
    finally:
        await second.stop()
        await http.stopListening()
    conn.close()


async def _ack_latencies(site: Site, gids: list[int]) -> list[float]:
    node = await site.connect("n1")
    await site.side.dispatcher.idle()
    latencies = []
    for i, gid in enumerate(gids):
        started = time.monotonic()
        node.report(f"r{gid}", 1000 + i, [(gid, 1, 0.5)], {gid: f"op-{gid}"})
        assert (await node.next(TaskReportAck)).result == "APPLIED"
        latencies.append(time.monotonic() - started)
    return latencies


@pytest_twisted.ensureDeferred
async def test_a_slow_webhook_does_not_delay_acks(new_db_target: NewTarget) -> None:
    gids = list(range(1, 9))
    baseline_site = await Site(new_db_target("a")).start()
    try:
        conn = baseline_site.sql()
        uid, _ = add_user(conn, "alice")
        for gid in gids:
            add_task(conn, gid, uid, node_id="n1")
        conn.close()
        baseline = await _ack_latencies(baseline_site, gids)
    finally:
        await baseline_site.stop()

    receiver = WebhookReceiver(delay=10.0)
    http = await listen_http(receiver)
    slow_site = Site(new_db_target("b"))
    try:
        await slow_site.start(
            webhook_url=f"http://127.0.0.1:{http.getHost().port}/hook", webhook_concurrency=2
        )
        conn = slow_site.sql()
        uid, _ = add_user(conn, "alice")
        for gid in gids:
            add_task(conn, gid, uid, node_id="n1")
        conn.close()
        started = time.monotonic()
        slow = await _ack_latencies(slow_site, gids)
        # The webhook really is hanging meanwhile: requests in, none answered.
        await eventually(lambda: len(receiver.bodies) == 2)
        assert receiver.answered == 0
        assert time.monotonic() - started < 5.0
    finally:
        # Stopping cancels the hanging requests: the test does not sit out 10 s.
        await slow_site.stop()
        await http.stopListening()
    mean_base = sum(baseline) / len(baseline)
    mean_slow = sum(slow) / len(slow)
    print(
        f"ACK latency: no webhook {mean_base * 1000:.1f} ms, slow webhook {mean_slow * 1000:.1f} ms"
    )
    assert mean_slow < max(10 * mean_base, 0.25), (baseline, slow)


@pytest_twisted.ensureDeferred
async def test_webhook_retries_with_backoff_then_gives_up(db_target: str) -> None:
    receiver = WebhookReceiver(statuses=[500, 503, 200, 500, 500, 500])
    http = await listen_http(receiver)
    site = Site(db_target)
    try:
        await site.start(
            webhook_url=f"http://127.0.0.1:{http.getHost().port}/hook",
            webhook_backoff=0.02,
            webhook_max_attempts=3,
            webhook_concurrency=1,
        )
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1")
        node = await site.connect("n1")
        node.report("r1", 1000, [(1, 1, 0.5)], {1: "op-1"})
        await node.next(TaskReportAck)

        def states() -> list[tuple]:
            return [
                tuple(r)
                for r in conn.execute(
                    "SELECT webhook_state, webhook_attempts FROM notification_outbox ORDER BY id"
                )
            ]

        await eventually(lambda: states() == [("delivered", 3)])
        node.report("r2", 1001, [(1, 4, 1.0)], {1: "op-1"})
        await node.next(TaskReportAck)
        await eventually(lambda: states() == [("delivered", 3), ("failed", 3)])
        error = conn.execute("SELECT webhook_error FROM notification_outbox WHERE id = 2")
        assert error.fetchone()[0] == "HTTP 500"
        assert len(receiver.bodies) == 6
        conn.close()
    finally:
        await site.stop()
        await http.stopListening()
