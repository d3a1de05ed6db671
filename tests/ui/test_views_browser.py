"""The web UI's views for people with many tasks (issue 14), in headless
Chromium against real processes.

One :class:`DemoStack` per module (real ``twistd -n`` upstream throttled with
``--bandwidth``, a site, a v2 node and a legacy node) and one browser; each
test opens its own context (locale, viewport) and signs in through the form.
Every page is watched for page errors, console errors and CSP violations
(the site sends a strict Content-Security-Policy; the test checks it does).

Screenshots go to ``$TASKNET_SCREENSHOTS`` (default: a new temp dir).
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import Reply, request
from tasknet.site.storage.throughput import iso
from tests.eventually import eventually_blocking
from tests.ui.conftest import (
    CHROMIUM,
    CHROMIUM_ARGS,
    demo_running,
    gid_with_size,
    require_browser,
    screenshot_dir,
)
from tests.ui.signed_in import CSP_WATCH

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Slow enough that a 1 MB archive takes several seconds (speed and ETA show).
BANDWIDTH = 150_000
# Past it a create is UNKNOWN: long enough to watch the elapsed time count.
UPSTREAM_TIMEOUT = 4.0
WAIT_MS = 60_000
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 360, "height": 780}


@dataclass
class Watched:
    """A page and what went wrong on it."""

    page: Any
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    # Console errors a test provokes on purpose (e.g. a refused WebSocket).
    expected: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        csp = self.page.evaluate("window.__csp || []")
        # Chromium logs every 4xx answer as "Failed to load resource"; the UI
        # expects those (a 409, a 404 after a delete) and shows them.
        allowed = ["Failed to load resource", *self.expected]
        console = [e for e in self.console_errors if not any(a in e for a in allowed)]
        return [*self.page_errors, *console, *csp]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    require_browser()
    demo = DemoStack(
        tmp_path_factory.mktemp("views") / "stack",
        bandwidth=BANDWIDTH,
        nodes=(NodeSpec("node-1", 2, "views-secret-1"), NodeSpec("node-2", 1, "views-secret-2")),
        upstream_timeout=UPSTREAM_TIMEOUT,
        ready_timeout=90.0,
    )
    with demo_running(demo):
        yield demo


@pytest.fixture(scope="module")
def browser(stack: DemoStack) -> Iterator[Any]:
    sync_api = require_browser()
    playwright = sync_api.sync_playwright().start()
    chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    try:
        yield chromium
    finally:
        chromium.close()
        playwright.stop()


@pytest.fixture(scope="module")
def shots() -> Path:
    return screenshot_dir()


@pytest.fixture(scope="module")
def bob(stack: DemoStack) -> str:
    """The API token of a second, non-admin user."""
    db = stack.data_dir / "site" / "tasknet-site.sqlite"
    admin = Path(sys.executable).with_name("tasknet-admin")
    made = subprocess.run(
        [str(admin), "--db", str(db), "user", "add", "bob"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return made.stdout.strip()


@pytest.fixture
def open_page(browser: Any, stack: DemoStack) -> Iterator[Callable[..., Watched]]:
    """``open_page(locale=..., viewport=..., token=...)``: a fresh context,
    signed in through the form; its problems fail the test at the end."""
    contexts: list[Any] = []
    watched: list[Watched] = []

    def open_(
        locale: str = "en-US", viewport: dict[str, int] = DESKTOP, token: str | None = DEMO_TOKEN
    ) -> Watched:
        context = browser.new_context(locale=locale, viewport=viewport)
        contexts.append(context)
        context.add_init_script(CSP_WATCH)
        page = context.new_page()
        w = Watched(page)
        page.on("console", lambda m: w.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: w.page_errors.append(str(e)))
        watched.append(w)
        answer = page.goto(stack.url)
        assert answer is not None and "script-src 'self'" in (
            answer.headers.get("content-security-policy") or ""
        )
        if token is not None:
            sign_in(page, token)
        return w

    yield open_
    try:
        for w in watched:
            assert w.problems() == [], w.problems()
    finally:
        for context in contexts:
            context.close()


def expect() -> Any:
    return require_browser().expect


def sign_in(page: Any, token: str) -> None:
    page.fill("#token-input", token)
    page.press("#token-input", "Enter")
    expect()(page.locator("#app")).to_be_visible(timeout=WAIT_MS)
    expect()(page.locator("#live")).to_have_attribute("data-state", "online", timeout=WAIT_MS)


def api(
    stack: DemoStack, method: str, path: str, body: Any = None, token: str = DEMO_TOKEN
) -> Reply:
    return request(method, f"{stack.url}{path.lstrip('/')}", body, token=token)


def create(stack: DemoStack, gid: int, name: str = "", token: str = DEMO_TOKEN) -> dict[str, Any]:
    body: dict[str, Any] = {"gid": gid, "token": "upstream-token"}
    if name:
        body["name"] = name
    reply = api(stack, "POST", "/api/tasks", body, token=token)
    assert reply.status in (201, 202), reply.brief()
    return reply.body["task"]


def completed(stack: DemoStack, gid: int) -> bool:
    reply = api(stack, "GET", f"/api/tasks/{gid}")
    return reply.status == 200 and reply.body["task"]["status"] == "COMPLETED"


def row_gids(page: Any) -> list[int]:
    return [
        int(g)
        for g in page.eval_on_selector_all("#task-list > li", "els => els.map(e => e.dataset.gid)")
    ]


def expect_rows(page: Any, gids: list[int]) -> None:
    """Wait until the list shows exactly ``gids``, in that order."""
    wanted = [str(g) for g in gids]
    page.wait_for_function(
        "wanted => JSON.stringify([...document.querySelectorAll('#task-list > li')]"
        ".map(e => e.dataset.gid)) === JSON.stringify(wanted)",
        arg=wanted,
        timeout=WAIT_MS,
    )


def fault(stack: DemoStack, rule: dict[str, Any]) -> None:
    reply = request("PUT", f"{stack.upstream_url}/_drill/faults", {"rules": [rule]})
    assert reply.status == 200, reply.brief()


def no_horizontal_scroll(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"page is {width}px wide"


# -- language and dates ------------------------------------------------------------


def test_english_browser_gets_english_and_month_first_dates(
    stack: DemoStack, open_page: Callable[..., Watched]
) -> None:
    task = create(stack, gid_with_size(64 * 1024, 100_000, 1_100_001), "english dates")
    w = open_page(locale="en-US", token=None)
    page = w.page
    assert page.evaluate("document.documentElement.lang") == "en"
    expect()(page.locator("#sign-in-title")).to_have_text("Sign in")
    sign_in(page, DEMO_TOKEN)
    row = page.locator(f'#task-list > li[data-gid="{task["gid"]}"]')
    expect()(row.locator('[data-role="status"]')).not_to_be_empty()
    assert row.locator('[data-role="status"]').inner_text() in {
        "Submitted",
        "Downloading",
        "Waiting for compression",
        "Compressing",
        "Download complete",
    }
    # en-US: "Dec 1, 2026, 8:12:50 AM" (month first), from Intl, never day-first en-GB.
    created = row.locator('[data-role="created"], [data-role="completed"]').first.inner_text()
    assert re.match(r"^[A-Z][a-z]{2} \d{1,2}, \d{4}", created), created
    # The toggle still works and is remembered across a reload.
    page.click("#lang-toggle")
    expect()(page.locator("#tasks-title")).to_have_text("任务")
    page.reload()
    expect()(page.locator("#tasks-title, #sign-in-title").first).to_have_text(
        re.compile("任务|登录")
    )
    assert page.evaluate("document.documentElement.lang") == "zh-CN"


def test_chinese_browser_gets_chinese(open_page: Callable[..., Watched]) -> None:
    w = open_page(locale="zh-CN", token=None)
    page = w.page
    assert page.evaluate("document.documentElement.lang") == "zh-CN"
    expect()(page.locator("#sign-in-title")).to_have_text("登录")
    sign_in(page, DEMO_TOKEN)
    expect()(page.locator("#nav-tasks")).to_have_text("任务")
    expect()(page.locator('#status-tabs [data-filter="completed"]')).to_contain_text("已完成")


# -- the list: filter, search, counts, order, paging ----------------------------------


def test_filter_and_search(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    done = create(stack, gid_with_size(64 * 1024, 90_000, 1_200_001), "filter apple")
    other = create(stack, gid_with_size(64 * 1024, 90_000, done["gid"] + 1), "filter pear")
    eventually_blocking(
        lambda: completed(stack, done["gid"]) and completed(stack, other["gid"]),
        60.0,
        what="both small tasks to complete",
        longest=0.2,
    )
    w = open_page()
    page = w.page
    page.fill("#task-search", "filter apple")
    expect_rows(page, [done["gid"]])
    assert "q=filter+apple" in page.url or "q=filter%20apple" in page.url
    expect()(page.locator('#status-tabs [data-count="completed"]')).to_have_text("1")
    # By gid prefix.
    page.fill("#task-search", str(other["gid"]))
    expect_rows(page, [other["gid"]])
    page.fill("#task-search", "")
    # Status tab: only completed rows, and the choice survives a reload.
    page.click('#status-tabs [data-filter="completed"]')
    expect()(page.locator('#status-tabs [data-filter="completed"]')).to_have_attribute(
        "aria-pressed", "true"
    )
    page.wait_for_function("() => document.querySelectorAll('#task-list > li').length >= 2")
    statuses = set(
        page.eval_on_selector_all("#task-list > li", "els => els.map(e => e.dataset.status)")
    )
    assert statuses == {"COMPLETED"}, statuses
    page.locator("#tasks-section").evaluate("e => e.scrollIntoView()")
    page.screenshot(path=str(shots / "views-desktop-tasks.png"))
    page.set_viewport_size(PHONE)
    page.locator("#tasks-section").evaluate("e => e.scrollIntoView()")
    no_horizontal_scroll(page)
    page.screenshot(path=str(shots / "views-360-tasks.png"))
    page.set_viewport_size(DESKTOP)
    page.reload()
    expect()(page.locator('#status-tabs [data-filter="completed"]')).to_have_attribute(
        "aria-pressed", "true", timeout=WAIT_MS
    )
    page.click('#status-tabs [data-filter="attention"]')
    expect()(page.locator("#tasks-empty")).to_be_visible(timeout=WAIT_MS)
    expect()(page.locator("#tasks-empty")).to_have_text("No task matches.")


def test_counts_update_live(stack: DemoStack, open_page: Callable[..., Watched]) -> None:
    w = open_page()
    page = w.page
    total = page.locator('#status-tabs [data-count="all"]')
    expect()(total).not_to_be_empty(timeout=WAIT_MS)
    before = int(total.inner_text())
    gid = gid_with_size(64 * 1024, 90_000, 1_300_001)
    create(stack, gid, "counted live")
    # No reload: the push moves the counts.
    expect()(total).to_have_text(str(before + 1), timeout=WAIT_MS)
    eventually_blocking(
        lambda: completed(stack, gid), 60.0, what="the task to complete", longest=0.2
    )
    counts = api(stack, "GET", "/api/tasks/counts").body["counts"]
    expect()(page.locator('#status-tabs [data-count="completed"]')).to_have_text(
        str(counts["COMPLETED"]), timeout=WAIT_MS
    )
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1


def test_order_stable_across_reload_and_live_inserts(
    stack: DemoStack, bob: str, open_page: Callable[..., Watched]
) -> None:
    # 55 small tasks of bob's: more than one page of 50.
    gid = 1_400_001
    made = []
    for _ in range(55):
        gid = gid_with_size(64 * 1024, 70_000, gid + 1)
        made.append(create(stack, gid, token=bob)["gid"])
    w = open_page(token=bob)
    page = w.page
    expect()(page.locator("#task-list > li")).to_have_count(50, timeout=WAIT_MS)
    assert row_gids(page) == list(reversed(made))[:50]  # newest first
    expect()(page.locator("#nav-admin")).to_be_hidden()  # bob is no admin
    # A non-admin sees no owner column.
    expect()(page.locator('#task-list [data-role="owner"]')).to_have_count(0)
    page.click("#tasks-more")
    expect()(page.locator("#task-list > li")).to_have_count(55, timeout=WAIT_MS)
    assert row_gids(page) == list(reversed(made))
    # A live insert goes on top of newest-first page 1 ...
    newest = gid_with_size(64 * 1024, 70_000, gid + 1)
    create(stack, newest, token=bob)
    page.wait_for_function(
        f"() => document.querySelector('#task-list > li')?.dataset.gid === '{newest}'"
    )
    live_order = row_gids(page)
    assert live_order == [newest, *reversed(made)]
    # ... and is still there, in the same order, after a reload.
    page.reload()
    expect()(page.locator("#task-list > li")).to_have_count(50, timeout=WAIT_MS)
    assert row_gids(page) == live_order[:50]
    # A push for a task of a later page (the oldest one, being deleted) does
    # not pull it onto page 1.
    oldest = made[0]
    assert api(stack, "DELETE", f"/api/tasks/{oldest}", token=bob).status in (200, 202)
    eventually_blocking(
        lambda: api(stack, "GET", f"/api/tasks/{oldest}").status == 404,
        60.0,
        what="the delete to finish",
        longest=0.2,
    )
    page.wait_for_timeout(1000)
    assert row_gids(page) == live_order[:50]
    # Oldest first with everything loaded: a new task goes at the bottom, the top stays.
    page.select_option("#task-order", "oldest")
    oldest_first = list(reversed(live_order[:-1]))
    expect_rows(page, oldest_first[:50])
    page.click("#tasks-more")
    expect_rows(page, oldest_first)
    later = gid_with_size(64 * 1024, 70_000, newest + 1)
    create(stack, later, token=bob)
    expect_rows(page, [*oldest_first, later])


def test_conflict_with_another_users_gid(
    stack: DemoStack, bob: str, open_page: Callable[..., Watched]
) -> None:
    taken = create(stack, gid_with_size(64 * 1024, 90_000, 1_500_001), "demo's gid")["gid"]
    page = open_page(token=bob).page
    page.fill("#create-gid", str(taken))
    page.fill("#create-token", "upstream-token")
    page.click("#create-submit")
    result = page.locator("#create-result")
    expect()(result).to_have_attribute("data-outcome", "409", timeout=WAIT_MS)
    expect()(result).to_have_attribute("data-conflict", "other")
    expect()(result).to_contain_text("taken by another user")
    expect()(result).to_contain_text("Try another gid")
    expect()(page.locator("#create-gid")).to_be_focused()


# -- per-task speed and ETA ----------------------------------------------------------


def test_speed_and_eta_while_a_throttled_download_runs(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    eventually_blocking(
        lambda: all(n["activeTasks"] == 0 for n in nodes(stack)),
        60.0,
        what="the nodes to be idle",
        longest=0.2,
    )
    page = open_page().page
    gid = gid_with_size(950_000, 1_048_576, 1_600_001)  # ~6.5 s at 150 kB/s
    page.fill("#create-gid", str(gid))
    page.fill("#create-token", "upstream-token")
    page.fill("#create-name", "throttled download")
    page.click("#create-submit")
    row = page.locator(f'#task-list > li[data-gid="{gid}"]')
    expect()(row).to_have_attribute("data-status", "DOWNLOADING", timeout=WAIT_MS)
    speed = row.locator('[data-role="speed"]')
    expect()(speed).to_have_text(re.compile(r"\d.* [kM]B/s$"), timeout=WAIT_MS)
    expect()(row.locator('[data-role="eta"]')).to_have_text(re.compile(r"^about \d+ s left$"))
    expect()(row.locator('[data-role="bytes"]')).to_have_text(
        re.compile(r"^[\d.,]+ (B|kB|MB) of [\d.,]+ (kB|MB)$")
    )
    expect()(row.locator('[data-role="owner"]')).to_have_text("demo")  # admins see the owner
    page.screenshot(path=str(shots / "views-desktop-download.png"))
    page.set_viewport_size(PHONE)
    row.evaluate("e => e.scrollIntoView()")  # rows are re-rendered on every push
    expect()(speed).to_have_text(re.compile(r"B/s$"))
    page.screenshot(path=str(shots / "views-360-download.png"))
    no_horizontal_scroll(page)
    expect()(row).to_have_attribute("data-status", "COMPLETED", timeout=WAIT_MS)
    expect()(row.locator('[data-role="speed"]')).to_have_count(0)


def nodes(stack: DemoStack) -> list[dict[str, Any]]:
    reply = api(stack, "GET", "/api/admin/nodes")
    assert reply.status == 200, reply.brief()
    return list(reply.body["nodes"])


# -- charts ------------------------------------------------------------------------


def test_charts_drawn_with_data(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    gid = gid_with_size(300_000, 400_000, 1_700_001)
    create(stack, gid, "for the charts")
    eventually_blocking(
        lambda: completed(stack, gid), 60.0, what="the chart task to complete", longest=0.2
    )
    page = open_page().page
    page.click("#nav-charts")
    expect()(page.locator("#view-charts")).to_be_visible()
    area = page.locator('#chart-throughput svg[data-chart="area"]')
    expect()(area).to_be_visible(timeout=WAIT_MS)
    assert int(area.get_attribute("data-points") or 0) >= 50  # one per minute of the hour
    line = area.locator('path[data-role="series"]').get_attribute("d") or ""
    assert line.startswith("M") and line.count("L") >= 49, line[:80]
    assert area.locator("circle").count() >= 1  # some minute moved bytes
    assert "MB" in (area.get_attribute("aria-label") or "") or "kB" in (
        area.get_attribute("aria-label") or ""
    )
    bars = page.locator('#chart-nodes svg[data-chart="bars"] rect[data-role="series"]')
    expect()(bars.first).to_be_visible()
    values = [int(v) for v in bars.evaluate_all("els => els.map(e => e.dataset.value)")]
    assert values and max(values) > 0, values
    weeks = page.locator('#chart-usage svg[data-chart="quota"] rect[data-role="series"]')
    expect()(weeks).to_have_count(8)
    assert int(weeks.last.get_attribute("data-value") or 0) > 0  # this week's usage
    expect()(page.locator('#chart-usage [data-role="quota"]')).to_have_count(1)
    page.screenshot(path=str(shots / "views-desktop-charts.png"), full_page=True)
    # A shorter period: one point per minute of it.
    page.select_option("#charts-window", "900")
    page.wait_for_function(
        "() => Number(document.querySelector('#chart-throughput svg')?.dataset.points) <= 16"
    )
    assert "last 15 minutes" in (page.locator("#chart-throughput-summary").inner_text())
    page.set_viewport_size(PHONE)
    # Redrawn at the new width.
    page.wait_for_function(
        "() => Number(document.querySelector('#chart-throughput svg')?.getAttribute('width')) < 360"
    )
    no_horizontal_scroll(page)
    page.screenshot(path=str(shots / "views-360-charts.png"), full_page=True)


# -- unknown outcomes: slow create, evidence, ghost rows ---------------------------------


def test_create_shows_elapsed_time_while_the_upstream_is_slow(
    stack: DemoStack, open_page: Callable[..., Watched]
) -> None:
    fault(
        stack,
        {
            "method": "POST",
            "path": "/api/galleries/*/archive",
            "fault": "latency",
            "params": {"ms": 3000},
            "times": 1,
        },
    )
    page = open_page().page
    gid = gid_with_size(64 * 1024, 90_000, 1_800_001)
    page.fill("#create-gid", str(gid))
    page.fill("#create-token", "upstream-token")
    page.click("#create-submit")
    result = page.locator("#create-result")
    expect()(result).to_have_text(re.compile(r"^Submitting to upstream… [12] s"), timeout=5000)
    expect()(page.locator("#create-submit")).to_be_disabled()
    expect()(result).to_have_attribute("data-outcome", "201", timeout=WAIT_MS)
    expect()(result).not_to_contain_text("Submitting")
    expect()(page.locator("#create-submit")).to_be_enabled()


def test_not_submitted_leaves_no_ghost_row(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    fault(
        stack,
        {"method": "POST", "path": "/api/galleries/*/archive", "fault": "timeout", "times": 1},
    )
    gid = gid_with_size(64 * 1024, 90_000, 1_900_001)
    page = open_page(locale="zh-CN").page
    page.evaluate("window.__noReload = true")
    page.fill("#create-gid", str(gid))
    page.fill("#create-token", "upstream-token")
    # Past 3 s the form explains the wait (the site gives up after 4 s here):
    # recorded as it appears, since a loaded machine may poll only after the
    # answer has replaced it.
    page.evaluate(
        """() => {
          window.__slowTexts = [];
          new MutationObserver(() => {
            const slow = document.querySelector("#create-result .slow");
            if (slow) window.__slowTexts.push(slow.textContent);
          }).observe(document.getElementById("create-result"),
                     { childList: true, subtree: true, characterData: true });
        }"""
    )
    page.click("#create-submit")
    expect()(page.locator("#create-result")).to_have_attribute(
        "data-outcome", "202", timeout=WAIT_MS
    )
    slow_texts = page.evaluate("window.__slowTexts")
    assert any("超时" in text for text in slow_texts), slow_texts
    row = page.locator(f'#task-list > li[data-gid="{gid}"]')
    expect()(row).to_have_attribute("data-status", "SUBMIT_UNKNOWN")
    page.click("#nav-admin")
    item = page.locator(f'#unknown-list > li[data-gid="{gid}"]')
    expect()(item).to_be_visible(timeout=WAIT_MS)
    # Evidence in Chinese: no raw keys, no English outside technical details and codes.
    evidence = item.locator("dl.evidence")
    text = evidence.evaluate(
        "dl => { const c = dl.cloneNode(true);"
        " c.querySelectorAll('code, details').forEach(e => e.remove());"
        " return c.innerText; }"
    )
    assert "archiveUrl" not in text and "archiveUrlSource" not in text, text
    assert re.findall(r"[A-Za-z]{3,}", text) == [], text
    expect()(item.locator('[data-role="audit-count"]')).to_have_text(
        "1"
    )  # the timeout fault counted the POST
    expect()(item.locator('[data-role="audit"]')).to_have_class(re.compile("audit-yes"))
    page.screenshot(path=str(shots / "views-desktop-unknown-zh.png"))
    # A second socket of this session records what the site pushes for the
    # gid, to show the "gone" push really arrives (and is not rendered).
    page.evaluate(
        """gid => new Promise(resolve => {
          window.__pushes = [];
          const ws = new WebSocket(`ws://${location.host}/api/events`);
          ws.onmessage = e => {
            const m = JSON.parse(e.data);
            if (m.task && m.task.gid === gid) window.__pushes.push(m.task);
          };
          ws.onopen = () => resolve();
        })""",
        gid,
    )
    button = item.get_by_role("button", name=f"没有提交：gid {gid}")
    expect()(button).to_have_count(1)
    button.click()
    page.fill("#confirm-note", "audit checked; releasing for the test")
    page.click("#confirm-ok")
    expect()(item).to_have_count(0, timeout=WAIT_MS)
    page.click("#nav-tasks")
    expect()(row).to_have_count(0, timeout=WAIT_MS)
    # The push for the gone task (and any late one) must not bring it back.
    page.wait_for_function("() => window.__pushes.some(t => t.status === null)", timeout=WAIT_MS)
    page.wait_for_timeout(1000)
    expect()(row).to_have_count(0)
    assert api(stack, "GET", f"/api/tasks/{gid}").status == 404
    assert page.evaluate("window.__noReload") is True


def _set_verdict_wait(stack: DemoStack, gid: int, seconds: float) -> str:
    """Give ``gid``'s UNKNOWN a verdict wait ending ``seconds`` from now, as a
    reap records it (the site's SQLite file, written beside the running site)."""
    not_before = iso(time.time() + seconds)
    db = stack.data_dir / "site" / "tasknet-site.sqlite"
    with closing(sqlite3.connect(db, timeout=30)) as connection:
        connection.execute(
            "UPDATE task_operation SET verdict_not_before = ? WHERE gid = ?", (not_before, gid)
        )
        connection.commit()
    return not_before


def _audit_row(stack: DemoStack, gid: int) -> tuple[str, dict[str, Any]]:
    db = stack.data_dir / "site" / "tasknet-site.sqlite"
    with closing(sqlite3.connect(db, timeout=30)) as connection:
        note, evidence = connection.execute(
            "SELECT note, evidence FROM reconciliation_audit WHERE gid = ? ORDER BY id DESC",
            (gid,),
        ).fetchone()
    return note, json.loads(evidence)


def test_the_verdict_wait_and_a_verdict_against_the_audit(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    """A reaped submission's card names when "not submitted" becomes possible
    and keeps that button disabled until then (SCALE.md "Fencing" 2); a
    verdict the upstream's audit contradicts asks for a note, and the
    dialog's confirm waits for one."""
    fault(
        stack,
        {"method": "POST", "path": "/api/galleries/*/archive", "fault": "timeout", "times": 1},
    )
    waiting = gid_with_size(64 * 1024, 90_000, 2_500_001)
    create(stack, waiting)  # UNKNOWN; the audit counts its POST
    fault(
        stack,
        {"method": "POST", "path": "/api/galleries/*/archive", "fault": "drop_before", "times": 1},
    )
    unposted = gid_with_size(64 * 1024, 90_000, waiting + 1)
    create(stack, unposted)  # UNKNOWN; the audit counts nothing
    not_before = _set_verdict_wait(stack, waiting, 3600)
    page = open_page().page
    page.click("#nav-admin")

    item = page.locator(f'#unknown-list > li[data-gid="{waiting}"]')
    expect()(item).to_be_visible(timeout=WAIT_MS)
    shown = page.evaluate("v => window.TasknetFormat.date(v, 'en')", not_before)
    wait = item.locator('[data-role="verdict-wait"]')
    expect()(wait).to_contain_text("possible only from then")
    expect()(wait).to_contain_text(shown)
    not_submitted = item.get_by_role("button", name=f"It was not submitted: gid {waiting}")
    expect()(not_submitted).to_be_disabled()
    expect()(item.get_by_role("button", name=f"It was submitted: gid {waiting}")).to_be_enabled()
    # The audit records the POST: the card says "not submitted" would need a note.
    expect()(
        item.locator('[data-role="contradiction"][data-verdict="not_submitted"]')
    ).to_contain_text(re.compile(r"records 1 submission\(s\) for this gid \(last: .+\): "))
    item.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "views-unknown-verdict-wait.png"))

    other = page.locator(f'#unknown-list > li[data-gid="{unposted}"]')
    expect()(other.locator('[data-role="verdict-wait"]')).to_have_count(0)
    expect()(
        other.locator('[data-role="contradiction"][data-verdict="submitted"]')
    ).to_contain_text("records no submission")
    submitted = other.get_by_role("button", name=f"It was submitted: gid {unposted}")
    # Cancel closes the dialog even with the note empty; nothing is sent.
    submitted.click()
    warning = page.locator("#confirm-warning")
    expect()(warning).to_be_visible()
    expect()(warning).to_contain_text("records no submission")
    expect()(page.locator("#confirm-ok")).to_be_disabled()
    page.click("#confirm-cancel")
    expect()(page.locator("#confirm-dialog")).not_to_be_visible()
    expect()(other).to_have_count(1)
    # Confirm waits for a note that is not blank.
    submitted.click()
    page.fill("#confirm-note", "   ")
    expect()(page.locator("#confirm-ok")).to_be_disabled()
    page.screenshot(path=str(shots / "views-unknown-note-required.png"))
    page.fill("#confirm-note", "upstream support confirmed the POST arrived")
    expect()(page.locator("#confirm-ok")).to_be_enabled()
    page.click("#confirm-ok")
    expect()(other).to_have_count(0, timeout=WAIT_MS)
    note, evidence = _audit_row(stack, unposted)
    assert note == "upstream support confirmed the POST arrived"
    assert evidence["contradicts"] is True and "no archive POST" in evidence["contradiction"]

    # A wait that ends while the page is open: the button comes on by itself.
    _set_verdict_wait(stack, waiting, 3)
    page.click("#unknown-refresh")
    expect()(not_submitted).to_be_disabled()
    expect()(not_submitted).to_be_enabled(timeout=15_000)
    expect()(wait).to_contain_text("The wait is over")
    not_submitted.click()
    expect()(page.locator("#confirm-warning")).to_contain_text("records 1 submission(s)")
    page.fill("#confirm-note", "the POST was a test from another tool")
    page.click("#confirm-ok")
    expect()(item).to_have_count(0, timeout=WAIT_MS)
    assert _audit_row(stack, waiting)[1]["notBefore"] is not None


# -- accessible names ------------------------------------------------------------------


def test_every_per_task_button_is_named_with_its_gid(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    # Two UNKNOWN rows: their verdict buttons must not share a name.
    fault(
        stack,
        {"method": "POST", "path": "/api/galleries/*/archive", "fault": "timeout", "times": 2},
    )
    first = gid_with_size(64 * 1024, 90_000, 2_000_001)
    second = gid_with_size(64 * 1024, 90_000, first + 1)
    create(stack, first)
    create(stack, second)
    page = open_page().page
    page.click("#nav-admin")
    for gid in (first, second):
        expect()(page.get_by_role("button", name=f"It was submitted: gid {gid}")).to_have_count(
            1, timeout=WAIT_MS
        )
        expect()(page.get_by_role("button", name=f"It was not submitted: gid {gid}")).to_have_count(
            1
        )
    page.locator("#unknown-section").evaluate("e => e.scrollIntoView()")
    page.screenshot(path=str(shots / "views-desktop-unknown.png"))
    page.click("#nav-tasks")
    expect()(page.locator("#task-list > li").first).to_be_visible()
    labels = page.eval_on_selector_all(
        "#task-list button, #unknown-list button",
        "els => els.map(e => [e.closest('li').dataset.gid, e.getAttribute('aria-label') || ''])",
    )
    assert labels, "no per-task buttons"
    for gid, label in labels:
        assert f"gid {gid}" in label, (gid, label)
    assert len({label for _, label in labels}) == len(labels), "two buttons share a name"
    # Settle them so later tests see a quiet admin panel.
    # The timeout fault counted each POST: "not submitted" goes against the audit.
    for gid in (first, second):
        verdict = {"verdict": "not_submitted", "note": "test clean-up, not a real verdict"}
        reply = api(stack, "POST", f"/api/admin/tasks/{gid}/resolve", verdict)
        assert reply.status == 200, reply.brief()


# -- notices ------------------------------------------------------------------------------


def test_notices_clear_on_the_next_action_and_after_a_few_seconds(
    stack: DemoStack, open_page: Callable[..., Watched]
) -> None:
    first = gid_with_size(64 * 1024, 90_000, 2_100_001)
    second = gid_with_size(64 * 1024, 90_000, first + 1)
    create(stack, first, "to delete 1")
    create(stack, second, "to delete 2")
    eventually_blocking(
        lambda: completed(stack, first) and completed(stack, second),
        60.0,
        what="the tasks to complete",
        longest=0.2,
    )
    page = open_page().page
    notice = page.locator("#notice")

    def delete(gid: int) -> None:
        row = page.locator(f'#task-list > li[data-gid="{gid}"]')
        row.get_by_role(
            "button", name=f"Delete: gid {gid} (to delete {1 if gid == first else 2})"
        ).click()
        page.click("#confirm-ok")
        expect()(row).to_have_count(0, timeout=WAIT_MS)  # the node confirmed
        expect()(notice).to_have_text(f"Task {gid} deleted.")

    delete(first)
    page.click('#status-tabs [data-filter="all"]')  # the next action clears it
    expect()(notice).to_be_empty()
    delete(second)
    # With no further action it goes by itself after a few seconds.
    expect()(notice).to_be_empty(timeout=15_000)


# -- nodes --------------------------------------------------------------------------------


def test_node_panel(stack: DemoStack, open_page: Callable[..., Watched], shots: Path) -> None:
    gid = gid_with_size(950_000, 1_048_576, 2_200_001)
    create(stack, gid, "node panel download")
    page = open_page().page
    page.click("#nav-admin")
    table = page.locator("#nodes-table")
    expect()(table).to_be_visible(timeout=WAIT_MS)
    # The node running the download: "1 running, 0 queued".  Its speed is
    # the bytes of its last full minute (the charts' buckets), so any rate.
    busy = page.locator('#nodes-body tr[data-connected="true"]').filter(
        has=page.locator('[data-role="active"]', has_text=re.compile(r"^1 running, \d+ queued$"))
    )
    expect()(busy).to_have_count(1, timeout=WAIT_MS)
    expect()(busy.locator('[data-role="speed"]')).to_have_text(re.compile(r"^(—|.*B/s)$"))
    expect()(busy.locator("td[data-ago]").first).to_have_text(re.compile(r"^(just now|\d+ s ago)$"))
    expect()(
        page.locator('#nodes-body tr[data-node="node-2"] [data-role="state"]')
    ).to_contain_text("legacy v1")
    # No raw revision numbers anywhere in the panel.
    revisions = [n["lastRevision"] for n in nodes(stack) if n.get("lastRevision")]
    panel = page.locator("#nodes-section").inner_text()
    for revision in revisions:
        assert str(revision) not in panel, (revision, panel)
    page.screenshot(path=str(shots / "views-desktop-nodes.png"))
    eventually_blocking(
        lambda: completed(stack, gid), 60.0, what="the download to finish", longest=0.2
    )

    # A disconnected node stays, greyed, with when it was last seen.
    node2 = stack.child("node-2")
    node2.stop()
    try:
        page.click("#nodes-refresh")
        gone = page.locator('#nodes-body tr[data-node="node-2"]')
        expect()(gone).to_have_attribute("data-connected", "false", timeout=WAIT_MS)
        expect()(gone).to_have_class(re.compile("disconnected"))
        expect()(gone).to_contain_text("last seen")
        expect()(gone.locator('[data-role="state"]')).to_contain_text("Disconnected")
        page.set_viewport_size(PHONE)
        no_horizontal_scroll(page)
        page.screenshot(path=str(shots / "views-360-nodes.png"), full_page=True)
        page.set_viewport_size(DESKTOP)
        page.screenshot(path=str(shots / "views-desktop-nodes-disconnected.png"))
    finally:
        node2.start()
    eventually_blocking(
        lambda: "node-2" in stack.connected_nodes(),
        60.0,
        what="node-2 to log in again",
        longest=0.2,
    )


# -- 360 px -------------------------------------------------------------------------------


def test_phone_width_has_no_horizontal_scroll_and_reaches_admin(
    stack: DemoStack, open_page: Callable[..., Watched], shots: Path
) -> None:
    gid = 2_300_001
    while api(stack, "GET", "/api/tasks/counts").body["total"] < 5:  # a list to scroll past
        gid = gid_with_size(64 * 1024, 90_000, gid + 1)
        create(stack, gid, "phone")
    page = open_page(viewport=PHONE).page
    expect()(page.locator("#task-list > li").nth(4)).to_be_visible(timeout=WAIT_MS)
    no_horizontal_scroll(page)
    # The admin panel is one tap away at the top, not below every task.
    admin_link = page.locator("#nav-admin")
    box = admin_link.bounding_box()
    assert box is not None and box["y"] + box["height"] <= PHONE["height"], box
    page.screenshot(path=str(shots / "views-360-tasks-top.png"))
    admin_link.click()
    nodes_title = page.locator("#nodes-title")
    expect()(nodes_title).to_be_visible()
    title_box = nodes_title.bounding_box()
    assert title_box is not None and title_box["y"] < PHONE["height"], title_box
    expect()(page.locator("#task-list")).to_be_hidden()
    no_horizontal_scroll(page)
    page.click("#nav-charts")
    expect()(page.locator("#chart-throughput svg")).to_be_visible(timeout=WAIT_MS)
    no_horizontal_scroll(page)


# -- live connection down: stale marks and "not reachable" -------------------------------


def test_stale_marks_and_unreachable_site(
    stack: DemoStack, open_page: Callable[..., Watched]
) -> None:
    w = open_page()
    w.expected.append("WebSocket connection to")  # the redials while the site is down
    page = w.page
    expect()(page.locator("#task-list > li").first).to_be_visible(timeout=WAIT_MS)
    expect()(page.locator("#tasks-stale")).to_be_hidden()
    site = stack.child("site")
    site.stop()
    try:
        expect()(page.locator("#live")).to_have_attribute("data-state", "offline", timeout=WAIT_MS)
        expect()(page.locator("#task-list")).to_have_attribute("data-stale", "")
        expect()(page.locator("#tasks-stale")).to_be_visible()
        expect()(page.locator("#task-list > li .stale-mark").first).to_be_visible()
        page.fill("#create-gid", "4242")
        page.fill("#create-token", "upstream-token")
        page.click("#create-submit")
        result = page.locator("#create-result")
        expect()(result).to_have_attribute("data-outcome", "0", timeout=WAIT_MS)
        expect()(result).to_have_text(
            "The site is not reachable. Check your connection and try again."
        )
        assert "HTTP 0" not in page.locator("body").inner_text()
    finally:
        site.start()
    eventually_blocking(
        lambda: stack.health() is not None, 60.0, what="the site to answer again", longest=0.2
    )
    expect()(page.locator("#live")).to_have_attribute("data-state", "online", timeout=WAIT_MS)
    expect()(page.locator("#tasks-stale")).to_be_hidden()
    expect()(page.locator("#task-list")).not_to_have_attribute("data-stale", "")
    eventually_blocking(
        lambda: {"node-1", "node-2"} <= stack.connected_nodes(),
        60.0,
        what="both nodes to log in again",
        longest=0.2,
    )
