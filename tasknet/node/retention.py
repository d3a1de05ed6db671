"""Retention: which archives the node keeps, and room for the downloads to come.

DELIVERY.md "Custody" (issue 34).  Three options bound what the node holds:

- ``--keep-days N`` (default 30; 0 = for ever): an archive not served for N
  days (never served: N days after it completed) is removed and released
  ``EXPIRED``.
- ``--disk-budget SIZE`` (default none): the archives held, plus the
  downloads admitted and not yet complete (at their expected size), stay
  within SIZE.
- ``--min-free SIZE`` (default 1GiB): the data directory's disk keeps SIZE
  free, counting what the admitted downloads still have to write.

Past the budget or below the free space the archive served longest ago
(never served: completed longest ago) goes first, released ``DISK_BUDGET``.
The job runs on the node's clock every :data:`RETENTION_EVERY` seconds, and
when a download asks for room (:meth:`Retention.admit`): a download that
would break the budget or the free space waits for it instead of failing.
What retention may remove is removed; if that is not enough the download
waits (its report entry says ``queued`` while nothing was received, and its
``detail`` says why) and is admitted, first come first served, once space
frees: an archive removed or deleted, a download done, or anything else on
the disk freed (looked at every :data:`SPACE_RECHECK` seconds while one
waits).  A download whose size is unknown (no ``size`` in its command, and
the upstream has not said) asks for nothing more than the bounds as they are.

Never removed by retention: an archive whose completion the site has not
ACKed yet (the site would not know it completed), and an archive being sent
right now by ``--serve`` (``busy``): the transfer would keep the disk space
until it ends anyway, and cutting a user's download short helps nobody; it
is looked at again at the next run.

Each removal is one store transaction that forgets the archive and records
its release (``NodeStore.release_archive``), then its file goes.  Free space
is ``shutil.disk_usage`` of ``--data`` unless the root hands another
``disk_usage`` (the tests do).
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from tasknet.node.paths import DataDir
from tasknet.node.store import DISK_BUDGET, EXPIRED, ArchiveRow, NodeStore
from tasknet.units import parse_size

log = Logger()

DEFAULT_KEEP_DAYS = 30
DEFAULT_MIN_FREE = 1024**3
#: The options' defaults as --help shows them.
MIN_FREE_OPTION = "1GiB"
#: Seconds between two runs of the job.
RETENTION_EVERY = 60.0
#: Seconds between two looks at the disk while a download waits for room.
SPACE_RECHECK = 10.0
#: Archives read from the store at a time when choosing what to remove.
BATCH = 200

#: ``shutil.disk_usage``'s shape: anything with a ``free`` (bytes).
DiskUsage = Callable[[str], Any]


def keep_days_option(value: str | int) -> int:
    """``--keep-days``: a whole number of days, 0 (for ever) or more."""
    try:
        days = int(value)
    except ValueError:
        raise ValueError(f"--keep-days must be a whole number of days, got {value!r}") from None
    if days < 0:
        raise ValueError(f"--keep-days must be 0 (for ever) or more, got {value!r}")
    return days


def size_option(option: str) -> Callable[[str | int], int]:
    """A parser of ``--OPTION SIZE`` (``500GB``, ``1GiB``, bytes), at least 0."""

    def parse(value: str | int) -> int:
        try:
            return parse_size(value) if isinstance(value, str) else int(value)
        except ValueError as exc:
            raise ValueError(f"--{option}: {exc}") from None

    return parse


@dataclass(frozen=True)
class DiskFigures:
    """What ``/healthz`` and the metrics show: the archives held (count and
    bytes), the disk's free bytes (None: unknown), the budget (None: none)."""

    archives: int
    archive_bytes: int
    free: int | None
    budget: int | None


@dataclass
class _Admitted:
    operation_id: str
    need: int


@dataclass
class _Waiter:
    gid: int
    operation_id: str
    need: int
    admitted: Deferred[None]


class Retention(Service):
    """The retention job and the room for downloads (see the module's text).
    ``busy()`` gives the archives being served now; ``on_release()`` is
    called after archives were released (the reporter's ``changed``)."""

    name = "retention"

    def __init__(
        self,
        store: NodeStore,
        data: DataDir,
        *,
        clock: IReactorTime,
        keep_days: int = DEFAULT_KEEP_DAYS,
        disk_budget: int | None = None,
        min_free: int = DEFAULT_MIN_FREE,
        disk_usage: DiskUsage = shutil.disk_usage,
        busy: Callable[[], Collection[tuple[int, str]]] = frozenset,
        on_release: Callable[[], None] = lambda: None,
        every: float = RETENTION_EVERY,
    ) -> None:
        if keep_days < 0:
            raise ValueError(f"keep_days must be 0 or more, got {keep_days}")
        if disk_budget is not None and disk_budget < 0:
            raise ValueError(f"disk_budget must be 0 or more, got {disk_budget}")
        if min_free < 0:
            raise ValueError(f"min_free must be 0 or more, got {min_free}")
        self.store = store
        self.data = data
        self.clock: IReactorTime = clock
        self.keep_days = keep_days
        self.disk_budget = disk_budget
        self.min_free = min_free
        self.disk_usage = disk_usage
        self.busy = busy
        self.on_release = on_release
        self.every = every
        self._lock = DeferredLock()
        self._admitted: dict[int, _Admitted] = {}
        self._waiters: list[_Waiter] = []
        self._timer: IDelayedCall | None = None
        self._held = (0, 0)
        self._free: int | None = None
        #: The bounds are broken and retention cannot mend them (warned once).
        self._stuck = False
        #: Archives released by retention since the start, by reason.
        self.released: Counter[str] = Counter()

    # service ---------------------------------------------------------------------
    def startService(self) -> None:
        super().startService()
        self._schedule(0)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        self._cancel_timer()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.admitted.cancel()
        return self._lock.run(lambda: None)

    def _schedule(self, delay: float) -> None:
        if not self.running:
            return
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= self.clock.seconds() + delay:
                return
            self._timer.cancel()
        self._timer = self.clock.callLater(delay, self._tick)

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _tick(self) -> None:
        self._timer = None
        d = self.run()
        d.addErrback(lambda f: log.failure("retention: the run failed; trying again later", f))
        d.addBoth(lambda _: self._schedule(SPACE_RECHECK if self._waiters else self.every))

    def poke(self) -> None:
        """Something freed space (a delete, a cancel): look again soon."""
        self._schedule(0)

    # figures -----------------------------------------------------------------------
    def figures(self) -> DiskFigures:
        """As of the last run or admission."""
        count, size = self._held
        return DiskFigures(count, size, self._free, self.disk_budget)

    def waiting(self) -> frozenset[int]:
        """The gids whose download waits for room."""
        return frozenset(w.gid for w in self._waiters)

    # the job -------------------------------------------------------------------------
    def run(self) -> Deferred[None]:
        """Remove what expired, keep the bounds, admit the downloads that fit."""
        return self._lock.run(lambda: Deferred.fromCoroutine(self._run()))

    async def _run(self) -> None:
        released: Counter[str] = Counter()
        if self.keep_days > 0:
            await self._expire(released)
        await self._make_room(0, released)
        # First come, first served; one that can never fit the budget lets
        # the others pass.
        for waiter in list(self._waiters):
            part = self._part(waiter.gid, waiter.operation_id)
            if not await self._make_room(waiter.need, released, part):
                if self.disk_budget is not None and waiter.need > self.disk_budget:
                    continue
                break
            if waiter in self._waiters and not waiter.admitted.called:
                self._waiters.remove(waiter)
                self._admitted[waiter.gid] = _Admitted(waiter.operation_id, waiter.need)
                waiter.admitted.callback(None)
        await self._measure()
        self._released(released)

    def admit(
        self,
        gid: int,
        operation_id: str,
        need: int,
        *,
        on_wait: Callable[[], None] = lambda: None,
    ) -> Deferred[None]:
        """Room for the download of ``(gid, operation_id)``, ``need`` bytes
        (0: unknown): fires once admitted (as soon as it fits, after
        removing what retention may); ``on_wait()`` is called if it has to
        wait for space first.  Cancel it to give up."""
        self.done(gid)

        def cancel(d: Deferred[None]) -> None:
            self._waiters[:] = [w for w in self._waiters if w.admitted is not d]

        admitted: Deferred[None] = Deferred(cancel)
        waiter = _Waiter(gid, operation_id, max(need, 0), admitted)

        async def attempt() -> None:
            if admitted.called:  # cancelled before its turn
                return
            released: Counter[str] = Counter()
            part = self._part(gid, operation_id)
            fits = not self._waiters and await self._make_room(waiter.need, released, part)
            if admitted.called:
                pass
            elif fits:
                self._admitted[gid] = _Admitted(operation_id, waiter.need)
                admitted.callback(None)
            else:
                self._waiters.append(waiter)
                self._schedule(SPACE_RECHECK)
                on_wait()
            await self._measure()
            self._released(released)

        tried = self._lock.run(lambda: Deferred.fromCoroutine(attempt()))
        tried.addErrback(lambda f: log.failure("retention: admitting gid {gid}", f, gid=gid))
        return admitted

    def done(self, gid: int) -> None:
        """The download of ``gid`` ended (complete, cancelled, stopped): its
        room is no longer reserved; look again (its archive now counts)."""
        if self._admitted.pop(gid, None) is not None:
            self.poke()

    def why_waiting(self, need: int) -> str:
        """What a waiting download's report says."""
        bounds = []
        if self.disk_budget is not None:
            bounds.append(f"--disk-budget {self.disk_budget}")
        bounds.append(f"--min-free {self.min_free}")
        needs = f"{need} bytes" if need else "an unknown size"
        return f"waiting for disk space: needs {needs} within {' and '.join(bounds)}"

    # removing -----------------------------------------------------------------------
    async def _expire(self, released: Counter[str]) -> None:
        cutoff = self.clock.seconds() - self.keep_days * 86400.0
        busy = set(self.busy())
        skipped: set[tuple[int, str]] = set()
        while True:
            # In order of last use: the skipped ones come first again.
            batch = await self.store.eviction_candidates(BATCH + len(skipped))
            due = [
                a for a in batch if (a.gid, a.operation_id) not in skipped and _last_use(a) < cutoff
            ]
            if not due:
                return
            for row in due:
                key = (row.gid, row.operation_id)
                if key in busy or not await self._remove(row, EXPIRED):
                    skipped.add(key)
                    continue
                released[EXPIRED] += 1

    async def _make_room(self, need: int, released: Counter[str], part: int = 0) -> bool:
        """Remove archives, served longest ago first, until ``need`` more
        bytes (``part`` of them already on disk) fit both bounds; whether
        they fit.  Nothing is removed unless removing enough would make them
        fit: archives are never thrown away for room that cannot be had."""
        short = await self._shortfall(need, part)
        if short <= 0:
            return True
        plan = await self._plan(short)
        if plan is None:
            if need == 0 and not self._stuck:
                log.warn(
                    "retention: {short} bytes over --disk-budget or under --min-free, and the"
                    " archives it may remove do not cover them: nothing removed",
                    short=short,
                )
            self._stuck = need == 0 or self._stuck
            return False
        self._stuck = False
        for row in plan:
            if await self._remove(row, DISK_BUDGET):
                released[DISK_BUDGET] += 1
        # What was removed is gone from the disk now: measure, not guess.
        return await self._shortfall(need, part) <= 0

    async def _plan(self, short: int) -> list[ArchiveRow] | None:
        """The archives to remove, served longest ago first, whose bytes
        cover ``short``; None when all retention may remove would not."""
        busy = set(self.busy())
        plan: list[ArchiveRow] = []
        covered = 0
        offset = 0
        while covered < short:
            batch = await self.store.eviction_candidates(BATCH, offset=offset)
            if not batch:
                return None
            offset += len(batch)
            for row in batch:
                if (row.gid, row.operation_id) in busy:
                    continue
                plan.append(row)
                covered += row.size
                if covered >= short:
                    break
        return plan

    async def _remove(self, row: ArchiveRow, reason: str) -> bool:
        forgotten = await self.store.release_archive(row.gid, row.operation_id, reason)
        if forgotten is None:
            return False
        try:
            self.data.archive_file(forgotten).unlink(missing_ok=True)
        except (OSError, ValueError) as exc:
            log.error(
                "retention: gid {gid}: archive {operation_id} released but its file stays: {error}",
                gid=row.gid,
                operation_id=row.operation_id,
                error=exc,
            )
        log.info(
            "retention: gid {gid}: archive {operation_id} ({size} bytes) removed: {reason}",
            gid=row.gid,
            operation_id=row.operation_id,
            size=row.size,
            reason=reason,
        )
        return True

    async def _shortfall(self, need: int, part: int = 0) -> int:
        """Bytes to free before ``need`` more fit, ``part`` of them already
        written (0 or less: they fit)."""
        await self._measure()
        _count, held = self._held
        short = 0
        if self.disk_budget is not None:
            reserved = sum(a.need for a in self._admitted.values())
            short = held + reserved + need - self.disk_budget
        if self._free is not None:
            to_write = self._to_write() + max(need - part, 0)
            short = max(short, self.min_free - (self._free - to_write))
        return short

    def _to_write(self) -> int:
        """What the admitted downloads still have to write (their expected
        size less their partial file)."""
        return sum(
            max(a.need - self._part(gid, a.operation_id), 0) for gid, a in self._admitted.items()
        )

    def _part(self, gid: int, operation_id: str) -> int:
        try:
            return self.data.part_path(gid, operation_id).stat().st_size
        except OSError:
            return 0

    async def _measure(self) -> None:
        self._held = await self.store.archive_totals()
        try:
            self._free = int(self.disk_usage(str(self.data.root)).free)
        except OSError as exc:
            log.error(
                "retention: cannot read the free space of {data}: {error}",
                data=str(self.data.root),
                error=exc,
            )
            self._free = None

    def _released(self, released: Counter[str]) -> None:
        if not released:
            return
        self.released.update(released)
        log.info(
            "retention: released {count} archives ({reasons})",
            count=sum(released.values()),
            reasons=", ".join(f"{k} {v}" for k, v in sorted(released.items())),
        )
        self.on_release()


def _last_use(row: ArchiveRow) -> float:
    return row.served_at if row.served_at is not None else row.completed_at
