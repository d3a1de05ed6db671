"""The site's stream of an archive from the node that holds it
(DELIVERY.md, "Getting an archive (site)": a node without a public URL).

The site asks the node's ``serveUrl`` for a signed link it just made and
relays the answer: ``200``, ``206``, ``304`` and ``416`` with their headers
(:data:`PASSED_RESPONSE_HEADERS`), the client's ``Range``, ``If-Range`` and
``If-None-Match`` passed on (:data:`PASSED_REQUEST_HEADERS`).  The body is
relayed with back-pressure: the relay is the producer registered on the
client's request and pauses the node's body transport, so when the client
reads slowly the site stops reading the node's socket.  The node's socket is
read :data:`RELAY_READ` bytes at a time and the client's transport takes up
to :data:`RELAY_BUFFERED` before it pauses the node (Twisted's 64 KiB for
both made the relay pay a read, a pause and a resume per 64 KiB: B11), so at
most about their sum (half a MiB) is in the site's memory per transfer.  A
client that goes away stops the node's transfer (its connection is closed).
When both sockets are plain TCP (Linux), the rest of a GET's ``200``/``206``
body is moved in the kernel instead (splice.py: os.splice through a pipe,
B11), on the reactor's turn after the headers: the relay stays the way for
TLS on either side and anything unusual.

Nothing here hangs or answers ``500``: a node that cannot be reached, or
sends no headers within :data:`HEADERS_TIMEOUT`, is ``502 node_unreachable``
(with ``Retry-After``); a node at its ``--serve-max`` is ``503 node_busy``;
any other answer of the node is ``502 node_error`` naming it.  Once the
headers went out, a node that fails mid-body makes the site close the
client's connection (the client sees fewer bytes than ``Content-Length``
and resumes with ``Range``), never a complete-looking short file; so does
a node that sends nothing for :data:`BODY_IDLE_TIMEOUT` while the client is
ready for more (a client that reads slowly pauses the node, and the node's
own idle timeout bounds how long it waits).

At most ``per_user`` streams run at once per user (``--archive-streams-per-
user``): past it ``429 too_many_streams``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import orjson
from twisted.internet.abstract import FileDescriptor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.error import ConnectError, ConnectingCancelledError, DNSLookupError
from twisted.internet.interfaces import (
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IPushProducer,
    IReactorTCP,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    Agent,
    PartialDownloadError,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from twisted.web.server import Request
from zope.interface import implementer

from tasknet.netclient import DirectEndpoints, quiet_pool
from tasknet.site import metrics
from tasknet.site.web.errors import ApiError
from tasknet.site.web.splice import Splicer, spliceable

__all__ = [
    "BODY_IDLE_TIMEOUT",
    "CONNECT_TIMEOUT",
    "HEADERS_TIMEOUT",
    "PASSED_REQUEST_HEADERS",
    "PASSED_RESPONSE_HEADERS",
    "ArchiveStreams",
]

log = Logger()

#: Seconds to connect to a node's serve endpoint, and then to get its headers.
CONNECT_TIMEOUT = 10.0
HEADERS_TIMEOUT = 30.0
#: Seconds a node may send nothing of a body the client is ready for.
BODY_IDLE_TIMEOUT = 60.0
#: How long a client is told to wait after the node could not be reached.
RETRY_AFTER = 10

PASSED_REQUEST_HEADERS = (b"range", b"if-range", b"if-none-match", b"if-modified-since")
PASSED_RESPONSE_HEADERS = (
    b"content-length",
    b"content-range",
    b"accept-ranges",
    b"etag",
    b"content-type",
    b"content-disposition",
    b"last-modified",
)
#: The node's answers relayed as they are; any other is a JSON error.
PASSED_STATUSES = frozenset({200, 206, 304, 416})
#: The most of a node's error body read (to name its error code).
ERROR_BODY_LIMIT = 4096
#: Bytes read from a node's socket at once (Twisted reads 64 KiB).
RELAY_READ = 256 * 1024
#: Bytes the client's transport holds before it pauses the node (and the
#: most it sends at once).
RELAY_BUFFERED = 256 * 1024
#: Relayed bytes counted into the metric at least this often (not per read).
METRIC_EVERY = 64 * 1024 * 1024


def _widen(transport: object, *, read: int, buffered: int) -> tuple[int, int] | None:
    """Give a plain TCP ``transport`` larger reads, write buffer and sends;
    its old sizes (None for another kind, e.g. TLS: left as it is)."""
    if not isinstance(transport, FileDescriptor):
        return None
    old = (transport.bufferSize, transport.SEND_LIMIT)
    transport.bufferSize = max(read, buffered)
    transport.SEND_LIMIT = buffered
    return old


@implementer(IStreamClientEndpoint)
class _WideReadEndpoint:
    """An endpoint whose plain TCP connections read :data:`RELAY_READ` at once."""

    def __init__(self, endpoint: IStreamClientEndpoint) -> None:
        self._endpoint = endpoint

    def connect(self, factory: IProtocolFactory) -> Deferred[IProtocol]:
        def widen(protocol: IProtocol) -> IProtocol:
            transport = getattr(protocol, "transport", None)
            if isinstance(transport, FileDescriptor):
                transport.bufferSize = RELAY_READ
            return protocol

        connecting: Deferred[IProtocol] = self._endpoint.connect(factory)
        return connecting.addCallback(widen)


class _WideReadEndpoints(DirectEndpoints):
    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        return _WideReadEndpoint(super().endpointForURI(uri))


@implementer(IPushProducer)
class _Relay(Protocol):
    """Writes the node's body to the client's request as it arrives.  It is
    the request's producer: the client's transport pauses and resumes the
    node's socket through it (back-pressure).  While not paused, a node that
    sends nothing for ``idle_timeout`` seconds (on ``clock``) has its
    connection closed: the transfer fails rather than hangs."""

    def __init__(
        self, request: Request, done: Deferred[None], clock: IReactorTime, idle_timeout: float
    ) -> None:
        self.request = request
        self.done = done
        self.relayed = 0
        self.stopped = False
        self.paused = False
        self._clock = clock
        self._idle_timeout = idle_timeout
        self._idle: IDelayedCall | None = None
        self._last_data = clock.seconds()
        self._counted = 0
        self._client_sizes: tuple[int, int] | None = None
        self.splicer: Splicer | None = None
        self._take_over: IDelayedCall | None = None

    def connectionMade(self) -> None:
        channel = self.request.channel
        if channel is not None:
            self._client_sizes = _widen(channel.transport, read=RELAY_READ, buffered=RELAY_BUFFERED)
        self.request.registerProducer(self, True)
        self._watch()

    def dataReceived(self, data: bytes) -> None:
        if self.stopped:
            return  # the client is gone; the node's connection is closing
        # Read by the timer when it fires (no timer moved per piece of body).
        self._last_data = self._clock.seconds()
        self.request.write(data)
        self.relayed += len(data)
        if self.relayed - self._counted >= METRIC_EVERY:
            self._count()

    def _count(self) -> None:
        metrics.ARCHIVE_STREAM_BYTES.inc(self.relayed - self._counted)
        self._counted = self.relayed

    def _narrow(self) -> None:
        """The client's connection back to Twisted's sizes (it is kept alive
        for other requests)."""
        sizes, self._client_sizes = self._client_sizes, None
        channel = self.request.channel
        transport = channel.transport if channel is not None else None
        if sizes is not None and isinstance(transport, FileDescriptor):
            transport.bufferSize, transport.SEND_LIMIT = sizes

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:
        if self.splicer is not None:
            return  # the splicer ended the body and closed the node's connection
        self._unwatch()
        self._count()
        self._narrow()
        # A request whose client went away has no channel left to unregister from.
        if self.request.producer is not None and self.request.channel is not None:
            self.request.unregisterProducer()
        if self.done.called:
            return  # cancelled: the client went away first
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(None)
        else:
            self.done.errback(reason)

    # -- the request's producer

    def pauseProducing(self) -> None:
        self.paused = True
        self._unwatch()  # the client is slow, not the node
        self._node().pauseProducing()

    def resumeProducing(self) -> None:
        self.paused = False
        self._watch()
        self._node().resumeProducing()

    def stopProducing(self) -> None:
        self.stop()

    def stop(self) -> None:
        """The client went away: close the node's transfer."""
        self.stopped = True
        self._unwatch()
        if self._take_over is not None and self._take_over.active():
            self._take_over.cancel()
        self._take_over = None
        if self.splicer is not None:
            self.splicer.stop()
        elif self.transport is not None:
            self._node().stopProducing()

    # -- the kernel's way (splice.py)

    def splice(self, reactor: Any, length: int) -> None:
        """Hand the rest of the ``length`` bytes body to a :class:`Splicer`
        when both sides are plain TCP, on the reactor's next turn: the node's
        first read may hold more of the body than was delivered so far (the
        parser hands it over after the headers' callback)."""
        self._take_over = reactor.callLater(0, self._splice, reactor, length)

    def _splice(self, reactor: Any, length: int) -> None:
        self._take_over = None
        if self.done.called or self.stopped:
            return
        remaining = length - self.relayed
        node = getattr(self.transport, "_producer", None)
        channel = self.request.channel
        client = channel.transport if channel is not None else None
        if remaining <= 0 or not spliceable(node, client, reactor):
            return  # the relay goes on
        self._unwatch()  # the splicer keeps its own idle timer
        # The status line and headers into the client's transport first
        # (written with the first body bytes otherwise: none went yet).
        self.request.write(b"")
        if self.request.producer is self:
            self.request.unregisterProducer()
        self.splicer = Splicer(
            reactor,
            self._clock,
            node,
            client,
            channel,
            remaining,
            self._idle_timeout,
            self._spliced,
            self._splice_ended,
        )
        self.splicer.start()

    def _spliced(self, n: int) -> None:
        self.relayed += n
        self.request.sentLength += n  # the access log's byte count
        if self.relayed - self._counted >= METRIC_EVERY:
            self._count()

    def _splice_ended(self, failure: Failure | None) -> None:
        self._count()
        self._narrow()
        if self.done.called:
            return  # cancelled: the client went away first
        if failure is None:
            self.done.callback(None)
        else:
            self.done.errback(failure)

    # -- the idle timer

    def _node(self) -> IPushProducer:
        # Twisted's client gives the body's protocol a transport that is
        # also the push producer of the node's socket.
        return cast(IPushProducer, self.transport)

    def _watch(self) -> None:
        """Time the node from now (its transfer starts, or the client is
        ready again)."""
        self._unwatch()
        self._last_data = self._clock.seconds()
        if not self.paused and not self.stopped:
            self._idle = self._clock.callLater(self._idle_timeout, self._went_idle)

    def _unwatch(self) -> None:
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None

    def _went_idle(self) -> None:
        self._idle = None
        quiet = self._clock.seconds() - self._last_data
        if quiet < self._idle_timeout:
            # Data came meanwhile: wait for what is left of the timeout.
            self._idle = self._clock.callLater(self._idle_timeout - quiet, self._went_idle)
            return
        log.info(
            "the node sent nothing for {seconds}s: closing its transfer", seconds=self._idle_timeout
        )
        self._node().stopProducing()


class _ErrorBody(Protocol):
    """Reads at most :data:`ERROR_BODY_LIMIT` bytes of a node's error answer."""

    def __init__(self, done: Deferred[bytes]) -> None:
        self.done = done
        self.data = b""

    def dataReceived(self, data: bytes) -> None:
        self.data += data[: max(0, ERROR_BODY_LIMIT - len(self.data))]

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:
        self.done.callback(self.data)


def _node_error_code(body: bytes) -> str:
    try:
        document = orjson.loads(body)
        code = document["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ""
    return code if isinstance(code, str) else ""


class ArchiveStreams:
    """The site's archive streams: the per-user bound and the HTTP client
    that reaches the nodes' serve endpoints (on ``reactor``, timed on
    ``clock``)."""

    def __init__(
        self,
        reactor: IReactorTCP,
        clock: IReactorTime,
        *,
        per_user: int,
        connect_timeout: float = CONNECT_TIMEOUT,
        headers_timeout: float = HEADERS_TIMEOUT,
        body_idle_timeout: float = BODY_IDLE_TIMEOUT,
    ) -> None:
        if per_user < 1:
            raise ValueError("per_user must be >= 1")
        self.per_user = per_user
        self._reactor = reactor
        self._clock = clock
        self._headers_timeout = headers_timeout
        self._body_idle_timeout = body_idle_timeout
        # A connection per transfer: none is left open when the site stops,
        # and a transfer the client abandoned closes its own.
        self._agent = Agent.usingEndpointFactory(
            reactor,
            _WideReadEndpoints(reactor, connect_timeout),
            pool=quiet_pool(reactor, persistent=False),
        )
        self._active: Counter[int] = Counter()

    def active(self, user_id: int | None = None) -> int:
        """Streams running now: ``user_id``'s, or everyone's."""
        if user_id is None:
            return sum(self._active.values())
        return self._active[user_id]

    @contextmanager
    def slot(self, user_id: int) -> Iterator[None]:
        """Hold one of ``user_id``'s streams while the block runs; ``429
        too_many_streams`` when all are taken."""
        if self._active[user_id] >= self.per_user:
            raise ApiError(
                "too_many_streams",
                f"at most {self.per_user} archives at once through the site per user: "
                "wait for one to finish",
                retry_after=1,
            )
        self._active[user_id] += 1
        metrics.ARCHIVE_STREAMS.inc()
        try:
            yield
        finally:
            metrics.ARCHIVE_STREAMS.dec()
            self._active[user_id] -= 1
            if self._active[user_id] <= 0:
                del self._active[user_id]

    async def relay(self, request: Request, url: str) -> None:
        """Answer ``request`` (GET or HEAD) with the node's answer to
        ``url`` (a signed link under its ``serveUrl``).  Raises
        :class:`ApiError` while nothing was written; after the headers went
        out, a failure closes the client's connection."""
        method = b"HEAD" if request.method == b"HEAD" else b"GET"
        headers = Headers()
        for name in PASSED_REQUEST_HEADERS:
            values = request.requestHeaders.getRawHeaders(name)
            if values:
                headers.setRawHeaders(name, values)
        response = await self._headers_of(method, url, headers)
        if response.code not in PASSED_STATUSES:
            await self._refusal(response)
        request.setResponseCode(response.code)
        for name in PASSED_RESPONSE_HEADERS:
            values = response.headers.getRawHeaders(name)
            if values:
                request.responseHeaders.setRawHeaders(name, values)
        if method == b"GET" and response.code != 304 and response.length is not UNKNOWN_LENGTH:
            # Twisted's client keeps a GET's Content-Length as the body's length.
            request.setHeader(b"content-length", str(response.length).encode("ascii"))
        request.responseHeaders.setRawHeaders(b"cache-control", [b"private, no-store"])
        done: Deferred[None] = Deferred()
        relay = _Relay(request, done, self._clock, self._body_idle_timeout)
        response.deliverBody(relay)  # what Twisted read of the body is written now
        if (
            method == b"GET"
            and response.code in (200, 206)
            and response.length is not UNKNOWN_LENGTH
        ):
            relay.splice(self._reactor, response.length)
        try:
            await done
        except CancelledError:
            relay.stop()  # the client went away
            raise
        except Exception as e:
            log.info(
                "the node's transfer of {url} broke after {n} bytes: {why}",
                url=url.split("?", 1)[0],
                n=relay.relayed,
                why=e,
            )
            # The headers went out: the client must not take this for the
            # whole file.
            request.loseConnection()
            try:
                await request.notifyFinish()  # klein cancels this answer then
            except Exception:
                pass
            raise CancelledError() from None

    async def _headers_of(self, method: bytes, url: str, headers: Headers) -> IResponse:
        asked = self._agent.request(method, url.encode("ascii"), headers)
        asked.addTimeout(self._headers_timeout, self._clock)
        try:
            return await asked
        except CancelledError:
            raise
        except (
            ConnectError,
            ConnectingCancelledError,
            DNSLookupError,
            DeferredTimeout,
            ResponseNeverReceived,
            ResponseFailed,
        ) as e:
            raise ApiError(
                "node_unreachable",
                f"the node holding the archive did not answer the site: {type(e).__name__}",
                retry_after=RETRY_AFTER,
            ) from None

    async def _refusal(self, response: IResponse) -> None:
        """Raise the JSON error for a node's answer the site does not relay."""
        body: Deferred[bytes] = Deferred()
        response.deliverBody(_ErrorBody(body))
        try:
            code = _node_error_code(await body.addTimeout(self._headers_timeout, self._clock))
        except (DeferredTimeout, PartialDownloadError):
            code = ""
        if response.code == 503:
            after = response.headers.getRawHeaders(b"retry-after") or [b""]
            seconds = int(after[0]) if after[0].isdigit() else RETRY_AFTER
            raise ApiError(
                "node_busy",
                "the node holding the archive serves as many transfers as it may: try again",
                retry_after=min(seconds, 3600),
            )
        named = f" ({code})" if code else ""
        raise ApiError(
            "node_error",
            f"the node holding the archive refused the site's link: HTTP {response.code}{named}",
        )
