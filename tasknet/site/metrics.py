"""Prometheus metrics of the main site, served at ``/metrics``.

Every metric lives in :data:`REGISTRY`, a private ``CollectorRegistry`` (not
the prometheus-client global one), so several sites in one test process never
collide and nothing else leaks into the page.  Other modules import the
objects below and update them; the names are the contract.

Counters (``.labels(...).inc()``):

``CREATES``  ``tasknet_creates_total{outcome}``
    one per ``POST /api/tasks`` answer.  ``outcome``: ``created`` (201),
    ``unknown`` (202), ``conflict`` (409), ``rejected`` (422),
    ``quota_exceeded`` (429), ``upstream_unavailable`` (502),
    ``invalid`` (400), ``error`` (500).
``UPSTREAM_CALLS``  ``tasknet_upstream_calls_total{call,outcome}``
    one per upstream HTTP call.  ``call``: ``prepare``, ``submit``, ``audit``;
    ``outcome``: ``ok``, ``refused``, ``ambiguous``, ``error``.
``REPORTS``  ``tasknet_reports_total{result}``
    one per node report handled.  ``result``: ``APPLIED``, ``DUPLICATE``,
    ``STALE``, ``FAILED`` (not committed, not ACKed), ``LEGACY``.
``WEBHOOK_FAILURES``  ``tasknet_webhook_failures_total``
    one per failed webhook delivery attempt.

Histograms (``.observe(seconds)``, or :func:`observe_since`):

``UPSTREAM_LATENCY``  ``tasknet_upstream_call_seconds{call}``
    wall time of one upstream call, whatever its outcome.
``APPLY_LATENCY``  ``tasknet_report_apply_seconds``
    time of the report-apply write transaction.
``ACK_LATENCY``  ``tasknet_report_ack_seconds``
    from a report's arrival to its ``TaskReportAck`` being sent.

Gauges:

``CONNECTED_NODES``  ``tasknet_connected_nodes{protocol}``
    ``.labels(protocol="2").inc()`` on attach, ``.dec()`` on detach.
``OUTBOX_BACKLOG``  ``tasknet_outbox_backlog``
    undelivered notification rows; ``.set(n)``.
``TASKS``  ``tasknet_tasks{state}``
    tasks by ``task_operation.state`` (``LEGACY`` for a row without one);
    set it with :func:`set_task_counts`, typically from the ``refresh``
    callable given to :func:`metrics_resource`, which runs before each scrape.

Helpers: :func:`record_upstream_call`, :func:`observe_since`,
:func:`set_task_counts`, :func:`render_latest`, :func:`metrics_resource`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request

log = Logger()

REGISTRY = CollectorRegistry(auto_describe=True)

# Upstream calls and transactions are sub-second in normal operation; the top
# buckets catch the submit timeout (30 s by default).
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

CREATES = Counter("tasknet_creates", "Create requests by outcome.", ["outcome"], registry=REGISTRY)
UPSTREAM_CALLS = Counter(
    "tasknet_upstream_calls",
    "Upstream HTTP calls by call and outcome.",
    ["call", "outcome"],
    registry=REGISTRY,
)
UPSTREAM_LATENCY = Histogram(
    "tasknet_upstream_call_seconds",
    "Upstream HTTP call latency.",
    ["call"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
REPORTS = Counter(
    "tasknet_reports", "Node reports handled, by result.", ["result"], registry=REGISTRY
)
APPLY_LATENCY = Histogram(
    "tasknet_report_apply_seconds",
    "Latency of the report-apply write transaction.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
ACK_LATENCY = Histogram(
    "tasknet_report_ack_seconds",
    "From a report's arrival to its ACK being sent.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
CONNECTED_NODES = Gauge(
    "tasknet_connected_nodes",
    "Connected nodes by protocol version.",
    ["protocol"],
    registry=REGISTRY,
)
OUTBOX_BACKLOG = Gauge(
    "tasknet_outbox_backlog", "Undelivered notification outbox rows.", registry=REGISTRY
)
WEBHOOK_FAILURES = Counter(
    "tasknet_webhook_failures", "Failed webhook delivery attempts.", registry=REGISTRY
)
TASKS = Gauge("tasknet_tasks", "Tasks by task_operation state.", ["state"], registry=REGISTRY)

# Show both protocol series from the first scrape, so a dashboard sees 0
# rather than "no data" before the first node connects.
for _protocol in ("1", "2"):
    CONNECTED_NODES.labels(protocol=_protocol)

_task_states_seen: set[str] = set()


def record_upstream_call(call: str, outcome: str, seconds: float) -> None:
    """Count one upstream call and observe its latency."""
    UPSTREAM_CALLS.labels(call=call, outcome=outcome).inc()
    UPSTREAM_LATENCY.labels(call=call).observe(seconds)


def observe_since(histogram: Any, started: float) -> float:
    """Observe ``time.monotonic() - started`` on ``histogram`` (or a labelled child); return it."""
    elapsed = time.monotonic() - started
    histogram.observe(elapsed)
    return elapsed


def set_task_counts(counts: Mapping[str, int]) -> None:
    """Replace the ``tasknet_tasks`` series: states missing from ``counts`` drop to 0."""
    for state in _task_states_seen - set(counts):
        TASKS.labels(state=state).set(0)
    for state, n in counts.items():
        TASKS.labels(state=state).set(n)
        _task_states_seen.add(state)


def render_latest() -> bytes:
    """The current metrics page in Prometheus text format."""
    return generate_latest(REGISTRY)


class MetricsResource(Resource):
    """``GET /metrics``: refresh the sampled gauges, then render :data:`REGISTRY`."""

    isLeaf = True

    def __init__(self, refresh: Callable[[], Deferred[Any] | None] | None = None) -> None:
        super().__init__()
        self._refresh = refresh

    def render_GET(self, request: Request) -> bytes | int:
        if self._refresh is None:
            return self._page(request)
        d = maybeDeferred(self._refresh)

        def failed(failure: Any) -> None:
            # A failed refresh must not hide the counters: serve stale gauges.
            log.failure("metrics refresh failed; serving the last sampled gauges", failure)

        d.addErrback(failed)
        d.addCallback(lambda _: self._finish(request))
        return NOT_DONE_YET

    def _page(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode("ascii"))
        request.setHeader(b"Cache-Control", b"no-store")
        return render_latest()

    def _finish(self, request: Request) -> None:
        if request._disconnected:  # the scraper gave up while we refreshed
            return
        request.write(self._page(request))
        request.finish()


def metrics_resource(refresh: Callable[[], Deferred[Any] | None] | None = None) -> IResource:
    """The ``/metrics`` resource.  ``refresh`` (optional) runs before every
    scrape and may return a Deferred, e.g. one reading task counts from the
    database and calling :func:`set_task_counts` and ``OUTBOX_BACKLOG.set``."""
    return cast(IResource, MetricsResource(refresh))
