"""Issue 38: when the upstream's audit cannot be read, the reconcile card
says so (both languages) instead of showing a submission count as if one
were read, and says a note is required; the confirm dialog waits for one.

Before, the card of an ``UNKNOWN`` task whose audit answered ``503`` said
"The upstream's audit records 0 submission(s) for this gid" and "records
no submission": evidence nobody read.  A real demo stack (site, nodes, the
mock upstream with its audit answering 503) and Chromium.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tasknet.cli.demo import DemoStack
from tasknet.cli.jsonhttp import request
from tests.ui.conftest import gid_with_size
from tests.ui.test_views_browser import (  # noqa: F401 -- fixtures used by name
    WAIT_MS,
    Watched,
    _audit_row,
    browser,
    create,
    expect,
    fault,
    open_page,
    shots,
    stack,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AUDIT = "/api/galleries/*/archive"


def clear_faults(demo: DemoStack) -> None:
    reply = request("DELETE", f"{demo.upstream_url}/_drill/faults")
    assert reply.status in (200, 204), reply.brief()


def _unreadable_unknown(demo: DemoStack, start: int) -> int:
    fault(demo, {"method": "POST", "path": AUDIT, "fault": "timeout", "times": 1})
    gid = gid_with_size(64 * 1024, 90_000, start)
    create(demo, gid)  # UNKNOWN
    fault(
        demo,
        {
            "method": "GET",
            "path": AUDIT,
            "fault": "error",
            "params": {"status": 503, "charged": False},
            "times": None,
        },
    )
    return gid


def test_an_unreadable_audit_is_said_and_needs_a_note(
    stack: DemoStack,  # noqa: F811 -- the fixture imported above
    open_page: Callable[..., Watched],  # noqa: F811
    shots: Any,  # noqa: F811
) -> None:
    gid = _unreadable_unknown(stack, 3_100_001)
    try:
        page = open_page().page
        page.click("#nav-admin")
        item = page.locator(f'#unknown-list > li[data-gid="{gid}"]')
        expect()(item).to_be_visible(timeout=WAIT_MS)
        expect()(item.locator('[data-role="audit"]')).to_contain_text("Upstream audit unavailable")
        for verdict in ("submitted", "not_submitted"):
            said = item.locator(f'[data-role="contradiction"][data-verdict="{verdict}"]')
            expect()(said).to_have_text(
                "The upstream's audit could not be read, so nothing confirms this verdict:"
                " a note saying why is required."
            )
        expect()(item).not_to_contain_text("submission(s)")
        expect()(item).not_to_contain_text("records no submission")
        item.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "views-unknown-audit-unavailable.png"))

        # The dialog says why and waits for a note.
        item.get_by_role("button", name=f"It was not submitted: gid {gid}").click()
        warning = page.locator("#confirm-warning")
        expect()(warning).to_contain_text("No readable evidence")
        expect()(warning).to_contain_text("could not be read")
        expect()(warning).not_to_contain_text("submission(s)")
        # Said once (issue 36, item 10): not the card's line again after it.
        said = warning.inner_text()
        assert said.count("could not be read") == 1, said
        expect()(page.locator("#confirm-ok")).to_be_disabled()
        page.fill("#confirm-note", "the upstream's support says no POST arrived")
        expect()(page.locator("#confirm-ok")).to_be_enabled()
        page.click("#confirm-ok")
        expect()(item).to_have_count(0, timeout=WAIT_MS)
        note, evidence = _audit_row(stack, gid)
        assert note == "the upstream's support says no POST arrived"
        assert evidence["evidence"] == "unavailable"
    finally:
        clear_faults(stack)


def test_the_chinese_card_says_it_too(
    stack: DemoStack,  # noqa: F811 -- the fixture imported above
    open_page: Callable[..., Watched],  # noqa: F811
) -> None:
    gid = _unreadable_unknown(stack, 3_200_001)
    try:
        page = open_page(locale="zh-CN").page
        page.click("#nav-admin")
        item = page.locator(f'#unknown-list > li[data-gid="{gid}"]')
        expect()(item).to_be_visible(timeout=WAIT_MS)
        for verdict in ("submitted", "not_submitted"):
            expect()(
                item.locator(f'[data-role="contradiction"][data-verdict="{verdict}"]')
            ).to_have_text("无法读取上游审计，没有证据能证实这个结论：必须写明理由（备注）。")
        expect()(item).not_to_contain_text("次提交")
    finally:
        clear_faults(stack)
