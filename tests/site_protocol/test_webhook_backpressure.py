"""Webhook backpressure (INTERFACES.md "Growth"): a webhook that is down
holds a bounded number of outbox rows in memory, the rest are re-read from
the database when there is room, and the site stops cleanly.

A real database (either backend) with the site schema, the real outbox executor and webhook
sender, real loopback TCP: a port nothing listens on (the webhook is down)
and a real HTTP receiver.
"""

from __future__ import annotations

import socket
import tracemalloc

import pytest_twisted
from twisted.internet import reactor
from twisted.logger import globalLogPublisher

from tasknet.site.outbox import LocalWebhook, OutboxExecutor, WebhookSender
from tasknet.site.storage.engine.database import connect, open_pool, run_write
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.sql import sql
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site_protocol.harness import WebhookReceiver, listen_http

PAYLOAD = '{"type":"task","task":{"gid":%d,"name":"%s"}}'


_DELIVERED_ROW = sql(
    "INSERT INTO notification_outbox (gid, user_id, payload, ws_delivered_at)"
    " VALUES (?, NULL, ?, {now})"
)


def database_with_pending_rows(path: str, count: int, payload_bytes: int = 1024) -> str:
    prepare_database(path)
    conn = connect(path)
    filler = "x" * payload_bytes
    run_write(
        conn,
        lambda c: c.executemany(
            _DELIVERED_ROW,
            [(gid, PAYLOAD % (gid, filler)) for gid in range(1, count + 1)],
        ),
    )
    conn.close()
    return path


def count(path: str, where: str) -> int:
    conn = connect(path)
    try:
        return int(
            conn.execute(f"SELECT COUNT(*) FROM notification_outbox WHERE {where}").fetchone()[0]
        )  # noqa: S608
    finally:
        conn.close()


def dead_port() -> int:
    """A loopback port with nothing listening: connections are refused."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port


def our_delayed_calls(sender: WebhookSender) -> list[object]:
    return [
        c
        for c in reactor.getDelayedCalls()  # type: ignore[attr-defined]
        if getattr(c.func, "__self__", None) is sender
    ]


@pytest_twisted.ensureDeferred
async def test_a_dead_webhook_with_20000_pending_rows_holds_a_bounded_number(db_target):
    rows, held = 20_000, 100
    path = database_with_pending_rows(db_target, rows)
    db = open_pool(path, **site_runtime())
    failures: list[dict] = []

    def observe(event: dict) -> None:
        if event.get("log_failure") is not None or event.get("log_level").name == "critical":
            failures.append(event)

    sender = WebhookSender(
        f"http://127.0.0.1:{dead_port()}/hook",
        db,
        concurrency=10,  # a refused connect takes the client ~0.25 s
        timeout=2.0,
        max_attempts=5,
        backoff=3600.0,  # every row tried once, then waiting for its retry
        max_held=held,
        clock=reactor,
        reactor=reactor,
    )
    executor = OutboxExecutor(
        db, None, LocalWebhook(sender, db), poll_interval=0.05, prune_interval=None, clock=reactor
    )
    globalLogPublisher.addObserver(observe)
    tracemalloc.start()
    try:
        baseline = tracemalloc.take_snapshot()
        executor.startService()
        await executor.wake()
        # Every held row has been tried once and waits for its retry.
        await eventually(lambda: count(path, "webhook_attempts = 1") == held, timeout=30)
        for _ in range(10):  # polls keep coming: still no more than `held` rows taken
            await executor.wake()
        assert len(sender.known) == held and sender.peak_held == held
        assert len(our_delayed_calls(sender)) == held
        assert count(path, "webhook_state = 'pending'") == rows
        assert count(path, "webhook_attempts = 0") == rows - held
        grown = sum(
            s.size_diff for s in tracemalloc.take_snapshot().compare_to(baseline, "filename")
        )
        # Holding the whole backlog would take its payloads alone: over 20 MiB.
        assert grown < rows * 1024 / 4, grown
    finally:
        tracemalloc.stop()
        await executor.stopService()
        globalLogPublisher.removeObserver(observe)
        db.close()
    assert failures == []  # no RecursionError, nothing else logged as a failure
    assert our_delayed_calls(sender) == []
    assert sender.known == set()
    # Nothing was given up on: every row is still pending for the next start.
    assert count(path, "webhook_state = 'pending'") == rows


@pytest_twisted.ensureDeferred
async def test_rows_beyond_the_bound_are_read_from_the_database_when_there_is_room(db_target):
    rows, held = 1_500, 40
    path = database_with_pending_rows(db_target, rows, payload_bytes=16)
    receiver = WebhookReceiver()
    http = await listen_http(receiver)
    db = open_pool(path, **site_runtime())
    sender = WebhookSender(
        f"http://127.0.0.1:{http.getHost().port}/hook",
        db,
        concurrency=4,
        max_held=held,
        clock=reactor,
        reactor=reactor,
    )
    # No poll: only the sender's "room again" call brings the next rows in.
    executor = OutboxExecutor(
        db, None, LocalWebhook(sender, db), poll_interval=None, prune_interval=None, clock=reactor
    )
    try:
        executor.startService()
        await executor.wake()
        await eventually(lambda: count(path, "webhook_state = 'delivered'") == rows, timeout=60)
        assert sender.peak_held == held
        delivered = [int(h["X-Tasknet-Notification"]) for h in receiver.headers]
        assert sorted(delivered) == list(range(1, rows + 1))
        assert len(delivered) == rows  # each once
    finally:
        await executor.stopService()
        await http.stopListening()
        db.close()
