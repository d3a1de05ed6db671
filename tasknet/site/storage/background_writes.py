"""Writes that must land while the site lives, retried in the background on
the site's clock until they do.

An outcome a client was already answered with (a release, an ``UNKNOWN``)
cannot wait for the site's next start: a task left ``SUBMITTING`` shows
提交中 for ever.  Such a write is retried every ``interval`` seconds until it
commits; only a lost lease (a reap or the next start settles it) or the
site's stop ends it earlier.  Its function must act only on the expected
row in the expected state, so that a repeat (after a ``COMMIT`` whose answer
was lost) is a no-op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVarTuple

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from tasknet.site.storage.engine.database import Cursor, Database, Retry
from tasknet.site.storage.engine.errors import DatabaseFailed
from tasknet.site.storage.instances import LeaseLost

log = Logger()

Ts = TypeVarTuple("Ts")


class BackgroundWrites:
    """The writes of one site part retried every ``interval`` seconds on
    ``clock`` (:meth:`keep_trying`), until each lands or :meth:`stop`."""

    def __init__(self, db: Database, *, interval: float, clock: IReactorTime) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self._db = db
        self._interval = interval
        self._clock = clock
        # In the order they began (a dict: stop cancels them in that order,
        # never in the order of their addresses).
        self._pending: dict[Deferred[bool], None] = {}

    @property
    def pending(self) -> int:
        """Writes still being retried."""
        return len(self._pending)

    def keep_trying(
        self, what: str, fn: Callable[[Cursor, *Ts], object], *args: *Ts
    ) -> Deferred[bool]:
        """Write ``fn(cursor, *args)`` after ``interval`` seconds, and again
        every ``interval`` while the database is busy or fails.  Fires
        ``True`` once it committed, ``False`` if it was given up (the lease
        lost, the stop, an unexpected error: logged, for a reap or the next
        start's recovery to settle).  ``what`` names it in the log."""
        d = Deferred.fromCoroutine(self._retried(what, fn, *args))
        self._pending[d] = None

        def ended(landed: bool) -> bool:
            self._pending.pop(d, None)
            return landed

        return d.addCallback(ended)

    async def _retried(self, what: str, fn: Callable[[Cursor, *Ts], object], *args: *Ts) -> bool:
        every = Retry(f"{what} (background)", math.inf, lambda _: self._interval)
        try:
            while True:
                await deferLater(self._clock, self._interval, lambda: None)
                try:
                    await self._db.write_retrying(every, fn, *args)
                    break
                except LeaseLost as e:
                    log.warn("{what}: {e}; left for a reap or the next start", what=what, e=e)
                    return False
                except DatabaseFailed as e:  # the write is guarded: a repeat is a no-op
                    log.warn("{what}: {error}; retrying", what=what, error=e)
        except CancelledError:
            # Stopped while waiting (or while writing: the write lands or not).
            log.warn("{what}: not recorded before the stop; recovery at start does", what=what)
            return False
        except Exception:
            log.failure("{what} failed; recovery at the next start settles it", what=what)
            return False
        log.info("{what}: recorded at last", what=what)
        return True

    def stop(self) -> None:
        """Give up every write still being retried (what they had not
        recorded is left for the recovery at the next start)."""
        for d in list(self._pending):
            d.cancel()
