"""An admin drains, pauses and resumes a node and sets its download limit in
the web UI (issue 36, item 6), in headless Chromium against real processes
(the demo's upstream, site and two v2 nodes on a slow upstream, so a task
stays downloading throughout).

Drain: the node's row says "draining, 1 left" and the next task goes to
the other node, while the node's own download goes on; then Pause (offered
while it drains: "paused"), then Resume, its download going on throughout;
a limit of 1 on the other node ("limit 1"), a limit of 0 refused with
words and nothing changed; that node drained and its task deleted:
"drained"; in Chinese the dialog asks in Chinese; on a phone the controls
are on screen.  At 1280x800 and on the phone the page does not scroll
sideways (the panel fits).  Page errors, console
errors (other than the 401 before signing in) and CSP violations fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, SERVES_USERS, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import Reply, request
from tasknet.site.storage.engine import database as dbmod
from tests.eventually import eventually_blocking
from tests.ui.conftest import demo_running, gid_with_size, require_browser
from tests.ui.signed_in import signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 60_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    require_browser()
    nodes = (
        NodeSpec("node-1", 2, "control-secret-1", SERVES_USERS),
        NodeSpec("node-2", 2, "control-secret-2", SERVES_USERS),
    )
    # A slow upstream: a large archive stays downloading for the whole test.
    root: Path = tmp_path_factory.mktemp("node-control")
    demo = DemoStack(root / "stack", bandwidth=5_000, nodes=nodes, ready_timeout=90.0)
    with demo_running(demo):
        yield demo


def api(stack: DemoStack, method: str, path: str, body: Any = None) -> Reply:
    return request(method, f"{stack.url}{path.lstrip('/')}", body, token=DEMO_TOKEN)


def task(stack: DemoStack, gid: int) -> dict[str, Any]:
    reply = api(stack, "GET", f"/api/tasks/{gid}")
    assert reply.status == 200, reply.brief()
    found: dict[str, Any] = reply.body["task"]
    return found


def create(stack: DemoStack, gid: int) -> dict[str, Any]:
    created = api(stack, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token"})
    assert created.status == 201, created.brief()
    eventually_blocking(lambda: task(stack, gid).get("node") is not None, timeout=60.0)
    return task(stack, gid)


def controls(stack: DemoStack) -> list[tuple[str, str, int | None, str]]:
    with closing(dbmod.connect(str(stack.sqlite_path))) as connection:
        return [
            (r[0], r[1], r[2], r[3])
            for r in connection.execute(
                "SELECT node_id, mode, download_limit, note FROM node_control ORDER BY node_id"
            ).fetchall()
        ]


def test_an_admin_drains_pauses_resumes_and_limits_a_node(stack: DemoStack) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    first = create(stack, gid_with_size(600_000, 2_000_000, 5_200_001))
    holder = first["node"]
    other = "node-2" if holder == "node-1" else "node-1"

    with signed_in_page(stack.url) as signed:
        page = signed.page
        page.click("#nav-admin")
        row = page.locator(f'#nodes-body tr[data-node="{holder}"]')
        expect(row).to_be_visible(timeout=WAIT_MS)
        dialog = page.locator("#confirm-dialog")

        def fits() -> None:
            # The panel and its controls fit the window: no sideways scroll.
            width = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
            assert width[0] <= width[1], width

        def act(node: str, action: str, note: str = "") -> None:
            target = page.locator(f'#nodes-body tr[data-node="{node}"]')
            target.locator(f'button[data-node-action="{action}"]').click()
            expect(dialog).to_be_visible(timeout=WAIT_MS)
            if note:
                page.fill("#confirm-note", note)
            page.click("#confirm-ok")
            expect(dialog).to_be_hidden()

        # Drain: the row says so, the next task goes to the other node,
        # and the drained node's own download goes on.
        act(holder, "drain", "swapping its disk")
        expect(page.locator("#notice")).to_have_text(
            f"{holder}: draining · no limit.", timeout=WAIT_MS
        )
        state = row.locator('[data-role="control"]')
        expect(state).to_have_text(" · draining, 1 left", timeout=WAIT_MS)
        assert controls(stack) == [(holder, "DRAINING", None, "swapping its disk")]
        second = create(stack, gid_with_size(600_000, 2_000_000, 5_300_001))
        assert second["node"] == other
        assert row.locator('button[data-node-action="drain"]').count() == 0
        fits()

        # Then Pause, offered while it drains: "paused"; then Resume.  The
        # first download runs there throughout.
        act(holder, "pause")
        expect(state).to_have_text(" · paused", timeout=WAIT_MS)
        assert controls(stack) == [(holder, "PAUSED", None, "")]
        expect(row.locator('button[data-node-action="drain"]')).to_be_visible()
        assert row.locator('button[data-node-action="pause"]').count() == 0
        fits()
        act(holder, "resume")
        expect(state).to_have_count(0, timeout=WAIT_MS)
        assert controls(stack) == []
        now = task(stack, first["gid"])
        assert (now["node"], now["status"]) == (holder, "DOWNLOADING")

        # A limit on the other node; 0 is refused with words, nothing changed.
        other_row = page.locator(f'#nodes-body tr[data-node="{other}"]')
        other_row.locator("input[data-node-limit]").fill("0")
        other_row.locator('button[data-node-action="limit"]').click()
        expect(page.locator("#notice")).to_have_text(
            "A limit is a whole number from 1 to 100,000; leave it empty for no limit.",
            timeout=WAIT_MS,
        )
        expect(dialog).to_be_hidden()
        other_row.locator("input[data-node-limit]").fill("1")
        act(other, "limit")
        other_state = other_row.locator('[data-role="control"]')
        expect(other_state).to_have_text(" · limit 1", timeout=WAIT_MS)
        assert controls(stack) == [(other, "ACTIVE", 1, "")]

        # Drained: the other node drains, its one task goes, nothing is left.
        act(other, "drain")
        expect(other_state).to_have_text(" · draining, 1 left · limit 1", timeout=WAIT_MS)
        deleted = api(stack, "DELETE", f"/api/tasks/{second['gid']}")
        assert deleted.status in (200, 202), deleted.brief()
        expect(other_state).to_have_text(" · drained · limit 1", timeout=WAIT_MS)
        fits()

        # In Chinese, on a phone: the words and the controls are there.
        page.click("#lang-toggle")
        expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
        page.set_viewport_size({"width": 360, "height": 740})
        expect(other_state).to_have_text(" · 已排空 · 上限 1")
        fits()
        resume = other_row.locator('button[data-node-action="resume"]')
        expect(resume).to_be_visible()
        resume.click()
        expect(page.locator("#confirm-title")).to_have_text(f"恢复 {other}？")
        page.click("#confirm-ok")
        expect(other_state).to_have_text(" · 上限 1", timeout=WAIT_MS)
        assert controls(stack) == [(other, "ACTIVE", 1, "")]
        csp = page.evaluate("window.__csp")
    assert signed.page_errors == []
    assert csp == []
    assert [e for e in signed.console_errors if "status of 401" not in e] == []


def test_the_control_api_refuses_what_it_cannot_do_and_changes_nothing(stack: DemoStack) -> None:
    before = controls(stack)
    for body, words in (
        ({}, "give 'mode', 'downloadLimit' or both"),
        ({"mode": "STOPPED"}, "'mode' is one of ACTIVE, DRAINING, PAUSED, got 'STOPPED'"),
        ({"downloadLimit": 0}, "a download limit is a whole number from 1 to 100,000"),
        ({"downloadLimit": "keep"}, "a download limit is a whole number from 1 to 100,000"),
        ({"downloadLimit": 2.5}, "a download limit is a whole number from 1 to 100,000"),
        ({"mode": "PAUSED", "speed": 3}, "unknown field(s): speed"),
        ({"mode": "PAUSED", "note": 7}, "'note' must be a string"),
    ):
        reply = api(stack, "POST", "/api/admin/nodes/node-1/control", body)
        error = reply.body["error"]
        assert (reply.status, error["code"]) == (400, "invalid_request"), body
        assert words in error["message"], reply.body
    reply = api(stack, "POST", "/api/admin/nodes/ghost/control", {"mode": "PAUSED"})
    assert (reply.status, reply.body["error"]["code"]) == (404, "not_found")
    assert reply.body["error"]["message"] == "no node 'ghost' is known to this site"
    assert controls(stack) == before
