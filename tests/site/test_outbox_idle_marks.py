"""The outbox executor with nobody to deliver to: committed rows are marked
(pushed to no one; with no webhook, deleted) by the lazy marking, which reads the
watermark once per marking instead of once per wake (a create wakes it twice:
after SUBMITTING and after SUBMITTED).  A client connecting before the marking
gets the rows pushed first.

Real SQLite file with the site schema; the reader connection's statement
trace counts the watermark reads.  The publisher is a recording stand-in for
the WebSocket hub (the executor's ``Publisher`` seam).
"""

from __future__ import annotations

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from tasknet.site.outbox import OutboxExecutor
from tasknet.site.storage import create, outbox, usage
from tasknet.site.storage.engine.database import Database, open_pool
from tasknet.site.storage.engine.schema import prepare_database
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import add_user, query

WATERMARK_SQL = "SELECT COALESCE(MAX(id), 0) FROM notification_outbox"


class RecordingPublisher:
    def __init__(self) -> None:
        self.connected = False
        self.pushed: list[str] = []

    def listening(self) -> bool:
        return self.connected

    def publish(self, user_id: int | None, payload: str) -> int:
        self.pushed.append(payload)
        return 1


async def reserve_some(db: Database, user_id: int, gids: range) -> None:
    """A task row and one outbox row per gid (a reservation alone is not announced)."""
    week = usage.iso_week()
    for gid in gids:
        await db.write(create.reserve, gid, user_id, "", "tok", week)
        await db.write(outbox.enqueue_task_change, gid)


def unmarked(path: str) -> int:
    rows = query(
        path,
        "SELECT COUNT(*) FROM notification_outbox"
        " WHERE ws_delivered_at IS NULL OR webhook_state = 'pending'",
    )
    return int(rows[0][0])


def database(target: str) -> tuple[str, int]:
    path = target
    prepare_database(path)
    user_id, _ = add_user(path, "alice")
    return path, user_id


@pytest_twisted.ensureDeferred
async def test_rows_nobody_listens_to_are_marked_with_one_watermark_read(tmp_path):
    # SQLite only: the witness of the one read is SQLite's statement trace
    # (the second test, on both backends, shows the marking itself).
    path, user_id = database(str(tmp_path / "site.sqlite"))
    db = open_pool(path, **site_runtime(), readers=1)  # the one connection whose trace is read
    reads: list[str] = []
    executor = OutboxExecutor(
        db, RecordingPublisher(), poll_interval=None, mark_interval=0.05, clock=reactor
    )
    try:
        await reserve_some(db, user_id, range(1, 6))
        await db.read(lambda cursor: cursor.connection.set_trace_callback(reads.append))
        executor.startService()
        await executor.wake()
        for _ in range(10):
            await executor.wake()
        assert unmarked(path) == 5
        await eventually(lambda: unmarked(path) == 0)
        assert reads.count(WATERMARK_SQL) == 1
        # No webhook configured: nothing else needs them, so they are gone.
        assert query(path, "SELECT COUNT(*) FROM notification_outbox")[0][0] == 0
    finally:
        await executor.stopService()
        db.close()


def marking_due(clock: Clock, executor: OutboxExecutor) -> bool:
    return any(c.func == executor.marks.due for c in clock.getDelayedCalls())


@pytest_twisted.ensureDeferred
async def test_a_client_connecting_before_the_marking_gets_the_rows_pushed(db_target):
    # The marking is timed on a task.Clock: it runs when the test says, after
    # the client connected (on the reactor, the marking asked for by the
    # first wake could run while the rows are still being written, and mark
    # the ones already committed: rightly, nobody was listening).
    path, user_id = database(db_target)
    db = open_pool(path, **site_runtime())
    clock = Clock()
    publisher = RecordingPublisher()
    executor = OutboxExecutor(
        db, publisher, poll_interval=None, prune_interval=None, mark_interval=0.05, clock=clock
    )
    try:
        executor.startService()
        await executor.wake()
        await reserve_some(db, user_id, range(1, 4))
        await executor.wake()  # nobody yet: left for the marking
        assert marking_due(clock, executor) and unmarked(path) == 3
        publisher.connected = True
        clock.advance(0.05)  # the marking finds a client: the rows are pushed first
        await eventually(lambda: len(publisher.pushed) == 3)
        await eventually(lambda: marking_due(clock, executor))  # once the drain is done
        clock.advance(0.05)
        await eventually(lambda: unmarked(path) == 0)
        assert len(publisher.pushed) == 3
    finally:
        await executor.stopService()
        db.close()
    assert clock.getDelayedCalls() == []
