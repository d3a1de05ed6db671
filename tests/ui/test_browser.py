"""The web UI in headless Chromium against real processes.

Real ``twistd -n`` upstream + site + node (started by :class:`DemoStack`),
Debian's Chromium driven by Playwright's sync API.  This module runs no
reactor in-process: Playwright's sync API and pytest-twisted's reactor do not
mix, so everything here is plain blocking code.

Screenshots go to a temp dir whose path the test prints (or to
``$TASKNET_SCREENSHOTS`` when set).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import request
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, demo_running
from tests.ui.conftest import gid_with_size as _gid_with_size
from tests.ui.conftest import require_browser as _require_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Slow enough that progress is visible between reports, fast enough for CI.
BANDWIDTH = 200_000
WAIT_MS = 60_000


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    _require_browser()
    demo = DemoStack(
        tmp_path / "stack",
        bandwidth=BANDWIDTH,
        nodes=(NodeSpec("node-1", 2, "browser-secret-1"),),
        upstream_timeout=2.0,
        ready_timeout=90.0,
    )
    with demo_running(demo):
        yield demo


# Records every status each task row takes, including ones that last a
# moment (待删除 can be brief): rows are replaced on each push, so watch the
# list's subtree.
_WATCH_JS = """() => {
  window.__seen = [];
  window.__noReload = true;
  const record = () => document.querySelectorAll('#task-list > li').forEach(li => {
    const bar = li.querySelector('[role=progressbar]');
    const percent = Number(bar.getAttribute('aria-valuenow'));
    window.__seen.push([Number(li.dataset.gid), li.dataset.status, percent]);
  });
  const list = document.getElementById('task-list');
  new MutationObserver(record).observe(list, {childList: true, subtree: true});
}"""


def _seen(page: Any, gid: int) -> list[tuple[str, int]]:
    return [(s, p) for g, s, p in page.evaluate("window.__seen") if g == gid]


def test_browser_flow(stack: DemoStack, screenshots: Path) -> None:
    sync_api = _require_browser()
    expect = sync_api.expect
    console_errors: list[str] = []
    page_errors: list[str] = []

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # A Chinese browser: the UI follows navigator.languages.
            page = browser.new_page(viewport={"width": 1280, "height": 900}, locale="zh-CN")
            page.on(
                "console", lambda m: console_errors.append(m.text) if m.type == "error" else None
            )
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(stack.url)

            # --- sign in by keyboard only -------------------------------------
            for _ in range(10):
                if (
                    page.evaluate("document.activeElement && document.activeElement.id")
                    == "token-input"
                ):
                    break
                page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.id") == "token-input"
            page.keyboard.type(DEMO_TOKEN)
            page.keyboard.press("Enter")
            expect(page.locator("#app")).to_be_visible()
            expect(page.locator("#live")).to_have_attribute("data-state", "online", timeout=WAIT_MS)
            # The token lives in an HttpOnly cookie, out of the page's reach,
            # and a reload finds the session again.
            assert page.evaluate("localStorage.getItem('tasknet.token')") is None
            assert DEMO_TOKEN not in page.evaluate(
                "document.cookie + JSON.stringify(localStorage) + JSON.stringify(sessionStorage)"
            )
            (session,) = [c for c in page.context.cookies() if c["name"] == "tasknet_session"]
            assert session["httpOnly"] and session["sameSite"] == "Strict", session
            page.reload()
            expect(page.locator("#app")).to_be_visible()
            expect(page.locator("#live")).to_have_attribute("data-state", "online", timeout=WAIT_MS)
            page.click("#nav-admin")
            expect(page.locator("#admin-section")).to_be_visible()
            expect(page.locator('#nodes-body tr[data-node="node-1"]')).to_contain_text("v2")
            page.click("#nav-tasks")
            page.evaluate(_WATCH_JS)

            # --- create, and watch it reach 下载完成 live ------------------------
            gid = _gid_with_size(600_000, 1_000_000, 910_001)
            page.fill("#create-gid", str(gid))
            page.fill("#create-token", "upstream-token")
            page.fill("#create-name", "浏览器测试")
            page.click("#create-submit")
            expect(page.locator("#create-result")).to_have_attribute("data-outcome", "201")
            row = page.locator(f'#task-list > li[data-gid="{gid}"]')
            expect(row.locator('[data-role="status"]')).to_have_text("下载完成", timeout=WAIT_MS)
            expect(row.locator("[role=progressbar]")).to_have_attribute("aria-valuenow", "100")
            assert page.evaluate("window.__noReload") is True, "the page reloaded"
            assert int(row.get_attribute("data-live-updates") or 0) >= 2
            seen = _seen(page, gid)
            assert any(status == "DOWNLOADING" and 0 < p < 100 for status, p in seen), seen
            page.screenshot(path=str(screenshots / "desktop-completed.png"), full_page=True)

            # --- English toggle uses the same label table ----------------------
            page.click("#lang-toggle")
            expect(row.locator('[data-role="status"]')).to_have_text("Download complete")
            page.click("#lang-toggle")
            expect(row.locator('[data-role="status"]')).to_have_text("下载完成")

            # --- favorite ----------------------------------------------------
            star = row.locator('button[data-action="favorite"]')
            star.click()
            expect(star).to_have_attribute("aria-pressed", "true")
            favorites = request("GET", f"{stack.url}api/favorites", token=DEMO_TOKEN)
            assert favorites.status == 200, favorites.brief()
            assert gid in {task["gid"] for task in favorites.body["tasks"]}

            # --- delete: confirm, 待删除 until the node confirms, then gone -----
            row.locator('button[data-action="delete"]').click()
            dialog = page.locator("#confirm-dialog")
            expect(dialog).to_be_visible()
            page.click("#confirm-ok")
            expect(row).to_have_count(0, timeout=WAIT_MS)
            statuses = [s for s, _ in _seen(page, gid)]
            assert "DELETE_PENDING" in statuses, statuses
            gone = request("GET", f"{stack.url}api/tasks/{gid}", token=DEMO_TOKEN)
            assert gone.status == 404, gone.brief()

            # --- an UNKNOWN made by a timeout fault, resolved from the UI -------
            faults = request(
                "PUT",
                f"{stack.upstream_url}/_drill/faults",
                {
                    "rules": [
                        {
                            "method": "POST",
                            "path": "/api/galleries/*/archive",
                            "fault": "timeout",
                            "times": 1,
                        }
                    ]
                },
            )
            assert faults.status == 200, faults.brief()
            unknown_gid = _gid_with_size(64 * 1024, 200_000, 920_001)
            page.fill("#create-gid", str(unknown_gid))
            page.fill("#create-token", "upstream-token")
            page.click("#create-submit")
            expect(page.locator("#create-result")).to_have_attribute(
                "data-outcome", "202", timeout=WAIT_MS
            )
            unknown_row = page.locator(f'#task-list > li[data-gid="{unknown_gid}"]')
            expect(unknown_row.locator('[data-role="status"]')).to_have_text("提交未知")
            page.click("#nav-admin")
            item = page.locator(f'#unknown-list > li[data-gid="{unknown_gid}"]')
            expect(item).to_be_visible(timeout=WAIT_MS)
            expect(item.locator("dl.evidence")).to_contain_text("提交到上游")  # the step, localized
            expect(item.locator('[data-role="audit-count"]')).to_have_text("1")
            item.scroll_into_view_if_needed()
            page.screenshot(path=str(screenshots / "desktop-unknown.png"), full_page=True)
            # The timeout fault counts the POST: the upstream did act.
            audit = request("GET", f"{stack.upstream_url}/api/galleries/{unknown_gid}/archive")
            assert audit.status == 200 and audit.body["submissions"] == 1, audit.brief()
            item.locator('button[data-verdict="submitted"]').click()
            expect(page.locator("#confirm-note")).to_be_focused()
            page.fill("#confirm-note", "upstream audit shows one submission")
            page.click("#confirm-ok")
            expect(item).to_have_count(0, timeout=WAIT_MS)
            page.click("#nav-tasks")
            expect(unknown_row.locator('[data-role="status"]')).not_to_have_text(
                "提交未知", timeout=WAIT_MS
            )

            # --- 360 px: readable, no horizontal scrolling ---------------------
            page.set_viewport_size({"width": 360, "height": 800})
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(screenshots / "mobile-360.png"), full_page=True)
            overflow = page.evaluate("document.documentElement.scrollWidth")
            assert overflow <= 360, f"page is {overflow}px wide at a 360px viewport"
            page.set_viewport_size({"width": 1280, "height": 900})
            page.screenshot(path=str(screenshots / "desktop.png"), full_page=True)

            assert page_errors == [], page_errors
            # Resolved "submitted": metered once, dispatched, downloaded.
            expect(unknown_row.locator('[data-role="status"]')).to_have_text(
                "下载完成", timeout=WAIT_MS
            )
        finally:
            browser.close()

    assert page_errors == [], page_errors
    # Chromium logs every 4xx/5xx fetch as a console error; those are answers
    # the UI expects and shows (none is expected in this flow, but an admin
    # probe or a 409 would be fine).  Anything else is a bug.
    unexpected = [e for e in console_errors if "Failed to load resource" not in e]
    assert unexpected == [], unexpected
