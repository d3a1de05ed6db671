"""Reaping the site instances that are gone (SCALE.md 2): whose lease the
database lets this instance take, their generations in flight settled, each
in a transaction of its own with its evidence
(:func:`tasknet.site.storage.reaping.reap`, ``instance_reap``).

A module of its own beside :mod:`tasknet.site.instance_service` rather than
inside it: the instance service is the timer (lease checks, heartbeat,
fencing) and only one of the reaper's two callers, and on SQLite it runs no
timer at all; the other is the start's recovery
(:meth:`tasknet.site.lifecycle.Lifecycle.recover`), which reaps every
instance that is gone (on SQLite the flock says every other one is) and the
generations no instance recorded.  The composition root builds one
:class:`Reaper` and hands it to both, so one lock keeps one pass at a time.

The reaper writes as the lifecycle does: nothing once the lease is lost
(:class:`~tasknet.site.storage.instances.LeaseLost`), and the outbox woken
after each commit (``on_commit``, whose errors are logged, never raised).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, DeferredLock
from twisted.logger import Logger

from tasknet.site.storage import instances, reaping
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.lease import Lease, dead_here
from tasknet.site.storage.reaping import Reaped

log = Logger()


class Reaper:
    """The reaping of gone instances by the instance holding ``lease`` over
    ``db``.  ``upstream_timeout``: how long a reaped submission's POST may
    still be answered (on a shared database the reap records when its
    verdict may come, a lease timeout plus this after the gone instance's
    last confirmation).  ``on_commit()`` after each reap's commit (the site
    wires it to its outbox executor's ``wake()``)."""

    def __init__(
        self,
        db: Database,
        lease: Lease,
        *,
        upstream_timeout: float,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self.db = db
        self.lease = lease
        self.upstream_timeout = upstream_timeout
        self.on_commit: Callable[[], None] = on_commit or (lambda: None)
        # One reaping pass at a time (the start's recovery and the ticks).
        self._reaping = DeferredLock()

    def reap_gone(self, *, unrecorded: bool = False) -> Deferred[list[Reaped]]:
        """One reaping pass (SCALE.md 2): every other instance that is
        registered open or owns a generation in flight is judged by its
        lease; each one found gone is reaped (its row marked, its
        ``SUBMITTING`` now ``UNKNOWN``, its ``RESERVED`` released, the
        evidence in ``instance_reap``).  A live instance's generations are
        never touched.  Two sites reaping at once are harmless: taking the
        gone instance's lock is what allows its reap, and only one session
        at a time can hold it.

        ``unrecorded``: also the generations no instance recorded (the
        start's recovery; the ticks leave them to it)."""
        return Deferred.fromCoroutine(self._reap_gone(unrecorded=unrecorded))

    async def _reap_gone(self, *, unrecorded: bool) -> list[Reaped]:
        lease = self.lease
        await self._reaping.acquire()
        try:
            me = lease.instance_id
            reaped: list[Reaped] = []
            for suspect in await self.db.read(instances.suspects, me, unrecorded=unrecorded):
                if suspect is None:
                    reaped.append(await self._reap(None, me))
                    continue
                if not await lease.judge(suspect):
                    continue  # alive, or being reaped by another site right now
                try:
                    if lease.shared and not await self._reapable(suspect):
                        # Gone, or only paused: not before its own clock must
                        # call its lease stale, so it can start nothing after
                        # its reap.  A later pass reaps it.
                        log.info(
                            "site instance {id} is gone; reaping it once its lease timeout "
                            "has passed",
                            id=suspect,
                        )
                        continue
                    # A paused instance may hold a transaction (and its row
                    # locks) open: end its sessions, or the reap would wait.
                    ended = await lease.end_sessions_of(suspect)
                    if ended:
                        log.warn(
                            "ended {n} database session(s) of gone site instance {id}",
                            n=ended,
                            id=suspect,
                        )
                    reaped.append(await self._reap(suspect, me))
                finally:
                    await lease.forget(suspect)
            return reaped
        finally:
            self._reaping.release()

    async def _reapable(self, suspect: int) -> bool:
        """A gone instance may be reaped once it can start nothing any more:
        its process is certainly dead (same kernel and pid namespace, pid
        gone, as the lease's probe of processes tells), or its last lease
        confirmation is a lease timeout old, so that, were it only paused,
        its own clock calls its lease stale."""
        row = await self.db.read(instances.instance, suspect)
        if row is not None and dead_here(row, self.lease.processes):
            return True
        return bool(await self.db.read(instances.surely_stale, suspect, self.lease.timeout))

    async def _reap(self, gone: int | None, me: int) -> Reaped:
        # A shared database: the gone instance may have been paused, not dead.
        wait = (self.lease.timeout, self.upstream_timeout) if self.lease.shared else None
        result = await self._write_reap(gone, me, wait)
        if result.marked or result.settled or result.nodes or result.claims:
            log.warn(
                "site instance {me} ({name}) reaped {whose}: {unknown} submission(s) now "
                "UNKNOWN {gids}, {released} reservation(s) released {released_gids}, "
                "node(s) {nodes} released, {claims} webhook claim(s) given back",
                me=me,
                name=self.lease.name,
                whose="generations of no instance"
                if gone is None
                else f"site instance {gone} ({result.who}; its lease is gone)",
                unknown=len(result.recovered.unknown),
                gids=result.recovered.unknown,
                released=len(result.recovered.released),
                released_gids=result.recovered.released,
                nodes=result.nodes,
                claims=result.claims,
            )
        return result

    async def _write_reap(
        self, gone: int | None, me: int, wait: tuple[float, float] | None
    ) -> Reaped:
        """The reap's transaction, written as the lifecycle writes: refused
        once the lease is lost, the outbox woken after its commit."""
        self.lease.refuse_if_lost()
        result = await self.db.write(reaping.reap, gone, me, verdict_wait=wait)
        try:
            self.on_commit()
        except Exception:
            log.failure("outbox wake-up failed (delivery resumes on its next poll)")
        return result
