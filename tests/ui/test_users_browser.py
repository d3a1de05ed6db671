"""People at the edges of the console (issue 36, items 7 and 8), in headless
Chromium against a real site started WITHOUT ``--demo`` (as production is):

* the sign-in page says how the first admin is made and never names the
  demo token;
* the first admin, made with ``tasknet-admin user add --admin`` (a real
  process), adds a user in Admin → Users, sets its quota, disables it;
* that user's sign-in says the account is disabled, in English on a desktop
  and in Chinese on a phone;
* enabled again, a new token for it, its sessions ended.

One site process for the module.  Any page error, CSP violation or console
error other than an expected 401/403/409 answer fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DemoStack
from tasknet.cli.jsonhttp import request
from tasknet.process import Child
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, demo_running, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 30_000
REPO = Path(__file__).resolve().parents[2]


class ProductionStack(DemoStack):
    """The demo's processes, its site started without ``--demo`` and no nodes."""

    def _twistd(self, name: str, plugin: str, args: list[str]) -> Child:
        if plugin == "tasknet-site":
            args = [arg for arg in args if arg != "--demo"]
        return super()._twistd(name, plugin, args)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    require_browser()
    demo = ProductionStack(tmp_path_factory.mktemp("users") / "stack", nodes=(), ready_timeout=90.0)
    with demo_running(demo):
        yield demo


@pytest.fixture(scope="module")
def root_token(stack: DemoStack) -> str:
    """The first admin, made as the sign-in page says: on the site's host."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("tasknet-admin")), "--db", stack.database]
        + ["user", "add", "root", "--admin"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


class Watched:
    """A page whose errors are collected: page errors, CSP violations and
    console errors other than the answers the test expects (401, 403, 409)."""

    def __init__(self, browser: Any, viewport: dict[str, int], lang: str) -> None:
        self.context = browser.new_context(viewport=viewport, locale="en-US")
        self.context.add_init_script(f"localStorage.setItem('tasknet.lang', '{lang}')")
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if message.type != "error":
            return
        text = message.text
        if any(f"status of {code}" in text for code in (401, 403, 409)):
            return
        self.errors.append(text)

    def sign_in(self, url: str, token: str) -> None:
        self.page.goto(url)
        self.page.fill("#token-input", token)
        self.page.press("#token-input", "Enter")


def test_first_admin_users_section_and_a_disabled_sign_in(
    stack: DemoStack, root_token: str
) -> None:
    sync_api = require_browser()
    expect = sync_api.expect
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        watched: list[Watched] = []
        try:
            admin = Watched(browser, {"width": 1280, "height": 800}, "en")
            watched.append(admin)
            page = admin.page
            page.goto(stack.url)
            # Item 7: no demo token on a site without --demo; the first admin explained.
            expect(page.locator("#sign-in")).to_contain_text(
                "The first admin is made on the site's host: tasknet-admin --db SITE_DB user add"
                " NAME --admin"
            )
            expect(page.locator("#demo-hint")).to_be_hidden()
            assert "demo" not in page.locator("#sign-in").inner_text().lower()

            admin.sign_in(stack.url, root_token)
            expect(page.locator("#app")).to_be_visible(timeout=WAIT_MS)
            page.click("#nav-admin")
            rows = page.locator("#users-body tr")
            expect(rows).to_have_count(1, timeout=WAIT_MS)
            expect(rows.first.locator("th")).to_have_text("root (you)")
            # The own row offers no Disable.
            expect(rows.first.locator('button[data-user-action="disable"]')).to_have_count(0)

            # A bad name is refused in the page, and nothing is sent.
            page.fill("#user-add-name", "carol smith")
            page.click("#user-add-form button[type=submit]")
            expect(page.locator("#user-add-error")).to_have_text(
                "A name is 1 to 64 letters, digits, “_”, “.” or “-”."
            )
            # Add carol with a quota: her token, once.
            page.fill("#user-add-name", "carol")
            page.fill("#user-add-quota", "300")
            page.click("#user-add-form button[type=submit]")
            token = page.locator('#user-token code[data-role="token"]')
            expect(token).to_have_text(lambda_not_empty(), timeout=WAIT_MS)
            carol_token = token.inner_text()
            carol = page.locator('#users-body tr[data-user="carol"]')
            expect(carol.locator("input[data-user-quota]")).to_have_value("300")
            # Adding her again: told so, in words.
            page.fill("#user-add-name", "carol")
            page.click("#user-add-form button[type=submit]")
            expect(page.locator("#user-add-error")).to_have_text(
                "There is already a user named carol."
            )

            # Her quota, then disable her (confirmed in the dialog).
            carol.locator("input[data-user-quota]").fill("450")
            carol.locator('button[data-user-action="quota"]').click()
            expect(page.locator("#notice")).to_have_text(
                "carol's weekly quota is now 450 cost units."
            )
            carol.locator('button[data-user-action="disable"]').click()
            expect(page.locator("#confirm-title")).to_have_text("Disable carol?")
            page.click("#confirm-ok")
            expect(carol).to_have_attribute("data-disabled", "true")
            expect(carol.locator('[data-role="user-state"]')).to_contain_text("Disabled since")
            # The widest row (three actions) stays inside a laptop's width.
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (
                "the Users table makes the page scroll sideways at 1280 px"
            )
            card = page.locator("#users-section").bounding_box()
            last = carol.locator("td.actions button").last.bounding_box()
            assert card and last and last["x"] + last["width"] <= card["x"] + card["width"]

            # Her sign-in says the account is disabled, in both languages.
            for viewport, lang, words in (
                (
                    {"width": 1280, "height": 800},
                    "en",
                    "This account has been disabled by an admin: ask an admin to enable it again.",
                ),
                (
                    {"width": 360, "height": 740},
                    "zh",
                    "这个账户已被管理员停用：请联系管理员重新启用。",
                ),
            ):
                user = Watched(browser, viewport, lang)
                watched.append(user)
                user.sign_in(stack.url, carol_token)
                expect(user.page.locator("#sign-in-error")).to_have_text(words, timeout=WAIT_MS)
                expect(user.page.locator("#app")).to_be_hidden()

            # Enabled again: she signs in; a new token ends that; end sessions.
            carol.locator('button[data-user-action="enable"]').click()
            expect(carol).to_have_attribute("data-disabled", "false")
            user = Watched(browser, {"width": 360, "height": 740}, "zh")
            watched.append(user)
            user.sign_in(stack.url, carol_token)
            expect(user.page.locator("#app")).to_be_visible(timeout=WAIT_MS)
            page.click("#users-refresh")
            expect(carol.locator('[data-role="sessions"]')).to_have_text("1")
            carol.locator('button[data-user-action="token"]').click()
            expect(page.locator("#confirm-title")).to_have_text("Give carol a new token?")
            page.click("#confirm-ok")
            expect(token).not_to_have_text(carol_token)
            new_token = token.inner_text()
            expect(carol.locator('[data-role="sessions"]')).to_have_text("0")
            old = request("GET", f"{stack.url}api/me", token=carol_token)
            assert old.status == 401, old.brief()
            assert request("GET", f"{stack.url}api/me", token=new_token).status == 200
        finally:
            browser.close()
    errors = [error for one in watched for error in one.errors]
    assert not errors, errors


def lambda_not_empty() -> Any:
    import re

    return re.compile(r"^\S{16,}$")
