"""One signed-in page in headless Chromium, for the browser tests that
drive the demo stack through a single page: the browser launched, a
context with the CSP violation watch, console and page errors recorded,
the demo token signed in through the form, the page in English.

The tests judge what was recorded (each has its own expected console
noise, e.g. the 401 of the session probe before signing in).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tasknet.cli.demo import DEMO_TOKEN
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, require_browser

#: How long the page may take to sign in and go live.
WAIT_MS = 60_000
DESKTOP = {"width": 1280, "height": 800}

#: Records securitypolicyviolation events before any page script runs.
CSP_WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', e => {
  window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || '') + ' ' + (e.sample || ''));
});
"""


@dataclass
class SignedIn:
    """The page, its context and what went wrong on it."""

    page: Any
    context: Any
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def csp(self) -> list[str]:
        """The CSP violations seen so far."""
        return list(self.page.evaluate("window.__csp || []"))


@contextmanager
def signed_in_page(
    url: str,
    *,
    viewport: dict[str, int] = DESKTOP,
    permissions: Sequence[str] = (),
    **context_options: Any,
) -> Iterator[SignedIn]:
    """A page of the site at ``url``, signed in with the demo token, live,
    in English; the browser closes when the block ends."""
    sync_api = require_browser()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(locale="en-US", viewport=viewport, **context_options)
            if permissions:
                context.grant_permissions(list(permissions), origin=url)
            context.add_init_script(CSP_WATCH)
            page = context.new_page()
            signed = SignedIn(page, context)
            page.on(
                "console",
                lambda m: signed.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: signed.page_errors.append(str(e)))
            page.goto(url)
            page.fill("#token-input", DEMO_TOKEN)
            page.press("#token-input", "Enter")
            sync_api.expect(page.locator("#live")).to_have_attribute(
                "data-state", "online", timeout=WAIT_MS
            )
            if page.locator("html").get_attribute("lang") != "en":
                page.click("#lang-toggle")
            yield signed
        finally:
            browser.close()
