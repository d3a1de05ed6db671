"""Move the rest of a node's response body to the client in the kernel.

:class:`Splicer` takes both plain TCP sockets away from Twisted once the
response's headers (and whatever body Twisted had read) went to the client:
the node's socket is read with ``os.splice`` into a pipe, the pipe is
spliced into the client's socket, so body bytes never reach Python (B11).

* The node's side: Twisted stops reading its transport (``stopReading``) and
  the splicer is the reactor's reader for that file descriptor.
* The client's side: the splicer takes the HTTP channel's place as the
  transport's *pull* producer (as tasknet/node/sendfile.py does): the
  transport resumes it each time its buffer is empty, and ``startWriting``
  asks for that once the socket can take more.
* Back-pressure: at most a pipe's worth is in flight; while the pipe is
  full the node's socket is not read.
* Ends: every byte sent (``on_end(None)``); the node closing early, a socket
  error, the node sending nothing for ``idle_timeout`` seconds while the
  splicer waits for it, or the client going away (``on_end(failure)``).  In
  every case the pipe is closed, the node's connection is closed and the
  channel is put back as the client transport's producer.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import tcp
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import (
    IDelayedCall,
    IPullProducer,
    IReactorFDSet,
    IReactorTime,
    IReadDescriptor,
    ISSLTransport,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

__all__ = ["PIPE_SIZE", "NodeBodyBroken", "Splicer", "spliceable"]

log = Logger()

#: The pipe's size asked for (the kernel may give less: its size is read back).
PIPE_SIZE = 1024 * 1024
#: Bytes moved per reactor turn before letting other connections run.
TURN = 4 * 1024 * 1024

_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN, errno.EBADF)


class NodeBodyBroken(Exception):
    """The node's body ended or failed before its Content-Length."""


def _plain_tcp(transport: Any) -> bool:
    return bool(
        isinstance(transport, tcp.Connection)
        and not ISSLTransport.providedBy(transport)
        and not getattr(transport, "TLS", False)
        and transport.connected
        and not transport.disconnecting
    )


def spliceable(node_transport: Any, client_transport: Any, reactor: Any) -> bool:
    """Whether the kernel may move bytes between these two transports: both
    plain TCP, os.splice there (Linux), the reactor one of file descriptors
    and the node's socket not being written (its request went out)."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "splice")
        and IReactorFDSet.providedBy(reactor)
        and _plain_tcp(node_transport)
        and _plain_tcp(client_transport)
        and node_transport not in reactor.getWriters()
        and not node_transport.dataBuffer
        and not node_transport._tempDataBuffer
    )


@implementer(IPullProducer, IReadDescriptor)
class Splicer:
    """Moves ``length`` bytes from ``node``'s socket to ``client``'s (module
    doc); ``on_bytes(n)``: ``n`` more bytes went to the client."""

    def __init__(
        self,
        reactor: IReactorFDSet,
        clock: IReactorTime,
        node: Any,
        client: Any,
        channel: Any,
        length: int,
        idle_timeout: float,
        on_bytes: Callable[[int], None],
        on_end: Callable[[Failure | None], None],
    ) -> None:
        self._reactor = reactor
        self._clock = clock
        self._node = node
        self._client = client
        self._channel = channel
        self._to_write = length  # in the pipe or still at the node
        self._idle_timeout = idle_timeout
        self._on_bytes = on_bytes
        self._on_end = on_end
        self._node_fd: int = node.fileno()
        self._client_fd: int = client.fileno()
        self._pipe_r = -1
        self._pipe_w = -1
        self._capacity = 0
        self._in_pipe = 0
        self._pipe_full = False
        self._reading = False
        self._headers_asked = False
        self._client_ready = False
        self._registered = False
        self._ended = False
        self._idle: IDelayedCall | None = None
        self._last_data = clock.seconds()

    def start(self) -> None:
        """Take both sockets (the client's headers are in its transport's
        buffer: the first resume only asks to be called once they are out)."""
        self._pipe_r, self._pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(self._pipe_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # the default size serves, in more turns
        self._capacity = fcntl.fcntl(self._pipe_w, fcntl.F_GETPIPE_SZ)
        self._node.stopReading()
        self._client.unregisterProducer()  # the HTTP channel: put back at the end
        self._registered = True
        self._client.registerProducer(self, False)
        if not self._ended:
            self._want_read(True)

    # -- the reactor's reader of the node's socket

    def fileno(self) -> int:
        return self._node_fd

    def logPrefix(self) -> str:
        return "Splicer"

    def doRead(self) -> None:
        self._run()

    def connectionLost(self, reason: Failure) -> None:
        self._end(Failure(NodeBodyBroken(f"the node's socket failed: {reason.value}")))

    # -- the client transport's pull producer

    def resumeProducing(self) -> None:
        if self._ended:
            return
        if not self._headers_asked:
            # Resumed at once by registerProducer: the headers are still in
            # the transport's buffer.
            self._headers_asked = True
            self._client.startWriting()
            return
        self._client_ready = True
        self._run()

    def pauseProducing(self) -> None:
        """A pull producer is not paused (the transport asks when it is ready)."""

    def stopProducing(self) -> None:
        # The client's connection is lost (its transport unregisters us).
        self._registered = False
        self._end(Failure(ConnectionDone("the client went away")))

    def stop(self) -> None:
        """The client went away: close the node's transfer."""
        self._end(Failure(ConnectionDone("the client went away")))

    # -- moving bytes

    def _run(self) -> None:
        try:
            self._move()
        except Exception:
            log.failure("splicing an archive failed")
            self._end(Failure())

    def _move(self) -> None:
        moved = 0
        client_blocked = False
        while not self._ended and moved < TURN:
            progressed = False
            room = min(self._capacity, self._to_write) - self._in_pipe
            if room <= 0:
                self._pipe_full = self._to_write > self._in_pipe
            elif not self._pipe_full:
                try:
                    n = os.splice(
                        self._node_fd,
                        self._pipe_w,
                        room,
                        flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK,
                    )
                except BlockingIOError:
                    # The socket is empty or the pipe has no room left.
                    self._pipe_full = self._in_pipe > 0
                except InterruptedError:
                    continue
                except OSError as e:
                    self._end(Failure(NodeBodyBroken(f"reading the node failed: {e}")))
                    return
                else:
                    if n == 0:
                        self._end(Failure(NodeBodyBroken("the node closed its body early")))
                        return
                    self._in_pipe += n
                    self._last_data = self._clock.seconds()
                    progressed = True
            if self._in_pipe > 0 and self._client_ready and not client_blocked:
                try:
                    n = os.splice(
                        self._pipe_r,
                        self._client_fd,
                        self._in_pipe,
                        flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK,
                    )
                except BlockingIOError:
                    client_blocked = True
                except InterruptedError:
                    continue
                except OSError as e:
                    if e.errno not in _GONE:
                        log.error("splice to the client failed: {error}", error=e)
                    self._end(Failure(ConnectionDone(f"the client went away: {e}")))
                    return
                else:
                    self._in_pipe -= n
                    self._to_write -= n
                    self._pipe_full = False
                    moved += n
                    progressed = True
                    self._on_bytes(n)
            if self._to_write == 0:
                self._end(None)
                return
            if not progressed:
                break
        if self._ended:
            return
        self._want_read(self._to_write > self._in_pipe and not self._pipe_full)
        if self._in_pipe > 0 or not self._client_ready:
            # doWrite resumes us once the client's socket takes more.
            self._client.startWriting()

    def _want_read(self, wanted: bool) -> None:
        if wanted and not self._reading:
            self._reading = True
            self._reactor.addReader(self)
            self._watch()
        elif not wanted and self._reading:
            self._reading = False
            self._reactor.removeReader(self)
            self._unwatch()

    # -- the idle timer: runs while the splicer waits for the node

    def _watch(self) -> None:
        self._unwatch()
        self._last_data = self._clock.seconds()
        self._idle = self._clock.callLater(self._idle_timeout, self._went_idle)

    def _unwatch(self) -> None:
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None

    def _went_idle(self) -> None:
        self._idle = None
        if self._ended or not self._reading:
            return
        quiet = self._clock.seconds() - self._last_data
        if quiet < self._idle_timeout:
            self._idle = self._clock.callLater(self._idle_timeout - quiet, self._went_idle)
            return
        self._end(Failure(NodeBodyBroken(f"the node sent nothing for {self._idle_timeout}s")))

    # -- the end

    def _end(self, failure: Failure | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._unwatch()
        if self._reading:
            self._reading = False
            self._reactor.removeReader(self)
        for fd in (self._pipe_r, self._pipe_w):
            if fd >= 0:
                os.close(fd)
        self._pipe_r = self._pipe_w = -1
        if self._registered:
            self._registered = False
            if self._client.producer is self:
                self._client.unregisterProducer()
                if self._client.connected and not self._client.disconnecting:
                    # Back to the channel, as twisted.web set it up.
                    self._client.registerProducer(self._channel, True)
        # The node's connection is never handed back to Twisted's client:
        # its parser did not see these bytes.
        self._node.abortConnection()
        self._on_end(failure)
