"""The outbox executor's lazy marking against a wake that comes while a
marking runs: the wake is not lost.

With nobody to deliver to, a wake only asks for a marking (``_unread``), and
none is scheduled while one runs.  A wake during the marking's watermark
read or its write (rows committed meanwhile, nobody listening) must then
give one more marking when that one ends: otherwise the rows wait, unmarked,
for the next wake or poll (none, without a poll interval), and a client that
connects meanwhile never gets them pushed.

Deterministic: time is a ``task.Clock`` and the database a stand-in whose
reads and writes stay pending until the test answers them, in order.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from tasknet.site.outbox import OutboxExecutor
from tasknet.site.storage import outbox
from tasknet.site.storage.engine.database import Capabilities
from tests.site.test_outbox_idle_marks import RecordingPublisher

MARK_INTERVAL = 0.25


class PendingDatabase:
    """A SQLite-like database (not shared) whose reads and writes wait for
    the test: ``calls`` holds ``(fn, args, deferred)`` in the order made.
    The start's backlog read is answered at once."""

    capabilities = Capabilities(shared_by_sites=False)

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...], Deferred[Any]]] = []

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Deferred[Any]:
        if fn is outbox.backlog:
            return succeed(0)
        d: Deferred[Any] = Deferred()
        self.calls.append((fn, args, d))
        return d

    read = write = _call

    def answer(self, fn: Any, result: Any = None) -> tuple[Any, ...]:
        """Fire the one pending call, which must be of ``fn``; its args."""
        assert len(self.calls) == 1, [(c[0].__name__, c[1]) for c in self.calls]
        called, args, d = self.calls.pop()
        assert called is fn, (called.__name__, fn.__name__)
        d.callback(result)
        return args


def row(row_id: int) -> outbox.OutboxRow:
    return outbox.OutboxRow(row_id, row_id, None, f"row {row_id}", True, False, 0)


def marking_due(clock: Clock, executor: OutboxExecutor) -> float | None:
    calls = [c for c in clock.getDelayedCalls() if c.func == executor.marks.due]
    assert len(calls) <= 1
    return round(calls[0].getTime() - clock.seconds(), 6) if calls else None


def started() -> tuple[Clock, PendingDatabase, RecordingPublisher, OutboxExecutor]:
    clock, db, publisher = Clock(), PendingDatabase(), RecordingPublisher()
    executor = OutboxExecutor(
        db,  # type: ignore[arg-type]
        publisher,
        poll_interval=None,
        prune_interval=None,
        mark_interval=MARK_INTERVAL,
        clock=clock,
    )
    executor.startService()
    return clock, db, publisher, executor


def test_a_wake_during_the_watermark_read_gets_a_marking_of_its_own() -> None:
    clock, db, publisher, executor = started()
    assert executor.wake().called  # rows 1-2 committed, nobody listening
    assert marking_due(clock, executor) == MARK_INTERVAL
    clock.advance(MARK_INTERVAL)  # the marking reads the watermark...
    assert executor.wake().called  # ...row 3 commits meanwhile: wake, nobody listening
    assert marking_due(clock, executor) is None, "one marking at a time"
    db.answer(outbox.last_id, 2)  # the read saw rows 1-2 only
    assert db.answer(outbox.mark_range_fanned_out) == (0, 2)
    # The wake asked for one more marking: it is scheduled as this one ends.
    assert marking_due(clock, executor) == MARK_INTERVAL

    # A client connects before it runs: row 3 is pushed to it, then marked.
    publisher.connected = True
    clock.advance(MARK_INTERVAL)
    assert db.answer(outbox.fanout_rows, [row(3)]) == (2, 500)
    assert publisher.pushed == ["row 3"]
    db.answer(outbox.fanout_rows, [])
    assert marking_due(clock, executor) == MARK_INTERVAL
    clock.advance(MARK_INTERVAL)
    assert db.answer(outbox.mark_range_fanned_out) == (2, 3)
    assert db.calls == [] and clock.getDelayedCalls() == []

    stopped = executor.stopService()
    assert stopped.called and db.calls == [] and clock.getDelayedCalls() == []


def test_a_wake_during_the_marks_write_gets_a_marking_of_its_own() -> None:
    clock, db, publisher, executor = started()
    executor.wake()
    clock.advance(MARK_INTERVAL)
    db.answer(outbox.last_id, 2)
    executor.wake()  # row 3 commits while rows 1-2 are being marked
    assert marking_due(clock, executor) is None
    assert db.answer(outbox.mark_range_fanned_out) == (0, 2)
    assert marking_due(clock, executor) == MARK_INTERVAL
    clock.advance(MARK_INTERVAL)  # still nobody: row 3 is marked unpushed
    db.answer(outbox.last_id, 3)
    assert db.answer(outbox.mark_range_fanned_out) == (2, 3)
    assert publisher.pushed == [] and db.calls == []
    assert clock.getDelayedCalls() == [], "nothing more asked: no further marking"
    assert executor.stopService().called


def test_a_failed_marking_waits_for_the_next_wake_as_before() -> None:
    # No retry loop on a failing database: the next wake (or poll) retries.
    clock, db, publisher, executor = started()
    executor.wake()
    clock.advance(MARK_INTERVAL)
    executor.wake()
    _, _, d = db.calls.pop()
    d.errback(RuntimeError("database down"))
    assert marking_due(clock, executor) is None and db.calls == []
    executor.wake()
    assert marking_due(clock, executor) == MARK_INTERVAL
    clock.advance(MARK_INTERVAL)
    db.answer(outbox.last_id, 3)
    assert db.answer(outbox.mark_range_fanned_out) == (0, 3)
    assert executor.stopService().called
