"""Before/after screenshots of issue 36's item 5 (a task's details) for
docs/screenshots/ (run by hand, not by CI):
``python -m tests.ui.screenshots_details36 [--before COMMIT] [--out DIR]``.

"Before" is the web UI of ``--before`` (default ``ad1857e``, the tree
before issue 36), served by request routing as tests/ui/screenshots.py
does; "after" the working tree's, against the same site: a task whose
archive POST timed out (UNKNOWN), reconciled "submitted" with a note, then
downloaded.  Both are opened at ``#task/GID``: before, there is no such
page (the list is shown, one row per task and nothing behind it); after, the
task's page with its ids, cost, why it went UNKNOWN and its history.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from tasknet.cli.demo import NodeSpec
from tasknet.cli.jsonhttp import request
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, gid_with_size
from tests.ui.screenshots import (
    REPO,
    WAIT_MS,
    Camera,
    Stack,
    api,
    compress,
    old_static,
    status,
    wait,
)

AUDIT = "/api/galleries/*/archive"


def reconciled_task(stack: Stack) -> int:
    rule = {"method": "POST", "path": AUDIT, "fault": "timeout", "times": 1}
    reply = request("PUT", f"{stack.upstream_url}/_drill/faults", {"rules": [rule]})
    assert reply.status == 200, reply.brief()
    gid = gid_with_size(64 * 1024, 90_000, 5_100_001)
    api(stack, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token", "name": "Harbour"})
    wait("the UNKNOWN", lambda: status(stack, gid) == "SUBMIT_UNKNOWN")
    verdict = {"verdict": "submitted", "note": "the upstream's log shows the POST"}
    api(stack, "POST", f"/api/admin/tasks/{gid}/resolve", verdict)
    wait("the download", lambda: status(stack, gid) == "COMPLETED")
    return gid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--before", default="ad1857e")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tasknet-shots-") as temp:
        before = old_static(args.before, Path(temp) / "before")
        stack = Stack(
            Path(temp) / "details",
            bandwidth=None,
            nodes=(NodeSpec("node-1", 2, "shots-details-1"),),
            ready_timeout=90.0,
        )
        stack.start()
        try:
            gid = reconciled_task(stack)

            def details_shown(page: Any) -> None:
                page.wait_for_selector("#task-list > li", timeout=WAIT_MS)
                page.evaluate(f"location.hash = '#task/{gid}'")
                if page.locator("#view-task").count():
                    page.wait_for_selector("#task-history li", timeout=WAIT_MS)

            with sync_playwright() as playwright:
                launch_args = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=launch_args)
                try:
                    camera = Camera(browser, args.out, before)
                    camera.scene("item5", stack.url, details_shown)
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
