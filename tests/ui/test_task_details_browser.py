"""Issue 36, items 5 and 10 in Chromium against a real demo stack (site,
nodes, the mock upstream): a task that went ``UNKNOWN`` and was reconciled
has a page at ``#task/GID`` with its history (each state with when and why,
the verdict with who and the note), its ids and cost, reached from its row
and by a deep link; its UNKNOWN row links to its reconcile card; Back and
Forward walk through Tasks → Charts → Admin → the task's page.  Shares the
module-scoped stack of tests/ui/test_views_browser.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.ui.conftest import gid_with_size
from tests.ui.test_views_browser import (  # noqa: F401 -- fixtures used by name
    WAIT_MS,
    Watched,
    api,
    browser,
    create,
    expect,
    fault,
    open_page,
    stack,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AUDIT = "/api/galleries/*/archive"


def _unknown(demo: Any, start: int) -> int:
    fault(demo, {"method": "POST", "path": AUDIT, "fault": "timeout", "times": 1})
    gid = gid_with_size(64 * 1024, 90_000, start)
    assert create(demo, gid)["state"] == "UNKNOWN"
    return gid


def test_an_unknown_task_links_to_its_card_and_its_reconciled_page_tells_its_history(
    stack: Any,  # noqa: F811 -- the fixture imported above
    open_page: Callable[..., Watched],  # noqa: F811
) -> None:
    gid = _unknown(stack, 4_100_001)
    page = open_page().page
    row = page.locator(f'#task-list > li[data-gid="{gid}"]')
    expect()(row).to_be_visible(timeout=WAIT_MS)
    # The UNKNOWN row leads to its reconcile card, focused.
    row.locator(f'a[data-reconcile="{gid}"]').click()
    card = page.locator(f'#unknown-list > li[data-gid="{gid}"]')
    expect()(card).to_be_focused(timeout=WAIT_MS)
    assert page.evaluate("location.hash") == "#admin"

    reply = api(
        stack,
        "POST",
        f"/api/admin/tasks/{gid}/resolve",
        {"verdict": "submitted", "note": "seen in the upstream's log"},
    )
    assert reply.status == 200, reply.brief()

    page.go_back()
    expect()(row).to_be_visible(timeout=WAIT_MS)
    row.get_by_role("link", name=f"History and details: gid {gid}").click()
    assert page.evaluate("location.hash") == f"#task/{gid}"
    history = page.locator("#task-history")
    expect()(history.locator('li[data-status="SUBMIT_UNKNOWN"]')).to_have_count(1, timeout=WAIT_MS)
    verdict = history.locator('li[data-kind="verdict"]')
    expect()(verdict).to_contain_text("demo reconciled it: submitted")
    expect()(verdict).to_contain_text("Note: seen in the upstream's log")
    facts = page.locator("#task-page-body dl")
    details = api(stack, "GET", f"/api/tasks/{gid}/details").body
    expect()(facts).to_contain_text(details["operation"]["operationId"])
    # Cost in cost units, as everywhere else in English; the last step in words.
    operation = details["operation"]
    expect()(facts).to_contain_text(f"{operation['cost']:,} cost units")
    expect()(facts).not_to_contain_text("points")
    expect()(history).to_contain_text(f"Created ({operation['cost']:,} cost units)")
    words = {
        "resolved": "judged submitted by an admin",
        "resolved_without_url": "judged submitted by an admin"
        " (no archive link: nothing to download)",
    }
    step = page.locator('#task-page-body dt:text-is("Last step reached") + dd')
    expect()(step).to_have_text(words[operation["step"]])

    # A deep link in Chinese, in a fresh page, at the phone's width.
    zh = open_page(locale="zh-CN", viewport={"width": 360, "height": 740}).page
    zh.goto(f"{stack.url}#task/{gid}")
    zh.reload()
    expect()(zh.locator("#task-history li[data-kind=verdict]")).to_contain_text(
        "demo 裁定：已提交", timeout=WAIT_MS
    )
    zh_step = zh.locator('#task-page-body dt:text-is("最后到达的步骤") + dd')
    expect()(zh_step).to_have_text(re.compile(r"^管理员判定为已提交"))
    width = zh.evaluate("document.documentElement.scrollWidth")
    assert width <= 360, f"page is {width}px wide"


def test_back_and_forward_walk_through_four_views(
    stack: Any,  # noqa: F811
    open_page: Callable[..., Watched],  # noqa: F811
) -> None:
    gid = gid_with_size(64 * 1024, 90_000, 4_200_001)
    create(stack, gid)
    page = open_page().page
    expect()(page.locator(f'#task-list > li[data-gid="{gid}"]')).to_be_visible(timeout=WAIT_MS)
    page.click("#nav a[data-view=charts]")
    page.click("#nav-admin")
    expect()(page.locator("#admin-section")).to_be_visible(timeout=WAIT_MS)
    page.click("#nav a[data-view=tasks]")
    page.locator(f'#task-list > li[data-gid="{gid}"] a[data-action=open]').click()
    expect()(page.locator("#view-task")).to_be_visible(timeout=WAIT_MS)
    # Back: the list, Admin, Charts, then the page as it was opened (no hash: the list).
    walk = [
        ("#tasks", "#view-tasks"),
        ("#admin", "#admin-section"),
        ("#charts", "#view-charts"),
        ("", "#view-tasks"),
    ]
    for hash_, panel in walk:
        page.go_back()
        expect()(page.locator(panel)).to_be_visible(timeout=WAIT_MS)
        assert page.evaluate("location.hash") == hash_
    # Forward again to the task's page, its details shown.
    ahead = [
        ("#charts", "#view-charts"),
        ("#admin", "#admin-section"),
        ("#tasks", "#view-tasks"),
        (f"#task/{gid}", "#view-task"),
    ]
    for hash_, panel in ahead:
        page.go_forward()
        expect()(page.locator(panel)).to_be_visible(timeout=WAIT_MS)
        assert page.evaluate("location.hash") == hash_
    expect()(page.locator("#task-page-title")).to_contain_text(f"Task {gid}")
    expect()(page.locator("#task-history li")).not_to_have_count(0, timeout=WAIT_MS)
