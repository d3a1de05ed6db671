"""Outbox housekeeping: finished notifications older than the retention are
pruned in small batches; unfinished or young ones never are.

A real database (either backend) with the site schema.  Rows are written by the outbox's own
``enqueue_task_change`` and marked by the delivery functions the executor
uses; only their age is set by hand (``created_at`` moved into the past).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from tasknet.site.outbox import OutboxExecutor
from tasknet.site.storage import outbox
from tasknet.site.storage.engine.database import connect, open_pool, run_write
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.sql import offset, sql
from tests.eventually import eventually
from tests.runtime import site_runtime

WEEK = 7.0


@pytest.fixture
def path(db_target: str) -> str:
    prepare_database(db_target)
    return db_target


@pytest.fixture
def conn(path: str) -> Iterator[sqlite3.Connection]:
    connection = connect(path)
    yield connection
    connection.close()


def add_rows(conn: sqlite3.Connection, count: int) -> list[int]:
    return [run_write(conn, outbox.enqueue_task_change, 100 + i) for i in range(count)]


_AGE = sql("UPDATE notification_outbox SET created_at = {now_offset} WHERE id = ?")


def age(conn: sqlite3.Connection, ids: list[int], days: float) -> None:
    conn.executemany(_AGE, [(offset(-days * 86400), i) for i in ids])


def fan_out(conn: sqlite3.Connection, after_id: int, upto_id: int) -> None:
    run_write(
        conn, lambda c: outbox.mark_range_fanned_out(c, after_id, upto_id, skip_webhook=False)
    )


def mark(conn: sqlite3.Connection, ids: list[int], webhook: str | None) -> None:
    """Fan ``ids`` out (one contiguous range); ``webhook``: its final state,
    None to leave it pending."""
    fan_out(conn, ids[0] - 1, ids[-1])
    if webhook is not None:
        results = [outbox.WebhookResult(i, webhook, 1, None) for i in ids]
        run_write(conn, outbox.record_webhook_results, results)


def finished_rows(conn: sqlite3.Connection, count: int, webhook: str, *, days: float) -> list[int]:
    """``count`` new rows, fully delivered, created ``days`` ago."""
    ids = add_rows(conn, count)
    mark(conn, ids, webhook)
    age(conn, ids, days)
    return ids


def remaining(conn: sqlite3.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM notification_outbox ORDER BY id")]


def test_only_old_finished_rows_are_pruned_a_batch_at_a_time(conn: sqlite3.Connection) -> None:
    ids = add_rows(conn, 10)
    mark(conn, ids[0:3], outbox.WEBHOOK_DELIVERED)  # 1-3 finished
    fan_out(conn, ids[4] - 1, ids[4])
    mark(conn, ids[5:6], outbox.WEBHOOK_FAILED)  # 6 finished (gave up)
    mark(conn, ids[6:10], outbox.WEBHOOK_SKIPPED)  # 7-10 finished but young
    age(conn, ids[0:6], WEEK + 1)  # 4 never fanned out, 5 webhook pending: old, unfinished

    found = run_write(conn, outbox.prunable, WEEK * 86400)
    assert found == outbox.Prunable(first=ids[0], below=ids[6])
    assert run_write(conn, outbox.prune_finished, ids[0] - 1, found.below, 2) == (2, ids[1])
    assert run_write(conn, outbox.prune_finished, ids[1], found.below, 2) == (2, ids[5])
    assert run_write(conn, outbox.prune_finished, ids[5], found.below, 2) == (0, ids[5])
    assert remaining(conn) == [ids[3], ids[4], *ids[6:]]
    # What is left is still delivered as before.
    fanout = run_write(conn, outbox.fanout_rows, 0, 99)
    assert [(r.id, r.ws_pending, r.webhook_pending) for r in fanout] == [(ids[3], True, True)]
    webhook = run_write(conn, outbox.webhook_rows, 0, 99)
    assert [(r.id, r.ws_pending, r.webhook_pending) for r in webhook] == [
        (ids[3], True, True),
        (ids[4], False, True),
    ]


def test_nothing_old_means_nothing_prunable(conn: sqlite3.Connection) -> None:
    assert run_write(conn, outbox.prunable, 0.0) == outbox.Prunable(None, 1)
    ids = finished_rows(conn, 3, outbox.WEBHOOK_SKIPPED, days=0)
    assert run_write(conn, outbox.prunable, WEEK * 86400) == outbox.Prunable(None, ids[0])
    age(conn, ids, WEEK + 1)
    # All old: the range ends after the newest row, so a row committed later
    # (necessarily young) is outside it.
    assert run_write(conn, outbox.prunable, WEEK * 86400) == outbox.Prunable(ids[0], ids[-1] + 1)


@pytest_twisted.ensureDeferred
async def test_executor_prunes_at_start_then_every_interval(
    path: str, conn: sqlite3.Connection
) -> None:
    finished_rows(conn, 5, outbox.WEBHOOK_SKIPPED, days=WEEK + 1)
    young = finished_rows(conn, 2, outbox.WEBHOOK_SKIPPED, days=0)
    db = open_pool(path, **site_runtime())
    clock = Clock()
    executor = OutboxExecutor(
        db,
        None,
        poll_interval=None,
        prune_interval=60.0,
        prune_batch=2,
        clock=clock,  # type: ignore[arg-type]  # task.Clock provides IReactorTime
    )
    try:
        executor.startService()
        await executor.wake()
        # Pruned at start, and that prune done (its last commit is seen here
        # before its Deferred has fired in the reactor and counted it).
        await eventually(lambda: remaining(conn) == young and executor._pruning is None)
        # Nothing old left: a prune reads, and writes nothing.
        writes = db.transactions
        assert await executor.prune() == 0
        assert db.transactions == writes
        age(conn, young, WEEK + 1)
        clock.advance(60)
        await eventually(lambda: remaining(conn) == [])  # pruned by the next round
    finally:
        await executor.stopService()
        db.close()


@pytest_twisted.ensureDeferred
async def test_a_prune_deletes_in_transactions_of_prune_batch_rows(
    path: str, conn: sqlite3.Connection
) -> None:
    old = finished_rows(conn, 7, outbox.WEBHOOK_DELIVERED, days=WEEK + 1)
    db = open_pool(path, **site_runtime())
    executor = OutboxExecutor(
        db, None, poll_interval=None, prune_interval=None, prune_batch=3, clock=reactor
    )
    try:
        before = db.transactions
        assert await executor.prune() == 7
        assert db.transactions - before == 3  # 3 + 3 + 1 rows
        assert remaining(conn) == []
        # Ids keep growing after a full prune (AUTOINCREMENT): the delivery
        # watermark of a running executor stays valid.
        assert add_rows(conn, 1) == [old[-1] + 1]
    finally:
        await executor.stopService()
        db.close()


def test_bad_settings_are_refused(path: str) -> None:
    db = open_pool(path, **site_runtime())
    try:
        with pytest.raises(ValueError, match="prune_batch"):
            OutboxExecutor(db, None, prune_batch=0, clock=reactor)
        with pytest.raises(ValueError, match="retention_days"):
            OutboxExecutor(db, None, retention_days=-1, clock=reactor)
    finally:
        db.close()
