"""The charts over 24 hours (issue 23): ``/api/stats`` answers quarter-hour
buckets for long windows, and the chart draws one point per bucket, its
per-node bars from ``nodes`` (plus one bar for ``other`` when more nodes
downloaded than ``nodeLimit``).  The demo stack and browser fixtures are
those of ``test_views_browser`` (a stack of this module's own)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tasknet.cli.demo import DemoStack
from tests.eventually import eventually_blocking
from tests.ui.conftest import gid_with_size
from tests.ui.test_views_browser import (  # noqa: F401 (fixtures)
    WAIT_MS,
    Watched,
    api,
    browser,
    completed,
    create,
    expect,
    open_page,
    stack,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_charts_over_24_hours_have_a_point_per_quarter_hour(
    stack: DemoStack,  # noqa: F811
    open_page: Callable[..., Watched],  # noqa: F811
) -> None:
    gid = gid_with_size(300_000, 400_000, 1_800_001)
    create(stack, gid, "for the 24 h chart")
    eventually_blocking(
        lambda: completed(stack, gid), 60.0, what="the chart task to complete", longest=0.2
    )
    reply = api(stack, "GET", "/api/stats?window=86400")
    assert reply.status == 200, reply.brief()
    answer = reply.body
    assert answer["bucketSeconds"] == 900 and len(answer["buckets"]) == 96
    assert answer["nodes"] and answer["otherNodes"] == 0
    page = open_page().page
    page.click("#nav-charts")
    expect()(page.locator("#view-charts")).to_be_visible()
    page.select_option("#charts-window", "86400")
    page.wait_for_function(
        "() => Number(document.querySelector('#chart-throughput svg').dataset.points) === 96",
        timeout=WAIT_MS,
    )
    assert "last 24 hours" in page.locator("#chart-throughput-summary").inner_text()
    bars = page.locator('#chart-nodes svg[data-chart="bars"] rect[data-role="series"]')
    expect()(bars).to_have_count(len(answer["nodes"]))
    values = [int(v) for v in bars.evaluate_all("els => els.map(e => e.dataset.value)")]
    assert sum(values) > 0, values


def test_the_nodes_past_the_top_are_one_bar(
    stack: DemoStack,  # noqa: F811
    open_page: Callable[..., Watched],  # noqa: F811
) -> None:
    # An answer with more nodes than the demo has: the site's, with 3 more
    # nodes' bytes in `other` (the browser sees it through a route).
    reply = api(stack, "GET", "/api/stats?window=3600")
    assert reply.status == 200, reply.brief()
    answer = dict(reply.body)
    answer["otherNodes"] = 3
    answer["buckets"] = [
        dict(b, other=1_000_000 if i == 0 else 0) for i, b in enumerate(answer["buckets"])
    ]
    answer["buckets"][0]["bytes"] += 1_000_000
    page = open_page().page
    page.route(
        "**/api/stats?window=3600",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(answer)
        ),
    )
    page.click("#nav-charts")
    expect()(page.locator("#view-charts")).to_be_visible()
    bars = page.locator('#chart-nodes svg[data-chart="bars"] rect[data-role="series"]')
    expect()(bars).to_have_count(len(answer["nodes"]) + 1, timeout=WAIT_MS)
    assert int(bars.last.get_attribute("data-value") or 0) == 1_000_000
    assert "3 other nodes" in page.locator("#chart-nodes-summary").inner_text()
