"""A legacy node with a queue, then killed (issue 36, items 1 and 2), in
headless Chromium against real processes: the demo's upstream (slowed),
a site, a v2 node and a legacy node with one download slot each.

The legacy node cannot say "queued"; its rows that have not started say
"queued on node-2, not started" (not "Downloading 0 B of ..."), and the
node panel says "1 running, N queued".  Killed, the panel shows what it
holds ("N held (offline, not downloading)") and no speed, in English and
in Chinese.  Page errors, console errors (other than the 401 before
signing in) and CSP violations fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, SERVES_USERS, NodeSpec
from tasknet.cli.jsonhttp import Reply, request
from tests.eventually import eventually_blocking
from tests.ui.conftest import demo_running, gid_with_size, require_browser
from tests.ui.screenshots import Stack
from tests.ui.signed_in import signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 60_000
TASKS = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_browser()
    nodes = (
        NodeSpec("node-1", 2, "legacy-journey-1", SERVES_USERS),
        NodeSpec("node-2", 1, "legacy-journey-2"),
    )
    demo = Stack(
        tmp_path_factory.mktemp("legacy-node") / "stack",
        bandwidth=5_000,
        nodes=nodes,
        ready_timeout=90.0,
    )
    demo.downloads = {"node-1": 1, "node-2": 1}
    with demo_running(demo):
        yield demo


def api(stack: Stack, method: str, path: str, body: Any = None) -> Reply:
    return request(method, f"{stack.url}{path.lstrip('/')}", body, token=DEMO_TOKEN)


def on_node(stack: Stack, node: str) -> list[dict[str, Any]]:
    reply = api(stack, "GET", "/api/tasks?limit=100")
    assert reply.status == 200, reply.brief()
    return [task for task in reply.body["tasks"] if task.get("node") == node]


def test_a_legacy_nodes_queue_is_honest_and_a_killed_node_shows_no_work(stack: Stack) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    gid = 6_500_001
    for _ in range(TASKS):
        gid = gid_with_size(300_000, 900_000, gid + 1)
        created = api(stack, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token"})
        assert created.status == 201, created.brief()
    # The legacy node's report has come in: all but one of its tasks queued.
    eventually_blocking(
        lambda: sum(bool(t["queued"]) for t in on_node(stack, "node-2")) >= 2,
        timeout=60.0,
    )
    held = len(on_node(stack, "node-2"))

    with signed_in_page(stack.url) as signed:
        page = signed.page
        queued_rows = page.locator("#task-list > li", has_text="queued on node-2, not started")
        expect(queued_rows.first).to_be_visible(timeout=WAIT_MS)
        assert queued_rows.count() >= 2

        page.click("#nav-admin")
        row = page.locator('#nodes-body tr[data-node="node-2"]')
        tasks = row.locator('[data-role="active"]')
        expect(tasks).to_have_text(f"1 running, {held - 1} queued", timeout=WAIT_MS)

        # Killed: what it holds, not running; no speed.
        stack.child("node-2").kill()
        expect(row).to_have_attribute("data-connected", "false", timeout=WAIT_MS)
        expect(tasks).to_have_text(f"{held} held (offline, not downloading)")
        expect(row.locator('[data-role="speed"]')).to_have_text("—")
        page.click("#lang-toggle")
        expect(tasks).to_have_text(f"持有 {held} 个（离线，未在下载）")
        csp = page.evaluate("window.__csp")
    assert signed.page_errors == []
    assert csp == []
    assert [e for e in signed.console_errors if "status of 401" not in e] == []
