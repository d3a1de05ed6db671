"""Getting a gone archive again in the web UI (DELIVERY.md "Getting it
again"), in headless Chromium against real processes (the demo's upstream,
site and one v2 node).

A task completes on the node; its archive then goes (``EXPIRED``, written
by ``storage/custody.mark_archive_gone``, the one writer every release
goes through, on the site's own SQLite file).  The page shows the row as
归档已失效 / "Archive gone" with the reason and when, offers no Download but
"Get it again", which fills the create form; Create asks first, with the
cost: Cancel charges nothing, accepting creates a new generation (one more
POST at the upstream, the week's usage grows by its cost).

Page errors, console errors (other than the 401 before signing in and the
409 the UI expects) and CSP violations fail the test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, SERVES_USERS, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import Reply, request
from tasknet.site.storage.custody import mark_archive_gone
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.timestamps import iso
from tests.eventually import eventually_blocking
from tests.ui.conftest import demo_running, gid_with_size, require_browser
from tests.ui.signed_in import signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 60_000


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    require_browser()
    nodes = (NodeSpec("node-1", 2, "charge-secret-1", SERVES_USERS),)
    demo = DemoStack(tmp_path / "stack", bandwidth=2_000_000, nodes=nodes, ready_timeout=90.0)
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


def used(stack: DemoStack) -> int:
    reply = api(stack, "GET", "/api/usage")
    assert reply.status == 200, reply.brief()
    return int(reply.body["used"])


def test_a_gone_archive_is_fetched_again_after_the_charge_is_confirmed(stack: DemoStack) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    gid = gid_with_size(100_000, 300_000, 4_200_001)
    created = api(stack, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token"})
    assert created.status == 201, created.brief()
    eventually_blocking(lambda: task(stack, gid)["status"] == "COMPLETED", timeout=60.0)
    done = task(stack, gid)
    cost, first_op = done["cost"], done["operationId"]
    connection = dbmod.connect(str(stack.sqlite_path))
    try:
        assert dbmod.run_write(
            connection,
            lambda c: mark_archive_gone(
                c,
                gid=gid,
                operation_id=first_op,
                reason="EXPIRED",
                node_id=done["node"],
                now=iso(time.time()),
            ),
        )
    finally:
        connection.close()
    assert task(stack, gid)["status"] == "ARCHIVE_GONE"
    assert (posts(stack, gid), used(stack)) == (1, cost)

    with signed_in_page(stack.url) as signed:
        page = signed.page
        row = page.locator(f'#task-list > li[data-gid="{gid}"]')
        expect(row).to_have_attribute("data-status", "ARCHIVE_GONE", timeout=WAIT_MS)
        expect(row).to_contain_text("Archive gone")
        expect(row.locator('[data-role="note"]')).to_contain_text(
            "Archive gone: kept past its retention time ("
        )
        expect(row.locator('button[data-action="download"]')).to_have_count(0)

        row.locator('button[data-action="fetch-again"]').click()
        expect(page.locator("#create-gid")).to_have_value(str(gid))
        expect(page.locator("#create-token")).to_be_focused()
        page.fill("#create-token", "upstream-token")

        # Cancel: nothing charged, nothing sent.
        page.click("#create-submit")
        dialog = page.locator("#confirm-dialog")
        expect(dialog).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#confirm-text")).to_contain_text(f"charges {cost} cost units")
        page.click("#confirm-cancel")
        result = page.locator("#create-result")
        expect(result).to_have_attribute("data-outcome", "declined")
        expect(result).to_contain_text("nothing was charged")
        assert (posts(stack, gid), used(stack)) == (1, cost)

        # Accept: a new generation, one more POST, counted by the quota.
        page.click("#create-submit")
        expect(dialog).to_be_visible(timeout=WAIT_MS)
        page.click("#confirm-ok")
        expect(result).to_have_attribute("data-outcome", "201", timeout=WAIT_MS)
        expect(row).not_to_have_attribute("data-status", "ARCHIVE_GONE", timeout=WAIT_MS)
        again = task(stack, gid)
        assert again["operationId"] != first_op and again["archiveGone"] is None
        assert (posts(stack, gid), used(stack)) == (2, 2 * cost)

        # The new generation goes to the node and completes like any task.
        expect(row).to_have_attribute("data-status", "COMPLETED", timeout=WAIT_MS)
        csp = page.evaluate("window.__csp")
    assert signed.page_errors == []
    assert csp == []
    # Chromium logs every 4xx answer as "Failed to load resource": the 401 of
    # the page's first look before signing in and the 409 that asked for the
    # confirmation are answers the UI expects; nothing else.
    expected = ("status of 401", "status of 409")
    assert [e for e in signed.console_errors if not any(x in e for x in expected)] == []
