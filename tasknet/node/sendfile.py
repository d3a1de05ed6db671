"""Send a byte range of an open file as an HTTP response body.

:func:`send_file_range` writes the response's headers, then
``[offset, offset + length)`` of the file, then finishes the request; its
Deferred fires with the :class:`Outcome`: ``SENT`` once every byte went to
the socket, ``CUT`` when the client went away or stalled for
``idle_timeout`` seconds, ``SHORT`` when the file ended before the range
did (the connection is aborted: a client never takes a short body for a
whole one).  Either way the file is closed when it fires: the caller frees
its slot then.

* **Plain TCP** (the transport is Twisted's own socket connection, no TLS):
  the kernel copies the bytes (``os.sendfile``), never through Python.  The
  headers go through Twisted's write buffer first, so the sender takes the
  HTTP channel's place as the transport's producer, as a *pull* producer:
  a FileDescriptor resumes a pull producer each time its buffer is empty,
  so the first resume after the headers is the moment the socket is ours.
  Each resume sends as much as the socket takes; on ``EAGAIN`` it asks the
  transport to watch for writability (``startWriting``), whose ``doWrite``
  finds its buffer empty and resumes us again.  The channel is put back as
  the transport's producer before the request finishes (keep-alive works).
* **TLS** (or any other transport): bytes are read in blocks and written
  with ``request.write`` by a push producer the channel pauses when the
  transport's buffer is full (Twisted's ``FileSender`` semantics, without
  its cooperator on the global reactor).

twisted.web switches the channel's idle timeout off while a request is
being answered, so a sender keeps its own: no progress for
``idle_timeout`` seconds (``clock``'s) aborts the connection.
"""

from __future__ import annotations

import enum
import errno
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, BinaryIO

from twisted.internet import tcp
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IDelayedCall,
    IPullProducer,
    IPushProducer,
    IReactorTime,
    ISSLTransport,
)
from twisted.logger import Logger
from twisted.web.server import Request
from zope.interface import implementer

__all__ = ["BLOCK", "Outcome", "kernel_sendable", "send_file_range"]

log = Logger()

#: Bytes read per block on the TLS path (and the most one sendfile call moves).
BLOCK = 256 * 1024
#: Bytes sent per reactor turn before letting other connections run.
TURN = 4 * 1024 * 1024


class Outcome(enum.Enum):
    """How a transfer ended."""

    SENT = "sent"
    CUT = "cut"
    SHORT = "short"


_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN, errno.EBADF)


def kernel_sendable(request: Request) -> bool:
    """Whether ``request`` is answered on a plain TCP socket sendfile may use."""
    transport = request.channel.transport if request.channel is not None else None
    return (
        isinstance(transport, tcp.Connection)
        and not ISSLTransport.providedBy(transport)
        and not getattr(transport, "TLS", False)
    )


def send_file_range(
    request: Request,
    file: BinaryIO,
    offset: int,
    length: int,
    *,
    clock: IReactorTime,
    idle_timeout: float,
    on_progress: Callable[[int], None] = lambda sent: None,
) -> Deferred[Outcome]:
    """Send the response's headers and ``length`` bytes of ``file`` from
    ``offset``, then finish ``request`` (module doc); the file is closed
    when the Deferred fires.  ``on_progress(n)``: ``n`` more body bytes
    went to the transport."""
    kind = _KernelSender if kernel_sendable(request) else _ReadSender
    return kind(request, file, offset, length, clock, idle_timeout, on_progress).start()


class _Sender(ABC):
    """What both ways share: the file, the count, the idle timer, the end."""

    def __init__(
        self,
        request: Request,
        file: BinaryIO,
        offset: int,
        length: int,
        clock: IReactorTime,
        idle_timeout: float,
        on_progress: Callable[[int], None],
    ) -> None:
        self.request = request
        self.on_progress = on_progress
        self.file = file
        self.offset = offset
        self.remaining = length
        self.clock = clock
        self.idle_timeout = idle_timeout
        self.done: Deferred[Outcome] = Deferred()
        self._idle: IDelayedCall | None = None
        self._ended = False

    def start(self) -> Deferred[Outcome]:
        self._idle = self.clock.callLater(self.idle_timeout, self._stalled)
        # The client may go while the body is being sent: stop then.
        self.request.notifyFinish().addErrback(lambda _: self._end(Outcome.CUT))
        self._begin()
        return self.done

    @abstractmethod
    def _begin(self) -> None:
        """Start moving the body: by the kernel, or by blocks."""

    def _progress(self, sent: int) -> None:
        self.remaining -= sent
        self.offset += sent
        self.request.sentLength += sent  # the access log's byte count
        self.on_progress(sent)
        if self._idle is not None and self._idle.active():
            self._idle.reset(self.idle_timeout)

    def _stalled(self) -> None:
        self._idle = None
        log.info(
            "dropping {peer}: no byte of the archive taken for {seconds}s",
            peer=str(self.request.getClientAddress()),
            seconds=self.idle_timeout,
        )
        self._abort()

    def _abort(self, outcome: Outcome = Outcome.CUT) -> None:
        transport: Any = self.request.channel.transport if self.request.channel else None
        self._end(outcome)
        if transport is not None:
            transport.abortConnection()

    def _end(self, outcome: Outcome) -> None:
        if self._ended:
            return
        self._ended = True
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None
        self._detach()
        try:
            self.file.close()
        finally:
            sent = outcome is Outcome.SENT
            if sent and not self.request.finished and not self.request._disconnected:
                self.request.finish()
            self.done.callback(outcome)

    @abstractmethod
    def _detach(self) -> None:
        """Stop being anyone's producer."""


@implementer(IPullProducer)
class _KernelSender(_Sender):
    """The plain TCP way (module doc): ``os.sendfile`` from a pull producer
    registered on the transport in the HTTP channel's place."""

    transport: Any
    _registered = False

    def _begin(self) -> None:
        self.transport = self.request.channel.transport
        self.socket_fd: int = self.transport.fileno()
        self.file_fd = self.file.fileno()
        self._headers_out = False
        self.request.write(b"")  # the status line and headers, into Twisted's buffer
        if self._ended:
            return
        self.transport.unregisterProducer()  # the HTTP channel: put back in _detach
        self._registered = True
        # A pull producer is resumed at once: the headers are still in the
        # buffer then (the transport writes on its next turn), so that first
        # resume only asks to be called once they are out.
        self.transport.registerProducer(self, False)

    def resumeProducing(self) -> None:
        if self._ended:
            return
        if not self._headers_out:
            self._headers_out = True
            self.transport.startWriting()
            return
        sent_this_turn = 0
        while self.remaining > 0 and sent_this_turn < TURN:
            try:
                sent = os.sendfile(
                    self.socket_fd, self.file_fd, self.offset, min(self.remaining, BLOCK)
                )
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno not in _GONE:
                    log.error("sendfile failed: {error}", error=exc)
                self._abort()
                return
            if sent == 0:
                # The file ends before the range does: never claim a whole
                # transfer; the client sees a short body and retries.
                self._abort(Outcome.SHORT)
                return
            sent_this_turn += sent
            self._progress(sent)
        if self.remaining == 0:
            self._end(Outcome.SENT)
            return
        # Socket full (or this turn's share sent): doWrite resumes us when
        # it can take more.
        self.transport.startWriting()

    def stopProducing(self) -> None:
        # The transport lost its connection (it unregisters us itself).
        self._registered = False
        self._end(Outcome.CUT)

    def _detach(self) -> None:
        if self._registered:
            self._registered = False
            transport = self.transport
            if transport.producer is self:
                transport.unregisterProducer()
                if transport.connected and not transport.disconnecting:
                    # Back to the channel, as twisted.web set it up.
                    transport.registerProducer(self.request.channel, True)


@implementer(IPushProducer)
class _ReadSender(_Sender):
    """The TLS way (module doc): blocks read and written while the channel
    does not pause us."""

    #: Blocks written per turn before yielding to other connections.
    BLOCKS_PER_TURN = TURN // BLOCK

    def _begin(self) -> None:
        self._paused = False
        self._scheduled: IDelayedCall | None = None
        self.file.seek(self.offset)
        self.request.registerProducer(self, True)
        self.request.write(b"")  # headers now, even if the body waits
        self._produce()

    def _produce(self) -> None:
        self._scheduled = None
        blocks = 0
        while not self._ended and not self._paused and self.remaining > 0:
            if blocks >= self.BLOCKS_PER_TURN:
                self._scheduled = self.clock.callLater(0, self._produce)
                return
            data = self.file.read(min(self.remaining, BLOCK))
            if not data:
                self._abort(Outcome.SHORT)
                return
            blocks += 1
            self._progress(len(data))
            self.request.write(data)
        if not self._ended and self.remaining == 0:
            self._end(Outcome.SENT)

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._scheduled is None and not self._ended:
            if self._idle is not None and self._idle.active():
                self._idle.reset(self.idle_timeout)
            self._produce()

    def stopProducing(self) -> None:
        self._end(Outcome.CUT)

    def _detach(self) -> None:
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None
        if self.request.producer is self:
            self.request.unregisterProducer()
