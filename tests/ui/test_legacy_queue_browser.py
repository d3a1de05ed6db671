"""A legacy node with a long queue (issue 36, items 1 and 9), in headless
Chromium against real processes: the demo's upstream (slowed), a site and
one legacy node running 2 downloads at a time, holding 45 tasks.

The status tabs tell the truth about it: "In progress" counts and lists the
2 downloads (not the 43 the node holds and has not started), "Queued"
counts those 43 and "Needs attention" stays at 0.  With the upstream frozen
a while, a legacy download says why it has no speed (item 9).  Past the
site's stall threshold (``views.STALL_AFTER_SECONDS``, not an option, so
the test waits it out) no queued row says "no progress since".  Page
errors, console errors (other than the 401 before signing in) and CSP
violations fail.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, NodeSpec
from tasknet.cli.jsonhttp import Reply, request
from tasknet.site.storage.throughput import STALL_SECONDS
from tasknet.site.storage.views import STALL_AFTER_SECONDS
from tests.eventually import eventually_blocking
from tests.ui.conftest import demo_running, gid_with_size, require_browser
from tests.ui.screenshots import Stack
from tests.ui.signed_in import signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 60_000
TASKS = 45
DOWNLOADS = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_browser()
    demo = Stack(
        tmp_path_factory.mktemp("legacy-queue") / "stack",
        # Slow enough that no download ends while the test runs (600 kB or
        # more at 5 kB/s), fast enough that each moves at every report.
        bandwidth=5_000,
        nodes=(NodeSpec("node-2", 1, "legacy-queue-2"),),
        ready_timeout=90.0,
    )
    demo.downloads = {"node-2": DOWNLOADS}
    with demo_running(demo):
        yield demo


def api(stack: Stack, method: str, path: str, body: Any = None) -> Reply:
    return request(method, f"{stack.url}{path.lstrip('/')}", body, token=DEMO_TOKEN)


def counts(stack: Stack) -> dict[str, int]:
    reply = api(stack, "GET", "/api/tasks/counts")
    assert reply.status == 200, reply.brief()
    return dict(reply.body["counts"])


def test_a_long_legacy_queue_is_counted_queued_not_in_progress_and_never_stalls(
    stack: Stack,
) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    gid = 6_600_001
    for _ in range(TASKS):
        gid = gid_with_size(600_000, 900_000, gid + 1)
        created = api(stack, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token"})
        assert created.status == 201, created.brief()
    # Every task reported, the node's 2 downloads moved, the rest queued.
    eventually_blocking(
        lambda: (
            (c := counts(stack))["QUEUED"] == TASKS - DOWNLOADS and c["DOWNLOADING"] == DOWNLOADS
        ),
        timeout=90.0,
    )
    queued_at = time.monotonic()

    with signed_in_page(stack.url) as signed:
        page = signed.page

        def tab(name: str) -> Any:
            return page.locator(f'#status-tabs [data-count="{name}"]')

        expect(tab("all")).to_have_text(str(TASKS), timeout=WAIT_MS)
        expect(tab("active")).to_have_text(str(DOWNLOADS))
        expect(tab("queued")).to_have_text(str(TASKS - DOWNLOADS))
        expect(tab("attention")).to_have_text("0")

        # "In progress" lists the downloads alone.
        page.click('#status-tabs [data-filter="active"]')
        rows = page.locator("#task-list > li")
        expect(rows).to_have_count(DOWNLOADS, timeout=WAIT_MS)
        expect(rows.first).to_contain_text("Downloading")

        # The upstream frozen (SIGSTOP) for longer than the site measures a
        # speed over (throughput.STALL_SECONDS), not as long as the stall
        # threshold: each legacy download, read afresh, says why it shows
        # no speed instead of "— —".
        upstream = stack.child("upstream").popen
        assert upstream is not None
        os.kill(upstream.pid, signal.SIGSTOP)
        try:
            page.wait_for_timeout((STALL_SECONDS + 2) * 1000)
            page.reload()
            expect(page.locator("#live")).to_have_attribute("data-state", "online", timeout=WAIT_MS)
            legacy = page.locator(
                "#task-list > li", has_text="not reported by this legacy node (progress only)"
            )
            expect(legacy).to_have_count(DOWNLOADS, timeout=WAIT_MS)
            page.click("#lang-toggle")
            expect(
                page.locator("#task-list > li", has_text="旧版节点不报告速度（只报告进度）")
            ).to_have_count(DOWNLOADS)
            page.click("#lang-toggle")
        finally:
            os.kill(upstream.pid, signal.SIGCONT)

        # Past the stall threshold, read afresh: queued, not stalled.
        page.wait_for_timeout(
            max(0.0, STALL_AFTER_SECONDS + 5 - (time.monotonic() - queued_at)) * 1000
        )
        page.reload()
        expect(page.locator("#live")).to_have_attribute("data-state", "online", timeout=WAIT_MS)
        page.click('#status-tabs [data-filter="queued"]')
        rows = page.locator("#task-list > li")
        expect(rows).to_have_count(TASKS - DOWNLOADS, timeout=WAIT_MS)
        expect(
            page.locator("#task-list > li", has_text="queued on node-2, not started")
        ).to_have_count(TASKS - DOWNLOADS)
        expect(page.locator("#task-list", has_text="no progress since")).to_have_count(0)
        expect(tab("active")).to_have_text(str(DOWNLOADS))
        expect(tab("attention")).to_have_text("0")

        page.click("#lang-toggle")
        expect(page.locator("#task-list > li", has_text="在 node-2 排队，尚未开始")).to_have_count(
            TASKS - DOWNLOADS
        )
        expect(page.locator("#task-list", has_text="起没有进展")).to_have_count(0)
        csp = page.evaluate("window.__csp")
    # The API agrees: nothing queued is stalled.
    reply = api(stack, "GET", "/api/tasks?status=QUEUED&limit=100")
    assert reply.status == 200, reply.brief()
    assert [t["stalledSince"] for t in reply.body["tasks"]] == [None] * (TASKS - DOWNLOADS)
    assert signed.page_errors == []
    assert csp == []
    assert [e for e in signed.console_errors if "status of 401" not in e] == []
