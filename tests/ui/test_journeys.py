"""Issue 21's journeys in headless Chromium against real processes.

Each journey starts its own stack (real ``twistd -n`` mock upstream, site
and v2 node(s): :class:`JourneyStack`, a :class:`DemoStack` whose nodes may
have fewer download slots) or, for the last one, the demo itself, and drives
Debian's Chromium with Playwright.  Every page is watched for page errors,
console errors and CSP violations (``Watched`` of test_views_browser); any
of them fails the test.

* queued vs downloading: a node with one download slot and three tasks;
* a node killed (SIGKILL) while downloading, then a delete it cannot
  confirm, force-deleted from the UI with a note;
* the upstream down while a task downloads, and a create meanwhile;
* the site restarted: "not reachable" clears by itself;
* "Load more" while a live refresh runs;
* the demo (``scripts/demo``) surviving a killed node.

Speeds come from the upstream's ``--bandwidth`` (bytes/s per response) and
archive sizes from the deterministic catalog (``gid_with_size``), so a
download lasts long enough to be looked at and no longer.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DEMO_TOKEN, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import Reply, request
from tasknet.process import Child
from tasknet.upstream.catalog import gallery
from tests.ui.conftest import (
    CHROMIUM,
    CHROMIUM_ARGS,
    gid_with_size,
    require_browser,
    seed_submitted,
)
from tests.ui.signed_in import CSP_WATCH
from tests.ui.test_demo import _processes_under
from tests.ui.test_views_browser import Watched, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WAIT_MS = 30_000
DESKTOP = {"width": 1280, "height": 800}
# The site's outbox poll, which also pushes the views whose liveness changed
# (a node that dropped): at most this long after the fact, plus a report.
LIVENESS_MS = 15_000


@dataclass
class JourneyStack(DemoStack):
    """A :class:`DemoStack` whose nodes may run fewer downloads at once
    (``downloads``: node id -> ``--downloads``)."""

    downloads: dict[str, int] = field(default_factory=dict)

    def _twistd(self, name: str, plugin: str, args: list[str]) -> Child:
        if plugin == "tasknet-node" and name in self.downloads:
            args = [*args, "--downloads", str(self.downloads[name])]
        return super()._twistd(name, plugin, args)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    sync_api = require_browser()
    playwright = sync_api.sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[Callable[..., JourneyStack]]:
    """``stacks(**options)``: a started :class:`JourneyStack`, stopped at the end."""
    require_browser()
    started: list[JourneyStack] = []

    def start(**options: Any) -> JourneyStack:
        options.setdefault("ready_timeout", 90.0)
        stack = JourneyStack(tmp_path / f"stack-{len(started)}", **options)
        started.append(stack)
        stack.start()
        return stack

    yield start
    for stack in started:
        stack.stop()


@pytest.fixture
def open_page(chromium: Any) -> Iterator[Callable[..., Watched]]:
    """``open_page(url, locale=...)``: a fresh context at ``url``, signed in
    as the demo admin; its page errors, console errors and CSP violations
    fail the test at the end."""
    contexts: list[Any] = []
    watched: list[Watched] = []

    def open_(url: str, locale: str = "en-US", viewport: dict[str, int] = DESKTOP) -> Watched:
        context = chromium.new_context(locale=locale, viewport=viewport)
        contexts.append(context)
        context.add_init_script(CSP_WATCH)
        page = context.new_page()
        w = Watched(page)
        page.on("console", lambda m: w.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: w.page_errors.append(str(e)))
        watched.append(w)
        answer = page.goto(url)
        assert answer is not None and "script-src 'self'" in (
            answer.headers.get("content-security-policy") or ""
        )
        sign_in(page, DEMO_TOKEN)
        return w

    yield open_
    try:
        for w in watched:
            assert w.problems() == [], w.problems()
    finally:
        for context in contexts:
            context.close()


def expect(subject: Any) -> Any:
    return require_browser().expect(subject)


def api(url: str, method: str, path: str, body: Any = None) -> Reply:
    return request(method, f"{url}{path.lstrip('/')}", body, token=DEMO_TOKEN)


def create(url: str, gid: int, name: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"gid": gid, "token": "upstream-token"}
    if name:
        body["name"] = name
    reply = api(url, "POST", "/api/tasks", body)
    assert reply.status == 201, reply.brief()
    return dict(reply.body["task"])


def task(url: str, gid: int) -> dict[str, Any]:
    reply = api(url, "GET", f"/api/tasks/{gid}")
    assert reply.status == 200, reply.brief()
    return dict(reply.body["task"])


def row(page: Any, gid: int) -> Any:
    return page.locator(f'#task-list > li[data-gid="{gid}"]')


def to_language(page: Any, lang: str) -> None:
    wanted = "en" if lang == "en" else "zh-CN"
    if page.evaluate("document.documentElement.lang") != wanted:
        page.click("#lang-toggle")
    expect(page.locator("html")).to_have_attribute("lang", wanted)


def no_reload(page: Any) -> None:
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    assert page.evaluate("window.__noReload") is True, "the page reloaded"


def submit_create(page: Any, gid: int) -> Any:
    page.fill("#create-gid", str(gid))
    page.fill("#create-token", "upstream-token")
    page.click("#create-submit")
    return page.locator("#create-result")


def distinct_gids(count: int, low: int, high: int, start: int) -> list[int]:
    gids: list[int] = []
    gid = start
    for _ in range(count):
        gid = gid_with_size(low, high, gid + 1)
        gids.append(gid)
    return gids


# Raw exception text that must never reach a person's eyes.
RAW = re.compile(r"Traceback|twisted|Error\b|errno|\b111\b|Connection was refused", re.I)


# -- a: queued vs downloading -----------------------------------------------------


def test_queued_rows_are_told_apart_from_the_download(
    stacks: Callable[..., JourneyStack], open_page: Callable[..., Watched], tmp_path: Path
) -> None:
    """One download slot, three tasks: one row downloads, two say "queued
    on node-1" (Submitted, no bytes, no speed); the Queued tab and the
    counts keep them apart; the node panel says "1 running, 2 queued"; the
    usage meter follows the creates live, and a create past the quota says
    the numbers."""
    stack = stacks(
        bandwidth=20_000,
        nodes=(NodeSpec("node-1", 2, "journey-a-1"),),
        downloads={"node-1": 1},
    )
    page = open_page(stack.url).page
    page.evaluate("window.__noReload = true")
    gids = distinct_gids(3, 250_000, 400_000, 3_100_000)
    for gid in gids:
        create(stack.url, gid, f"queued journey {gid}")

    page.wait_for_function(
        """() => {
          const rows = [...document.querySelectorAll('#task-list > li')];
          return rows.filter(r => r.dataset.status === 'DOWNLOADING').length === 1
            && rows.filter(r => r.dataset.queued === 'true').length === 2;
        }""",
        timeout=WAIT_MS,
    )
    running = page.locator('#task-list > li[data-status="DOWNLOADING"]')
    expect(running.locator('[data-role="status"]')).to_have_text("Downloading")
    expect(running.locator('[data-role="bytes"]')).to_have_text(
        re.compile(r"^[\d.,]+ (B|kB) of [\d.,]+ kB$")
    )
    queued = page.locator('#task-list > li[data-queued="true"]')
    for i in range(2):
        waiting = queued.nth(i)
        expect(waiting).to_have_attribute("data-status", "SUBMITTED")
        expect(waiting.locator('[data-role="status"]')).to_have_text("Submitted")
        expect(waiting.locator('[data-role="note"]')).to_have_text("queued on node-1, not started")
        expect(waiting.locator('[data-role="speed"]')).to_have_count(0)
        expect(waiting.locator('[data-role="eta"]')).to_have_count(0)
        # Its size, not "0 B of 300 kB" as if it were downloading.
        expect(waiting.locator('[data-role="bytes"]')).not_to_contain_text(" of ")
        expect(waiting).to_have_attribute("data-live", "false")

    # Counts and tabs: queued apart from downloading.
    counts = api(stack.url, "GET", "/api/tasks/counts").body["counts"]
    assert counts["QUEUED"] == 2 and counts["DOWNLOADING"] == 1, counts
    queued_tab = page.locator('#status-tabs [data-filter="queued"]')
    expect(queued_tab).to_be_visible()
    expect(page.locator('#status-tabs [data-count="queued"]')).to_have_text("2")
    # Queued is a part of All, not counted on top of it, and not of In
    # progress: that is the one download (issue 36, item 1).
    expect(page.locator('#status-tabs [data-count="active"]')).to_have_text("1")
    expect(page.locator('#status-tabs [data-count="all"]')).to_have_text("3")
    queued_tab.click()
    expect(page.locator("#task-list > li")).to_have_count(2)
    expect(page.locator('#task-list > li[data-queued="true"]')).to_have_count(2)
    expect(page.locator("#tasks-count")).to_have_text("2 of 2")

    # The node panel: one running, two queued (not "3 active").
    page.click("#nav-admin")
    expect(page.locator('#nodes-body tr[data-node="node-1"] [data-role="active"]')).to_have_text(
        "1 running, 2 queued", timeout=WAIT_MS
    )

    # The same in Chinese.
    to_language(page, "zh")
    expect(page.locator('#nodes-body tr[data-node="node-1"] [data-role="active"]')).to_have_text(
        "1 个运行中，2 个排队"
    )
    page.click("#nav-tasks")
    expect(queued.first.locator('[data-role="status"]')).to_have_text("已提交")
    expect(queued.first.locator('[data-role="note"]')).to_have_text("在 node-1 排队，尚未开始")

    # The usage meter followed the three creates (made elsewhere) live.
    cost = sum(gallery(gid).cost for gid in gids)
    used = api(stack.url, "GET", "/api/usage").body
    assert used["used"] == cost, used
    expect(page.locator("#usage-text")).to_contain_text(f"已用 {cost:,} 点")

    # Past the quota: the refusal says how much it costs and how much is used.
    admin = Path(sys.executable).with_name("tasknet-admin")
    subprocess.run(
        [str(admin), "--db", stack.database, "user", "quota", "demo", str(cost)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    refused = gid_with_size(64 * 1024, 90_000, 3_150_000)
    result = submit_create(page, refused)
    expect(result).to_have_attribute("data-outcome", "429", timeout=WAIT_MS)
    expect(result).to_have_text(
        f"本周额度不够创建这个任务，没有扣费：这个任务需要 {gallery(refused).cost} 点，"
        f"本周已用 {cost:,} 点 / 额度 {cost:,} 点。"
    )
    body = request(
        "POST",
        f"{stack.url}api/tasks",
        {"gid": refused, "token": "upstream-token"},
        token=DEMO_TOKEN,
    ).body["error"]
    assert body["code"] == "quota_exceeded"
    assert (body["cost"], body["used"], body["quota"], body["unsettled"]) == (
        gallery(refused).cost,
        cost,
        cost,
        0,
    ), body
    no_reload(page)


# -- b: a node killed while downloading ----------------------------------------------


def test_a_node_killed_while_downloading(
    stacks: Callable[..., JourneyStack], open_page: Callable[..., Watched]
) -> None:
    """SIGKILL the node mid-download: without a reload the row drops its
    speed and ETA, says "node-1 offline since …", is not live, and the Live
    indicator names the node; a delete then waits for the offline node and
    says so, and the admin force-deletes it from the row with a note."""
    stack = stacks(bandwidth=30_000, nodes=(NodeSpec("node-1", 2, "journey-b-1"),))
    page = open_page(stack.url).page
    page.evaluate("window.__noReload = true")
    gid = gid_with_size(600_000, 900_000, 3_200_000)
    create(stack.url, gid, "killed node journey")
    line = row(page, gid)
    expect(line).to_have_attribute("data-status", "DOWNLOADING", timeout=WAIT_MS)
    expect(line.locator('[data-role="speed"]')).to_have_text(re.compile(r"B/s$"), timeout=WAIT_MS)
    expect(line).to_have_attribute("data-live", "true")
    expect(page.locator("#live")).to_have_text("Live")

    stack.child("node-1").kill()

    expect(line).to_have_attribute("data-node-connected", "false", timeout=LIVENESS_MS)
    expect(line.locator('[data-role="speed"]')).to_have_count(0)
    expect(line.locator('[data-role="eta"]')).to_have_count(0)
    expect(line.locator('[data-role="note"]')).to_have_text(
        re.compile(r"^node-1 offline since \d{1,2}:\d{2}"), timeout=WAIT_MS
    )
    expect(line).to_have_attribute("data-live", "false")
    live = page.locator("#live")
    expect(live).to_have_attribute("data-state", "online")  # the socket is live ...
    expect(live).to_have_attribute("data-offline-nodes", "node-1")  # ... not this row
    expect(live).to_have_text("Live · node-1 offline")
    view = task(stack.url, gid)
    assert view["nodeConnected"] is False and view["speed"] is None, view
    no_reload(page)

    # A delete now waits for node-1, and the row says so.
    line.locator('button[data-action="delete"]').click()
    page.click("#confirm-ok")
    expect(line).to_have_attribute("data-status", "DELETE_PENDING", timeout=WAIT_MS)
    expect(line.locator('[data-role="note"]')).to_have_text(
        re.compile(r"^waiting for node-1 \(offline since \d{1,2}:\d{2}.*\)$")
    )
    force = line.get_by_role("button", name=f"Force delete: gid {gid} (killed node journey)")
    expect(force).to_be_visible()
    force.click()
    expect(page.locator("#confirm-dialog")).to_be_visible()
    expect(page.locator("#confirm-text")).to_contain_text("node-1 is offline")
    expect(page.locator("#confirm-ok")).to_be_disabled()  # the note is required
    page.fill("#confirm-note", "node-1 was killed by the journey test; its disk is gone")
    expect(page.locator("#confirm-ok")).to_be_enabled()
    page.click("#confirm-ok")
    expect(line).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator("#notice")).to_have_text(f"gid {gid} force-deleted.")
    assert api(stack.url, "GET", f"/api/tasks/{gid}").status == 404
    expect(live).to_have_text("Live")  # no row waits for node-1 any more
    no_reload(page)


# -- c: the upstream down -------------------------------------------------------------


def test_the_upstream_down_while_downloading(
    stacks: Callable[..., JourneyStack], open_page: Callable[..., Watched]
) -> None:
    """Stop the mock upstream mid-download: the row shows the node's detail
    (retrying, upstream unreachable) in the reader's language instead of a
    speed; a create meanwhile says the upstream is unavailable in plain
    words, in English and Chinese; with the upstream back the download
    finishes and the detail goes."""
    stack = stacks(
        bandwidth=40_000, upstream_timeout=3.0, nodes=(NodeSpec("node-1", 2, "journey-c-1"),)
    )
    page = open_page(stack.url).page
    page.evaluate("window.__noReload = true")
    gid = gid_with_size(200_000, 300_000, 3_300_000)
    create(stack.url, gid, "upstream journey")
    line = row(page, gid)
    expect(line.locator('[data-role="speed"]')).to_have_text(re.compile(r"B/s$"), timeout=WAIT_MS)

    upstream = stack.child("upstream")
    upstream.stop()
    detail = line.locator('[data-role="detail"]')
    expect(detail).to_have_text(
        re.compile(
            r"^retrying in (a moment|[\d.,]+ (s|min)): "
            r"upstream unreachable \(connection refused\)$"
        ),
        timeout=WAIT_MS,
    )
    expect(line).to_have_attribute("data-status", "DOWNLOADING")
    expect(line).to_have_attribute("data-live", "false")
    expect(line.locator('[data-role="speed"]')).to_have_count(0)
    expect(line.locator('[data-role="eta"]')).to_have_count(0)
    assert not RAW.search(line.inner_text()), line.inner_text()

    # A create while the upstream is down: a sentence, no exception text.
    other = gid_with_size(64 * 1024, 90_000, 3_350_000)
    result = submit_create(page, other)
    expect(result).to_have_attribute("data-outcome", "502", timeout=WAIT_MS)
    expect(result).to_have_text(
        "The upstream is unavailable; nothing was sent and nothing charged. Try again later."
    )
    assert result.locator("code, details").count() == 0
    to_language(page, "zh")
    expect(detail).to_have_text(re.compile(r"(后重试|马上重试)：上游无法访问（连接被拒绝）$"))
    result = submit_create(page, other)  # a refused create left nothing: the same gid again
    expect(result).to_have_attribute("data-outcome", "502", timeout=WAIT_MS)
    expect(result).to_have_text("上游暂时不可用，请求没有发出，也没有扣费；可以稍后再试。")
    assert not RAW.search(result.inner_text()) and result.locator("code, details").count() == 0
    assert api(stack.url, "GET", f"/api/tasks/{other}").status == 404

    # The upstream is back: the download resumes and completes; the detail goes.
    upstream.start()
    expect(line).to_have_attribute("data-status", "COMPLETED", timeout=60_000)
    expect(detail).to_have_count(0)
    expect(line.locator('[data-role="status"]')).to_have_text("下载完成")
    no_reload(page)


# -- the site restarted: "not reachable" clears ------------------------------------------


def test_not_reachable_clears_when_the_site_is_back(
    stacks: Callable[..., JourneyStack], open_page: Callable[..., Watched]
) -> None:
    stack = stacks(bandwidth=None, nodes=(NodeSpec("node-1", 2, "journey-e-1"),))
    w = open_page(stack.url)
    w.expected.append("WebSocket connection to")  # the redials while the site is down
    page = w.page
    gid = gid_with_size(64 * 1024, 90_000, 3_400_000)
    site = stack.child("site")
    site.stop()
    try:
        expect(page.locator("#live")).to_have_attribute("data-state", "offline", timeout=WAIT_MS)
        result = submit_create(page, gid)
        expect(result).to_have_attribute("data-outcome", "0", timeout=WAIT_MS)
        expect(result).to_have_text(
            "The site is not reachable. Check your connection and try again."
        )
        page.click("#tasks-refresh")
        expect(page.locator("#notice")).to_have_text(
            "The site is not reachable. Check your connection and try again."
        )
    finally:
        site.start()
    # Back: Live again, and neither message is left beside it.
    expect(page.locator("#live")).to_have_attribute("data-state", "online", timeout=60_000)
    expect(page.locator("#notice")).to_be_empty()
    expect(result).to_be_empty()
    expect(page.locator("#tasks-stale")).to_be_hidden()


# -- "Load more" while a live refresh runs ------------------------------------------------


def test_load_more_during_a_live_refresh_neither_duplicates_nor_drops(
    stacks: Callable[..., JourneyStack], open_page: Callable[..., Watched]
) -> None:
    """ "Load more" is held on its way; a live refresh starts meanwhile (the
    socket's reconnect does the same as Refresh); a push adds a task on top.
    When both answered, the list is every row once, in order: the top
    page, the pushed task and the next page."""
    stack = stacks(bandwidth=None, nodes=())
    first = 3_500_001
    seed_submitted(stack.database, range(first, first + 120), "ghost-node")
    page = open_page(stack.url).page
    page.evaluate("window.__noReload = true")
    expect(page.locator("#task-list > li")).to_have_count(50, timeout=WAIT_MS)
    page.wait_for_load_state("networkidle")

    held: list[Any] = []
    page.route(re.compile(r"/api/tasks\?.*after="), lambda route: held.append(route))
    page.click("#tasks-more")
    deadline = time.monotonic() + 10
    while not held:  # the route handler runs while Playwright waits
        assert time.monotonic() < deadline, "Load more sent no request"
        page.wait_for_timeout(50)
    # A live refresh and a push while "Load more" is out.
    page.click("#tasks-refresh")
    newest = first + 1000
    seed_submitted(stack.database, range(newest, newest + 1), "ghost-node")
    expect(row(page, newest)).to_have_count(1, timeout=LIVENESS_MS)  # pushed on top
    held[0].continue_()
    page.unroute(re.compile(r"/api/tasks\?.*after="))
    newest_first = [newest, *range(first + 119, first - 1, -1)]
    wanted = [str(g) for g in newest_first[:101]]
    page.wait_for_function(
        "wanted => JSON.stringify([...document.querySelectorAll('#task-list > li')]"
        ".map(e => e.dataset.gid)) === JSON.stringify(wanted)",
        arg=wanted,
        timeout=WAIT_MS,
    )
    page.wait_for_load_state("networkidle")
    shown = page.eval_on_selector_all("#task-list > li", "els => els.map(e => e.dataset.gid)")
    assert shown == wanted, shown[:5]
    expect(page.locator("#tasks-count")).to_have_text("101 of 121")
    no_reload(page)


# -- d: the demo survives a killed node ----------------------------------------------------


class Demo:
    """The demo as a person starts it: ``scripts/demo`` (which sets the
    virtualenv up when it is missing or older than setup.cfg, then runs
    ``tasknet-demo``); when that set-up would run here, ``tasknet-demo``
    of this virtualenv, the program scripts/demo ends in."""

    def __init__(self, data: Path, *argv: str) -> None:
        script = REPO / "scripts" / "demo"
        venv_demo = REPO / ".venv" / "bin" / "tasknet-demo"
        ready = (
            venv_demo.exists()
            and Path(sys.executable).parent == venv_demo.parent
            and venv_demo.stat().st_mtime >= (REPO / "setup.cfg").stat().st_mtime
        )
        program = [str(script)] if ready else [str(Path(sys.executable).with_name("tasknet-demo"))]
        self.command = [*program, "--port", "0", "--data", str(data), "--timeout", "90", *argv]
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.output)
                continue
            self.output.append(line)
            if needle in line:
                return line
        raise AssertionError(f"no {needle!r} in time; output:\n{''.join(self.output)}")

    @property
    def url(self) -> str:
        match = re.search(r"URL: (http://127\.0\.0\.1:\d+/)", "".join(self.output))
        assert match, "".join(self.output)
        return match.group(1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=60)


def test_the_demo_survives_a_killed_node(tmp_path: Path, open_page: Callable[..., Watched]) -> None:
    """SIGKILL one node of a running demo: the demo says so and keeps going,
    the UI shows the node offline (its row and the node panel), the site
    keeps answering, and the task on the other node completes."""
    data = tmp_path / "demo"
    demo = Demo(data, "--bandwidth", "40000")
    try:
        demo.wait_for("Press Ctrl-C", timeout=120)
        url = demo.url
        page = open_page(url, locale="zh-CN").page
        page.evaluate("window.__noReload = true")

        # One task per node (the dispatcher gives a task to the least busy one).
        doomed = create(url, gid_with_size(700_000, 1_000_000, 3_600_000), "demo doomed")["gid"]
        expect(row(page, doomed)).to_have_attribute("data-status", "DOWNLOADING", timeout=WAIT_MS)
        victim = task(url, doomed)["node"]
        survivor = create(url, gid_with_size(150_000, 250_000, 3_650_000), "demo survivor")["gid"]
        deadline = time.monotonic() + 30
        while task(url, survivor)["node"] is None:
            assert time.monotonic() < deadline, task(url, survivor)
            time.sleep(0.2)
        survivor_node = task(url, survivor)["node"]
        assert survivor_node != victim, task(url, survivor)

        [pid] = _processes_under(data / victim)
        os.kill(pid, signal.SIGKILL)
        said = demo.wait_for(f"{victim} exited", timeout=30)
        assert "killed by SIGKILL" in said and "the rest keeps running" in said, said

        line = row(page, doomed)
        expect(line).to_have_attribute("data-node-connected", "false", timeout=LIVENESS_MS)
        expect(line.locator('[data-role="note"]')).to_have_text(
            re.compile(rf"^{victim} 自 .+ 起离线$"), timeout=WAIT_MS
        )
        expect(line.locator('[data-role="speed"]')).to_have_count(0)
        expect(page.locator("#live")).to_have_text(f"实时更新中 · {victim} 离线")
        # The task on the other node carries on to the end.
        expect(row(page, survivor)).to_have_attribute("data-status", "COMPLETED", timeout=60_000)
        page.click("#nav-admin")
        gone = page.locator(f'#nodes-body tr[data-node="{victim}"]')
        expect(gone).to_have_attribute("data-connected", "false", timeout=WAIT_MS)
        expect(gone.locator('[data-role="state"]')).to_contain_text("已断开")
        expect(page.locator(f'#nodes-body tr[data-node="{survivor_node}"]')).to_have_attribute(
            "data-connected", "true"
        )
        health = request("GET", url + "healthz")
        assert health.status == 200 and health.body["recovery"] == "done", health.brief()
        assert demo.proc.poll() is None, "".join(demo.output)
        assert _processes_under(data / victim) == []  # nothing restarted it
        no_reload(page)
        # Leave the page before the site goes: its WebSocket would otherwise try
        # to reconnect to a stopped site, a console error on a slow machine.
        page.goto("about:blank")
        assert demo.stop() == 0
    finally:
        if demo.proc.poll() is None:
            demo.proc.kill()
            demo.proc.wait()
        for pid in _processes_under(data):
            os.kill(pid, signal.SIGKILL)
