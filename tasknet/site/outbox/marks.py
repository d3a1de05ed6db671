"""The marks of the outbox's WebSocket tail, as a small state machine.

The marks are written lazily: a wake or a drain that leaves rows to mark
*asks* for a marking, which runs ``interval`` seconds later on the clock
(a few times a second at most: each marking is a write transaction on the
one writer the reports need).  One marking at a time: while one runs, an
ask schedules nothing, and the marking asks again as it ends (a wake that
came meanwhile, rows committed with nobody listening, would otherwise wait
for the next wake or poll, unmarked, and a client connecting meanwhile
would not get them pushed).  A marking that failed (logged) asks for
nothing: the next wake or poll retries.  The stop cancels a scheduled
marking, waits for a running one and writes once more (*flush*).

=========  ===========  ===========  =========
input      idle         scheduled    writing
=========  ===========  ===========  =========
ask        scheduled    scheduled    writing
due        refused      writing      refused
flush      writing      writing      refused
written    refused      refused      idle
failed     refused      refused      idle
cancel     idle         idle         refused
=========  ===========  ===========  =========

(``ask`` is an input only when something needs marking; ``written`` asks
again unless stopped.)  The table is :data:`TRANSITIONS`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

log = Logger()


class MarkState(enum.Enum):
    #: Nothing scheduled, nothing running.
    IDLE = "idle"
    #: A marking is due on the clock.
    SCHEDULED = "scheduled"
    #: A marking runs.
    WRITING = "writing"


class MarkInput(enum.Enum):
    #: Rows need marking (a drain, or a wake with nobody listening).
    ASK = "ask"
    #: The scheduled marking's time came.
    DUE = "due"
    #: Write now (the stop's last marking).
    FLUSH = "flush"
    #: The marking ended, everything it saw marked.
    WRITTEN = "written"
    #: The marking ended early (logged); the next wake or poll retries.
    FAILED = "failed"
    #: The stop: the scheduled marking is dropped.
    CANCEL = "cancel"


IDLE, SCHEDULED, WRITING = MarkState.IDLE, MarkState.SCHEDULED, MarkState.WRITING

#: Every allowed transition; a pair not listed is refused.
TRANSITIONS: dict[tuple[MarkState, MarkInput], MarkState] = {
    (IDLE, MarkInput.ASK): SCHEDULED,
    (SCHEDULED, MarkInput.ASK): SCHEDULED,
    (WRITING, MarkInput.ASK): WRITING,
    (SCHEDULED, MarkInput.DUE): WRITING,
    (IDLE, MarkInput.FLUSH): WRITING,
    (SCHEDULED, MarkInput.FLUSH): WRITING,
    (WRITING, MarkInput.WRITTEN): IDLE,
    (WRITING, MarkInput.FAILED): IDLE,
    (IDLE, MarkInput.CANCEL): IDLE,
    (SCHEDULED, MarkInput.CANCEL): IDLE,
}


class RefusedTransition(Exception):
    """An input the current state does not take (a bug, never a runtime
    condition)."""

    def __init__(self, state: MarkState, event: MarkInput) -> None:
        super().__init__(f"marks: {event.value!r} refused while {state.value}")
        self.state = state
        self.event = event


def transition(state: MarkState, event: MarkInput) -> MarkState:
    """The state after ``event`` in ``state`` (:data:`TRANSITIONS`)."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise RefusedTransition(state, event) from None


class Marks:
    """Schedules and runs ``write`` (one marking: ``True`` when everything
    it saw is marked, ``False`` when it stopped early, having logged why)
    ``interval`` seconds after an :meth:`ask`, on ``clock``; ``needed()``
    says whether anything needs marking (an ask without it is no input)."""

    def __init__(
        self,
        write: Callable[[], Awaitable[bool]],
        needed: Callable[[], bool],
        *,
        interval: float,
        clock: IReactorTime,
    ) -> None:
        self._write = write
        self._needed = needed
        self._interval = interval
        self._clock = clock
        self.state = IDLE
        self._call: IDelayedCall | None = None  # while scheduled
        self._writing: Deferred[None] | None = None  # while writing (and not done at once)
        self._stopped = False

    def _step(self, event: MarkInput) -> None:
        self.state = transition(self.state, event)

    def start(self) -> None:
        """Asks are taken again (after a stop)."""
        self._stopped = False

    def ask(self) -> None:
        """Rows may need marking: schedule a marking, unless one is due or
        runs (that one asks again as it ends) or nothing needs one."""
        if self._stopped or not self._needed():
            return
        before = self.state
        self._step(MarkInput.ASK)
        if before is IDLE:
            self._call = self._clock.callLater(self._interval, self.due)

    def due(self) -> Deferred[None]:
        """The scheduled marking's time came: run it."""
        self._step(MarkInput.DUE)
        self._call = None
        return self._run()

    def flush(self) -> Deferred[None]:
        """Run a marking now (a scheduled one is cancelled)."""
        self._step(MarkInput.FLUSH)
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        return self._run()

    def cancel(self) -> None:
        """Drop the scheduled marking, if any."""
        self._step(MarkInput.CANCEL)
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _run(self) -> Deferred[None]:
        running = Deferred.fromCoroutine(self._marking())
        # Finished at once (nothing to await): already idle again.
        self._writing = None if running.called else running
        return running

    async def _marking(self) -> None:
        try:
            written = await self._write()
        except Exception:
            log.failure("writing the outbox marks failed")
            written = False
        self._writing = None
        self._step(MarkInput.WRITTEN if written else MarkInput.FAILED)
        if written:
            self.ask()

    async def stop(self) -> None:
        """Take no more asks; drop a scheduled marking, wait for a running
        one, then write once more.  Leaves no delayed call behind."""
        self._stopped = True
        if self.state is SCHEDULED:
            self.cancel()
        if self._writing is not None:
            await self._writing
        await self.flush()
