""" "Run again if asked while running": one call of an async function at a time.

A request that arrives while a run is under way does not start a second,
concurrent run; it asks for one more run right after the current one (any
number of such requests make one more run).  Each request's Deferred fires
when the run that covers it has finished, so a caller that awaits it knows
its change was seen.  Used by the node reporter's flush, the dispatcher's
unassigned pass, the outbox drain and the webhook outcome writes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure


class CoalescingRunner:
    """Runs ``fn`` (an async function of no arguments) coalesced.

    If ``fn`` raises, the loop stops (no further run until the next request)
    and every request it covered receives the failure."""

    def __init__(self, fn: Callable[[], Awaitable[object]]) -> None:
        self._fn = fn
        self._again = False
        self._waiters: list[Deferred[None]] = []
        #: A run is under way (or about to start again).
        self.running = False

    def run(self) -> Deferred[None]:
        """Run ``fn`` now, or once more after the run under way."""
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        if self.running:
            self._again = True
        else:
            self.running = True
            Deferred.fromCoroutine(self._loop())
        return d

    def idle(self) -> Deferred[None]:
        """Fires (never fails) once no run is under way (shutdown, tests)."""
        if not self.running:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        return d.addErrback(lambda _: None)

    async def _loop(self) -> None:
        failure: Failure | None = None
        try:
            again = True
            while again:
                self._again = False
                await self._fn()
                again = self._again
        except Exception:
            failure = Failure()
        finally:
            self.running = False
            self._again = False
            waiters, self._waiters = self._waiters, []
            for d in waiters:
                if failure is None:
                    d.callback(None)
                else:
                    d.errback(failure)
