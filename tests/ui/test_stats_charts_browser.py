"""The charts over 24 hours (issue 23): ``/api/stats`` answers quarter-hour
buckets for long windows, and the chart draws one point per bucket, its
per-node bars from ``nodes`` (plus one bar for ``other`` when more nodes
downloaded than ``nodeLimit``).  The demo stack and browser fixtures are
those of ``test_views_browser`` (a stack of this module's own)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

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
        "() => Number(document.querySelector('#chart-throughput svg')?.dataset.points) === 96",
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


# Every label of one kind in a chart, as [left, right] boxes, and the chart's width.
_LABEL_BOXES = """svg => {
  const width = svg.getBoundingClientRect().width, left = svg.getBoundingClientRect().left;
  const boxes = {};
  svg.querySelectorAll('text[data-role]').forEach(t => {
    const r = t.getBoundingClientRect();
    const role = t.dataset.role;
    (boxes[role] = boxes[role] || []).push([r.left - left, r.right - left, t.textContent]);
  });
  return {width, boxes};
}"""


@pytest.mark.parametrize("locale", ["en-US", "zh-CN"])
def test_charts_on_a_phone_over_24_hours_neither_overlap_nor_clip(
    stack: DemoStack,  # noqa: F811
    open_page: Callable[..., Watched],  # noqa: F811
    locale: str,
) -> None:
    """Issue 36, item 11: at 360 px the 24 h time labels and the weekly
    values and labels stay inside the chart and apart ("31,60920", "12:00 A"
    before); the summary says the peak is one bucket's average and of how long."""
    reply = api(stack, "GET", "/api/stats?window=86400")
    assert reply.status == 200, reply.brief()
    answer = dict(reply.body)
    # The last bucket on a round hour: its time label sits on the right edge.
    end = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    answer["buckets"] = [
        dict(
            b,
            start=(end - timedelta(seconds=900 * (95 - i))).isoformat().replace("+00:00", "Z"),
            bytes=(i % 7) * 900_000,
        )
        for i, b in enumerate(answer["buckets"])
    ]
    weeks = [{"week": f"2026-W{n:02d}", "used": 31_609 if n % 2 else 20} for n in range(39, 51)]
    answer["usage"] = dict(answer["usage"], quota=40_000, weeks=weeks)
    page = open_page(locale=locale, viewport={"width": 360, "height": 740}).page
    page.route(
        "**/api/stats?window=86400",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(answer)
        ),
    )
    page.click("#nav-charts")
    page.select_option("#charts-window", "86400")
    page.wait_for_function(
        "() => Number(document.querySelector('#chart-throughput svg')?.dataset.points) === 96",
        timeout=WAIT_MS,
    )
    for chart in ("#chart-throughput svg", "#chart-usage svg"):
        found = page.locator(chart).evaluate(_LABEL_BOXES)
        for role, boxes in found["boxes"].items():
            for left, right, text in boxes:
                assert 0 <= left and right <= found["width"] + 0.5, (chart, role, text, left, right)
            ordered = sorted(boxes)
            for (_, right, one), (left, _, other) in zip(ordered, ordered[1:], strict=False):
                assert right <= left, (chart, role, one, other)
    assert found["boxes"]["week-label"], found
    summary = page.locator("#chart-throughput-summary").inner_text()
    assert (
        "the average over 15 minutes" if locale == "en-US" else "每 15 分钟的平均速度"
    ) in summary
