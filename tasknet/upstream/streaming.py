"""Response bodies streamed by a push producer: throttled, cut, range-sliced.

Bodies are written in chunks from a producer (never one big write) so a
bandwidth limit, a ``slow_body`` fault and a ``reset_mid_body`` fault act on
the wire the way a slow or failing server would, and a paused transport
(client not reading) stops production instead of buffering the whole file.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web.server import Request
from zope.interface import implementer

from tasknet.upstream import catalog

CHUNK = 64 * 1024
# A throttled body is sent in pieces of about this many seconds' worth.
THROTTLE_TICK = 0.05
# Unthrottled, write at most this many chunks per reactor turn, so one big
# download never starves the other connections.
CHUNKS_PER_TURN = 4


class BodySource(Protocol):
    @property
    def length(self) -> int: ...

    def read(self, offset: int, size: int) -> bytes: ...


@dataclass(frozen=True)
class BytesSource:
    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)

    def read(self, offset: int, size: int) -> bytes:
        return self.data[offset : offset + size]


@dataclass(frozen=True)
class ArchiveSource:
    """Bytes ``[start, end)`` of the archive of ``gid``, generated on demand."""

    gid: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start

    def read(self, offset: int, size: int) -> bytes:
        begin = self.start + offset
        return catalog.archive_slice(self.gid, begin, min(begin + size, self.end))


class ByteRangeError(ValueError):
    """The Range header is well formed but no byte of it lies in the body (416)."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` of a single ``bytes=`` range, or None to send it all.

    A malformed or multi-range header is ignored (RFC 9110 allows serving the
    full body); a well-formed range past the end raises ByteRangeError.
    """
    if header is None:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first.isdigit() or first == "") or not (last.isdigit() or last == ""):
        return None
    if first == "":
        if last == "":
            return None
        suffix = int(last)
        if suffix == 0:
            raise ByteRangeError(header)
        return max(0, size - suffix), size
    start = int(first)
    end = size if last == "" else min(int(last) + 1, size)
    if last != "" and int(last) < start:
        return None
    if start >= size:
        raise ByteRangeError(header)
    return start, end


@implementer(IPushProducer)
class BodyStreamer:
    """Writes a body to a request, then finishes it (or cuts the connection).

    ``rate`` limits bytes per second (None: as fast as the transport takes
    them). ``cut_after``: after that many body bytes, flush them and reset the
    TCP connection instead of finishing (a ``reset_mid_body`` fault).
    """

    def __init__(
        self,
        request: Request,
        source: BodySource,
        clock: IReactorTime,  # a reactor or twisted.internet.task.Clock
        *,
        rate: float | None = None,
        cut_after: int | None = None,
    ) -> None:
        self._request = request
        self._source = source
        self._clock = clock
        self._rate = rate
        self._limit = source.length
        self._cut = cut_after is not None and cut_after < source.length
        if cut_after is not None and self._cut:
            self._limit = cut_after
        self._sent = 0
        self._paused = False
        self._done = False
        self._tick: IDelayedCall | None = None
        self.finished: Deferred[None] = Deferred()

    def start(self) -> Deferred[None]:
        """Begin streaming; the Deferred fires when the body ended either way."""
        self._request.notifyFinish().addErrback(self._lost)
        self._request.registerProducer(self, True)
        self._schedule(0)
        return self.finished

    # IPushProducer

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._tick is None and not self._done:
            self._schedule(0)

    def stopProducing(self) -> None:
        self._end()

    # internals

    def _schedule(self, delay: float) -> None:
        self._tick = self._clock.callLater(delay, self._write_some)

    def _write_some(self) -> None:
        self._tick = None
        if self._done or self._paused:
            return
        if self._rate is not None:
            piece = max(1, min(CHUNK, int(self._rate * THROTTLE_TICK)))
            written = self._write(piece)
            if self._sent < self._limit:
                self._schedule(written / self._rate)
            else:
                self._complete()
            return
        for _ in range(CHUNKS_PER_TURN):
            self._write(CHUNK)
            if self._sent >= self._limit:
                self._complete()
                return
            if self._paused:
                return  # resumeProducing reschedules
        self._schedule(0)

    def _write(self, size: int) -> int:
        data = self._source.read(self._sent, min(size, self._limit - self._sent))
        self._sent += len(data)
        self._request.write(data)
        return len(data)

    def _complete(self) -> None:
        if self._done:
            return
        self._request.unregisterProducer()
        if self._cut:
            _reset_after_flush(self._request)
        else:
            self._request.finish()
        self._end()

    def _lost(self, failure: Failure) -> None:
        self._end()

    def _end(self) -> None:
        if self._tick is not None and self._tick.active():
            self._tick.cancel()
        self._tick = None
        if not self._done:
            self._done = True
            self.finished.callback(None)


def _reset_after_flush(request: Request) -> None:
    """Close so the bytes already written still go out, then a TCP RST.

    ``abortConnection`` would discard the unsent buffer; instead arm SO_LINGER
    (on, 0 s) and close normally: Twisted flushes, then ``close`` resets.
    """
    transport: Any = request.transport  # ITCPTransport (or a wrapper of one)
    assert transport is not None
    try:
        handle = transport.getHandle()
        handle.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (AttributeError, OSError):
        pass  # not a TCP socket: a plain close still cuts the body short
    transport.loseConnection()
