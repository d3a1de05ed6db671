"""Applying the site's commands: DOWNLOAD and DELETE on either wire, CANCEL on v2.

A command is recorded (``received_command``) and its effect persisted before
any work starts.  Commands for one gid are applied one at a time (a per-gid
lock), so a DELETE never races the DOWNLOAD before it.

- DOWNLOAD, same operationId again: nothing happens (re-dispatch is a no-op).
- DOWNLOAD, new operationId for a held gid: a new generation; the old job is
  stopped and its files removed before the new one starts.
- DELETE: the job is stopped, every file of the gid removed, and the result
  (``DELETED``, ``NOT_FOUND`` when the node held nothing, or ``FAILED`` with
  the reason) recorded under the delete operation id.  Repeating a delete that
  succeeded changes nothing; repeating a failed one tries again.
- CANCEL (v2 only, PROTOCOL.md "Archives (v2)"): that generation's job is
  stopped if it runs, its files (partial and archive) removed, and it is
  released ``CANCELLED``; a CANCEL for a generation the node does not hold is
  released at once, so the site's record settles.  Repeating it is safe, and
  it never touches another generation of the gid.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from tasknet.node.paths import DataDir
from tasknet.node.store import DELETED, FAILED, LEGACY_DELETE_ID, NOT_FOUND, NodeStore
from tasknet.node.worker import Worker
from tasknet.protocol.messages import (
    ACTION_CANCEL,
    ACTION_DELETE,
    ACTION_DOWNLOAD,
    DeleteGallery,
    DownloadPost,
    Message,
    TaskCommand,
)
from tasknet.runtime import IEntropy
from tasknet.status import NodeCode

log = Logger()


class BadCommand(ValueError):
    """A command the node refuses; nothing was recorded."""


def remove_files(data: DataDir, gid: int) -> tuple[bool, str]:
    """Remove every file of ``gid``; return (anything was there, failure reason)."""
    found = False
    for path in data.files_of(gid):
        found = True
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            return found, f"cannot remove {path.name}: {exc.strerror or exc} (errno {exc.errno})"
    return found, ""


def _check_download(gid: int, url: str) -> None:
    if gid <= 0:
        raise BadCommand(f"gid must be positive, got {gid}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unbalanced [ in the host
        raise BadCommand(f"gid {gid}: url cannot be parsed: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise BadCommand(f"gid {gid}: url must be http(s)://host/..., got {url[:200]!r}")


#: Repeated DOWNLOADs within this many seconds of the first are one log line.
REPEATED_SUMMARY_DELAY = 1.0
#: How many of their gids that line names.
REPEATED_GIDS_SHOWN = 10


class CommandHandler:
    def __init__(
        self,
        store: NodeStore,
        data: DataDir,
        worker: Worker,
        on_change: Callable[[], None],
        *,
        entropy: IEntropy,
        clock: IReactorTime | None = None,
    ) -> None:
        self.store = store
        #: Repeated DOWNLOADs are logged as one line per burst, on this clock
        #: (None: each at once, as a test without a clock wants).
        self.clock = clock
        self._repeated: list[int] = []
        self._repeated_summary: IDelayedCall | None = None
        #: The ids of legacy downloads (which carry no operationId) come from it.
        self.entropy = entropy
        self.data = data
        self.worker = worker
        self.on_change = on_change
        self._locks: dict[int, DeferredLock] = {}

    def handle(self, message: Message) -> Deferred[None] | None:
        """Apply a command; ``None`` when ``message`` is not a command."""
        if isinstance(message, TaskCommand):
            if message.action == ACTION_DOWNLOAD:
                _check_download(message.gid, message.url)
                return self._serialised(
                    message.gid,
                    self._download,
                    message.gid,
                    message.operation_id,
                    message.name,
                    message.url,
                    2,
                    message.size,
                )
            if message.action == ACTION_DELETE:
                return self._serialised(
                    message.gid, self._delete, message.gid, message.operation_id, 2
                )
            if message.action == ACTION_CANCEL:
                if message.gid <= 0:
                    raise BadCommand(f"gid must be positive, got {message.gid}")
                return self._serialised(
                    message.gid, self._cancel, message.gid, message.operation_id
                )
            raise BadCommand(f"unknown action {message.action!r}")
        if isinstance(message, DownloadPost):
            _check_download(message.gid, message.url)
            return self._serialised(
                message.gid, self._download, message.gid, None, message.name, message.url, 1, 0
            )
        if isinstance(message, DeleteGallery):
            return self._serialised(message.gid, self._delete, message.gid, LEGACY_DELETE_ID, 1)
        return None

    def _repeated_download(self, gid: int, operation_id: str) -> None:
        """A DOWNLOAD of an operation already held: nothing to do.  A site
        sends every held task again when a node reconnects, so these come
        by the thousand: one summary line per burst, not one per gid."""
        if self.clock is None:
            log.info(
                "gid {gid}: DOWNLOAD {operation_id} again: nothing to do",
                gid=gid,
                operation_id=operation_id,
            )
            return
        self._repeated.append(gid)
        if self._repeated_summary is None or not self._repeated_summary.active():
            self._repeated_summary = self.clock.callLater(
                REPEATED_SUMMARY_DELAY, self._log_repeated
            )

    def _log_repeated(self) -> None:
        gids, self._repeated = self._repeated, []
        if not gids:
            return
        shown = ", ".join(str(gid) for gid in gids[:REPEATED_GIDS_SHOWN])
        more = len(gids) - REPEATED_GIDS_SHOWN
        log.info(
            "DOWNLOAD again for {count} task(s) already held: nothing to do (gids {gids}{more})",
            count=len(gids),
            gids=shown,
            more=f" and {more} more" if more > 0 else "",
        )

    def stop(self) -> None:
        """Log what :meth:`_repeated_download` still holds (the node stops)."""
        if self._repeated_summary is not None and self._repeated_summary.active():
            self._repeated_summary.cancel()
        self._repeated_summary = None
        self._log_repeated()

    def _serialised(self, gid: int, fn, *args) -> Deferred[None]:  # type: ignore[no-untyped-def]
        lock = self._locks.setdefault(gid, DeferredLock())

        def release(result: object) -> object:
            if not lock.locked and not lock.waiting:
                self._locks.pop(gid, None)
            return result

        d = lock.run(lambda: Deferred.fromCoroutine(fn(*args)))
        return d.addBoth(release)

    async def _download(
        self, gid: int, operation_id: str | None, name: str, url: str, protocol: int, size: int
    ) -> None:
        # size 0 (unknown, or a legacy DownloadPost): --max-archive-bytes bounds it.
        accepted = await self.store.accept_download(
            gid,
            operation_id,
            name,
            url,
            protocol,
            legacy_operation_id=f"legacy-{self.entropy.uuid4().hex}",
            size=size,
        )
        if accepted.kind == "duplicate":
            self._repeated_download(gid, accepted.operation_id)
            return
        if accepted.kind == "new_generation":
            log.info(
                "gid {gid}: new generation {operation_id} replaces {old}",
                gid=gid,
                operation_id=accepted.operation_id,
                old=accepted.old_operation_id,
            )
            await self.worker.cancel(gid)
            _found, failure = remove_files(self.data, gid)
            if failure:
                log.error("gid {gid}: old generation's files: {failure}", gid=gid, failure=failure)
        else:
            log.info(
                "gid {gid}: DOWNLOAD {operation_id} accepted",
                gid=gid,
                operation_id=accepted.operation_id,
            )
        self.on_change()
        self.worker.run(gid, accepted.operation_id)

    async def _cancel(self, gid: int, operation_id: str) -> None:
        # Only that generation's job: a newer one of the gid keeps running.
        if self.worker.active().get(gid) == operation_id:
            await self.worker.cancel(gid)
        # Forgotten (never served again) before its files go.
        cancelled = await self.store.cancel(gid, operation_id)
        failures = []
        for path in (
            self.data.part_path(gid, operation_id),
            self.data.archive_tmp_path(gid, operation_id),
            self.data.archive_path(gid, operation_id),
        ):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                failures.append(f"cannot remove {path.name}: {exc.strerror or exc}")
        if failures:
            log.error(
                "gid {gid}: CANCEL {operation_id}: {failures}",
                gid=gid,
                operation_id=operation_id,
                failures="; ".join(failures),
            )
        log.info(
            "gid {gid}: CANCEL {operation_id}: {what}; released CANCELLED",
            gid=gid,
            operation_id=operation_id,
            what="stopped and removed" if cancelled.held else "not held",
        )
        self.on_change()

    async def _delete(self, gid: int, operation_id: str, protocol: int) -> None:
        begun = await self.store.begin_delete(gid, operation_id, protocol)
        if begun.kind == "repeat":
            log.info(
                "gid {gid}: DELETE {operation_id} again: already done",
                gid=gid,
                operation_id=operation_id,
            )
            self.on_change()
            return
        await self.finish_delete(gid, operation_id, held=begun.task is not None)

    async def finish_delete(self, gid: int, operation_id: str, *, held: bool) -> None:
        """Stop the work, remove the files, record the result (also used at startup)."""
        await self.worker.cancel(gid)
        found, failure = remove_files(self.data, gid)
        if failure:
            result, reason = FAILED, failure
        elif held or found:
            result, reason = DELETED, ""
        else:
            result, reason = NOT_FOUND, "no task and no file for this gid"
        await self.store.finish_delete(gid, operation_id, result, reason)
        log_fn = log.error if result == FAILED else log.info
        log_fn(
            "gid {gid}: DELETE {operation_id}: {result} {reason}",
            gid=gid,
            operation_id=operation_id,
            result=result,
            reason=reason,
        )
        self.on_change()
        if result == FAILED:
            task = await self.store.get_task(gid)
            if task is not None and task.status != NodeCode.COMPLETED:
                self.worker.run(gid, task.operation_id)  # the task stays: so does its work
