"""The site's timers on ``task.Clock``: the lifecycle's outcome-write retries
(the 30 s window, then the background settle), the outbox executor's poll
and the webhook's retry backoff.  Real SQLite files, the real mock upstream
and a real loopback HTTP webhook receiver; only time is simulated (the
loopback tests in test_outcome_recording.py and site_protocol/test_notify.py
stay as the integration tests of the same paths)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, LoopingCall
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from tasknet.runtime import SystemEntropy
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.dispatcher import Dispatcher
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.outbox import RESULTS_RETRY, LocalWebhook, OutboxExecutor, WebhookSender
from tasknet.site.storage import outbox
from tasknet.site.storage.engine.database import (
    Database,
    connect,
    open_pool,
    run_write,
)
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.schema import prepare_database
from tests.backends import FailingCommits, WriteLock
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import RecordingSession, fault, lifecycle_env, one
from tests.site_protocol.harness import add_task, add_user

GID = 4242


def next_wait(clock: Clock, func: Any = None) -> float | None:
    """The delay of the one timer pending on ``clock`` (of ``func``, if
    given; None: none)."""
    calls = [c for c in clock.getDelayedCalls() if func is None or c.func == func]
    if not calls:
        return None
    assert len(calls) == 1, [(c.func, c.getTime() - clock.seconds()) for c in calls]
    [call] = calls
    return round(call.getTime() - clock.seconds(), 6)


def doubling(initial: float, maximum: float, window: float) -> list[float]:
    """The waits of a retry doubling from ``initial`` to ``maximum`` that
    stops once the next wait would pass ``window`` (written out, not derived
    from the code under test)."""
    waits: list[float] = []
    elapsed, delay = 0.0, initial
    while elapsed + delay <= window:
        waits.append(round(delay, 6))
        elapsed += delay
        delay = min(delay * 2, maximum)
    return waits


def test_the_expected_retry_waits_are_the_documented_ones() -> None:
    # 0.1, 0.2, 0.4, 0.8, 1.6, then 2 s each: 29.1 s of waiting in a 30 s window.
    waits = doubling(0.1, 2.0, 30.0)
    assert waits[:6] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert len(waits) == 18 and round(sum(waits), 6) == 29.1


@pytest_twisted.ensureDeferred
async def test_outcome_writes_retry_for_the_window_then_settle_in_the_background(
    db_target: str,
) -> None:
    clock = Clock()
    async with lifecycle_env(db_target, timeout=3.0) as env:
        # The database retries a busy write on its clock; the lifecycle sets the window.
        db = Database(env.path, **site_runtime(), busy_timeout_ms=10, clock=clock)
        lifecycle = Lifecycle(
            db,
            env.client,
            upstream_timeout=3.0,
            record_retry_for=30.0,
            retry_initial=0.1,
            retry_max=2.0,
            settle_interval=5.0,
            clock=clock,
            entropy=SystemEntropy(),
        )
        try:
            # The prepare is held: lock the database before SUBMITTING is written.
            env.upstream.set_faults([fault("latency", "GET", f"/api/galleries/{GID}", ms=300)])
            created = lifecycle.create(env.user_id, GID, "tok", "")
            await eventually(lambda: env.upstream.app.journal.requests >= 1)
            lock = WriteLock(env.path).acquire()
            waits: list[float] = []
            try:
                while not created.called:
                    await eventually(lambda: created.called or next_wait(clock) is not None)
                    wait = next_wait(clock)
                    if wait is None or created.called:
                        break
                    waits.append(wait)
                    clock.advance(wait)
                with pytest.raises(TaskError) as refused:
                    await created
                # SUBMITTING, then the release: each retried for its own 30 s.
                expected = doubling(0.1, 2.0, 30.0)
                assert waits == expected + expected
                assert round(clock.seconds(), 6) == round(2 * sum(expected), 6)
                assert refused.value.code == "unavailable"
                assert "nothing was submitted" in refused.value.message
                # The release goes on in the background, every settle_interval.
                assert lifecycle.settling == 1
                assert next_wait(clock) == 5.0
                clock.advance(5.0)
                await eventually(lambda: next_wait(clock) is not None)
                assert lifecycle.settling == 1, "still locked: still settling"
            finally:
                lock.release()
            clock.advance(5.0)
            await eventually(lambda: lifecycle.settling == 0)
            assert one(env.path, "SELECT COUNT(*) FROM gallery")[0] == 0
            assert env.upstream.stats()["postAttempts"] == {}
        finally:
            lifecycle.stop()
            db.close()
    assert clock.getDelayedCalls() == []


class Published:
    """A WebSocket hub that records what it is given."""

    def __init__(self) -> None:
        self.payloads: list[str] = []

    def publish(self, user_id: int | None, payload: str) -> int:
        self.payloads.append(payload)
        return 1

    def listening(self) -> bool:
        return True


@pytest.fixture
def site_db(db_target: str) -> str:
    path = db_target
    prepare_database(path)
    return path


def enqueue(path: str, gid: int) -> int:
    """A row committed by another process (the admin CLI): no wake-up."""
    connection = connect(path)
    try:
        return int(run_write(connection, outbox.enqueue_task_change, gid))
    finally:
        connection.close()


def next_poll(clock: Clock) -> float | None:
    """The delay of the next call of the one timer (a ``TimerService``'s
    looping call) pending on ``clock`` (None: none pending)."""
    calls = [c for c in clock.getDelayedCalls() if isinstance(c.func, LoopingCall)]
    assert len(calls) <= 1, calls
    return round(calls[0].getTime() - clock.seconds(), 6) if calls else None


@pytest_twisted.ensureDeferred
async def test_the_outbox_poll_delivers_rows_from_another_process_every_interval(
    site_db: str,
) -> None:
    clock = Clock()
    db = open_pool(site_db, **site_runtime())
    hub = Published()
    executor = OutboxExecutor(db, hub, poll_interval=5.0, prune_interval=None, clock=clock)
    try:
        executor.startService()  # its first poll runs now: nothing to deliver
        await executor.wake()
        assert hub.payloads == [] and next_poll(clock) == 5.0
        enqueue(site_db, 1)
        clock.advance(4.99)
        assert hub.payloads == [], "no poll before 5 s"
        clock.advance(0.01)
        await eventually(lambda: len(hub.payloads) == 1)
        # The poll's drain is returned to its timer, which schedules the next
        # poll once the drain is done (reading on past row 1 takes real time):
        # moving the clock on before that would skip the 10 s poll (a
        # LoopingCall skips the intervals its call overran).
        await eventually(lambda: next_poll(clock) == 5.0)
        enqueue(site_db, 2)
        clock.advance(5.0)
        await eventually(lambda: len(hub.payloads) == 2)
        assert executor.pushed == 2
    finally:
        await executor.stopService()
        db.close()
    assert clock.getDelayedCalls() == []


class FlakyReceiver(Resource):
    """A webhook receiver answering 503 to its first ``failures`` POSTs."""

    isLeaf = True

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.posts = 0

    def render_POST(self, request: Request) -> bytes:
        self.posts += 1
        if self.posts <= self.failures:
            request.setResponseCode(503)
        return b"ok"


def webhook_state(path: str, row_id: int) -> sqlite3.Row:
    return one(
        path, "SELECT webhook_state, webhook_attempts FROM notification_outbox WHERE id = ?", row_id
    )


@asynccontextmanager
async def webhook_outbox(
    site_db: str,
    receiver: Resource,
    clock: Clock,
    *,
    storage_faults: FailingCommits | None = None,
    **sender_options: Any,
) -> AsyncIterator[tuple[WebhookSender, OutboxExecutor]]:
    """A real webhook sender to ``receiver`` (over loopback HTTP) driven by
    an outbox executor, both on ``clock``, on a pool of ``site_db`` with
    ``storage_faults``; ``sender_options`` go to the sender (``backoff``)."""
    port: Any = reactor.listenTCP(0, Site(receiver), interface="127.0.0.1")  # type: ignore[attr-defined]
    db = open_pool(site_db, storage_faults=storage_faults, **site_runtime())
    webhook = WebhookSender(
        f"http://127.0.0.1:{port.getHost().port}/hook",
        db,
        clock=clock,
        reactor=reactor,
        **sender_options,
    )
    executor = OutboxExecutor(
        db, None, LocalWebhook(webhook, db), poll_interval=None, prune_interval=None, clock=clock
    )
    try:
        yield webhook, executor
    finally:
        await executor.stopService()  # stops the webhook sender too
        db.close()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_failing_webhook_is_retried_after_a_doubling_delay(site_db: str) -> None:
    receiver = FlakyReceiver(failures=2)
    clock = Clock()
    async with webhook_outbox(site_db, receiver, clock, backoff=1.0) as (webhook, executor):
        row_id = enqueue(site_db, 1)
        executor.startService()
        executor.wake()

        # The webhook's retry timer (the executor also marks rows on this clock).
        def retry_wait() -> float | None:
            return next_wait(clock, webhook._retry)

        await eventually(lambda: receiver.posts == 1 and retry_wait() is not None)
        assert retry_wait() == 1.0, "first retry after the backoff"
        clock.advance(0.99)
        assert receiver.posts == 1
        clock.advance(0.01)
        await eventually(lambda: receiver.posts == 2 and retry_wait() is not None)
        assert retry_wait() == 2.0, "then twice as long"
        clock.advance(2.0)
        await eventually(lambda: webhook.delivered == 1 and webhook.idle())
        assert receiver.posts == 3
        row = webhook_state(site_db, row_id)
        assert (row[0], row[1]) == (outbox.WEBHOOK_DELIVERED, 3)
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_the_dispatchers_periodic_pass_assigns_tasks_written_elsewhere(
    site_db: str,
) -> None:
    clock = Clock()
    db = open_pool(site_db, **site_runtime())
    nodes = ConnectedNodes()
    session = RecordingSession("n1")
    nodes.attach(session)
    dispatcher = Dispatcher(db, nodes, poll_interval=5.0, clock=clock)
    connection = connect(site_db)
    try:
        dispatcher.startService()
        await dispatcher.idle()  # the catch-up pass: nothing to send yet
        assert session.downloads == [] and dispatcher.polls == 0
        # Committed by another process: no task_changed, only the poll sees it.
        user_id, _ = add_user(connection, "alice")
        add_task(connection, 31, user_id, "SUBMITTED", dispatched=0)
        clock.advance(4.99)
        await dispatcher.idle()
        assert session.downloads == [], "no pass before the poll interval"
        clock.advance(0.01)
        await dispatcher.idle()
        assert session.downloads == [("op-31", 31)]
        assert dispatcher.polls == 1
        clock.advance(5.0)
        await dispatcher.idle()
        assert dispatcher.polls == 2 and session.downloads == [("op-31", 31)], "sent once"
        assert session.deletes == [] and session.acks == [] and session.closed == []
    finally:
        await dispatcher.stopService()
        connection.close()
        db.close()
    assert clock.getDelayedCalls() == []


class ArmingReceiver(Resource):
    """Answers 204, and arms the database's commit failures as it does."""

    isLeaf = True

    def __init__(self, failures: FailingCommits, times: int) -> None:
        super().__init__()
        self.failures, self.times, self.posts = failures, times, 0

    def render_POST(self, request: Request) -> bytes:
        self.posts += 1
        self.failures.left = self.times
        request.setResponseCode(204)
        return b""


@pytest_twisted.ensureDeferred
async def test_a_delivery_whose_outcome_failed_to_commit_is_recorded_later(site_db: str) -> None:
    """Simulator seed 1534: a delivered notification whose outcome write met
    an I/O error stayed pending for the rest of the run (to be sent again
    after the next start).  The outcome is written again on the clock."""
    failures = FailingCommits(site_db)
    receiver = ArmingReceiver(failures, times=2)
    clock = Clock()
    async with webhook_outbox(site_db, receiver, clock, storage_faults=failures) as (
        webhook,
        executor,
    ):
        row_id = enqueue(site_db, 1)
        executor.startService()
        executor.wake()

        def waiting_again() -> float | None:
            return next_wait(clock, webhook._write_again)

        for _ in range(5):
            await eventually(
                lambda: (
                    waiting_again() is not None
                    or webhook_state(site_db, row_id)[0] == outbox.WEBHOOK_DELIVERED
                )
            )
            if webhook_state(site_db, row_id)[0] == outbox.WEBHOOK_DELIVERED:
                break
            assert waiting_again() == RESULTS_RETRY
            clock.advance(RESULTS_RETRY)
        row = webhook_state(site_db, row_id)
        assert (row[0], row[1]) == (outbox.WEBHOOK_DELIVERED, 1)
        assert receiver.posts == 1  # recorded, never sent again
