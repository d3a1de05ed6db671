"""One download attempt: stream a URL into a ``.part`` file, resuming with Range.

An attempt appends to whatever the ``.part`` file already holds (asking for
``bytes=N-``), checks that the server really answered that range (206 with a
matching ``Content-Range``; a 200 means the server ignored the range, so the
file restarts from byte 0), and only returns when the file holds the whole
body, as long as the server said it is.  Anything short or broken raises, and
the caller retries: the bytes already on disk are kept for the next attempt.

Bounded (PROTOCOL.md "Bounds", INTERFACES.md "Node downloads"): an attempt
given a :class:`SizeLimit` stops as soon as the body passes it (a declared
length past it stops it before any byte is read), removes the ``.part`` file
and raises :class:`TooLarge`: nothing of such a download is kept.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import treq
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

# Errors of the local disk rather than of the network: reported loudly, since
# retrying does not help until an operator acts.
STORAGE_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EFBIG,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.EIO,
        errno.EISDIR,
        errno.ENOTDIR,
    }
)

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")
_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$")

ProgressCallback = Callable[[int, int | None], None]

#: ``--max-archive-bytes``: the bound of a download whose size the site did not give.
DEFAULT_MAX_ARCHIVE_BYTES = 8 * 1024**3


class DownloadError(Exception):
    """A failed attempt worth retrying (network, server, short body)."""


class StorageError(DownloadError):
    """The local disk refused (full, read-only, permission): reported, then retried."""


class RangeIgnored(DownloadError):
    """The server sent another range than asked: the ``.part`` file was reset."""


class TooLarge(DownloadError):
    """The body passed its :class:`SizeLimit`: stopped, and nothing of it kept."""


@dataclass(frozen=True)
class SizeLimit:
    """How large a task's archive may grow: the site's ``size`` plus 1 %, or
    ``maximum`` (``--max-archive-bytes``) when the site gave none (0)."""

    expected: int
    maximum: int = DEFAULT_MAX_ARCHIVE_BYTES

    @property
    def bytes(self) -> int:
        return self.expected + self.expected // 100 if self.expected > 0 else self.maximum

    def exceeded(self, seen: int) -> TooLarge:
        if self.expected > 0:
            return TooLarge(f"archive larger than expected: {seen:,} > {self.expected:,} bytes")
        return TooLarge(
            f"archive larger than --max-archive-bytes: {seen:,} > {self.maximum:,} bytes"
        )


def storage_error(exc: OSError, path: Path) -> StorageError | None:
    if exc.errno in STORAGE_ERRNOS:
        return StorageError(f"cannot write {path}: {exc.strerror} (errno {exc.errno})")
    return None


class _FileSink(Protocol):
    """Writes a response body to an open file; aborts on stall or cancel."""

    def __init__(
        self,
        file: IO[bytes],
        path: Path,
        written: int,
        on_data: Callable[[int], None],
        clock: IReactorTime,
        idle_timeout: float,
        limit: SizeLimit | None = None,
    ) -> None:
        self.limit = limit
        self.file = file
        self.path = path
        self.written = written
        self.on_data = on_data
        self.clock = clock
        self.idle_timeout = idle_timeout
        self.finished: Deferred[int] = Deferred(self._cancel)
        self._watchdog: IDelayedCall | None = None
        self._failure: Exception | None = None
        self._cancelled = False

    def connectionMade(self) -> None:
        self._arm()

    def _arm(self) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.reset(self.idle_timeout)
        else:
            self._watchdog = self.clock.callLater(self.idle_timeout, self._stalled)

    def _disarm(self) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.cancel()
        self._watchdog = None

    def _cancel(self, _finished: Deferred[int]) -> None:
        # Deferred.cancel then fails ``finished`` with CancelledError.
        self._cancelled = True
        self._abort()

    def _stalled(self) -> None:
        self._watchdog = None
        self._failure = DownloadError(f"no data for {self.idle_timeout:g} s")
        self._abort()

    def _abort(self) -> None:
        self._disarm()
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        if self._failure is not None or self._cancelled:
            return
        if self.limit is not None and self.written + len(data) > self.limit.bytes:
            # Not one byte past the bound is written.
            self._failure = self.limit.exceeded(self.written + len(data))
            self._abort()
            return
        try:
            self.file.write(data)
        except OSError as exc:
            self._failure = storage_error(exc, self.path) or DownloadError(
                f"cannot write {self.path}: {exc}"
            )
            self._abort()
            return
        self.written += len(data)
        self._arm()
        self.on_data(self.written)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self._disarm()
        if self._cancelled or self.finished.called:
            return
        if self._failure is not None:
            self.finished.errback(self._failure)
        elif reason.check(ResponseDone, PotentialDataLoss):
            self.finished.callback(self.written)
        else:
            self.finished.errback(DownloadError(f"body broken: {reason.getErrorMessage()}"))


def _header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else None


def _truncate(path: Path) -> None:
    with open(path, "wb"):
        pass


async def fetch(
    client: HTTPClient,
    url: str,
    part: Path,
    clock: IReactorTime,
    on_progress: ProgressCallback,
    *,
    idle_timeout: float = 30.0,
    limit: SizeLimit | None = None,
) -> int:
    """Bring ``part`` to the whole body of ``url``; return its size in bytes.

    Raises :class:`DownloadError` (retry later; the bytes kept are valid),
    :class:`StorageError`, or :class:`TooLarge` (past ``limit``: ``part``
    removed).  Cancelling the returned coroutine's Deferred aborts the
    connection.
    """
    try:
        return await _fetch(client, url, part, clock, on_progress, idle_timeout, limit)
    except TooLarge:
        part.unlink(missing_ok=True)
        raise


async def _fetch(
    client: HTTPClient,
    url: str,
    part: Path,
    clock: IReactorTime,
    on_progress: ProgressCallback,
    idle_timeout: float,
    limit: SizeLimit | None,
) -> int:
    try:
        offset = part.stat().st_size if part.exists() else 0
    except OSError as exc:
        raise storage_error(exc, part) or DownloadError(str(exc)) from exc
    if limit is not None and offset > limit.bytes:
        raise limit.exceeded(offset)
    headers = Headers({"Range": [f"bytes={offset}-"]} if offset else {})
    try:
        # treq's timeout runs on the reactor it is given (else the global one);
        # it only calls its callLater, though treq types it as a whole reactor.
        response: Any = await client.get(
            url,
            headers=headers,
            timeout=idle_timeout,
            reactor=clock,  # type: ignore[arg-type]
        )
    except CancelledError:
        raise
    except Exception as exc:
        raise DownloadError(f"GET {url}: {exc}") from exc
    if response.code == 416 and offset:
        return await _already_whole(response, part, offset, on_progress)
    offset, total = await _body_range(response, part, offset, url)
    if limit is not None and total is not None and total > limit.bytes:
        _drop(response)  # not read: it may be huge
        raise limit.exceeded(total)
    size = await _append_body(
        response, part, offset, total, clock, on_progress, idle_timeout, limit
    )
    if total is not None and size != total:
        if size > total:
            _truncate(part)
        raise DownloadError(f"short body: have {size} of {total} bytes")
    return size


async def _already_whole(
    response: Any, part: Path, offset: int, on_progress: ProgressCallback
) -> int:
    """A 416 to ``bytes=offset-``: ``part`` is whole if the server says its
    length is ``offset``; otherwise start again from byte 0."""
    await _discard(response)
    match = _UNSATISFIED_RANGE.match(_header(response, b"content-range") or "")
    if match is not None and int(match.group(1)) == offset:
        on_progress(offset, offset)
        return offset
    _truncate(part)
    raise RangeIgnored(f"range bytes={offset}- not satisfiable: starting again")


async def _body_range(response: Any, part: Path, offset: int, url: str) -> tuple[int, int | None]:
    """Where the body starts in ``part`` and the whole length (None if the
    server did not say), from a 200 or 206 answer; else raise."""
    if response.code == 206 and offset:
        match = _CONTENT_RANGE.match(_header(response, b"content-range") or "")
        if match is None or int(match.group(1)) != offset:
            await _discard(response)
            _truncate(part)
            raise RangeIgnored(f"asked bytes={offset}-, got Content-Range {match and match[0]!r}")
        return offset, None if match.group(3) == "*" else int(match.group(3))
    if response.code == 200 or (response.code == 206 and not offset):
        # With an offset, the server ignored Range: start again from byte 0.
        return 0, None if response.length is UNKNOWN_LENGTH else int(response.length)
    await _discard(response)
    raise DownloadError(f"GET {url}: HTTP {response.code}")


async def _append_body(
    response: Any,
    part: Path,
    offset: int,
    total: int | None,
    clock: IReactorTime,
    on_progress: ProgressCallback,
    idle_timeout: float,
    limit: SizeLimit | None = None,
) -> int:
    """Write the body to ``part`` from ``offset`` and fsync it; its new size."""
    try:
        file = open(part, "ab" if offset else "wb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        await _discard(response)
        raise storage_error(exc, part) or DownloadError(str(exc)) from exc
    try:
        on_progress(offset, total)
        sink = _FileSink(
            file, part, offset, lambda n: on_progress(n, total), clock, idle_timeout, limit
        )
        response.deliverBody(sink)
        size: int = await sink.finished
        file.flush()
        os.fsync(file.fileno())
    except OSError as exc:
        raise storage_error(exc, part) or DownloadError(str(exc)) from exc
    finally:
        file.close()
    return size


class _Refuse(Protocol):
    """A body receiver that stops the body at once (the connection is aborted)."""

    def connectionMade(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        return None


def _drop(response: Any) -> None:
    """Abandon ``response``'s body without reading it."""
    try:
        response.deliverBody(_Refuse())
    except Exception:  # a body already gone: nothing to stop
        return


async def _discard(response: Any) -> Any:
    try:
        await treq.content(response)
    except Exception:  # the body of a refusal does not matter
        return None
