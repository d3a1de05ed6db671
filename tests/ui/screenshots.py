"""Before/after screenshots of issue 21 for docs/screenshots/ (run by hand,
not by CI): ``scripts/screenshots`` or ``python -m tests.ui.screenshots``.

"Before" is the web UI of git commit ``f364a0e`` (its static files, read
with ``git show`` into a temporary directory and served in place of the
site's own by Playwright's request routing: nothing is checked out), "after"
the UI of the working tree, both against the same running site.  Each item
of issue 21 that changed what a person sees is shot at 1280×800 and
360×740, in English and in Chinese:

* ``02-queued``: a node with one download slot holding three tasks (one
  downloading, two queued), beside a node running two;
* ``03-failures``: the same after a node was killed (its rows offline, a
  delete waiting for it) and with a download the upstream keeps refusing
  (503: the node's ``detail``, retrying);
* ``05-charts``: the charts section with an hour of data;
* ``06-thousands``: 3,000 tasks.

Needs Debian's ``chromium`` and, for the Chinese shots, ``fonts-noto-cjk``
(headless Chromium has no CJK font of its own); ``pngquant``, when
installed, makes the PNGs a fraction of their size.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from tasknet.cli.demo import DEMO_TOKEN, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import request
from tasknet.process import Child
from tasknet.upstream.catalog import gallery
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, gid_with_size, seed_submitted

REPO = Path(__file__).resolve().parents[2]
BEFORE = "f364a0e"
STATIC = "tasknet/site/web/static"
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "mobile": {"width": 360, "height": 740}}
LOCALES = {"en": "en-US", "zh": "zh-CN"}
WAIT_MS = 60_000


class Stack(DemoStack):
    """A :class:`DemoStack` whose nodes may run fewer downloads at once."""

    downloads: dict[str, int]

    def _twistd(self, name: str, plugin: str, args: list[str]) -> Child:
        wanted = getattr(self, "downloads", {}).get(name)
        if plugin == "tasknet-node" and wanted:
            args = [*args, "--downloads", str(wanted)]
        return super()._twistd(name, plugin, args)


def old_static(commit: str, into: Path) -> Path:
    """The UI's static files as of ``commit``, in ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{commit}:{STATIC}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in names:
        blob = subprocess.run(
            ["git", "show", f"{commit}:{STATIC}/{name}"], cwd=REPO, check=True, capture_output=True
        ).stdout
        (into / name).write_bytes(blob)
    return into


def api(stack: DemoStack, method: str, path: str, body: Any = None) -> Any:
    reply = request(method, f"{stack.url}{path.lstrip('/')}", body, token=DEMO_TOKEN)
    assert reply.status < 400, reply.brief()
    return reply.body


def wait(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: timed out waiting for {what}")
        time.sleep(0.2)


def status(stack: DemoStack, gid: int) -> str:
    return str(api(stack, "GET", f"/api/tasks/{gid}")["task"]["status"])


def create(stack: DemoStack, gid: int, name: str) -> int:
    api(stack, "POST", "/api/tasks", {"gid": gid, "token": "upstream-token", "name": name})
    return gid


def gids(count: int, low: int, high: int, start: int) -> list[int]:
    found: list[int] = []
    gid = start
    for _ in range(count):
        gid = gid_with_size(low, high, gid + 1)
        found.append(gid)
    return found


class Camera:
    """Shoots one scene in every viewport and language, before and after."""

    def __init__(self, browser: Any, out: Path, before_dir: Path) -> None:
        self.browser = browser
        self.out = out
        self.before_dir = before_dir
        self.taken: list[Path] = []

    def _serve_old(self, route: Any) -> None:
        path = route.request.url.split("?", 1)[0].split("#", 1)[0]
        name = path.rsplit("/", 1)[-1] or "index.html"
        old = self.before_dir / name
        if not old.is_file():
            route.continue_()
            return
        kinds = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
        route.fulfill(
            status=200,
            body=old.read_bytes(),
            content_type=kinds.get(old.suffix, "application/octet-stream") + "; charset=utf-8",
        )

    @contextmanager
    def page(self, url: str, version: str, device: str, lang: str) -> Iterator[Any]:
        context = self.browser.new_context(viewport=VIEWPORTS[device], locale=LOCALES[lang])
        context.add_init_script(f"localStorage.setItem('tasknet.lang', '{lang}')")
        if version == "before":
            context.route("**/*", self._serve_old)
        try:
            page = context.new_page()
            page.goto(url)
            page.fill("#token-input", DEMO_TOKEN)
            page.press("#token-input", "Enter")
            page.wait_for_selector("#app:not([hidden])", timeout=WAIT_MS)
            page.wait_for_function(
                "() => document.getElementById('live').dataset.state === 'online'",
                timeout=WAIT_MS,
            )
            yield page
        finally:
            context.close()

    def scene(
        self,
        item: str,
        url: str,
        arrange: Callable[[Any], None],
        full: bool = False,
        versions: tuple[str, ...] = ("before", "after"),
    ) -> None:
        for version in versions:
            for device in VIEWPORTS:
                for lang in LOCALES:
                    with self.page(url, version, device, lang) as page:
                        arrange(page)
                        page.wait_for_timeout(600)  # pushes and counts settle
                        target = self.out / f"{item}-{version}-{device}-{lang}.png"
                        page.screenshot(path=str(target), full_page=full)
                        self.taken.append(target)
                        print(f"  {target.name}", flush=True)


def show_tasks(page: Any) -> None:
    page.wait_for_selector("#task-list > li", timeout=WAIT_MS)
    page.locator("#tasks-section").evaluate("e => e.scrollIntoView()")


def show_charts(page: Any) -> None:
    page.click("#nav-charts")
    page.wait_for_selector("#chart-usage svg, #chart-usage p", timeout=WAIT_MS)
    page.wait_for_timeout(500)


def live_scenes(camera: Camera, data: Path) -> None:
    """Items 2, 3 and 5 on one stack: node-1 with one download slot,
    node-2 (killed for item 3) and node-3 (whose download the upstream
    refuses), throttled so the downloads last the whole session."""
    stack = Stack(
        data / "live",
        bandwidth=12_000,
        nodes=(
            NodeSpec("node-1", 2, "shots-1"),
            NodeSpec("node-2", 2, "shots-2"),
            NodeSpec("node-3", 2, "shots-3"),
        ),
        ready_timeout=90.0,
    )
    stack.downloads = {"node-1": 1, "node-2": 2, "node-3": 2}
    stack.start()
    try:
        node2, node3 = stack.child("node-2"), stack.child("node-3")
        # A few small tasks that complete (the charts have an hour with data).
        quick = request("PUT", f"{stack.upstream_url}/_drill/faults", {"rules": []})
        assert quick.status == 200, quick.brief()
        small = [create(stack, g, f"photos {g}") for g in gids(3, 64 * 1024, 90_000, 4_100_000)]
        wait("the small tasks", lambda: all(status(stack, g) == "COMPLETED" for g in small))
        # Three tasks for node-1 alone (one slot), then two for node-2.
        node2.stop()
        node3.stop()
        wait("node-1 alone", lambda: stack.connected_nodes() == {"node-1"})
        for g in gids(3, 900_000, 1_100_000, 4_200_000):
            create(stack, g, f"album {g}")
        node2.start()
        wait("node-2 back", lambda: "node-2" in stack.connected_nodes())
        for g in gids(2, 900_000, 1_100_000, 4_300_000):
            create(stack, g, f"scans {g}")
        time.sleep(3)  # the first reports: queued and downloading
        print("02-queued", flush=True)
        camera.scene("02-queued", stack.url, show_tasks)

        # Item 3: node-3's download refused by the upstream (it retries),
        # node-2 killed (its rows offline), a delete waiting for it.
        node3.start()
        wait("node-3 back", lambda: "node-3" in stack.connected_nodes())
        refused = gid_with_size(300_000, 400_000, 4_400_000)
        rule: dict[str, Any] = {"method": "GET", "path": f"/files/{refused}-*", "fault": "error"}
        rule.update(params={"status": 503, "charged": False}, times=None)
        faults = request("PUT", f"{stack.upstream_url}/_drill/faults", {"rules": [rule]})
        assert faults.status == 200, faults.brief()
        create(stack, refused, f"refused {refused}")
        node2.kill()
        wait("node-2 offline", lambda: "node-2" not in stack.connected_nodes())
        pending = [t["gid"] for t in api(stack, "GET", "/api/tasks?node=node-2")["tasks"]]
        api(stack, "DELETE", f"/api/tasks/{pending[0]}")
        wait(
            "the refused download's detail",
            lambda: bool(api(stack, "GET", f"/api/tasks/{refused}")["task"]["detail"]),
        )
        time.sleep(6)  # the site's liveness poll has pushed node-2's rows
        print("03-failures", flush=True)
        camera.scene("03-failures", stack.url, show_tasks)
        print("05-charts", flush=True)
        camera.scene("05-charts", stack.url, show_charts, full=True)
    finally:
        stack.stop()


def thousands_scene(camera: Camera, data: Path) -> None:
    """Item 6: 3,000 tasks (seeded; most completed)."""
    stack = Stack(data / "thousands", bandwidth=None, nodes=(), ready_timeout=90.0)
    stack.start()
    try:
        first = 5_000_001
        seed_submitted(stack.database, range(first, first + 3000), "node-1")
        with closing(sqlite3.connect(stack.database, timeout=30)) as db:
            for gid in range(first, first + 3000):
                size = gallery(gid).size
                if gid % 17:
                    db.execute(
                        "UPDATE gallery SET status = 4, progress = 1.0, size = ?,"
                        " completed_at = updated_at WHERE gid = ?",
                        (size, gid),
                    )
                else:
                    db.execute("UPDATE gallery SET size = ? WHERE gid = ?", (size, gid))
            db.commit()
        for gid in range(first + 2990, first + 3000, 3):
            api(stack, "PUT", f"/api/favorites/{gid}")
        print("06-thousands", flush=True)
        camera.scene("06-thousands", stack.url, show_tasks)
    finally:
        stack.stop()


def compress(paths: list[Path]) -> None:
    tool = shutil.which("pngquant")
    if tool is None:
        print("pngquant is not installed: the PNGs stay as Chromium wrote them")
        return
    for path in paths:
        subprocess.run(
            # 48 colours: UI shots keep crisp text (CJK included) at a third of the size.
            [tool, "48", "--force", "--skip-if-larger", "--quality", "40-80"]
            + ["--ext", ".png", str(path)],
            check=False,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/screenshots", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--before", default=BEFORE, help="the commit of the 'before' UI")
    args = parser.parse_args(argv)
    # SIGTERM (a timeout, a kill) stops the stacks too: their ``finally`` runs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tasknet-shots-") as temp:
        before = old_static(args.before, Path(temp) / "before")
        with sync_playwright() as playwright:
            # The "before" page is served by request routing, which Chromium's
            # local network access checks do not count as a loopback page: its
            # WebSocket to 127.0.0.1 would be blocked.
            args_ = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args_)
            try:
                camera = Camera(browser, args.out, before)
                live_scenes(camera, Path(temp))
                thousands_scene(camera, Path(temp))
            finally:
                browser.close()
        compress(camera.taken)
    total = sum(p.stat().st_size for p in camera.taken)
    print(f"{len(camera.taken)} screenshots in {args.out} ({total / 1000:,.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
