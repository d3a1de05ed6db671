"""An admin's node actions in the web UI (DELIVERY.md "A node that is
gone"), in headless Chromium against real processes (the demo's upstream,
site and two v2 nodes on a slow upstream, so a task stays unfinished).

The nodes panel offers Reassign tasks and Retire on each node, each asking
first in a dialog that says what it does (in English and in Chinese):
Cancel changes nothing; confirming with a note moves the node's unfinished
task to the other node with the same operationId (one POST upstream, ever)
and is audited; Retire is audited too.

Page errors, console errors (other than the 401 before signing in) and CSP
violations fail the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, SERVES_USERS, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import Reply, request
from tasknet.site.storage import reassign
from tasknet.site.storage.engine import database as dbmod
from tests.eventually import eventually_blocking
from tests.ui.conftest import demo_running, gid_with_size, require_browser
from tests.ui.signed_in import signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 60_000


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    require_browser()
    nodes = (
        NodeSpec("node-1", 2, "actions-secret-1", SERVES_USERS),
        NodeSpec("node-2", 2, "actions-secret-2", SERVES_USERS),
    )
    # A slow upstream: a large archive stays downloading for the whole test.
    demo = DemoStack(tmp_path / "stack", bandwidth=5_000, nodes=nodes, ready_timeout=90.0)
    with demo_running(demo):
        yield demo


def api(stack: DemoStack, method: str, path: str, body: Any = None) -> Reply:
    return request(method, f"{stack.url}{path.lstrip('/')}", body, token=DEMO_TOKEN)


def task(stack: DemoStack, gid: int) -> dict[str, Any]:
    reply = api(stack, "GET", f"/api/tasks/{gid}")
    assert reply.status == 200, reply.brief()
    found: dict[str, Any] = reply.body["task"]
    return found


def posts(stack: DemoStack, gid: int) -> int:
    reply = request("GET", f"{stack.upstream_url}/_drill/journal")
    assert reply.status == 200, reply.brief()
    return sum(1 for entry in reply.body["entries"] if entry["gid"] == gid)


def audit(stack: DemoStack, node_id: str) -> list[tuple[str, str, int]]:
    with closing(dbmod.connect(str(stack.sqlite_path))) as connection:
        entries = dbmod.run_read(connection, reassign.custody_audit, node_id)
    return [(e.action, e.note, e.tasks) for e in entries]


def test_an_admin_reassigns_and_retires_a_node_from_the_panel(stack: DemoStack) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    gid = gid_with_size(600_000, 2_000_000, 5_100_001)
    created = api(stack, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token"})
    assert created.status == 201, created.brief()
    eventually_blocking(lambda: task(stack, gid).get("node") is not None, timeout=60.0)
    first = task(stack, gid)
    holder, operation_id = first["node"], first["operationId"]
    other = "node-2" if holder == "node-1" else "node-1"

    with signed_in_page(stack.url, viewport={"width": 1400, "height": 900}) as signed:
        page = signed.page
        page.click("#nav-admin")
        row = page.locator(f'#nodes-body tr[data-node="{holder}"]')
        expect(row).to_be_visible(timeout=WAIT_MS)
        dialog = page.locator("#confirm-dialog")

        # Cancel: nothing changes.
        row.locator('button[data-node-action="reassign"]').click()
        expect(dialog).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#confirm-title")).to_have_text(
            f"Reassign the unfinished tasks of {holder}?"
        )
        expect(page.locator("#confirm-text")).to_contain_text("nothing is submitted or charged")
        page.click("#confirm-cancel")
        expect(dialog).to_be_hidden()
        assert audit(stack, holder) == []
        assert task(stack, gid)["node"] == holder

        # Confirmed with a note: moved to the other node, same operationId.
        row.locator('button[data-node-action="reassign"]').click()
        expect(dialog).to_be_visible(timeout=WAIT_MS)
        page.fill("#confirm-note", "moving it by hand")
        page.click("#confirm-ok")
        expect(page.locator("#notice")).to_contain_text(
            f"1 task(s) moved off {holder} (1 sent to other nodes, 0 waiting for a node).",
            timeout=WAIT_MS,
        )
        moved = task(stack, gid)
        assert (moved["node"], moved["operationId"]) == (other, operation_id)
        assert posts(stack, gid) == 1
        assert audit(stack, holder) == [("REASSIGN", "moving it by hand", 1)]

        # In Chinese: Retire asks in Chinese, and is audited.
        page.click("#lang-toggle")
        expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
        row = page.locator(f'#nodes-body tr[data-node="{holder}"]')
        row.locator('button[data-node-action="retire"]').click()
        expect(dialog).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#confirm-title")).to_have_text(f"让 {holder} 退役？")
        expect(page.locator("#confirm-text")).to_contain_text("密钥被删除")
        page.fill("#confirm-note", "退役")
        page.click("#confirm-ok")
        expect(page.locator("#notice")).to_contain_text(f"{holder} 已退役", timeout=WAIT_MS)
        assert [a for a, _, _ in audit(stack, holder)] == ["REASSIGN", "RETIRE"]
        assert task(stack, gid)["node"] == other
        csp = page.evaluate("window.__csp")
    assert signed.page_errors == []
    assert csp == []
    assert [e for e in signed.console_errors if "status of 401" not in e] == []
