"""The upstream archive service, seen from the site (a Twisted ``Agent``;
persistent connections for the GETs, a fresh one per POST), with the
outcome classification the lifecycle depends on.

``prepare`` and ``audit`` are read-only GETs.  ``submit`` is the one
non-idempotent POST (every call is charged), so its answer is classified with
care (LIFECYCLE.md invariant 3):

* ``OK``: 2xx with a JSON body carrying ``archiveUrl`` (str) and ``cost`` (int);
* ``REFUSED``: 4xx with a JSON error body ``{"error": ...}``: the upstream
  says it did not act; nothing was charged;
* ``AMBIGUOUS``: everything else: timeout, dropped or reset connection, 5xx
  (the upstream may have acted before failing), a 4xx without an error body
  (maybe a proxy), a body that is not the expected JSON.  The POST may or may
  not have been applied; only reconciliation can tell.

Each call has a deadline covering the whole exchange (connect, headers *and*
body); past it the request is cancelled, which aborts the connection.

The GETs reuse idle persistent connections.  The POST never does: it goes on
a fresh connection, closed after its answer.  An idle pooled connection may
have just been closed by the upstream (its idle timeout, a restart) without
the client having seen it yet; a request written on it fails without an
answer, which for the POST is indistinguishable from "sent, then lost", so a
create that was never sent would become ``UNKNOWN``.  One connect per create
is cheap next to that.

Two calls per create make this a hot path, so it uses ``Agent`` directly, not
treq: treq wraps every request in cookie, redirect and gzip agents, parses
the URL with IDNA each time and streams bytes bodies through a cooperator
task, which together cost as much reactor time as the request itself
(py-spy, B2).  None of that is wanted here: the upstream sets no cookies, a
redirect must never make us POST again, and bodies are small JSON.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard
from urllib.parse import urlencode

from hyperlink import EncodedURL
from twisted.internet.defer import CancelledError, Deferred, TimeoutError, gatherResults, succeed
from twisted.internet.interfaces import IConsumer, IReactorTCP, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    Agent,
    ResponseDone,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from tasknet.failures import cannot_reach, plain_words
from tasknet.json_types import JsonObject, JsonValue
from tasknet.netclient import DirectEndpoints, quiet_pool
from tasknet.site import metrics

MAX_BODY = 1024 * 1024  # no sane answer of ours is larger
#: Idle upstream connections kept for reuse: about the creates in flight at once.
MAX_IDLE_CONNECTIONS = 64


class Outcome(enum.Enum):
    OK = "ok"
    REFUSED = "refused"
    AMBIGUOUS = "ambiguous"
    #: The POST gate closed before the first byte: nothing was sent.
    NOT_SENT = "not_sent"


class NotSent(Exception):
    """The POST's gate refused it once its connection was up: not one byte
    of the request was written (the message says why)."""


#: Asked once the POST's connection is up, just before its first byte is
#: written: ``None`` lets it go, a reason stops it (SCALE.md "Fencing" 1).
PostGate = Callable[[], "str | None"]


@dataclass(frozen=True)
class SubmitResult:
    outcome: Outcome
    archive_url: str = ""
    cost: int = 0
    status: int | None = None
    error: str = ""


class PrepareOutcome(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # 404: no such gallery upstream
    REFUSED = "refused"  # another 4xx with an error body (e.g. a bad token)
    UNAVAILABLE = "unavailable"  # anything else: timeout, 5xx, bad answer


@dataclass(frozen=True)
class PrepareResult:
    outcome: PrepareOutcome
    title: str = ""
    cost: int = 0
    metadata: JsonObject = field(default_factory=dict)
    error: str = ""

    @property
    def size(self) -> int | None:
        """The archive size in bytes, when the upstream gave a sane one."""
        size = self.metadata.get("size")
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            return size
        return None


class UpstreamError(Exception):
    """A read-only call (``audit``) failed; the message says how."""


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes


class _BodyReader(Protocol):
    """Collects a response body, up to ``limit`` bytes; cancelling its
    Deferred stops the transfer and closes the connection."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.done: Deferred[bytes] = Deferred(self._cancel)

    def _cancel(self, _: Deferred[bytes]) -> None:
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        if self.done.called:
            return
        self.size += len(data)
        if self.size > self.limit:
            self._cancel(self.done)
            self.done.errback(ValueError(f"answer larger than {self.limit} bytes"))
            return
        self.chunks.append(data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        if self.done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self.chunks))
        else:
            self.done.errback(reason)


@implementer(IBodyProducer)
class BytesBody:
    """A request body already in memory, written in one go (the stock
    ``FileBodyProducer`` schedules a cooperator task for it)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


_JSON_HEADERS = {b"Content-Type": [b"application/json"]}


@implementer(IAgentEndpointFactory)
class _GatedEndpoints:
    """``endpoints``, each connection asked ``gate`` the moment it is up,
    before the agent writes the request on it (the agent writes in a
    callback chained after this one, so nothing runs between the two but
    these few instructions): a refusal aborts the connection unwritten."""

    def __init__(self, endpoints: IAgentEndpointFactory, gate: PostGate) -> None:
        self._endpoints = endpoints
        self._gate = gate

    def endpointForURI(self, uri: URI) -> Any:  # an IStreamClientEndpoint
        return _GatedEndpoint(self._endpoints.endpointForURI(uri), self._gate)


class _GatedEndpoint:
    def __init__(self, endpoint: Any, gate: PostGate) -> None:
        self._endpoint = endpoint
        self._gate = gate

    def connect(self, factory: Any) -> Deferred[Any]:
        def gated(protocol: Any) -> Any:
            refusal = self._gate()
            if refusal is not None:
                protocol.transport.abortConnection()
                raise NotSent(refusal)
            return protocol

        d: Deferred[Any] = self._endpoint.connect(factory)
        return d.addCallback(gated)


def _not_sent(failure: Failure) -> NotSent | None:
    """The :class:`NotSent` inside ``failure`` (the agent may wrap it)."""
    if failure.check(NotSent):
        return failure.value  # type: ignore[return-value]
    for reason in getattr(failure.value, "reasons", None) or ():
        if isinstance(reason, Failure) and reason.check(NotSent):
            return reason.value  # type: ignore[return-value]
    return None


def _read_body(response: IResponse) -> Deferred[_Answer]:
    reader = _BodyReader(MAX_BODY)
    response.deliverBody(reader)
    return reader.done.addCallback(lambda body: _Answer(response.code, body))


def _describe(failure: Failure) -> str:
    if failure.check(TimeoutError):
        return failure.getErrorMessage()
    if failure.check(CancelledError):
        return "cancelled before an answer arrived"
    value = failure.value
    # Words, not an exception's text (it reaches API messages and the
    # evidence a person reads: issue 36, item 9); the rest as before.
    # ResponseFailed / ResponseNeverReceived wrap the real reasons.
    reasons = getattr(value, "reasons", None)
    if reasons:
        said = [
            plain_words(r.value) or f"{r.type.__name__}: {r.getErrorMessage()}" for r in reasons
        ]
        return "; ".join(dict.fromkeys(said))
    words = None if value is None else plain_words(value)
    if words is not None:
        return words
    return f"{type(value).__name__}: {failure.getErrorMessage()}"


def _json(body: bytes) -> JsonValue:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _error_text(status: int, document: JsonValue, body: bytes) -> str:
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict):
        return f"HTTP {status}: {error.get('code', '')}: {error.get('message', '')}"
    return f"HTTP {status}: {body[:200]!r}"


def _has_error_body(document: JsonValue) -> bool:
    return isinstance(document, dict) and "error" in document


def _is_int(value: JsonValue) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class UpstreamReach:
    """Whether this site's own calls reach the upstream (issue 36, item 9:
    a banner on every page says so, whatever tasks the page shows).

    Any answer, even an error, is reach; a call that found nothing there
    (refused, no route, unknown host, no answer before its timeout) is not.
    ``failing_since``: the site clock's time of the first such call since
    the last answer (``None``: the last call was answered, or none was
    made); ``reason``: its words."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self.failing_since: float | None = None
        self.reason: str | None = None

    def answered(self) -> None:
        self.failing_since = None
        self.reason = None

    def not_reached(self, reason: str) -> None:
        if self.failing_since is None:
            self.failing_since = self._clock.seconds()
            self.reason = reason


class UpstreamClient:
    """The site's client of the upstream at ``base_url`` (own connection pool).

    ``reactor``: its root's (the site's, the admin tool's, a test's): the
    TCP its connections go over and, adapted to ``IReactorTime``, the clock
    of its timeouts and call durations."""

    def __init__(
        self,
        base_url: str,
        *,
        reactor: IReactorTCP,
        prepare_timeout: float = 10.0,
        audit_timeout: float = 2.0,
        persistent: bool = True,
        max_idle_connections: int = MAX_IDLE_CONNECTIONS,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # Parsed and IDNA-encoded once, not per request.
        self._base = EncodedURL.from_text(self.base_url).to_uri().to_text().encode("ascii")
        self.prepare_timeout = prepare_timeout
        self.audit_timeout = audit_timeout
        self._reactor: IReactorTime = IReactorTime(reactor)
        #: Whether the last calls reached the upstream (the API's ``/api/upstream``).
        self.reach = UpstreamReach(self._reactor)
        self._pool = quiet_pool(reactor, persistent=persistent)
        self._pool.retryAutomatically = False  # a POST is never retried behind our back
        # Twisted keeps 2 idle connections per host by default: with more
        # creates in flight than that, most calls paid a fresh TCP connection
        # (a resolver thread round trip, connect, close) on the reactor.
        self._pool.maxPersistentPerHost = max_idle_connections
        # Built once per scheme/host/port; an IP literal dialled straight.
        endpoints = DirectEndpoints(reactor)
        self._endpoints = endpoints
        self._agent = Agent.usingEndpointFactory(reactor, endpoints, pool=self._pool)
        # The POST's own: never a pooled (possibly stale) connection.
        self._fresh_pool = quiet_pool(reactor, persistent=False)
        self._fresh_pool.retryAutomatically = False
        self._fresh_agent = Agent.usingEndpointFactory(reactor, endpoints, pool=self._fresh_pool)

    def _url(self, gid: int, suffix: str = "", query: dict[str, str] | None = None) -> bytes:
        url = b"%s/api/galleries/%d%s" % (self._base, gid, suffix.encode("ascii"))
        return url + b"?" + urlencode(query).encode("ascii") if query else url

    def _exchange(
        self,
        method: bytes,
        url: bytes,
        timeout: float,
        body: bytes | None = None,
        *,
        fresh: bool = False,
        gate: PostGate | None = None,
    ) -> Deferred[_Answer]:
        """One request and its whole body, cancelled (connection aborted) at
        ``timeout``; on a new connection of its own if ``fresh`` (or if a
        ``gate`` is to be asked on it before its first byte)."""
        producer: IBodyProducer | None = BytesBody(body) if body is not None else None
        if gate is not None:
            agent = Agent.usingEndpointFactory(
                self._reactor, _GatedEndpoints(self._endpoints, gate), pool=self._fresh_pool
            )
        else:
            agent = self._fresh_agent if fresh else self._agent
        d: Deferred[Any] = agent.request(
            method, url, Headers(_JSON_HEADERS) if body is not None else None, producer
        )
        d.addCallback(_read_body)
        deadline = self._reactor.callLater(timeout, d.cancel)

        def finished(result: Any) -> Any:
            if deadline.active():
                deadline.cancel()
            elif isinstance(result, Failure) and _not_sent(result) is None:
                # Cancelled by the deadline (whatever wrapper the agent put on it).
                result = Failure(TimeoutError(f"no complete answer within {timeout:g}s (timeout)"))
                self.reach.not_reached(str(result.value))
                return result
            if isinstance(result, _Answer):
                self.reach.answered()
            elif isinstance(result, Failure) and _not_sent(result) is None:
                words = _describe(result)
                if cannot_reach(words):
                    self.reach.not_reached(words)
            return result

        return d.addBoth(finished)

    def prepare(
        self, gid: int, token: str, timeout: float | None = None
    ) -> Deferred[PrepareResult]:
        """Read-only metadata lookup (``GET /api/galleries/{gid}?token=``): the
        title and the cost, before anything is charged."""
        started = self._reactor.seconds()
        d = self._exchange(
            b"GET",
            self._url(gid, query={"token": token}),
            timeout if timeout is not None else self.prepare_timeout,
        )

        def answered(answer: _Answer) -> PrepareResult:
            document = _json(answer.body)
            cost = document.get("cost") if isinstance(document, dict) else None
            if answer.status == 200 and isinstance(document, dict) and _is_int(cost):
                return PrepareResult(
                    PrepareOutcome.OK,
                    title=str(document.get("title", "")),
                    cost=int(cost),
                    metadata=document,
                )
            error = _error_text(answer.status, document, answer.body)
            if answer.status == 404:
                return PrepareResult(PrepareOutcome.MISSING, error=error)
            if 400 <= answer.status < 500 and _has_error_body(document):
                return PrepareResult(PrepareOutcome.REFUSED, error=error)
            return PrepareResult(PrepareOutcome.UNAVAILABLE, error=error)

        def failed(failure: Failure) -> PrepareResult:
            return PrepareResult(PrepareOutcome.UNAVAILABLE, error=_describe(failure))

        def count(result: PrepareResult) -> PrepareResult:
            outcome = {
                PrepareOutcome.OK: "ok",
                PrepareOutcome.MISSING: "refused",
                PrepareOutcome.REFUSED: "refused",
                PrepareOutcome.UNAVAILABLE: "error",
            }[result.outcome]
            metrics.record_upstream_call("prepare", outcome, self._reactor.seconds() - started)
            return result

        return d.addCallbacks(answered, failed).addCallback(count)

    def submit(
        self, gid: int, token: str, timeout: float, *, gate: PostGate | None = None
    ) -> Deferred[SubmitResult]:
        """The archive POST (not idempotent: call it once per generation),
        classified as ``OK`` / ``REFUSED`` / ``AMBIGUOUS``, or ``NOT_SENT``
        when ``gate``, asked once the connection is up and before the first
        byte, refused it.  Never fails."""
        started = self._reactor.seconds()
        d = self._exchange(
            b"POST",
            self._url(gid, "/archive"),
            timeout,
            body=json.dumps({"token": token}).encode("utf-8"),
            fresh=True,
            gate=gate,
        )

        def answered(answer: _Answer) -> SubmitResult:
            document = _json(answer.body)
            if 200 <= answer.status < 300:
                url = document.get("archiveUrl") if isinstance(document, dict) else None
                cost = document.get("cost") if isinstance(document, dict) else None
                if isinstance(url, str) and url and _is_int(cost) and cost >= 0:
                    return SubmitResult(
                        Outcome.OK,
                        archive_url=url,
                        cost=int(cost),
                        status=answer.status,
                    )
                return SubmitResult(
                    Outcome.AMBIGUOUS,
                    status=answer.status,
                    error=f"HTTP {answer.status} with an unusable body: {answer.body[:200]!r}",
                )
            error = _error_text(answer.status, document, answer.body)
            if 400 <= answer.status < 500 and _has_error_body(document):
                return SubmitResult(Outcome.REFUSED, status=answer.status, error=error)
            return SubmitResult(Outcome.AMBIGUOUS, status=answer.status, error=error)

        def failed(failure: Failure) -> SubmitResult:
            refused = _not_sent(failure)
            if refused is not None:
                return SubmitResult(Outcome.NOT_SENT, error=str(refused))
            return SubmitResult(Outcome.AMBIGUOUS, error=_describe(failure))

        def count(result: SubmitResult) -> SubmitResult:
            metrics.record_upstream_call(
                "submit", result.outcome.value, self._reactor.seconds() - started
            )
            return result

        return d.addCallbacks(answered, failed).addCallback(count)

    def audit(self, gid: int, timeout: float | None = None) -> Deferred[JsonObject]:
        """The upstream's read-only record of archive POSTs for ``gid``
        (``GET /api/galleries/{gid}/archive``); fails with :class:`UpstreamError`."""
        started = self._reactor.seconds()
        d = self._exchange(
            b"GET",
            self._url(gid, "/archive"),
            timeout if timeout is not None else self.audit_timeout,
        )

        def answered(answer: _Answer) -> JsonObject:
            document = _json(answer.body)
            if answer.status == 200 and isinstance(document, dict):
                metrics.record_upstream_call("audit", "ok", self._reactor.seconds() - started)
                return document
            metrics.record_upstream_call("audit", "error", self._reactor.seconds() - started)
            raise UpstreamError(_error_text(answer.status, document, answer.body))

        def failed(failure: Failure) -> JsonObject:
            if failure.check(UpstreamError):
                failure.raiseException()
            metrics.record_upstream_call("audit", "error", self._reactor.seconds() - started)
            raise UpstreamError(_describe(failure))

        return d.addCallback(answered).addErrback(failed)

    def close(self) -> Deferred[None]:
        """Close the pooled connections (on service stop)."""
        return gatherResults(
            [self._pool.closeCachedConnections(), self._fresh_pool.closeCachedConnections()]
        ).addCallback(lambda _: None)
