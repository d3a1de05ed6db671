"""``/metrics`` over real loopback HTTP: the text format and the names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Site

from tasknet.site import metrics

EXPECTED_FAMILIES = {
    "tasknet_tasks": "gauge",
    "tasknet_creates": "counter",
    "tasknet_upstream_calls": "counter",
    "tasknet_upstream_call_seconds": "histogram",
    "tasknet_reports": "counter",
    "tasknet_report_apply_seconds": "histogram",
    "tasknet_report_ack_seconds": "histogram",
    "tasknet_connected_nodes": "gauge",
    "tasknet_outbox_backlog": "gauge",
    "tasknet_webhook_failures": "counter",
    "tasknet_tasks_by_status": "gauge",
    "tasknet_bytes_downloaded": "counter",
    "tasknet_node_bytes_downloaded": "counter",
}


@defer.inlineCallbacks
def _scrape(refresh: Callable[[], Any] | None = None) -> Any:
    root = Resource()
    root.putChild(b"metrics", metrics.metrics_resource(refresh))
    port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Site(root))
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        url = f"http://127.0.0.1:{port.getHost().port}/metrics"
        response = yield treq.get(url, pool=pool)
        body = yield response.text()
        return response, body
    finally:
        yield port.stopListening()
        yield pool.closeCachedConnections()


def _families(body: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(body)}


def _sample(body: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name}{labels} in:\n{body}")


@pytest_twisted.inlineCallbacks
def test_serves_text_format_with_every_family() -> Any:
    metrics.CREATES.labels(outcome="created").inc()
    metrics.record_upstream_call("submit", "ok", 0.02)
    metrics.REPORTS.labels(result="APPLIED").inc()
    metrics.APPLY_LATENCY.observe(0.003)
    metrics.ACK_LATENCY.observe(0.004)
    metrics.WEBHOOK_FAILURES.inc()
    metrics.OUTBOX_BACKLOG.set(3)
    response, body = yield _scrape()
    assert response.code == 200
    assert response.headers.getRawHeaders("content-type")[0].startswith("text/plain")
    families = _families(body)
    for name, kind in EXPECTED_FAMILIES.items():
        assert name in families, f"{name} missing"
        assert families[name].type == kind, name
    assert _sample(body, "tasknet_outbox_backlog") == 3
    assert _sample(body, "tasknet_creates_total", outcome="created") >= 1
    assert _sample(body, "tasknet_upstream_call_seconds_count", call="submit") >= 1
    # Both protocol series exist before any node connects.
    _sample(body, "tasknet_connected_nodes", protocol="1")
    _sample(body, "tasknet_connected_nodes", protocol="2")


@pytest_twisted.inlineCallbacks
def test_counter_moves_between_scrapes() -> Any:
    _, before = yield _scrape()
    metrics.CREATES.labels(outcome="conflict").inc(2)
    _, after = yield _scrape()
    try:
        old = _sample(before, "tasknet_creates_total", outcome="conflict")
    except AssertionError:
        old = 0.0
    assert _sample(after, "tasknet_creates_total", outcome="conflict") == old + 2


@pytest_twisted.inlineCallbacks
def test_refresh_runs_before_each_scrape_and_replaces_task_counts() -> Any:
    counts = [{"SUBMITTED": 4, "UNKNOWN": 1}, {"SUBMITTED": 5}]

    def refresh() -> defer.Deferred[None]:
        # Asynchronous on purpose: the site's refresh reads the database.
        return deferLater(reactor, 0, metrics.set_task_counts, counts.pop(0))

    _, first = yield _scrape(refresh)
    assert _sample(first, "tasknet_tasks", state="SUBMITTED") == 4
    assert _sample(first, "tasknet_tasks", state="UNKNOWN") == 1
    _, second = yield _scrape(refresh)
    assert _sample(second, "tasknet_tasks", state="SUBMITTED") == 5
    assert _sample(second, "tasknet_tasks", state="UNKNOWN") == 0


@pytest_twisted.inlineCallbacks
def test_failed_refresh_still_serves_the_counters() -> Any:
    def refresh() -> None:
        raise RuntimeError("database is locked")

    response, body = yield _scrape(refresh)
    assert response.code == 200
    assert "tasknet_creates_total" in body


@pytest_twisted.inlineCallbacks
def test_no_created_series_and_every_state_and_status_from_the_first_scrape() -> Any:
    metrics.CREATES.labels(outcome="created").inc()
    metrics.UPSTREAM_LATENCY.labels(call="prepare").observe(0.01)
    _, body = yield _scrape()
    assert "_created" not in body
    for state in ("LEGACY", "RESERVED", "SUBMITTING", "SUBMITTED", "UNKNOWN"):
        _sample(body, "tasknet_tasks", state=state)
    for state in ("DELETE_PENDING", "DELETED"):
        _sample(body, "tasknet_tasks", state=state)
    for status in ("SUBMITTED", "DOWNLOADING", "COMPLETED", "SUBMIT_UNKNOWN", "DELETE_FAILED"):
        _sample(body, "tasknet_tasks_by_status", status=status)


@pytest_twisted.inlineCallbacks
def test_sampled_statuses_and_byte_counters() -> Any:
    def refresh() -> None:
        metrics.set_sampled(
            {
                "states": {"SUBMITTED": 3},
                "statuses": {"DOWNLOADING": 1, "COMPLETED": 2},
                "nodeBytes": {"n1": 1000, "n2": 24},
            }
        )

    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_tasks_by_status", status="DOWNLOADING") == 1
    assert _sample(body, "tasknet_tasks_by_status", status="COMPLETED") == 2
    assert _sample(body, "tasknet_bytes_downloaded_total") == 1024
    assert _sample(body, "tasknet_node_bytes_downloaded_total", node="n2") == 24
    families = _families(body)
    assert families["tasknet_node_bytes_downloaded"].type == "counter"
