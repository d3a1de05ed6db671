"""The metrics the alert rules read (deploy/prometheus/tasknet-rules.yml)
beyond the counters: the /healthz mirror and the per-user, per-node and
per-instance gauges sampled from the database, over real loopback HTTP."""

from __future__ import annotations

from typing import Any

import pytest_twisted

from tasknet.site import metrics
from tests.ui.test_metrics import _sample, _scrape

HEALTHY = {"recovery": "done", "dispatch": "enabled", "database": "ok"}
SAMPLE: dict[str, Any] = {"states": {}, "statuses": {}, "nodeBytes": {}}


@pytest_twisted.inlineCallbacks
def test_health_and_database_gauges_follow_each_scrape() -> Any:
    documents = [
        HEALTHY,
        {"recovery": "failed", "dispatch": "disabled", "database": "ok"},
        {**HEALTHY, "database": "failing since 2026-12-01T20:41:07.120Z"},
    ]
    read: list[bool] = []

    def refresh() -> None:
        if metrics.set_health(documents.pop(0)):
            read.append(True)
            metrics.set_sampled(SAMPLE)

    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_database_up") == 1
    assert _sample(body, "tasknet_dispatch_enabled") == 1
    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_dispatch_enabled") == 0
    assert _sample(body, "tasknet_database_up") == 1
    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_database_up") == 0
    assert read == [True, True]  # not read while the database does not answer


@pytest_twisted.inlineCallbacks
def test_a_failed_refresh_reports_the_database_down() -> Any:
    def refresh() -> None:
        metrics.set_health(HEALTHY)
        raise RuntimeError("database is locked")

    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_database_up") == 0
    _, body = yield _scrape(lambda: metrics.set_health(HEALTHY))
    assert _sample(body, "tasknet_database_up") == 1


@pytest_twisted.inlineCallbacks
def test_sampled_users_nodes_and_instances_replace_the_last_sample() -> Any:
    first = {
        **SAMPLE,
        "quota": {"alice": (4600, 5000), "bob": (10, 800)},
        "nodes": {"n1": (3, 1_796_000_000.5), "n9": (1, None)},
        "instances": {"open": 2, "ended": 5, "reaped": 1},
    }
    _, body = yield _scrape(lambda: metrics.set_sampled(first))
    assert _sample(body, "tasknet_user_quota_used", user="alice") == 4600
    assert _sample(body, "tasknet_user_quota", user="bob") == 800
    assert _sample(body, "tasknet_node_unfinished_tasks", node="n9") == 1
    assert _sample(body, "tasknet_node_last_report_timestamp_seconds", node="n1") == 1_796_000_000.5
    assert 'tasknet_node_last_report_timestamp_seconds{node="n9"}' not in body
    assert _sample(body, "tasknet_site_instances", status="reaped") == 1
    second = {**first, "quota": {"bob": (20, 800)}, "nodes": {}}
    _, body = yield _scrape(lambda: metrics.set_sampled(second))
    # Only these sampled gauges: other metrics of the process's one registry
    # (counters other tests drove) may name the same node or user.
    for gauge in ("tasknet_user_quota", "tasknet_user_quota_used"):
        assert f'{gauge}{{user="alice"}}' not in body
    assert _sample(body, "tasknet_user_quota_used", user="bob") == 20
    for gauge in ("tasknet_node_unfinished_tasks", "tasknet_node_last_report_timestamp_seconds"):
        assert f'{gauge}{{node="n1"}}' not in body
