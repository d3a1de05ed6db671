"""The work of a task: download (status 1) → queued (2) → compressing (3) → done (4).

One job per gid runs the task's current generation.  Downloads are bounded by
a DeferredSemaphore (``--downloads``); compression runs on a dedicated
ThreadPool behind another semaphore (``--compressors``), so status 3 means
"a thread is compressing it now" and 2 means "waiting for a thread".

Every database write is conditional on the job's operationId, so a job of a
superseded generation can never overwrite the new one.  A failed attempt is
retried with exponential backoff; the bytes already downloaded are kept.  Disk
errors (full, read-only, permission) are logged at error level and stored in
the task's ``error`` column, and retried with backoff until an operator frees
the disk (the wire has no "failed" node status: see docs/protocol.md, "The legacy boundary").

With a ``space`` keeper (``tasknet.node.retention``), a download first asks
for room for its expected size and waits, reported ``queued`` with its reason
as the ``detail``, until it is given; its room is held until its job ends.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from treq.client import HTTPClient
from twisted.application.internet import backoffPolicy
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredSemaphore,
    gatherResults,
    succeed,
)
from twisted.internet.interfaces import IReactorFromThreads, IReactorTCP, IReactorTime
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from twisted.web.client import Agent

from tasknet.deferreds import shield
from tasknet.failures import plain_words
from tasknet.netclient import DirectEndpoints, quiet_pool
from tasknet.node.compress import BuiltArchive, CompressionAborted, build_archive
from tasknet.node.download import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    DownloadError,
    SizeLimit,
    StorageError,
    fetch,
    storage_error,
)
from tasknet.node.paths import DataDir
from tasknet.node.store import NodeStore, TaskRow
from tasknet.runtime import IThreadPools
from tasknet.status import NodeCode

log = Logger()

PROGRESS_WRITE_INTERVAL = 0.5  # seconds between progress writes of one task
BACKOFF_BASE = 0.1
BACKOFF_CAP = 30.0


def backoff(
    attempt: int,
    rng: random.Random,
    base: float = BACKOFF_BASE,
    cap: float = BACKOFF_CAP,
) -> float:
    """Twisted's backoffPolicy doubling from ``base`` up to ``cap``, scaled by
    a random 0.5-1 drawn from ``rng`` (the worker's, from its root) so that
    jobs failing together do not retry together."""
    policy = backoffPolicy(initialDelay=base, maxDelay=cap, factor=2.0, jitter=_no_jitter)
    return policy(attempt) * rng.uniform(0.5, 1.0)


def _no_jitter() -> float:
    return 0.0


class SpaceKeeper(Protocol):
    """What the worker asks of retention (``tasknet.node.retention.Retention``)."""

    def admit(
        self, gid: int, operation_id: str, need: int, *, on_wait: Callable[[], None]
    ) -> Deferred[None]: ...

    def done(self, gid: int) -> None: ...

    def why_waiting(self, need: int) -> str: ...


#: Characters never in an archive member's name: path separators and the
#: control characters (C0, DEL and C1).
_UNSAFE_NAME = re.compile(r"[/\\\x00-\x1f\x7f-\x9f]")
#: The longest member name kept, in UTF-8 bytes (a file name's usual limit).
MEMBER_NAME_MAX = 255


def member_name(task: TaskRow) -> str:
    """The file name inside the archive: the URL's last path segment,
    percent-decoded once, when that is a safe single file name (no ``/``,
    ``\\``, control character, not ``.`` or ``..``, at most 255 bytes);
    otherwise ``<gid>.bin``.  It is checked after decoding, so ``%2F`` or
    ``%00`` cannot bring a separator or a control character back."""
    segment = urlsplit(task.url).path.rsplit("/", 1)[-1]
    name = unquote(segment, errors="replace").strip()
    if (
        not name
        or name in (".", "..")
        or _UNSAFE_NAME.search(name)
        or len(name.encode("utf-8", "surrogatepass")) > MEMBER_NAME_MAX
    ):
        return f"{task.gid}.bin"
    return name


def retry_detail(delay: float, error: Exception) -> str:
    """What a report says of a failed attempt: ``retrying in 8 s: WHY``."""
    # A network or disk failure in words (issue 36, item 9), the rest as it says.
    return f"retrying in {round(delay, 1):g} s: {plain_words(error) or error}"


class _Job:
    def __init__(self, gid: int, operation_id: str) -> None:
        self.gid = gid
        self.operation_id = operation_id
        self.abort = threading.Event()
        self.thread: Deferred[Any] | None = None
        self.deferred: Deferred[None] | None = None
        self.ended: list[Deferred[None]] = []
        self.last_write = -PROGRESS_WRITE_INTERVAL  # the first tick is written
        self.writing = False
        #: Bytes on disk at the last progress tick of this attempt (None: none yet).
        self.received: int | None = None

    def when_ended(self) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self.ended.append(d)
        return d


class Worker:
    """Runs the jobs; ``on_change`` is called after every status/progress write."""

    def __init__(
        self,
        store: NodeStore,
        data: DataDir,
        on_change: Callable[[], None],
        *,
        downloads: int = 4,
        compressors: int = 1,
        clock: IReactorTime,
        idle_timeout: float = 30.0,
        max_archive_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
        threads: IThreadPools,
        rng: random.Random,
        space: SpaceKeeper | None = None,
    ) -> None:
        """``clock``: the reactor its timers and HTTP connections run on
        (``IReactorTime``, ``IReactorTCP`` and ``IReactorFromThreads``);
        ``threads``: where its compression pool comes from; ``rng``: the
        jitter of its retries.  All three are its caller's (the node's
        root, the tests, ``bench/nodeworker.py``'s entry point)."""
        self.store = store
        #: The bound of a download whose size the site did not give.
        self.max_archive_bytes = max_archive_bytes
        self.data = data
        self.on_change = on_change
        self.clock: IReactorTime = clock
        # A compression's result comes back through the reactor's callFromThread.
        self._from_threads: IReactorFromThreads = IReactorFromThreads(clock)
        self.idle_timeout = idle_timeout
        self._downloads = DeferredSemaphore(downloads)
        self._compressors = DeferredSemaphore(compressors)
        self._rng = rng
        #: Room for downloads (retention), None: not asked.
        self.space = space
        self._threads: ThreadPool = threads.thread_pool(0, compressors, "tasknet-compress")
        # Quiet (no factory start/stop lines), and an IP literal dialled
        # straight, never through the resolver thread (tasknet.netclient);
        # its connections are the clock's TCP (the same object, timers too).
        tcp: IReactorTCP = IReactorTCP(clock)
        self._http_pool = quiet_pool(tcp, persistent=False)
        agent: Any = Agent.usingEndpointFactory(tcp, DirectEndpoints(tcp), pool=self._http_pool)
        self._client = HTTPClient(agent)
        self._jobs: dict[int, _Job] = {}
        #: Gids whose job waits for a download slot.
        self._waiting: set[int] = set()
        self._running = False
        #: Bytes received from the upstream since the start (node metrics).
        self.bytes_downloaded = 0

    # lifecycle --------------------------------------------------------------
    def start(self) -> None:
        self._threads.start()
        self._running = True

    async def stop(self) -> None:
        """Cancel every job (their ``.part`` files stay for the next start)."""
        self._running = False
        await gatherResults([self.cancel(gid) for gid in list(self._jobs)])
        self._threads.stop()

    async def resume_all(self) -> None:
        for task in await self.store.tasks():
            if task.status != NodeCode.COMPLETED:
                self.run(task.gid, task.operation_id)

    # jobs ---------------------------------------------------------------------
    def active(self) -> dict[int, str]:
        return {gid: job.operation_id for gid, job in self._jobs.items()}

    def downloading(self) -> int:
        """Downloads running now (holding a download slot)."""
        return self._downloads.limit - self._downloads.tokens

    def queued(self) -> tuple[int, int]:
        """Jobs waiting for a download slot, and for a compression slot."""
        return len(self._downloads.waiting), len(self._compressors.waiting)

    def waiting(self) -> frozenset[int]:
        """The gids whose job waits for a download slot (reports: ``queued``)."""
        return frozenset(self._waiting)

    def run(self, gid: int, operation_id: str) -> None:
        """Start the job of ``(gid, operation_id)`` unless it already runs."""
        if not self._running:
            return
        current = self._jobs.get(gid)
        if current is not None:
            if current.operation_id == operation_id:
                return
            raise RuntimeError(f"gid {gid}: cancel generation {current.operation_id} first")
        job = _Job(gid, operation_id)
        self._jobs[gid] = job
        job.deferred = Deferred.fromCoroutine(self._run(job))
        job.deferred.addErrback(self._job_failed, job)
        job.deferred.addBoth(self._job_ended, job)

    def cancel(self, gid: int) -> Deferred[None]:
        """Stop the job of ``gid``; fires once nothing of it runs any more."""
        job = self._jobs.get(gid)
        if job is None:
            return succeed(None)
        job.abort.set()
        waits = [job.when_ended()]
        if job.thread is not None:
            waits.append(job.thread)
        assert job.deferred is not None
        job.deferred.cancel()
        return gatherResults(waits).addCallback(lambda _: None)

    def _job_failed(self, failure: Failure, job: _Job) -> None:
        if failure.check(CancelledError) or job.abort.is_set():
            return None
        log.failure("gid {gid}: job failed unexpectedly", failure, gid=job.gid)
        return None

    def _job_ended(self, _result: Any, job: _Job) -> None:
        if self._jobs.get(job.gid) is job:
            del self._jobs[job.gid]
            if self.space is not None:
                self.space.done(job.gid)
        for d in job.ended:
            d.callback(None)
        job.ended.clear()

    async def _run(self, job: _Job) -> None:
        while not job.abort.is_set():
            task = await self.store.get_task(job.gid)
            if task is None or task.operation_id != job.operation_id:
                return  # deleted or superseded meanwhile
            if task.status == NodeCode.DOWNLOADING:
                await self._download(job, task)
            elif task.status in (NodeCode.WAITING_COMPRESSION, NodeCode.COMPRESSING):
                await self._compress(job, task)
            else:
                return

    # download -------------------------------------------------------------------
    async def _download(self, job: _Job, task: TaskRow) -> None:
        await self._wait_for_space(job, task)
        await self._acquire_download_slot(job)
        try:
            part = self.data.part_path(task.gid, task.operation_id)
            limit = SizeLimit(task.expected_size, self.max_archive_bytes)
            attempt = 0
            while True:
                before = part.stat().st_size if part.exists() else 0
                job.received = None  # a resumed attempt starts at what is on disk
                try:
                    await fetch(
                        self._client,
                        task.url,
                        part,
                        self.clock,
                        lambda n, total: self._progress(job, n, total),
                        idle_timeout=self.idle_timeout,
                        limit=limit,
                    )
                    break
                except CancelledError:
                    raise
                except Exception as exc:
                    if job.abort.is_set():
                        # Cancelled (a delete, the node stopping): what the
                        # cancel made of the connection is no failed attempt.
                        raise CancelledError() from exc
                    if not isinstance(exc, DownloadError):
                        log.failure("gid {gid}: unexpected download error", gid=job.gid)
                    after = part.stat().st_size if part.exists() else 0
                    attempt = 0 if after > before else attempt + 1
                    delay = backoff(attempt, self._rng)
                    await self._report_error(job, exc, delay)
                    await deferLater(self.clock, delay, lambda: None)
        finally:
            self._downloads.release()
        if await self.store.set_status(
            job.gid, job.operation_id, NodeCode.WAITING_COMPRESSION, 1.0
        ):
            log.info("gid {gid}: downloaded, queued for compression", gid=job.gid)
            self.on_change()

    async def _wait_for_space(self, job: _Job, task: TaskRow) -> None:
        """Room for the archive (its size from the command, else what the
        upstream said); queued, with the reason as its detail, until given."""
        if self.space is None:
            return
        space = self.space
        need = task.expected_size or task.size or 0
        waited = False

        def queued() -> None:
            nonlocal waited
            waited = True
            self._waiting.add(job.gid)
            why = space.why_waiting(need)
            log.warn("gid {gid}: {why}", gid=job.gid, why=why)
            written = self.store.set_error(job.gid, job.operation_id, why)
            written.addCallbacks(
                lambda _: self.on_change(),
                lambda f: log.failure("gid {gid}: noting the wait failed", f, gid=job.gid),
            )

        try:
            await space.admit(job.gid, job.operation_id, need, on_wait=queued)
        finally:
            if waited:
                self._waiting.discard(job.gid)
        if waited and await self.store.set_error(job.gid, job.operation_id, None):
            self.on_change()

    async def _acquire_download_slot(self, job: _Job) -> None:
        acquiring = self._downloads.acquire()
        if acquiring.called:
            await acquiring
            return
        # Queued behind the other downloads: reports say so until a slot frees.
        self._waiting.add(job.gid)
        self.on_change()
        try:
            await acquiring
        finally:
            self._waiting.discard(job.gid)
        self.on_change()

    def _progress(self, job: _Job, received: int, total: int | None) -> None:
        if job.received is not None and received > job.received:
            self.bytes_downloaded += received - job.received
        job.received = received
        # Throttled: a progress tick is worth a write at most every 0.5 s.
        now = self.clock.seconds()
        if job.writing or now - job.last_write < PROGRESS_WRITE_INTERVAL:
            return
        job.last_write = now
        job.writing = True
        progress = min(received / total, 1.0) if total else 0.0

        def written(changed: bool) -> None:
            job.writing = False
            if changed:
                self.on_change()

        def failed(failure: Failure) -> None:
            job.writing = False
            log.failure("gid {gid}: progress write failed", failure, gid=job.gid)

        self.store.set_progress(job.gid, job.operation_id, progress, total).addCallbacks(
            written, failed
        )

    async def _report_error(self, job: _Job, exc: Exception, delay: float) -> None:
        """Log a failed attempt and keep its reason as the task's ``detail``."""
        detail = retry_detail(delay, exc)
        if isinstance(exc, StorageError):
            log.error("gid {gid}: storage error: {detail}", gid=job.gid, detail=detail)
        else:
            log.warn("gid {gid}: attempt failed: {detail}", gid=job.gid, detail=detail)
        if await self.store.set_error(job.gid, job.operation_id, detail):
            self.on_change()

    # compression ------------------------------------------------------------------
    async def _compress(self, job: _Job, task: TaskRow) -> None:
        part = self.data.part_path(task.gid, task.operation_id)
        if not part.exists():
            log.warn("gid {gid}: downloaded file missing, downloading again", gid=task.gid)
            await self.store.set_status(job.gid, job.operation_id, NodeCode.DOWNLOADING, 0.0)
            return
        await self._compressors.acquire()
        try:
            if not await self.store.set_status(
                job.gid, job.operation_id, NodeCode.COMPRESSING, 1.0
            ):
                return
            self.on_change()
            final = self.data.archive_path(task.gid, task.operation_id)
            attempt = 0
            while True:
                job.thread = deferToThreadPool(
                    self._from_threads,
                    self._threads,
                    build_archive,
                    part,
                    self.data.archive_tmp_path(task.gid, task.operation_id),
                    final,
                    member_name(task),
                    job.abort,
                    self.clock.seconds(),
                )
                try:
                    # Cancelling the job must not forget the thread: cancel()
                    # waits on the thread itself before removing files.
                    built: BuiltArchive = await shield(job.thread, expected=(CompressionAborted,))
                    break
                except OSError as exc:
                    error: Exception = storage_error(exc, final) or DownloadError(
                        f"compress: {exc}"
                    )
                    attempt += 1
                    delay = backoff(attempt, self._rng, base=1.0)
                    await self._report_error(job, error, delay)
                    await deferLater(self.clock, delay, lambda: None)
                finally:
                    job.thread = None
        finally:
            self._compressors.release()
        if await self.store.complete(
            job.gid, job.operation_id, final.name, size=built.size, sha256=built.sha256
        ):
            part.unlink(missing_ok=True)
            log.info(
                "gid {gid}: archive ready: {archive} ({size} bytes, sha256 {sha256})",
                gid=job.gid,
                archive=str(final),
                size=built.size,
                sha256=built.sha256,
            )
            self.on_change()
