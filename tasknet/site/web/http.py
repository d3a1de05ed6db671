"""The site's HTTP transport: bounds and headers that hold before any
resource runs (INTERFACES.md, "Bounds, failures and secrets").

* **Body limit** (``--max-body``, default 1 MiB): checked on
  ``Content-Length`` as soon as the headers are in, and on the running total
  of a chunked body, before the body is buffered and before authentication.
  Past it the answer is ``413 payload_too_large`` (error envelope) and the
  connection is closed.
* **Slow clients**: a connection that has not sent a complete request within
  :data:`REQUEST_TIMEOUT` seconds of its first byte (of the connection, for
  the first request) gets ``408`` and is closed; one that sits idle for
  :data:`IDLE_TIMEOUT` seconds is closed (twisted.web's idle timeout).  Both
  run on the factory's reactor, so a ``task.Clock`` drives them in tests.
* **Security headers** (:data:`SECURITY_HEADERS`) on every answer: the
  resources' answers, the error answers written here, twisted's own.
* **Bad paths**: a NUL or another control character in the (decoded) path is
  ``404 not_found`` before routing (the static file resource would raise on
  it).
* **Access log without secrets**: twisted.web's access line names the
  request URI and the ``Referer``; :func:`access_log_line` writes it with
  ``?token=`` and every other secret parameter redacted
  (``tasknet.logging.redact_secrets``), so a WebSocket handshake refused
  with its token in the URL leaves no token in the log.  The lines go to
  ``--access-log PATH``, or are debug events, not info lines of the main
  log (:mod:`tasknet.weblog`).

A refused body is answered with a *lingering close*: the site stops writing
(FIN) and keeps reading and dropping what the client is still sending for up
to :data:`LINGER_SECONDS`, then aborts.  Closing at once with unread data
would make the kernel reset the connection, and a client still sending its
body would lose the ``413`` it was sent.
"""

from __future__ import annotations

import re
from typing import Any, cast
from urllib.parse import unquote_to_bytes

from twisted.internet.interfaces import IConsumer, IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.iweb import IAccessLogFormatter, IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.static import File
from zope.interface import provider

from tasknet.logging import redact_secrets
from tasknet.site.web.errors import STATUS, json_bytes, write_error
from tasknet.weblog import QuietSite

log = Logger()

DEFAULT_MAX_BODY = 1024 * 1024
REQUEST_TIMEOUT = 30.0
IDLE_TIMEOUT = 60.0
LINGER_SECONDS = 2.0

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"Content-Security-Policy", CONTENT_SECURITY_POLICY.encode("ascii")),
    (b"X-Content-Type-Options", b"nosniff"),
    (b"Referrer-Policy", b"no-referrer"),
    (b"X-Frame-Options", b"DENY"),
)

# NUL, C0 controls and DEL, after percent-decoding.
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def error_response(status: int, code: str, message: str) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 answer with the error
    envelope, for the answers written before (or instead of) a request."""
    body = json_bytes({"error": {"code": code, "message": message}})
    reason = http.RESPONSES.get(status, b"Error")
    lines = [
        b"HTTP/1.1 %d %s" % (status, reason),
        b"Content-Type: application/json; charset=utf-8",
        b"Content-Length: %d" % len(body),
        b"Cache-Control: no-store",
        b"Connection: close",
        *(name + b": " + value for name, value in SECURITY_HEADERS),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class BoundedRequest(server.Request):
    """A request that enforces the running body total and answers bad paths
    with ``404``; every answer carries :data:`SECURITY_HEADERS`."""

    channel: BoundedChannel
    _body_received = 0

    def handleContentChunk(self, data: bytes) -> None:
        channel = self.channel
        if channel is None or channel.refused:
            return
        self._body_received += len(data)
        if self._body_received > channel.max_body:
            channel.refuse_body()
            return
        super().handleContentChunk(data)

    def process(self) -> None:
        for name, value in SECURITY_HEADERS:
            self.setHeader(name, value)
        path = unquote_to_bytes(self.path)
        if _CONTROL.search(path) or not _is_utf8(path):
            # No resource has such a name (and the static file resource
            # would raise on a NUL, klein log a traceback on bad UTF-8).
            self._answer_error("not_found", "no such resource")
            return
        if not _is_utf8(self.getRequestHostname()):
            self._answer_error("invalid_request", "the Host header is not UTF-8")
            return
        super().process()

    def _answer_error(self, code: str, message: str) -> None:
        self.site = self.channel.site
        self.setResponseCode(STATUS[code])
        self.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        self.setHeader(b"Cache-Control", b"no-store")
        self.write(json_bytes({"error": {"code": code, "message": message}}))
        self.finish()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class BoundedChannel(http.HTTPChannel):
    """An HTTP/1.1 channel with the body limit and the request deadline."""

    site: BoundedSite
    refused = False
    _deadline: IDelayedCall | None = None
    _linger: IDelayedCall | None = None

    @property
    def max_body(self) -> int:
        return self.site.max_body

    def connectionMade(self) -> None:
        super().connectionMade()
        self._start_deadline()

    def dataReceived(self, data: bytes) -> None:
        if self.refused:
            return  # lingering: read and drop
        if self._deadline is None and not self._handlingRequest:
            self._start_deadline()  # the first byte of the next request
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        if self.length is not None and self.length > self.max_body:
            # Before gotLength: no buffer, no temp file, no 100-continue.
            self.refuse_body()
            return
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        if self.refused:
            return
        super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        if self.refused:
            return
        self._cancel_deadline()
        super().allContentReceived()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._cancel_deadline()
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        super().connectionLost(reason)

    # -- answers written by the channel -------------------------------------

    def refuse_body(self) -> None:
        self._refuse(
            413,
            "payload_too_large",
            f"the body is limited to {self.max_body} bytes",
        )

    def _respondToBadRequestAndDisconnect(self) -> None:
        # twisted.web's own answer to a malformed request line, header or
        # chunk: the same 400, with the envelope and the headers.
        if self.refused:
            return
        self.refused = True
        self._cancel_deadline()
        transport: Any = self.transport
        transport.write(error_response(400, "invalid_request", "malformed HTTP request"))
        self.loseConnection()

    def _request_timed_out(self) -> None:
        self._deadline = None
        seconds = self.site.request_timeout
        log.info(
            "closing {peer}: no complete request within {seconds}s",
            peer=str(self.getPeer()),
            seconds=seconds,
        )
        self._refuse(
            STATUS["request_timeout"],
            "request_timeout",
            f"no complete request within {seconds:g} s",
        )

    def _refuse(self, status: int, code: str, message: str) -> None:
        if self.refused:
            return
        self.refused = True
        self._cancel_deadline()
        self.setTimeout(None)
        # Typed IPushProducer by Twisted, it is the transport (or Twisted's
        # stand-in for one), which is also the consumer it registered with.
        cast(IConsumer, self._networkProducer).unregisterProducer()
        transport: Any = self.transport
        transport.write(error_response(status, code, message))
        lose_write = getattr(transport, "loseWriteConnection", None)
        if lose_write is None:
            transport.loseConnection()
            return
        lose_write()
        self._linger = self.callLater(self.site.linger, self._end_linger)

    def _end_linger(self) -> None:
        self._linger = None
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()

    def _start_deadline(self) -> None:
        self._cancel_deadline()
        self._deadline = self.callLater(self.site.request_timeout, self._request_timed_out)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None


class ErrorResource(Resource):
    """Answers every request with one error envelope."""

    isLeaf = True

    def __init__(self, code: str, message: str) -> None:
        super().__init__()
        self.code = code
        self.message = message

    def render(self, request: server.Request) -> bytes:
        return write_error(request, self.code, self.message)


class StaticFiles(File):
    """The UI's files; a missing one is the ``404`` envelope, not an HTML page."""

    childNotFound = ErrorResource("not_found", "no such resource")  # type: ignore[assignment]
    forbidden = ErrorResource("forbidden", "not allowed")  # type: ignore[assignment]


@provider(IAccessLogFormatter)
def access_log_line(timestamp: str, request: IRequest) -> str:
    """twisted.web's combined access log line, secrets redacted."""
    return redact_secrets(http.combinedLogFormatter(timestamp, request))


class BoundedSite(QuietSite):
    """``twisted.web.server.Site`` with :class:`BoundedChannel` and
    :class:`BoundedRequest`; ``reactor`` drives the timeouts.  Access lines
    go to ``access_log`` (a file, ``--access-log``) or are debug events
    (:class:`tasknet.weblog.QuietSite`)."""

    requestFactory = BoundedRequest

    def __init__(
        self,
        resource: IResource,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        request_timeout: float = REQUEST_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        linger: float = LINGER_SECONDS,
        reactor: IReactorTime,
        access_log: str | None = None,
    ) -> None:
        super().__init__(
            resource,
            logPath=access_log,
            timeout=idle_timeout,
            reactor=reactor,
            logFormatter=access_log_line,
            # Every body is JSON, read by its endpoint: no form or multipart
            # body is parsed into ``request.args`` (which holds the query
            # only), and no create pays twisted.web's 30 us Content-Type parse.
            parsePOSTFormSubmission=False,
        )
        self.max_body = max_body
        self.request_timeout = request_timeout
        self.linger = linger

    def protocol(self) -> BoundedChannel:  # type: ignore[override]
        # Plain HTTP/1.1 (no ALPN switch to HTTP/2): the channel is ours.
        return BoundedChannel()
