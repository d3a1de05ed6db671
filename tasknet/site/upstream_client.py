"""The upstream archive service, seen from the site (treq), with the outcome
classification the lifecycle depends on.

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
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any

import treq
from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss

from tasknet.site import metrics

MAX_BODY = 1024 * 1024  # no sane answer of ours is larger


class Outcome(enum.Enum):
    OK = "ok"
    REFUSED = "refused"
    AMBIGUOUS = "ambiguous"


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
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str = ""


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


def _read_body(response: Any) -> Deferred[_Answer]:
    reader = _BodyReader(MAX_BODY)
    response.deliverBody(reader)
    return reader.done.addCallback(lambda body: _Answer(response.code, body))


def _describe(failure: Failure) -> str:
    if failure.check(TimeoutError):
        return failure.getErrorMessage()
    if failure.check(CancelledError):
        return "cancelled before an answer arrived"
    value = failure.value
    # ResponseFailed / ResponseNeverReceived wrap the real reasons.
    reasons = getattr(value, "reasons", None)
    if reasons:
        inner = "; ".join(f"{r.type.__name__}: {r.getErrorMessage()}" for r in reasons)
        return f"{type(value).__name__} ({inner})"
    return f"{type(value).__name__}: {failure.getErrorMessage()}"


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _error_text(status: int, document: Any, body: bytes) -> str:
    if isinstance(document, dict) and isinstance(document.get("error"), dict):
        error = document["error"]
        return f"HTTP {status}: {error.get('code', '')}: {error.get('message', '')}"
    return f"HTTP {status}: {body[:200]!r}"


def _has_error_body(document: Any) -> bool:
    return isinstance(document, dict) and "error" in document


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class UpstreamClient:
    """The site's client of the upstream at ``base_url`` (own connection pool)."""

    def __init__(
        self,
        base_url: str,
        *,
        reactor: Any = None,
        prepare_timeout: float = 10.0,
        audit_timeout: float = 2.0,
        persistent: bool = True,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.base_url = base_url.rstrip("/")
        self.prepare_timeout = prepare_timeout
        self.audit_timeout = audit_timeout
        self._reactor = reactor
        self._pool = HTTPConnectionPool(reactor, persistent=persistent)
        self._pool.retryAutomatically = False  # a POST is never retried behind our back

    def _url(self, gid: int, suffix: str = "") -> str:
        return f"{self.base_url}/api/galleries/{gid}{suffix}"

    def _exchange(self, method: str, url: str, timeout: float, **kwargs: Any) -> Deferred[_Answer]:
        """One request and its whole body, cancelled (connection aborted) at ``timeout``."""
        d: Deferred[Any] = treq.request(
            method, url, pool=self._pool, reactor=self._reactor, **kwargs
        )
        d.addCallback(_read_body)
        deadline = self._reactor.callLater(timeout, d.cancel)

        def finished(result: Any) -> Any:
            if deadline.active():
                deadline.cancel()
            elif isinstance(result, Failure):
                # Cancelled by the deadline (whatever wrapper the agent put on it).
                return Failure(TimeoutError(f"no complete answer within {timeout:g}s (timeout)"))
            return result

        return d.addBoth(finished)

    def prepare(
        self, gid: int, token: str, timeout: float | None = None
    ) -> Deferred[PrepareResult]:
        """Read-only metadata lookup (``GET /api/galleries/{gid}?token=``): the
        title and the cost, before anything is charged."""
        started = time.monotonic()
        d = self._exchange(
            "GET",
            self._url(gid),
            timeout if timeout is not None else self.prepare_timeout,
            params={"token": token},
        )

        def answered(answer: _Answer) -> PrepareResult:
            document = _json(answer.body)
            if (
                answer.status == 200
                and isinstance(document, dict)
                and _is_int(document.get("cost"))
            ):
                return PrepareResult(
                    PrepareOutcome.OK,
                    title=str(document.get("title", "")),
                    cost=int(document["cost"]),
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
            metrics.record_upstream_call("prepare", outcome, time.monotonic() - started)
            return result

        return d.addCallbacks(answered, failed).addCallback(count)

    def submit(self, gid: int, token: str, timeout: float) -> Deferred[SubmitResult]:
        """The archive POST (not idempotent: call it once per generation),
        classified as ``OK`` / ``REFUSED`` / ``AMBIGUOUS``.  Never fails."""
        started = time.monotonic()
        d = self._exchange(
            "POST",
            self._url(gid, "/archive"),
            timeout,
            data=json.dumps({"token": token}).encode("utf-8"),
            headers={"Content-Type": ["application/json"]},
        )

        def answered(answer: _Answer) -> SubmitResult:
            document = _json(answer.body)
            if 200 <= answer.status < 300:
                if (
                    isinstance(document, dict)
                    and isinstance(document.get("archiveUrl"), str)
                    and document["archiveUrl"]
                    and _is_int(document.get("cost"))
                    and document["cost"] >= 0
                ):
                    return SubmitResult(
                        Outcome.OK,
                        archive_url=document["archiveUrl"],
                        cost=int(document["cost"]),
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
            return SubmitResult(Outcome.AMBIGUOUS, error=_describe(failure))

        def count(result: SubmitResult) -> SubmitResult:
            metrics.record_upstream_call("submit", result.outcome.value, time.monotonic() - started)
            return result

        return d.addCallbacks(answered, failed).addCallback(count)

    def audit(self, gid: int, timeout: float | None = None) -> Deferred[dict[str, Any]]:
        """The upstream's read-only record of archive POSTs for ``gid``
        (``GET /api/galleries/{gid}/archive``); fails with :class:`UpstreamError`."""
        started = time.monotonic()
        d = self._exchange(
            "GET",
            self._url(gid, "/archive"),
            timeout if timeout is not None else self.audit_timeout,
        )

        def answered(answer: _Answer) -> dict[str, Any]:
            document = _json(answer.body)
            if answer.status == 200 and isinstance(document, dict):
                metrics.record_upstream_call("audit", "ok", time.monotonic() - started)
                return document
            metrics.record_upstream_call("audit", "error", time.monotonic() - started)
            raise UpstreamError(_error_text(answer.status, document, answer.body))

        def failed(failure: Failure) -> dict[str, Any]:
            if failure.check(UpstreamError):
                failure.raiseException()
            metrics.record_upstream_call("audit", "error", time.monotonic() - started)
            raise UpstreamError(_describe(failure))

        return d.addCallback(answered).addErrback(failed)

    def close(self) -> Deferred[None]:
        """Close the pooled connections (on service stop)."""
        return self._pool.closeCachedConnections()
