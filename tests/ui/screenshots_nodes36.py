"""Screenshots of issue 36's items 1, 2 and 6 (the nodes) for docs/screenshots/
(run by hand, not by CI), one version of the whole site at a time:

    python tests/ui/screenshots_nodes36.py --label after
    git archive 31c18d0 | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python tests/ui/screenshots_nodes36.py --label before

Items 1 and 2 are the site's doing (what it records of a legacy node's
queue, what the panel counts), so "before" is the whole tree of an earlier
commit (its site, nodes and UI, imported first through ``PYTHONPATH``),
not its static files alone.  The stack: the demo's upstream, slowed; a v2
node and a legacy node with two download slots each; 40 tasks, so the
legacy node holds about 20 of which 2 download.

* ``item1``: the task list (its tabs and counts, the legacy node's rows);
* ``item6``: the admin page's node panel, node-1 draining (Pause and
  Resume offered) and the legacy node limited to 25 (after; the "before"
  site has no such control).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from tasknet.cli.demo import DEMO_TOKEN, SERVES_USERS, NodeSpec
from tasknet.cli.jsonhttp import request
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, gid_with_size
from tests.ui.screenshots import LOCALES, VIEWPORTS, WAIT_MS, Stack, compress

TASKS = 40


def _api(url: str, method: str, path: str, body: Any = None) -> Any:
    return request(method, f"{url}{path.lstrip('/')}", body, token=DEMO_TOKEN)


def _seed(url: str) -> None:
    gid = 6_100_001
    for _ in range(TASKS):
        gid = gid_with_size(300_000, 900_000, gid + 1)
        reply = _api(url, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token"})
        assert reply.status in (201, 202), reply.brief()


def _tasks(page: Any) -> None:
    page.wait_for_selector("#task-list > li", timeout=WAIT_MS)
    page.locator("#tasks-section").evaluate("e => e.scrollIntoView()")


def _nodes(page: Any) -> None:
    page.click("#nav-admin")
    page.wait_for_selector("#nodes-body tr", timeout=WAIT_MS)
    # The panel fits the window (its controls included): no sideways scroll.
    page.locator("#nodes-table").evaluate("e => e.scrollIntoView()")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", required=True, choices=("before", "after"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[2] / "docs/screenshots")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    taken: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="tasknet-shots-") as temp:
        stack = Stack(
            Path(temp) / "nodes",
            bandwidth=20_000,
            nodes=(
                NodeSpec("node-1", 2, "shots-nodes-1", SERVES_USERS),
                NodeSpec("node-2", 1, "shots-nodes-2"),
            ),
            ready_timeout=90.0,
        )
        stack.downloads = {"node-1": 2, "node-2": 2}
        stack.start()
        try:
            _seed(stack.url)
            if args.label == "after":
                for node, body in (
                    ("node-1", {"mode": "DRAINING"}),
                    ("node-2", {"downloadLimit": 25}),
                ):
                    reply = _api(stack.url, "POST", f"/api/admin/nodes/{node}/control", body)
                    assert reply.status == 200, reply.brief()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    for item, arrange in (("item1", _tasks), ("item6", _nodes)):
                        for device in VIEWPORTS:
                            for lang in LOCALES:
                                context = browser.new_context(
                                    viewport=VIEWPORTS[device], locale=LOCALES[lang]
                                )
                                context.add_init_script(
                                    f"localStorage.setItem('tasknet.lang', '{lang}')"
                                )
                                page = context.new_page()
                                page.goto(stack.url)
                                page.fill("#token-input", DEMO_TOKEN)
                                page.press("#token-input", "Enter")
                                page.wait_for_function(
                                    "() => document.getElementById('live').dataset.state"
                                    " === 'online'",
                                    timeout=WAIT_MS,
                                )
                                # A few legacy reports in: what the rows say has settled.
                                page.wait_for_timeout(4000)
                                arrange(page)
                                page.wait_for_timeout(600)
                                target = args.out / f"{item}-{args.label}-{device}-{lang}.png"
                                page.screenshot(path=str(target))
                                taken.append(target)
                                print(f"  {target.name}", flush=True)
                                context.close()
                finally:
                    browser.close()
        finally:
            stack.stop()
    compress(taken)
    return 0


if __name__ == "__main__":
    sys.exit(main())
