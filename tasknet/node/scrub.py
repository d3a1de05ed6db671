"""The scrub: re-read every archive the node holds, and set aside a damaged one.

DELIVERY.md "Integrity": every held archive is re-read whole at least once
per ``--scrub-every`` and at most at ``--scrub-rate`` (serving and
downloading keep the disk).  An archive is due once half of ``every`` has
passed since it was last found whole (or written), so one due at the end of a
pass is still re-read in time; the archive scrubbed longest ago goes first.
An archive whose size on disk differs from the recorded one, or whose bytes
no longer hash to the recorded SHA-256, or that cannot be read (EIO), is
``NodeStore.set_aside``: forgotten (never served again), its file moved to
``corrupt/``, logged with its gid, operationId and why, and released
(``CORRUPT``; ``MISSING`` when its file is gone: the site learns it in the
next report).  At start every held archive's file is looked at (a stat, no
read): one missing or of another size than recorded is set aside at once.

Reads run on a one-thread pool, a chunk at a time; the pacing between chunks
is on the node's clock, so a test measures it with ``task.Clock``.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from tasknet.node.paths import DataDir
from tasknet.node.store import CORRUPT, MISSING, ArchiveRow, NodeStore
from tasknet.runtime import IThreadPools
from tasknet.units import parse_duration, parse_rate

log = Logger()

T = TypeVar("T")

DEFAULT_SCRUB_EVERY = 7 * 86400.0
DEFAULT_SCRUB_RATE = 50_000_000  # bytes per second (50MB/s)
#: Bytes read per thread call (and per pacing step).
SCRUB_CHUNK = 1024 * 1024
#: An archive is due once this fraction of ``every`` has passed since it was
#: last found whole: a pass that starts just before it is due still meets ``every``.
DUE_FRACTION = 0.5
#: Archives read from the store at a time.
BATCH = 100
#: Between two passes at least this long (an archive that could not be read
#: is tried again after it, not in a tight loop; less for a shorter ``every``),
#: at most ``MAX_SLEEP``.
MIN_PAUSE = 60.0
MAX_SLEEP = 3600.0
#: Pacing credit kept across an idle gap: no burst after a pause.
MAX_BURST_SECONDS = 1.0

#: The options' defaults as DELIVERY.md spells them (the --help shows these).
SCRUB_EVERY_OPTION = "7d"
SCRUB_RATE_OPTION = "50MB/s"

INTACT = "intact"
SET_ASIDE = "set_aside"
UNREADABLE = "unreadable"  # an error that may pass (not EIO): tried again later
STOPPED = "stopped"


def scrub_every_option(value: str | float) -> float:
    """``--scrub-every``: a duration (``7d``, ``12h``, seconds), positive.
    Already parsed (a number) is taken as is: twistd's defaults are strings."""
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    if not seconds > 0:
        raise ValueError(f"--scrub-every must be more than 0, got {value!r}")
    return seconds


def scrub_rate_option(value: str | int) -> int:
    """``--scrub-rate``: bytes per second (``50MB/s``, ``200MiB``), at least 1."""
    rate = parse_rate(value) if isinstance(value, str) else int(value)
    if rate < 1:
        raise ValueError(f"--scrub-rate must be at least 1 byte per second, got {value!r}")
    return rate


def _sizes_on_disk(paths: list[Path | None]) -> list[int | None | OSError]:
    """Each file's size; None when it is missing (or not a valid name); the
    error when it cannot be learnt now (logged by the caller, not here in
    the thread)."""
    sizes: list[int | None | OSError] = []
    for path in paths:
        try:
            sizes.append(None if path is None else path.stat().st_size)
        except FileNotFoundError:
            sizes.append(None)
        except OSError as exc:
            sizes.append(exc)
    return sizes


class _Reader:
    """One archive file open for the scrub (its methods run in the thread)."""

    def __init__(self, file: BinaryIO, size_on_disk: int) -> None:
        self.file = file
        self.size_on_disk = size_on_disk
        self.read = 0
        self.hash = hashlib.sha256()

    @classmethod
    def open(cls, path: Path) -> _Reader:
        file = open(path, "rb")  # noqa: SIM115 (closed by close(), on the thread)
        try:
            return cls(file, os.fstat(file.fileno()).st_size)
        except BaseException:
            file.close()
            raise

    def read_chunk(self, size: int) -> int:
        block = self.file.read(size)
        self.hash.update(block)
        self.read += len(block)
        return len(block)

    def close(self) -> None:
        self.file.close()


class _Pacer:
    """At most ``rate`` bytes per second of ``clock`` time, over a pass."""

    def __init__(self, clock: IReactorTime, rate: int) -> None:
        self.clock = clock
        self.rate = rate
        self.start: float | None = None
        self.done = 0

    def delay(self) -> float:
        """How long to wait before the next read."""
        now = self.clock.seconds()
        if self.start is None:
            self.start, self.done = now, 0
            return 0.0
        due = self.start + self.done / self.rate
        if due < now - MAX_BURST_SECONDS:  # idle meanwhile: start afresh
            self.start, self.done = now, 0
            return 0.0
        return max(0.0, due - now)

    def consumed(self, n: int) -> None:
        self.done += n


class Scrubber(Service):
    """Re-reads the held archives on ``clock`` (the node's); reads on a pool
    from ``threads``, their results back through ``reactor``."""

    name = "scrub"

    def __init__(
        self,
        store: NodeStore,
        data: DataDir,
        *,
        every: float = DEFAULT_SCRUB_EVERY,
        rate: int = DEFAULT_SCRUB_RATE,
        clock: IReactorTime,
        reactor: IReactorFromThreads,
        threads: IThreadPools,
        chunk: int = SCRUB_CHUNK,
    ) -> None:
        if every <= 0:
            raise ValueError(f"scrub every must be positive, got {every}")
        if rate < 1:
            raise ValueError(f"scrub rate must be at least 1 byte/s, got {rate}")
        self.store = store
        self.data = data
        self.every = every
        self.rate = rate
        self.chunk = max(1, min(chunk, rate))
        self.clock: IReactorTime = clock
        self._from_threads: IReactorFromThreads = reactor
        self._pool = threads.thread_pool(0, 1, "tasknet-scrub")
        self._pool_started = False
        self._pacer = _Pacer(clock, rate)
        self._stopping = False
        self._sleeping: Deferred[None] | None = None
        self._loop: Deferred[None] | None = None
        #: Totals since the start (logs, tests).
        self.scrubbed = 0
        self.set_aside = 0
        self.bytes_read = 0

    # service -----------------------------------------------------------------
    def startService(self) -> None:
        super().startService()
        self._stopping = False
        self._ensure_pool()
        self._loop = Deferred.fromCoroutine(self._run())
        self._loop.addErrback(lambda f: log.failure("the scrub stopped unexpectedly", f))

    def stopService(self) -> Deferred[None]:
        super().stopService()
        self._stopping = True
        if self._sleeping is not None:
            self._sleeping.cancel()
        loop, self._loop = self._loop, None
        done: Deferred[None] = loop if loop is not None else Deferred.fromCoroutine(_nothing())
        return done.addBoth(self._stop_pool)

    def _ensure_pool(self) -> None:
        if not self._pool_started:
            self._pool.start()
            self._pool_started = True

    def _stop_pool(self, _result: object) -> None:
        if self._pool_started:
            self._pool.stop()
            self._pool_started = False

    async def _run(self) -> None:
        try:
            await self.check_files()
        except Exception:
            log.failure("scrub: checking the archive files at start failed")
        while not self._stopping:
            try:
                next_due = await self.run_pass()
            except Exception:
                log.failure("scrub pass failed; trying again later")
                next_due = self.clock.seconds() + MIN_PAUSE
            if self._stopping:
                return
            shortest = min(MIN_PAUSE, self.every * DUE_FRACTION)
            pause = min(max(next_due - self.clock.seconds(), shortest), MAX_SLEEP)
            if not await self._sleep(pause):
                return

    async def _sleep(self, seconds: float) -> bool:
        """Wait on the clock; False when the service stopped meanwhile."""
        if self._stopping:
            return False
        self._sleeping = deferLater(self.clock, seconds, lambda: None)
        try:
            await self._sleeping
        except CancelledError:
            return False
        finally:
            self._sleeping = None
        return not self._stopping

    # passes ------------------------------------------------------------------
    async def check_files(self) -> int:
        """At start, without reading them: set aside every held archive whose
        file is missing or of another size than recorded (a crash, a disk
        swapped, a file an operator removed); the number set aside."""
        self._ensure_pool()
        rows = await self.store.archives()
        if not rows:
            return 0
        paths: list[Path | None] = []
        for row in rows:
            try:
                paths.append(self.data.archive_file(row))
            except ValueError:
                paths.append(None)
        sizes = await self._in_thread(_sizes_on_disk, paths)
        found = 0
        for row, size in zip(rows, sizes, strict=True):
            if isinstance(size, OSError):
                self._unreadable(row, size)
                continue
            if size == row.size:
                continue
            if size is None:
                await self._set_aside(row, "its file is missing", MISSING)
            else:
                await self._set_aside(
                    row, f"size on disk {size} differs from the recorded {row.size}"
                )
            found += 1
        return found

    def _last(self, row: ArchiveRow) -> float:
        return row.scrubbed_at if row.scrubbed_at is not None else row.completed_at

    async def run_pass(self) -> float:
        """Re-read every archive due now, longest unscrubbed first; return when
        the next one falls due (clock seconds)."""
        self._ensure_pool()
        started = self.clock.seconds()
        horizon = started - self.every * DUE_FRACTION
        tried: set[tuple[int, str]] = set()
        outcomes = {INTACT: 0, SET_ASIDE: 0, UNREADABLE: 0}
        read_before = self.bytes_read
        while not self._stopping:
            # The archives tried this pass that could not be read stay first
            # in the order: read past them.
            batch = await self.store.archives_to_scrub(BATCH + len(tried))
            due = [
                a
                for a in batch
                if self._last(a) <= horizon and (a.gid, a.operation_id) not in tried
            ]
            if not due:
                break
            for row in due:
                outcome = await self.scrub(row)
                if outcome == STOPPED:
                    return self.clock.seconds()
                outcomes[outcome] += 1
                tried.add((row.gid, row.operation_id))
        if sum(outcomes.values()):
            log.info(
                "scrub: {intact} archives whole, {set_aside} set aside, {unreadable} unreadable "
                "({size} bytes read in {seconds:.0f} s)",
                intact=outcomes[INTACT],
                set_aside=outcomes[SET_ASIDE],
                unreadable=outcomes[UNREADABLE],
                size=self.bytes_read - read_before,
                seconds=self.clock.seconds() - started,
            )
        if self.clock.seconds() - started > self.every * DUE_FRACTION:
            log.warn(
                "scrub: a pass took {seconds:.0f} s, over half of --scrub-every: "
                "raise --scrub-rate or --scrub-every",
                seconds=self.clock.seconds() - started,
            )
        return await self._next_due(tried)

    async def _next_due(self, tried: set[tuple[int, str]]) -> float:
        for row in await self.store.archives_to_scrub(len(tried) + 1):
            if (row.gid, row.operation_id) not in tried:
                return self._last(row) + self.every * DUE_FRACTION
        return self.clock.seconds() + self.every * DUE_FRACTION

    async def scrub(self, row: ArchiveRow) -> str:
        """Re-read one archive: ``intact`` (recorded as scrubbed now),
        ``set_aside``, ``unreadable`` (tried again later) or ``stopped``."""
        try:
            path = self.data.archive_file(row)
        except ValueError as exc:
            return await self._set_aside(row, str(exc))
        try:
            reader = await self._in_thread(_Reader.open, path)
        except FileNotFoundError:
            return await self._set_aside(row, "its file is missing", MISSING)
        except OSError as exc:
            return self._unreadable(row, exc)
        try:
            if reader.size_on_disk != row.size:
                return await self._set_aside(
                    row, f"size on disk {reader.size_on_disk} differs from the recorded {row.size}"
                )
            while True:
                delay = self._pacer.delay()
                if delay > 0 and not await self._sleep(delay):
                    return STOPPED
                if self._stopping:
                    return STOPPED
                n = await self._in_thread(reader.read_chunk, self.chunk)
                self._pacer.consumed(n)
                self.bytes_read += n
                if n == 0 or reader.read > row.size:
                    break
        except OSError as exc:
            if exc.errno == errno.EIO:
                return await self._set_aside(row, f"read error: {exc.strerror or exc}")
            return self._unreadable(row, exc)
        finally:
            await self._in_thread(reader.close)
        if reader.read != row.size:
            return await self._set_aside(
                row, f"{reader.read} bytes read, {row.size} recorded (changed while read)"
            )
        digest = reader.hash.hexdigest()
        if digest != row.sha256:
            return await self._set_aside(
                row, f"sha256 {digest} differs from the recorded {row.sha256}"
            )
        await self.store.mark_scrubbed(row.gid, row.operation_id, row.sha256)
        self.scrubbed += 1
        return INTACT

    async def _set_aside(self, row: ArchiveRow, why: str, reason: str = CORRUPT) -> str:
        await self.store.set_aside(row.gid, row.operation_id, f"scrub: {why}", reason=reason)
        self.set_aside += 1
        return SET_ASIDE

    def _unreadable(self, row: ArchiveRow, exc: OSError) -> str:
        log.error(
            "scrub: gid {gid}: archive {operation_id} cannot be read: {error}; trying again later",
            gid=row.gid,
            operation_id=row.operation_id,
            error=exc,
        )
        return UNREADABLE

    def _in_thread(self, fn: Callable[..., T], *args: Any) -> Deferred[T]:
        return deferToThreadPool(self._from_threads, self._pool, fn, *args)


async def _nothing() -> None:
    return None
