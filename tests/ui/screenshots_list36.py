"""Before/after screenshots of issue 36's items 3 and 4 (the list) for
docs/screenshots/ (run by hand, not by CI):
``python -m tests.ui.screenshots_list36 [--before COMMIT] [--out DIR]``.

"Before" is the web UI of ``--before`` (default ``ad1857e``, the tree
before issue 36), served by request routing as tests/ui/screenshots.py
does; "after" the working tree's, against the same site: 3,000 seeded tasks
whose newest 50 are 40 completed and 10 failed deletes
(tests/ui/test_table_bulk_browser.py's data).

* ``item3``: "Select all" ticked on the first page and "Retry" asked.
  Before: retry offered for all 50 (it can act on 10). After: "Retry delete
  (10)", a dialog that says the other 40 are left as they are, and "Select
  all 3,000 matching" (hidden behind the dialog on a phone).
* ``item4``: the list of 3,000.  Before: the cards.  After: the table view
  on page 30 of 60, scrolled to its pager: the page numbers (1 … 29 30 31
  … 60), "Go to page" and "Page 30 of 60".

``--items item4 --versions after`` takes only those again.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from tasknet.cli.demo import NodeSpec
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, seed_submitted
from tests.ui.screenshots import REPO, WAIT_MS, Camera, Stack, compress, old_static
from tests.ui.test_table_bulk_browser import FIRST_GID, GHOST, SEEDED, finish_and_fail


def retry_asked(page: Any) -> None:
    page.wait_for_selector("#task-list > li", timeout=WAIT_MS)
    page.wait_for_timeout(500)
    page.check("#select-all")
    page.locator("#tasks-section").evaluate("e => e.scrollIntoView()")
    page.click("#bulk-retry")
    page.wait_for_selector("#confirm-dialog[open]", timeout=WAIT_MS)


def table_shown(page: Any) -> None:
    page.wait_for_selector("#task-list > li", timeout=WAIT_MS)
    if not page.locator("#view-table").count():  # before: the cards
        page.locator("#tasks-section").evaluate("e => e.scrollIntoView()")
        return
    page.click("#view-table")
    page.wait_for_selector("#task-table tbody tr", timeout=WAIT_MS)
    if page.locator("#page-go-number").count():
        page.fill("#page-go-number", "30")
        page.press("#page-go-number", "Enter")
        page.wait_for_selector('#page-where[data-page="30"]', timeout=WAIT_MS)
        page.locator("#table-pager").evaluate("e => e.scrollIntoView({block: 'end'})")
    else:
        page.locator("#tasks-section").evaluate("e => e.scrollIntoView()")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--before", default="ad1857e")
    parser.add_argument("--items", default="item3,item4", help="comma-separated")
    parser.add_argument("--versions", default="before,after", help="comma-separated")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tasknet-shots-") as temp:
        before = old_static(args.before, Path(temp) / "before")
        stack = Stack(
            Path(temp) / "list",
            bandwidth=None,
            nodes=(NodeSpec("node-1", 2, "shots-list-1"),),
            ready_timeout=90.0,
        )
        stack.start()
        try:
            seed_submitted(stack.database, range(FIRST_GID, FIRST_GID + SEEDED), GHOST)
            finish_and_fail(stack.database)
            with sync_playwright() as playwright:
                launch_args = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=launch_args)
                try:
                    camera = Camera(browser, args.out, before)
                    versions = tuple(args.versions.split(","))
                    items = args.items.split(",")
                    if "item3" in items:
                        camera.scene("item3", stack.url, retry_asked, versions=versions)
                    if "item4" in items:
                        camera.scene("item4", stack.url, table_shown, versions=versions)
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
