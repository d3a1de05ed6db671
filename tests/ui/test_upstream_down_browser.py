"""The upstream-down story (issue 36, item 9), in headless Chromium against
the demo's real processes with the mock upstream killed mid-download:

* the row's "retrying in N s" counts down between the node's reports;
* a site-wide banner says the upstream is not answering (downloads that
  cannot reach it, "2 downloads" then "1 download", also in a view that
  does not show them: the site counts them, GET /api/upstream; then a
  create that could not), in both languages;
* the API's message for that create is words with numbers, no exception text.

Any page error, CSP violation or console error other than the expected
401 (the session probe) and 502 (the create) fails the test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import request
from tests.eventually import eventually_blocking
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, demo_running, gid_with_size, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 30_000
RETRY = re.compile(r"retrying in (\d+(?:\.\d+)?) s")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    require_browser()
    demo = DemoStack(
        tmp_path_factory.mktemp("upstream-down") / "stack",
        nodes=(NodeSpec("node-1", 2, "down-secret-1"),),
        bandwidth=20_000,  # the download lasts until the upstream is killed
        ready_timeout=90.0,
    )
    with demo_running(demo):
        yield demo


def _task(stack: DemoStack, gid: int) -> dict[str, Any]:
    reply = request("GET", f"{stack.url}api/tasks/{gid}", token=DEMO_TOKEN)
    assert reply.status == 200, reply.brief()
    return dict(reply.body["task"])


def test_a_dead_upstream_is_said_site_wide_and_the_retry_counts_down(stack: DemoStack) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    gid = gid_with_size(400_000, 600_000, 5_400_001)
    # A second download, deleted later: the banner says "2 downloads", then "1 download".
    second = gid_with_size(400_000, 600_000, gid + 1)
    for each, name in ((gid, "doomed"), (second, "doomed too")):
        reply = request(
            "POST",
            f"{stack.url}api/tasks",
            {"gid": each, "token": "upstream-token", "name": name},
            token=DEMO_TOKEN,
        )
        assert reply.status == 201, reply.brief()
    eventually_blocking(
        lambda: all(float(_task(stack, g)["progress"] or 0) > 0 for g in (gid, second)),
        timeout=30,
    )
    stack.child("upstream").kill()
    # The node retries, doubling its wait: until one is long enough to watch.
    eventually_blocking(
        lambda: (m := RETRY.search(_task(stack, gid)["detail"] or "")) and float(m[1]) >= 6,
        timeout=60,
        what="a retry of 6 s or more",
    )
    eventually_blocking(lambda: "refused" in (_task(stack, second)["detail"] or ""), timeout=60)
    detail = _task(stack, gid)["detail"]
    assert "Error" not in detail and "refused" in detail, detail

    errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            context.add_init_script("localStorage.setItem('tasknet.lang', 'en')")
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "console",
                lambda m: (
                    errors.append(m.text)
                    if m.type == "error" and not re.search(r"status of (401|502)", m.text)
                    else None
                ),
            )
            page.goto(stack.url)
            page.fill("#token-input", DEMO_TOKEN)
            page.press("#token-input", "Enter")
            banner = page.locator("#upstream-banner")
            expect(banner).to_have_text(
                "The upstream is not answering: 2 downloads cannot reach it and retry by"
                " themselves.",
                timeout=WAIT_MS,
            )
            # The countdown ticks between reports.
            span = page.locator(f'#task-list li[data-gid="{gid}"] [data-retry-at]')
            expect(span).to_have_text(re.compile(r"^retrying in \d+ s: "), timeout=WAIT_MS)
            first = span.inner_text()
            expect(span).not_to_have_text(first, timeout=3_000)

            # One download left: the singular, in English; Chinese has one form.
            deleted = request("DELETE", f"{stack.url}api/tasks/{second}", token=DEMO_TOKEN)
            assert deleted.status in (200, 202), deleted.brief()
            expect(banner).to_have_text(
                "The upstream is not answering: 1 download cannot reach it and retries by itself.",
                timeout=WAIT_MS,
            )
            page.click("#lang-toggle")
            expect(banner).to_have_text("上游没有响应：1 个下载连不上它，会自动重试。")
            page.click("#lang-toggle")
            expect(page.locator("html")).to_have_attribute("lang", "en")
            # The site says it, not the rows shown: a view without that
            # download (Completed: none here) keeps the banner.
            page.click('#status-tabs button[data-filter="completed"]')
            expect(page.locator(f'#task-list li[data-gid="{gid}"]')).to_have_count(0)
            expect(banner).to_have_text(
                "The upstream is not answering: 1 download cannot reach it and retries by itself.",
            )
            page.wait_for_timeout(1_000)  # a tick of the countdowns: still shown
            expect(banner).to_contain_text("1 download cannot reach it")
            page.click('#status-tabs button[data-filter="all"]')

            # A create that cannot reach the upstream: the banner says so too.
            other = gid_with_size(100_000, 200_000, gid + 1)
            page.fill("#create-gid", str(other))
            page.fill("#create-token", "upstream-token")
            page.click("#create-form button[type=submit]")
            expect(banner).to_contain_text("a create just now could not reach it")
            page.click("#lang-toggle")
            expect(banner).to_have_text(
                "上游没有响应（刚才的创建请求连不上它）：它恢复之前无法提交新任务；没有扣费。"
            )
        finally:
            browser.close()
    assert not errors, errors

    # The API's own message: words with numbers, no exception text.
    refused = request(
        "POST", f"{stack.url}api/tasks", {"gid": gid + 7, "token": "t"}, token=DEMO_TOKEN
    )
    assert refused.status == 502, refused.brief()
    message = refused.body["error"]["message"]
    assert "refused" in message and "Error" not in message, message
