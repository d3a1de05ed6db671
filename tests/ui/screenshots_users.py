"""Before/after screenshots of issue 36, item 8 (Admin → Users) for
docs/screenshots/ (run by hand, not by CI):
``python -m tests.ui.screenshots_users``.

"Before" is the UI of ``ad1857e`` (no Users section: the admin view as it
was), "after" the working tree's, both against one demo site with a few
users (one of them disabled), at 1280×800 and 360×740, in English and
Chinese.  The machinery (old static files served by request routing,
pngquant) is tests/ui/screenshots.py's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from tasknet.cli.demo import DemoStack
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.ui.screenshots import REPO, WAIT_MS, Camera, api, compress, old_static

BEFORE = "ad1857e"


def show_users(page: Any) -> None:
    page.click("#nav-admin")
    page.wait_for_selector("#nodes-section", state="visible", timeout=WAIT_MS)
    if page.locator("#users-section").count():
        page.wait_for_selector("#users-body tr", timeout=WAIT_MS)
        page.locator("#users-section").evaluate("e => e.scrollIntoView()")
    page.wait_for_timeout(300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="screenshots_users", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tasknet-shots-") as temp:
        before = old_static(BEFORE, Path(temp) / "before")
        stack = DemoStack(Path(temp) / "stack", nodes=(), ready_timeout=90.0)
        stack.start()
        try:
            for name, quota in (("alice", 5000), ("bob", 1200), ("carol", 300)):
                api(stack, "POST", "/api/admin/users", {"name": name, "quota": quota})
            api(stack, "POST", "/api/admin/users/carol/disable")
            with sync_playwright() as playwright:
                chromium_args = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=chromium_args)
                try:
                    camera = Camera(browser, args.out, before)
                    camera.scene("item8", stack.url, show_users)
                finally:
                    browser.close()
        finally:
            stack.stop()
        compress(camera.taken)
    total = sum(p.stat().st_size for p in camera.taken)
    print(f"{len(camera.taken)} screenshots in {args.out} ({total / 1000:,.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
