"""This site process as an instance among the sites of one database
(SCALE.md 2): its lease checked, its heartbeat written and the instances
that are gone reaped, every ``interval`` seconds on the site's clock.

The lease (:mod:`tasknet.site.storage.lease`) is taken when the site is
built, before recovery; the start's recovery settles what earlier runs and
gone instances left (:meth:`tasknet.site.lifecycle.Lifecycle.recover`).
While the site runs, :class:`InstanceService` on a shared database
(PostgreSQL), on each tick:

1. checks the lease (its connection alive, its lock held), within
   ``check_timeout`` seconds; a check that finds it held confirms it from
   the moment it started (the lease's freshness, SCALE.md "Fencing" 1);
2. writes the heartbeat, which also asks the database whether another
   instance has reaped this one (its row is then no longer open);
3. reaps the instances that are gone (``reap``: the reaper's
   :meth:`~tasknet.site.reaper.Reaper.reap_gone`, which first ends
   every database session the gone instance left), so their interrupted
   submissions show as ``UNKNOWN`` within seconds, not at their restart.

The service starts before the start's recovery, so a long recovery does not
let the lease go stale (the reaper, which the recovery runs too, runs one
reaping pass at a time).

Fencing: when 1 or 2 fails the lease is lost: the service stops its timer,
the lifecycle refuses every further write (:class:`LeaseLost`) and
:attr:`InstanceService.fenced` fires with the reason; the site service
stops and, under twistd, exits non-zero.  A tick still running when the next
is due is skipped, not queued, but for its lease check: when the last tick's
heartbeat or reaping is slow (a database in failover retries its
connections for seconds) the lease is still checked on time, on its own
session, so the site keeps its lease fresh or learns at once that it lost
it (SCALE.md "Database failover" 3).

On SQLite the flock is the lease and the site is alone on its file: there is
nothing to check or reap while it runs, so there is no timer at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, TimeoutError, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.site.storage import instances
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.engine.errors import DatabaseError
from tasknet.site.storage.instances import LeaseLost
from tasknet.site.storage.lease import CHECK_INTERVAL, CHECK_TIMEOUT, Lease

log = Logger()

#: Seconds between two ticks: a gone instance is reaped at most this long
#: after the database ended its lease session (SCALE.md: within 30 s).  The
#: lease timeout (storage.lease.LEASE_TIMEOUT) is this plus CHECK_TIMEOUT.
INTERVAL = CHECK_INTERVAL


class InstanceService(MultiService):
    """The running instance: lease checks, heartbeats and reaping over
    ``db`` on ``clock``; ``reap()`` is one reaping pass."""

    def __init__(
        self,
        lease: Lease,
        db: Database,
        reap: Callable[[], Deferred[Any]],
        *,
        interval: float = INTERVAL,
        check_timeout: float = CHECK_TIMEOUT,
        clock: IReactorTime,
    ) -> None:
        if interval <= 0 or check_timeout <= 0:
            raise ValueError("the interval and the check timeout must be > 0")
        super().__init__()
        self.lease = lease
        self._db = db
        self._reap = reap
        self._clock: IReactorTime = clock
        self._check_timeout = check_timeout
        self._timer: TimerService | None = None
        if lease.shared:
            self._timer = TimerService(interval, self._in_background)
            self._timer.clock = self._clock
            self._timer.setServiceParent(self)
        self._running: Deferred[None] | None = None
        # A lease check under way (a tick's, or one on its own while a
        # tick's heartbeat or reaping is slow).
        self._checking: Deferred[bool] | None = None
        self._check_waiters: list[Deferred[bool]] = []
        #: Fires once, with the reason, when the lease is lost.
        self.fenced: Deferred[str] = Deferred()
        #: Ticks finished (tests, logs).
        self.ticks = 0

    @property
    def instance_id(self) -> int:
        return self.lease.instance_id

    def _in_background(self) -> None:
        # Not returned to the timer: a failed or slow tick must not stop it.
        if self.fenced.called:
            return
        if self._running is None:
            self._running = Deferred.fromCoroutine(self.tick())
            self._running.addErrback(lambda f: log.failure("instance tick failed", f))
            self._running.addBoth(self._tick_ended)
        elif self._checking is None:
            # The last tick is still at its heartbeat or reaping: check anyway.
            check = self._check()
            check.addErrback(lambda f: log.failure("lease check failed", f))

    def _tick_ended(self, _: object) -> None:
        self._running = None

    def _check(self) -> Deferred[bool]:
        """Check the lease (within the check timeout), or wait for the
        check under way; fires True if it holds, False once it was found
        lost (the site is then fenced)."""
        waiter: Deferred[bool] = Deferred()
        self._check_waiters.append(waiter)
        if self._checking is None:
            self._checking = Deferred.fromCoroutine(self._check_lease())
            self._checking.addBoth(self._check_ended)
        return waiter

    def _check_ended(self, result: bool | Failure) -> None:
        self._checking = None
        waiters, self._check_waiters = self._check_waiters, []
        for waiter in waiters:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)

    async def _check_lease(self) -> bool:
        try:
            await self.lease.check().addTimeout(self._check_timeout, self._clock)
        except (LeaseLost, TimeoutError) as e:
            self.fence(
                f"the lease check failed: {e}"
                if isinstance(e, LeaseLost)
                else f"the lease check did not answer within {self._check_timeout} s"
            )
            return False
        return True

    async def tick(self) -> None:
        """One round: lease, heartbeat, reaping (see the module doc)."""
        if not await self._check():
            return
        try:
            still_open = await self._db.write(instances.heartbeat, self.instance_id)
        except DatabaseError as e:
            # The lease is what decides; a busy database is not a lost lease.
            log.warn("heartbeat of site instance {id} failed: {e}", id=self.instance_id, e=e)
        else:
            if not still_open:
                self.fence("another instance found this one gone and reaped it")
                return
        if not self.fenced.called:
            await self._reap()
        self.ticks += 1

    def fence(self, reason: str) -> None:
        """The lease is lost: stop writing (the lease refuses, the lifecycle
        checks it), stop the timer, fire :attr:`fenced`.  Once."""
        if self.fenced.called:
            return
        self.lease.lose(reason)
        log.critical(
            "LEASE LOST for site instance {id} ({name}): {reason}; this site stops writing "
            "and exits",
            id=self.instance_id,
            name=self.lease.name,
            reason=reason,
        )
        if self._timer is not None and self._timer.running:
            self._timer.stopService()
        self.fenced.callback(reason)

    def stopService(self) -> Deferred[None]:
        """Stop the timer; fires once a tick under way has ended."""
        timer: Deferred[None] = super().stopService() if self.running else succeed(None)
        return timer.addCallback(lambda _: self._running)
