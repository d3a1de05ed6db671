# ruff: noqa: F811 -- pytest fixtures imported from test_views_browser
"""Issue 21 in headless Chromium against real processes: a list for
thousands (compact rows, "50 of 3,000", page sizes, bulk delete), deep
links, the header, queued/offline rows and the charts' axes.

The 3,000 tasks are written straight into the running site's SQLite
database with the site's own storage functions (reserve → begin_submit →
persist_submitted, then assigned to ``ghost-node``, a node that never
connects, so no real node downloads them).  Every page is watched for page
errors, console errors and CSP violations (the fixtures of
test_views_browser).  Screenshots go to ``$TASKNET_SCREENSHOTS``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DemoStack, NodeSpec
from tests.ui.conftest import demo_running, require_browser, screenshot_dir, seed_submitted
from tests.ui.test_views_browser import (  # noqa: F401  (fixtures)
    Watched,
    api,
    browser,
    expect,
    open_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 360, "height": 740}
SEEDED = 3000
FIRST_GID = 5_000_001
GHOST = "ghost-node"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    require_browser()
    demo = DemoStack(
        tmp_path_factory.mktemp("list") / "stack",
        nodes=(NodeSpec("node-1", 2, "list-secret-1"),),
        ready_timeout=90.0,
    )
    with demo_running(demo):
        seed_submitted(demo.database, range(FIRST_GID, FIRST_GID + SEEDED), GHOST)
        yield demo


@pytest.fixture(scope="module")
def shots() -> Path:
    return screenshot_dir()


def count_text(page: Any) -> str:
    return page.locator("#tasks-count").inner_text()


def rows_in_view(page: Any) -> int:
    """How many task rows fit in one viewport, the list's top at the viewport's top."""
    return page.evaluate(
        """() => {
          const rows = [...document.querySelectorAll('#task-list > li')];
          const top = rows[0].getBoundingClientRect().top;
          const fits = (r) => r.getBoundingClientRect().bottom - top <= window.innerHeight;
          return rows.filter(fits).length;
        }"""
    )


def to_english(page: Any) -> None:
    if page.evaluate("document.documentElement.lang") != "en":
        page.click("#lang-toggle")


def to_chinese(page: Any) -> None:
    if page.evaluate("document.documentElement.lang") != "zh-CN":
        page.click("#lang-toggle")


def test_compact_rows_count_and_header(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    for name, viewport, least in (("desktop", DESKTOP, 12), ("phone", PHONE, 4)):
        for lang in ("en", "zh"):
            w = open_page(locale="en-US" if lang == "en" else "zh-CN", viewport=viewport)
            page = w.page
            (to_english if lang == "en" else to_chinese)(page)
            expect()(page.locator("#task-list > li")).to_have_count(50, timeout=WAIT_MS)
            # "50 of 3,000" (the list's total, or the counts).
            expect()(page.locator("#tasks-count")).to_have_attribute("data-shown", "50")
            text = count_text(page)
            assert re.search(r"50\D+3[,，]?0\d\d", text), text
            # The signed-in user and the site's name in the header.
            who = page.locator("#who")
            expect()(who).to_be_visible()
            expect()(who).to_contain_text("demo")
            assert rows_in_view(page) >= least, (name, lang, rows_in_view(page))
            page.locator("#task-list").scroll_into_view_if_needed()
            page.screenshot(path=str(shots / f"tasks-{name}-{lang}.png"))


def test_search_gid_substring_sorts_and_filters(
    stack: DemoStack, open_page: Callable[..., Watched]
) -> None:
    page = open_page(viewport=DESKTOP).page
    expect()(page.locator("#task-list > li")).to_have_count(50, timeout=WAIT_MS)
    # Full-width digits, a substring from the middle of a gid.
    page.fill("#task-search", "００１７７")
    expect()(page.locator('#task-list > li[data-gid="5000177"]')).to_have_count(1, timeout=WAIT_MS)
    page.fill("#task-search", "")
    # A deep link with a sort and a favourite filter survives a reload.
    for order in ("size", "progress", "status"):
        page.select_option("#task-order", order)
        expect()(page).to_have_url(re.compile(f"order={order}"))
    page.select_option("#task-order", "newest")
    page.check("#task-favorite")
    expect()(page).to_have_url(re.compile("fav=1"))
    page.reload()
    expect()(page.locator("#task-favorite")).to_be_checked(timeout=WAIT_MS)


def test_deep_links(stack: DemoStack, open_page: Callable[..., Watched]) -> None:
    page = open_page(viewport=DESKTOP).page
    for link, visible in (
        ("#admin", "#admin-section"),
        ("#charts", "#view-charts"),
        ("#tasks?status=completed", "#tasks-section"),
        ("#tasks?status=attention&order=oldest", "#tasks-section"),
    ):
        page.goto(stack.url + link)
        page.reload()
        expect()(page.locator(visible)).to_be_visible(timeout=WAIT_MS)
        assert page.evaluate("location.hash") == link
    expect()(page.locator('#status-tabs [data-filter="attention"]')).to_have_attribute(
        "aria-pressed", "true"
    )
    expect()(page.locator("#task-order")).to_have_value("oldest")


def test_offline_rows_node_panel_and_charts(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    task = api(stack, "GET", f"/api/tasks/{FIRST_GID}").body["task"]
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        for lang in ("en", "zh"):
            page = open_page(locale="en-US" if lang == "en" else "zh-CN", viewport=viewport).page
            (to_english if lang == "en" else to_chinese)(page)
            row = page.locator(f'#task-list > li[data-gid="{FIRST_GID + SEEDED - 1}"]')
            expect()(row).to_be_visible(timeout=WAIT_MS)
            if "nodeConnected" in task:
                expect()(row.locator('[data-role="note"]')).to_contain_text(GHOST)
                expect()(row.locator('[data-role="speed"]')).to_have_count(0)
            page.screenshot(path=str(shots / f"offline-row-{name}-{lang}.png"))
            page.goto(stack.url + "#charts")
            expect()(page.locator("#view-charts")).to_be_visible(timeout=WAIT_MS)
            expect()(page.locator('#chart-usage [data-role="axis-max"]')).to_be_visible(
                timeout=WAIT_MS
            )
            axis = page.locator('#chart-usage [data-role="axis-max"]').bounding_box()
            assert axis is not None and axis["x"] >= 0, axis  # not clipped at the left edge
            page.screenshot(path=str(shots / f"charts-{name}-{lang}.png"), full_page=True)
            page.goto(stack.url + "#admin")
            expect()(page.locator('#nodes-body tr[data-node="node-1"]')).to_be_visible(
                timeout=WAIT_MS
            )
            if name == "phone":
                # The card's label column (``td::before``, attr(data-label)) is
                # there: the label is set and the value sits in the second
                # column (waited for: a language switch re-renders the table).
                page.wait_for_function(
                    """() => {
                      const e = document.querySelector(
                        '#nodes-body tr[data-node="node-1"] [data-role="state"]');
                      if (!e || !e.firstElementChild) return false;
                      const indent = e.firstElementChild.getBoundingClientRect().left
                        - e.getBoundingClientRect().left;
                      return ['State', '状态'].includes(e.getAttribute('data-label'))
                        && indent > 64;
                    }""",
                    timeout=WAIT_MS,
                )
            page.screenshot(path=str(shots / f"nodes-{name}-{lang}.png"), full_page=True)
    if "nodeConnected" not in task:
        pytest.xfail("the site does not send nodeConnected/stalledSince yet (issue 21 server side)")


@pytest.mark.timeout(420)  # 3,000 deletes and their pushes in a real browser, beside other workers
def test_bulk_delete_of_3000(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    page = open_page(viewport=DESKTOP).page
    page.goto(stack.url + "#tasks?size=500")
    page.reload()
    expect()(page.locator("#live")).to_have_attribute("data-state", "online", timeout=WAIT_MS)
    expect()(page.locator("#task-list > li")).to_have_count(500, timeout=WAIT_MS)
    page.wait_for_timeout(500)  # the reconnect's own refresh of the list has answered
    while page.locator("#tasks-more").is_visible():
        before = page.locator("#task-list > li").count()
        page.click("#tasks-more")
        page.wait_for_function(
            "n => document.querySelectorAll('#task-list > li').length > n",
            arg=before,
            timeout=WAIT_MS,
        )
    shown = page.locator("#task-list > li").count()
    assert shown >= SEEDED, shown
    page.check("#select-all")
    expect()(page.locator("#bulk-count")).to_contain_text(f"{shown:,}")
    page.click("#bulk-delete")
    page.click("#confirm-ok")
    # The outcome stays under the list bar (issue 36), not in the passing notice.
    # Waited for as a plain selector: each retry of a failing expect() builds
    # an ARIA snapshot of the 3,000 rows, which starved the page (20 s became
    # 140-260 s).
    outcome = '#bulk-result [data-role="bulk-outcome"]'
    page.wait_for_selector(outcome, timeout=300_000)
    expect()(page.locator(outcome)).to_contain_text(re.compile(r"done"))
    page.screenshot(path=str(shots / "bulk-delete-desktop-en.png"))
    # Every seeded task is gone or waits for its (never connected) node.
    listed = api(stack, "GET", "/api/tasks?q=500&limit=500").body["tasks"]
    assert all(t["status"] in ("DELETE_PENDING",) for t in listed if t["gid"] >= FIRST_GID), {
        t["status"] for t in listed
    }
