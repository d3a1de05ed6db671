"""The admin node panel's disk columns (archives, bytes held, free space), in
headless Chromium against the demo's real processes.

``node-1`` and ``node-3`` (v2) serve archives, so the site reads their disk
figures from their serve endpoints' ``/healthz``; legacy ``node-2`` serves
nothing and sends no inventory: its three cells are "—".  What the page
shows is what ``GET /api/admin/nodes`` says, in both languages; page errors
and console errors (but the 401 of the session probe) fail the test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, SERVES_SITE, SERVES_USERS, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import request
from tests.eventually import eventually_blocking
from tests.ui.conftest import demo_running, gid_with_size, require_browser
from tests.ui.signed_in import signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 60_000
NODES = (
    NodeSpec("node-1", 2, "archive-secret-1", SERVES_USERS),
    NodeSpec("node-2", 1, "archive-secret-2"),
    NodeSpec("node-3", 2, "archive-secret-3", SERVES_SITE),
)
#: What F.bytes writes: a number and a decimal unit.
SIZE = re.compile(r"^\d[\d.,]* (B|kB|MB|GB|TB|PB)$")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    require_browser()
    demo = DemoStack(tmp_path / "stack", nodes=NODES, ready_timeout=90.0)
    with demo_running(demo):
        yield demo


def _panel(stack: DemoStack) -> dict[str, dict[str, Any]]:
    reply = request("GET", f"{stack.url}api/admin/nodes", token=DEMO_TOKEN)
    assert reply.status == 200, reply.brief()
    return {node["id"]: node for node in reply.body["nodes"]}


def test_the_node_panel_shows_archives_bytes_held_and_free_space(stack: DemoStack) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    gid = gid_with_size(100_000, 300_000, 5_200_001)
    reply = request(
        "POST",
        f"{stack.url}api/tasks",
        {"gid": gid, "token": "upstream-token", "name": "disk"},
        token=DEMO_TOKEN,
    )
    assert reply.status == 201, reply.brief()
    # The serving nodes' figures, read by the site from their /healthz.
    panel = eventually_blocking(
        lambda: (p := _panel(stack))["node-1"]["disk"] and p["node-3"]["disk"] and p,
        timeout=30,
    )
    assert panel["node-2"]["disk"] is None and panel["node-2"]["inventory"] is None
    for node in ("node-1", "node-3"):
        disk = panel[node]["disk"]
        assert isinstance(disk["free"], int) and disk["free"] > 0, disk
        assert disk["budget"] is None, disk  # the demo sets no --disk-budget
    with signed_in_page(stack.url, viewport={"width": 1280, "height": 900}) as signed:
        page = signed.page
        page.click("#nav-admin")
        headers = page.locator("#nodes-table thead th")
        expect(headers).to_contain_text(["Archives", "Held", "Free space"])
        for node in ("node-1", "node-3"):
            row = page.locator(f'#nodes-body tr[data-node="{node}"]')
            expect(row.locator('[data-role="free"]')).to_have_text(SIZE)
            expect(row.locator('[data-role="free"]')).to_have_attribute("title", "no disk budget")
            expect(row.locator('[data-role="archives"]')).to_have_text(re.compile(r"^\d+$"))
            expect(row.locator('[data-role="held"]')).to_have_text(SIZE)
            expect(row.locator('[data-role="held"]')).to_have_attribute(
                "title", re.compile(r"^As the node said at ")
            )
        legacy = page.locator('#nodes-body tr[data-node="node-2"]')
        for role in ("archives", "held", "free"):
            expect(legacy.locator(f'[data-role="{role}"]')).to_have_text("—")
        page.click("#lang-toggle")
        expect(headers).to_contain_text(["归档", "占用空间", "剩余空间"])
        expect(
            page.locator('#nodes-body tr[data-node="node-1"] [data-role="free"]')
        ).to_have_attribute("title", "无磁盘预算")
    assert not signed.page_errors, signed.page_errors
    # The session probe before signing in answers 401, which the UI expects.
    unexpected = [e for e in signed.console_errors if "status of 401" not in e]
    assert not unexpected, unexpected
