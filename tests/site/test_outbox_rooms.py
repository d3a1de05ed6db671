"""The outbox's rooms, each on ``task.Clock`` (issue 37, item 3): the marks
machine (its table: every input in every state, allowed or refused; and
the machine itself on the clock), the two tails, the webhook claims'
renewer (every third of the lease, on a timer of its own), the liveness
sweep (on a timer of its own, at the poll interval) and how the executor
wires their timers.

No database: a stand-in answers each read and write at once from a table
of results by function, and records the calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from tasknet.site.outbox import (
    ClaimRenewer,
    LivenessSweep,
    LocalTail,
    LocalWebhook,
    OutboxExecutor,
    SharedTail,
    SharedWebhook,
)
from tasknet.site.outbox.marks import (
    TRANSITIONS,
    MarkInput,
    Marks,
    MarkState,
    RefusedTransition,
    transition,
)
from tasknet.site.storage import outbox as outbox_rows
from tasknet.site.storage.engine.database import Capabilities
from tests.site.test_outbox_idle_marks import RecordingPublisher

IDLE, SCHEDULED, WRITING = MarkState.IDLE, MarkState.SCHEDULED, MarkState.WRITING
ASK, DUE, FLUSH = MarkInput.ASK, MarkInput.DUE, MarkInput.FLUSH
WRITTEN, FAILED, CANCEL = MarkInput.WRITTEN, MarkInput.FAILED, MarkInput.CANCEL


class AnsweringDatabase:
    """Answers each call at once: ``results[fn]`` (a value, or a callable
    of the call's args; an exception instance fails it); records
    ``(fn name, args)``."""

    capabilities = Capabilities(shared_by_sites=False)

    def __init__(self, results: dict[Any, Any] | None = None) -> None:
        self.results: dict[Any, Any] = {outbox_rows.backlog: 0, **(results or {})}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Deferred[Any]:
        self.calls.append((fn.__name__, args))
        result = self.results.get(fn)
        if isinstance(result, Exception):
            return fail(result)
        return succeed(result(*args) if callable(result) else result)

    read = write = _call

    def names(self) -> list[str]:
        return [name for name, _ in self.calls if name != "backlog"]


def row(row_id: int) -> outbox_rows.OutboxRow:
    return outbox_rows.OutboxRow(row_id, row_id, None, f"row {row_id}", True, False, 0)


# -- the marks machine ------------------------------------------------------

#: The table written out (not read from the code): the state after each
#: input, ``None`` where the input is refused.
EXPECTED: dict[MarkState, dict[MarkInput, MarkState | None]] = {
    IDLE: {
        ASK: SCHEDULED,
        DUE: None,
        FLUSH: WRITING,
        WRITTEN: None,
        FAILED: None,
        CANCEL: IDLE,
    },
    SCHEDULED: {
        ASK: SCHEDULED,
        DUE: WRITING,
        FLUSH: WRITING,
        WRITTEN: None,
        FAILED: None,
        CANCEL: IDLE,
    },
    WRITING: {
        ASK: WRITING,
        DUE: None,
        FLUSH: None,
        WRITTEN: IDLE,
        FAILED: IDLE,
        CANCEL: None,
    },
}


@pytest.mark.parametrize("state", list(MarkState), ids=lambda s: s.value)
@pytest.mark.parametrize("event", list(MarkInput), ids=lambda e: e.value)
def test_every_input_in_every_state_is_allowed_or_refused(
    state: MarkState, event: MarkInput
) -> None:
    expected = EXPECTED[state][event]
    if expected is None:
        with pytest.raises(RefusedTransition):
            transition(state, event)
    else:
        assert transition(state, event) is expected


def test_the_table_lists_only_the_allowed_pairs() -> None:
    allowed = {(s, e) for s, row in EXPECTED.items() for e, after in row.items() if after}
    assert set(TRANSITIONS) == allowed


class Writes:
    """The marks' ``write``: each call waits for the test (``answer``)."""

    def __init__(self) -> None:
        self.pending: list[Deferred[bool]] = []
        self.calls = 0

    def __call__(self) -> Deferred[bool]:
        self.calls += 1
        d: Deferred[bool] = Deferred()
        self.pending.append(d)
        return d

    def answer(self, written: bool) -> None:
        self.pending.pop(0).callback(written)


def machine(needed: Callable[[], bool] = lambda: True) -> tuple[Clock, Writes, Marks]:
    clock, writes = Clock(), Writes()
    marks = Marks(writes, needed, interval=0.25, clock=clock)
    return clock, writes, marks


def due_in(clock: Clock, marks: Marks) -> float | None:
    calls = [c for c in clock.getDelayedCalls() if c.func == marks.due]
    assert len(calls) <= 1
    return round(calls[0].getTime() - clock.seconds(), 6) if calls else None


def test_an_ask_schedules_one_marking_and_nothing_needed_is_no_input() -> None:
    need = [False]
    clock, writes, marks = machine(lambda: need[0])
    marks.ask()
    assert marks.state is IDLE and due_in(clock, marks) is None
    need[0] = True
    marks.ask()
    marks.ask()
    assert marks.state is SCHEDULED and due_in(clock, marks) == 0.25
    clock.advance(0.25)
    assert marks.state is WRITING and writes.calls == 1 and due_in(clock, marks) is None


def test_an_ask_while_writing_is_taken_up_as_the_write_ends() -> None:
    need = [True]
    clock, writes, marks = machine(lambda: need[0])
    marks.ask()
    clock.advance(0.25)
    marks.ask()
    assert marks.state is WRITING and due_in(clock, marks) is None, "one marking at a time"
    writes.answer(True)  # written: asks again, and something still needs marking
    assert marks.state is SCHEDULED and due_in(clock, marks) == 0.25
    clock.advance(0.25)
    need[0] = False
    writes.answer(True)  # nothing more needed: idle
    assert marks.state is IDLE and clock.getDelayedCalls() == []


def test_a_failed_marking_asks_for_nothing() -> None:
    clock, writes, marks = machine()
    marks.ask()
    clock.advance(0.25)
    writes.answer(False)
    assert marks.state is IDLE and clock.getDelayedCalls() == []
    marks.ask()  # the next wake or poll retries
    assert due_in(clock, marks) == 0.25


def test_a_write_that_raises_is_a_failed_marking() -> None:
    clock = Clock()
    marks = Marks(lambda: fail(RuntimeError("boom")), lambda: True, interval=0.25, clock=clock)
    marks.ask()
    clock.advance(0.25)
    assert marks.state is IDLE and clock.getDelayedCalls() == []


def test_the_stop_cancels_a_scheduled_marking_and_writes_once_more() -> None:
    clock, writes, marks = machine()
    marks.ask()
    stopped = Deferred.fromCoroutine(marks.stop())
    assert marks.state is WRITING and due_in(clock, marks) is None and writes.calls == 1
    writes.answer(True)  # stopped: asks for nothing more
    assert stopped.called and marks.state is IDLE and clock.getDelayedCalls() == []
    marks.ask()
    assert marks.state is IDLE, "no ask taken after the stop"
    marks.start()
    marks.ask()
    assert marks.state is SCHEDULED


def test_the_stop_waits_for_a_running_marking_then_writes_once_more() -> None:
    clock, writes, marks = machine()
    marks.ask()
    clock.advance(0.25)
    stopped = Deferred.fromCoroutine(marks.stop())
    assert not stopped.called and writes.calls == 1
    writes.answer(True)
    assert marks.state is WRITING and writes.calls == 2, "the last marking"
    writes.answer(True)
    assert stopped.called and clock.getDelayedCalls() == []


def test_a_refused_input_leaves_the_state_as_it_was() -> None:
    clock, writes, marks = machine()
    with pytest.raises(RefusedTransition):
        marks.due()
    assert marks.state is IDLE
    marks.ask()
    clock.advance(0.25)
    with pytest.raises(RefusedTransition):
        marks.flush()
    assert marks.state is WRITING and writes.calls == 1


# -- the tails ----------------------------------------------------------------


def test_the_local_tail_reads_unmarked_rows_and_marks_a_range() -> None:
    db = AnsweringDatabase({outbox_rows.fanout_rows: [row(1), row(2)]})
    tail = LocalTail(db)  # type: ignore[arg-type]
    Deferred.fromCoroutine(tail.join()).result  # noqa: B018 -- nothing to join
    assert not tail.joined and db.calls == []
    rows = Deferred.fromCoroutine(tail.rows(500)).result
    assert [r.id for r in rows] == [1, 2] and db.calls == [("fanout_rows", (0, 500))]
    tail.after = 2
    assert Deferred.fromCoroutine(tail.mark(skip_webhook=True)).result is True
    assert db.calls[-1] == ("mark_range_fanned_out", (0, 2)) and tail.marked == 2


def test_the_shared_tail_joins_once_from_the_newest_row_and_marks_its_reads() -> None:
    join: list[Deferred[int]] = []

    def joining(instance_id: int) -> Deferred[int]:
        join.append(Deferred())
        return join[-1]

    db = AnsweringDatabase({outbox_rows.rows_after: [row(8)]})
    db.write = db.read = _with(db, outbox_rows.join_readers, joining)  # type: ignore[method-assign]
    tail = SharedTail(db, 7)  # type: ignore[arg-type]
    first = Deferred.fromCoroutine(tail.join())
    second = Deferred.fromCoroutine(tail.join())  # waits for the first: one join at a time
    assert len(join) == 1
    join[0].callback(5)  # rows up to 5 were committed before this site started
    assert first.called and second.called and len(join) == 1
    assert tail.joined and (tail.after, tail.marked) == (5, 5)
    Deferred.fromCoroutine(tail.rows(100))
    tail.after = 8
    assert Deferred.fromCoroutine(tail.mark(skip_webhook=False)).result is True
    assert db.names() == ["join_readers", "rows_after", "mark_read"]
    assert db.calls[1][1] == (5, 100) and db.calls[2][1] == (7, 8)


def test_a_failed_shared_join_is_tried_again_by_the_next_one() -> None:
    answers: list[Any] = [RuntimeError("database down"), 3]

    def joining(instance_id: int) -> Deferred[int]:
        answer = answers.pop(0)
        return fail(answer) if isinstance(answer, Exception) else succeed(answer)

    db = AnsweringDatabase()
    db.write = db.read = _with(db, outbox_rows.join_readers, joining)  # type: ignore[method-assign]
    tail = SharedTail(db, 7)  # type: ignore[arg-type]
    failed = Deferred.fromCoroutine(tail.join())
    failed.addErrback(lambda f: f.trap(RuntimeError))
    assert not tail.joined
    Deferred.fromCoroutine(tail.join())
    assert tail.joined and tail.after == 3


def test_a_failed_mark_is_left_for_the_next_marking() -> None:
    db = AnsweringDatabase({outbox_rows.mark_range_fanned_out: RuntimeError("disk I/O error")})
    tail = LocalTail(db)  # type: ignore[arg-type]
    tail.after = 4
    assert Deferred.fromCoroutine(tail.mark(skip_webhook=True)).result is False
    assert tail.marked == 0


def _with(db: AnsweringDatabase, fn: Any, answer: Callable[..., Deferred[Any]]) -> Any:
    plain = db._call

    def call(called: Any, *args: Any, **kw: Any) -> Deferred[Any]:
        if called is fn:
            db.calls.append((called.__name__, args))
            return answer(*args)
        return plain(called, *args, **kw)

    return call


# -- the webhook claims' renewer ----------------------------------------------


class HeldRows:
    """The sender as the claims see it: the rows it holds, and drops."""

    def __init__(self, *known: int) -> None:
        self.known = set(known)
        self.dropped: list[int] = []
        self.on_room: Any = None

    def drop(self, ids: Any) -> None:
        self.dropped += list(ids)
        self.known -= set(ids)

    def room(self) -> int:
        return 0

    async def stop(self) -> None:
        self.known.clear()


def renewals(db: AnsweringDatabase) -> list[tuple[Any, ...]]:
    return [args for name, args in db.calls if name == "renew_webhook_claims"]


def test_held_claims_are_renewed_every_third_of_the_lease_on_the_renewers_clock() -> None:
    clock = Clock()
    db = AnsweringDatabase({outbox_rows.renew_webhook_claims: []})
    sender = HeldRows()
    claims = SharedWebhook(sender, db, 7, lease=30.0, clock=clock)  # type: ignore[arg-type]
    renewer = claims.renewer
    assert isinstance(renewer, ClaimRenewer) and renewer.step == 10.0
    renewer.startService()  # its first call now: nothing held, nothing written
    assert renewals(db) == []
    sender.known = {3, 1}
    clock.advance(9.99)
    assert renewals(db) == []
    clock.advance(0.01)
    assert renewals(db) == [(7, [1, 3], 30.0)]
    clock.advance(10.0)
    assert len(renewals(db)) == 2
    renewer.stopService()
    clock.advance(30.0)
    assert len(renewals(db)) == 2 and clock.getDelayedCalls() == []


def test_a_lapsed_claim_is_dropped_and_a_failed_renewal_does_not_stop_the_timer() -> None:
    clock = Clock()
    answers: list[Any] = [RuntimeError("serialization failure"), [3]]

    def renewing(*args: Any) -> Deferred[list[int]]:
        answer = answers.pop(0)
        return fail(answer) if isinstance(answer, Exception) else succeed(answer)

    db = AnsweringDatabase()
    db.write = db.read = _with(db, outbox_rows.renew_webhook_claims, renewing)  # type: ignore[method-assign]
    sender = HeldRows(1, 3)
    claims = SharedWebhook(sender, db, 7, lease=9.0, clock=clock)  # type: ignore[arg-type]
    claims.renewer.startService()  # renews at once: it fails (logged)
    assert sender.dropped == [] and len(renewals(db)) == 1
    clock.advance(3.0)  # and again a third of the lease later: row 3 is another site's
    assert sender.dropped == [3] and sender.known == {1} and len(renewals(db)) == 2
    claims.renewer.stopService()


def test_the_lease_must_be_positive() -> None:
    with pytest.raises(ValueError, match="webhook_lease"):
        SharedWebhook(HeldRows(), AnsweringDatabase(), 7, lease=0, clock=Clock())  # type: ignore[arg-type]


def test_local_webhook_rows_are_read_after_the_last_handed_over() -> None:
    db = AnsweringDatabase({outbox_rows.webhook_rows: lambda after, room: [row(after + 1)]})
    local = LocalWebhook(HeldRows(), db)  # type: ignore[arg-type]
    assert local.timers == ()
    for _ in range(2):
        Deferred.fromCoroutine(local.take(10))
    assert db.calls == [("webhook_rows", (0, 10)), ("webhook_rows", (1, 10))]


def test_shared_webhook_rows_are_claimed_only_when_some_are_claimable() -> None:
    db = AnsweringDatabase(
        {outbox_rows.claimable_webhook_rows: False, outbox_rows.claim_webhook_rows: [row(4)]}
    )
    shared = SharedWebhook(HeldRows(), db, 7, lease=30.0, clock=Clock())  # type: ignore[arg-type]
    assert Deferred.fromCoroutine(shared.take(10)).result == []
    db.results[outbox_rows.claimable_webhook_rows] = True
    assert [r.id for r in Deferred.fromCoroutine(shared.take(10)).result] == [4]
    assert db.names() == ["claimable_webhook_rows"] * 2 + ["claim_webhook_rows"]
    assert db.calls[-1][1] == (7, 10, 30.0)


# -- the liveness sweep ---------------------------------------------------------


class Watch:
    """A liveness watch whose sweeps wait for the test."""

    def __init__(self) -> None:
        self.sweeps: list[Deferred[int]] = []

    async def sweep(self) -> int:
        self.sweeps.append(Deferred())
        return await self.sweeps[-1]


def test_the_liveness_sweep_runs_on_its_own_timer_one_at_a_time() -> None:
    clock, watch = Clock(), Watch()
    sweep = LivenessSweep(watch, 5.0, clock=clock)  # type: ignore[arg-type]
    sweep.startService()
    assert len(watch.sweeps) == 1, "the first sweep as it starts"
    clock.advance(5.0)
    assert len(watch.sweeps) == 1, "a sweep still running: no second one"
    watch.sweeps[0].callback(0)
    clock.advance(5.0)
    assert len(watch.sweeps) == 2
    watch.sweeps[1].errback(RuntimeError("database down"))  # logged
    clock.advance(4.99)
    assert len(watch.sweeps) == 2
    clock.advance(0.01)
    assert len(watch.sweeps) == 3, "a failed sweep does not stop the timer"
    stopped: list[object] = []
    sweep.stopService().addBoth(stopped.append)
    assert stopped == [], "the stop waits for the sweep in flight"
    watch.sweeps[2].callback(1)
    assert stopped == [None] and clock.getDelayedCalls() == []


# -- the executor's timers --------------------------------------------------------


def steps(executor: OutboxExecutor) -> dict[str, float]:
    return {type(t).__name__ + ":" + getattr(t.call[0], "__name__", ""): t.step for t in executor}


def test_each_room_has_its_own_timer_on_the_executors_clock() -> None:
    clock, db = Clock(), AnsweringDatabase()
    sender = HeldRows()
    executor = OutboxExecutor(
        db,  # type: ignore[arg-type]
        RecordingPublisher(),
        SharedWebhook(sender, db, 7, lease=9.0, clock=clock),  # type: ignore[arg-type]
        tail=SharedTail(db, 7),  # type: ignore[arg-type]
        liveness=Watch(),  # type: ignore[arg-type]
        poll_interval=5.0,
        prune_interval=3600.0,
        clock=clock,
    )
    timers = list(executor)
    # The renewer every third of the lease, not min(poll, lease / 3) for all.
    assert sorted((type(t).__name__, t.step) for t in timers) == [
        ("ClaimRenewer", 3.0),
        ("LivenessSweep", 5.0),
        ("TimerService", 5.0),
        ("TimerService", 3600.0),
    ]
    assert all(t.clock is clock for t in timers)


def test_no_poll_interval_no_liveness_sweep_and_alone_no_renewer() -> None:
    clock, db = Clock(), AnsweringDatabase()
    executor = OutboxExecutor(
        db,  # type: ignore[arg-type]
        RecordingPublisher(),
        LocalWebhook(HeldRows(), db),  # type: ignore[arg-type]
        liveness=Watch(),  # type: ignore[arg-type]
        poll_interval=None,
        prune_interval=None,
        clock=clock,
    )
    assert list(executor) == [] and isinstance(executor.tail, LocalTail)


def test_a_shared_tail_registers_as_the_executor_starts_and_leaves_at_its_stop() -> None:
    clock = Clock()
    db = AnsweringDatabase({outbox_rows.join_readers: 4, outbox_rows.claimable_webhook_rows: False})
    sender = HeldRows()
    executor = OutboxExecutor(
        db,  # type: ignore[arg-type]
        RecordingPublisher(),
        SharedWebhook(sender, db, 7, lease=30.0, clock=clock),  # type: ignore[arg-type]
        tail=SharedTail(db, 7),  # type: ignore[arg-type]
        poll_interval=None,
        prune_interval=None,
        clock=clock,
    )
    executor.startService()
    assert db.names() == ["join_readers"], "joined as it starts, before any wake"
    assert executor.tail.joined and executor.tail.after == 4
    stopped: list[object] = []
    executor.stopService().addBoth(stopped.append)
    assert stopped == [None]
    assert db.names()[-2:] == ["release_webhook_claims", "leave_readers"]
    assert not executor.tail.joined and clock.getDelayedCalls() == []
