"""The mock upstream's HTTP API (INTERFACES.md "Mock upstream HTTP API").

``UpstreamApp`` holds all state (journal, fault table) and serves it with
klein. Every non-``/_drill`` request is counted, then offered to the fault
table; the fault decides whether the handler (and its side effect) runs and
how (or whether) the answer reaches the client. ``/_drill/*`` is the control
plane and is never faulted, so a broad rule cannot lock a drill out.

Usage in-process::

    app = UpstreamApp(None, clock=reactor, rng=random.Random(seed))
    port = reactor.listenTCP(0, app.site(), interface="127.0.0.1")
    ...
    await app.close_connections()   # aborts hung and streaming requests

Everything that varies comes from what the composition root hands in
(``tasknet.upstream.service.makeService``, or ``testing.start_upstream``):
time only from ``clock`` (the journal's times, latencies, throttling, the
HTTP channels' timeouts, the ``Date`` header), chance only from ``rng`` (the
fault table's probability draws). Nothing iterates in an order that depends
on object addresses or string hashes, so the same reactor and seed give the
same bytes and the same events (SIMULATION.md).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from klein import Klein
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import datetimeToString
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from werkzeug.exceptions import MethodNotAllowed, NotFound

from tasknet.upstream import catalog
from tasknet.upstream.faults import FaultRule, FaultRuleError, FaultTable, parse_rules
from tasknet.upstream.journal import Journal
from tasknet.upstream.streaming import (
    ArchiveSource,
    BodySource,
    BodyStreamer,
    ByteRangeError,
    BytesSource,
    parse_range,
)
from tasknet.upstream.tracking import ConnectionTracker
from tasknet.weblog import QuietSite

log = Logger()

_GID_TEXT = re.compile(r"[0-9]{1,12}")
_FILE_NAME = re.compile(r"([0-9]{1,12})-([0-9]{1,12})\.bin")


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Reply:
    status: int
    body: BodySource
    headers: dict[str, str] = field(default_factory=dict)
    throttled: bool = False  # archive bytes: subject to --bandwidth

    @classmethod
    def json(cls, status: int, document: object) -> Reply:
        data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(status, BytesSource(data), {"Content-Type": "application/json; charset=utf-8"})

    @classmethod
    def error(cls, status: int, code: str, message: str) -> Reply:
        return cls.json(status, {"error": {"code": code, "message": message}})


def parse_gid(text: str) -> int:
    """A gid from a path segment; HttpError 400 if not an integer, 404 if out of range."""
    if not _GID_TEXT.fullmatch(text):
        raise HttpError(400, "invalid_request", f"gid must be a decimal integer, got {text!r}")
    gid = int(text)
    try:
        return catalog.check_gid(gid)
    except catalog.InvalidGid as e:
        raise HttpError(404, "not_found", str(e)) from None


class _Send(Resource):
    """Klein renders this leaf: it streams the reply and finishes the request."""

    isLeaf = True

    def __init__(self, streamer: BodyStreamer) -> None:
        super().__init__()
        self._streamer = streamer

    def render(self, request: Request) -> Any:  # type: ignore[override]
        self._streamer.start()
        return NOT_DONE_YET


class UpstreamApp:
    """The upstream's state and HTTP API.

    ``clock``: the reactor (or any ``IReactorTime``) every timer and every
    time read goes to. ``rng``: the app's own random source (the fault
    table's probability draws); the app rewinds it to the state it was given
    in on ``reset``, so it must not be shared.
    """

    router = Klein()

    def __init__(
        self,
        bandwidth: float | None = None,
        *,
        clock: IReactorTime,
        rng: random.Random,
    ) -> None:
        if bandwidth is not None and bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
        self.bandwidth = bandwidth
        self.clock = clock
        self.journal = Journal()
        self.faults = FaultTable(rng)
        # Insertion-ordered (a dict, not a set): dropping them aborts the
        # connections in the order they hung, never in address order.
        self._hung: dict[Request, None] = {}
        self._tracker: ConnectionTracker | None = None

    # -- wiring ---------------------------------------------------------------

    def resource(self) -> Resource:
        return self.router.resource()

    def site(self) -> ConnectionTracker:
        """A protocol factory serving this app that tracks its connections."""
        if self._tracker is None:
            # Access lines at debug (the mock's log shows faults, not every GET);
            # the channels' timeouts and the log-date timer run on our clock.
            site = QuietSite(self.resource(), reactor=self.clock)
            self._tracker = ConnectionTracker(site)
        return self._tracker

    def close_connections(self) -> Deferred[None]:
        """Abort every open connection (hung, streaming, idle); fires when all are gone."""
        self.drop_hung()
        if self._tracker is None:
            return succeed(None)
        return self._tracker.abort_all()

    def drop_hung(self) -> int:
        """Abort the connections of requests a ``timeout`` fault is holding."""
        hung = list(self._hung)
        self._hung.clear()
        for request in hung:
            if request.transport is not None:
                request.transport.abortConnection()  # type: ignore[attr-defined]
        return len(hung)

    def reset(self) -> None:
        """Clear counts, charges, journal and faults; reseed; drop hung requests."""
        self.journal.reset()
        self.faults.reset()
        self.drop_hung()

    def set_faults(self, document: object) -> None:
        """Replace the rules from a ``{"rules": [...]}`` document (FaultRuleError if bad)."""
        self.faults.replace(parse_rules(document))

    def clear_faults(self) -> None:
        self.faults.clear()
        self.drop_hung()

    # -- upstream API ----------------------------------------------------------

    @router.route("/api/galleries/<gid>", methods=["GET"])
    def get_gallery(self, request: Request, gid: str) -> Any:
        return self._serve(
            request, lambda: Reply.json(200, catalog.gallery(parse_gid(gid)).to_json())
        )

    @router.route("/api/galleries/<gid>/archive", methods=["POST"])
    def submit_archive(self, request: Request, gid: str) -> Any:
        if _GID_TEXT.fullmatch(gid):
            self.journal.record_post_attempt(int(gid))
        return self._serve(request, lambda: self._submit(request, parse_gid(gid)))

    @router.route("/api/galleries/<gid>/archive", methods=["GET"])
    def audit_archive(self, request: Request, gid: str) -> Any:
        return self._serve(request, lambda: self._audit(request, parse_gid(gid)))

    def _audit(self, request: Request, gid: int) -> Reply:
        # The last archive URL lets a reconciler that judges "submitted" hand
        # the node a file without a second (charged) POST.
        audit = self.journal.audit(gid)
        n = audit["submissions"]
        audit["archiveUrl"] = f"{_base_url(request)}/files/{gid}-{n}.bin" if n else None
        return Reply.json(200, audit)

    @router.route("/files/<name>", methods=["GET"])
    def get_file(self, request: Request, name: str) -> Any:
        return self._serve(request, lambda: self._file(request, name))

    def _submit(self, request: Request, gid: int) -> Reply:
        gallery = catalog.gallery(gid)
        entry = self.journal.submit(gid, gallery.cost, self.clock.seconds())
        url = f"{_base_url(request)}/files/{gid}-{entry.submission}.bin"
        return Reply.json(200, {"archiveUrl": url, "cost": gallery.cost})

    def _file(self, request: Request, name: str) -> Reply:
        match = _FILE_NAME.fullmatch(name)
        if match is None or int(match.group(2)) < 1:
            raise HttpError(404, "not_found", f"no such file {name!r} (expected GID-N.bin)")
        gid = parse_gid(match.group(1))
        size = catalog.gallery(gid).size
        range_header = _header(request, "range")
        self.journal.record_file_get(name, ranged=range_header is not None)
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        try:
            byte_range = parse_range(range_header, size)
        except ByteRangeError:
            reply = Reply.error(416, "range_not_satisfiable", f"file size is {size} bytes")
            reply.headers["Content-Range"] = f"bytes */{size}"
            return reply
        if byte_range is None:
            return Reply(200, ArchiveSource(gid, 0, size), headers, throttled=True)
        start, end = byte_range
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        return Reply(206, ArchiveSource(gid, start, end), headers, throttled=True)

    # -- drill control plane (never faulted, not counted) ------------------------

    @router.route("/_drill/stats", methods=["GET"])
    def drill_stats(self, request: Request) -> Any:
        stats = self.journal.stats()
        stats["faultsFired"] = self.faults.fired_total
        stats["hung"] = len(self._hung)
        return self._send(request, Reply.json(200, stats))

    @router.route("/_drill/journal", methods=["GET"])
    def drill_journal(self, request: Request) -> Any:
        return self._send(request, Reply.json(200, self.journal.to_json()))

    @router.route("/_drill/faults", methods=["GET"])
    def drill_get_faults(self, request: Request) -> Any:
        return self._send(request, Reply.json(200, self.faults.to_json()))

    @router.route("/_drill/faults", methods=["PUT"])
    def drill_put_faults(self, request: Request) -> Any:
        assert request.content is not None
        try:
            document = json.loads(request.content.read())
            self.set_faults(document)
        except (ValueError, UnicodeDecodeError) as e:
            # FaultRuleError is a ValueError; so is json.JSONDecodeError.
            message = str(e) if isinstance(e, FaultRuleError) else f"body is not valid JSON: {e}"
            return self._send(request, Reply.error(400, "invalid_request", message))
        log.info("fault rules replaced: {rules}", rules=self.faults.to_json()["rules"])
        return self._send(request, Reply.json(200, self.faults.to_json()))

    @router.route("/_drill/faults", methods=["DELETE"])
    def drill_clear_faults(self, request: Request) -> Any:
        self.clear_faults()
        return self._send(request, Reply.json(200, self.faults.to_json()))

    @router.route("/_drill/reset", methods=["POST"])
    def drill_reset(self, request: Request) -> Any:
        self.reset()
        return self._send(request, Reply.json(200, {"reset": True}))

    # klein types an error handler's request as IRequest; it is always a server Request.
    @router.handle_errors(NotFound)
    def not_found(self, request: IRequest, failure: Failure) -> Any:
        path = request.path.decode("utf-8", "replace")
        return self._send(
            cast(Request, request), Reply.error(404, "not_found", f"no route for {path}")
        )

    @router.handle_errors(MethodNotAllowed)
    def method_not_allowed(self, request: IRequest, failure: Failure) -> Any:
        method = request.method.decode("ascii", "replace")
        return self._send(
            cast(Request, request),
            Reply.error(405, "method_not_allowed", f"{method} is not allowed here"),
        )

    # -- request pipeline ----------------------------------------------------------

    def _serve(self, request: Request, handler: Callable[[], Reply]) -> Any:
        """Count the request, let a fault act on it, run the handler, answer."""
        method = request.method.decode("ascii", "replace")
        path = request.path.decode("utf-8", "replace")
        entry = self.journal.record_request(
            method, path, _header(request, "range"), self.clock.seconds()
        )
        rule = self.faults.take(method, path)
        if rule is None:
            return self._send(request, _run(handler), throttle=True)
        entry["fault"] = rule.fault
        log.debug("fault {fault} on {method} {path}", fault=rule.fault, method=method, path=path)
        if rule.fault == "latency":
            delayed = _sleep(self.clock, rule.params["ms"] / 1000.0)
            return delayed.addCallback(lambda _: self._send(request, _run(handler), throttle=True))
        if not rule.runs_handler:
            return self._refuse(request, rule)
        return self._after_handler(request, rule, _run(handler))

    def _refuse(self, request: Request, rule: FaultRule) -> Any:
        """Faults acting before the handler: nothing was applied."""
        if rule.fault == "drop_before":
            return self._drop(request)
        if rule.fault == "missing":
            return self._send(request, Reply.error(404, "not_found", "no such gallery"))
        if rule.fault == "reject":
            message = "the upstream refused the request; nothing was charged"
            return self._send(request, Reply.error(rule.params["status"], "rejected", message))
        assert rule.fault == "error"
        return self._send(request, _injected_error(rule))

    def _after_handler(self, request: Request, rule: FaultRule, reply: Reply) -> Any:
        """Faults acting after the handler applied its side effect."""
        if rule.fault == "timeout":
            return self._hang(request)
        if rule.fault == "commit_then_drop":
            return self._drop(request)
        if rule.fault == "error":
            return self._send(request, _injected_error(rule))
        if rule.fault == "slow_body":
            return self._send(request, reply, throttle=True, rate=rule.params["bytes_per_s"])
        assert rule.fault == "reset_mid_body"
        return self._send(request, reply, throttle=True, cut_after=rule.params["after_bytes"])

    def _send(
        self,
        request: Request,
        reply: Reply,
        *,
        throttle: bool = False,
        rate: float | None = None,
        cut_after: int | None = None,
    ) -> _Send:
        if throttle and reply.throttled and self.bandwidth is not None:
            rate = self.bandwidth if rate is None else min(rate, self.bandwidth)
        request.setResponseCode(reply.status)
        # twisted.web stamped Date from the wall clock; the app's clock says when.
        request.setHeader("Date", datetimeToString(self.clock.seconds()))
        for name, value in reply.headers.items():
            request.setHeader(name, value)
        request.setHeader("Content-Length", str(reply.body.length))
        streamer = BodyStreamer(request, reply.body, self.clock, rate=rate, cut_after=cut_after)
        return _Send(streamer)

    def _hang(self, request: Request) -> Deferred[None]:
        """Never answer. Klein cancels this Deferred when the client goes away."""
        self._hung[request] = None
        request.notifyFinish().addBoth(lambda _: self._hung.pop(request, None))
        return Deferred()

    def _drop(self, request: Request) -> Deferred[None]:
        assert request.transport is not None
        request.transport.abortConnection()  # type: ignore[attr-defined]
        return Deferred()  # cancelled by klein once the connection is gone


def _sleep(clock: IReactorTime, seconds: float) -> Deferred[None]:
    """Fires after ``seconds``; cancelling it (klein does, on disconnect) cancels the timer."""
    delayed: Deferred[None] = Deferred(lambda _: call.cancel())
    call = clock.callLater(seconds, delayed.callback, None)
    return delayed


def _run(handler: Callable[[], Reply]) -> Reply:
    try:
        return handler()
    except HttpError as e:
        return Reply.error(e.status, e.code, e.message)


#: The body of an injected error without an error body: what a proxy in
#: front of the upstream answers (``body: false``).
PROXY_ERROR_PAGE = b"<html><body><h1>%d</h1>the server is unavailable</body></html>"


def _injected_error(rule: FaultRule) -> Reply:
    status = rule.params["status"]
    if not rule.params.get("body", True):
        return Reply(status, BytesSource(PROXY_ERROR_PAGE % status), {"Content-Type": "text/html"})
    return Reply.error(status, "upstream_error", "injected upstream error")


def _header(request: Request, name: str) -> str | None:
    value = request.getHeader(name)
    if value is None:
        return None
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _base_url(request: Request) -> str:
    host = _header(request, "host")
    if not host:
        address = request.getHost()
        host = f"{address.host}:{address.port}"  # type: ignore[attr-defined]
    return f"http://{host}"
