"""``tasknet-demo`` as a real subprocess: ready banner, /healthz, clean Ctrl-C.

Needs the site, node and upstream twistd plugins; it starts six real
processes, so it is marked slow.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tasknet.cli.demo import DEMO_TOKEN
from tasknet.cli.jsonhttp import request

pytestmark = pytest.mark.slow

READY_TIMEOUT = 90.0


def _processes_under(directory: Path) -> list[int]:
    """Pids of live processes whose working directory is inside ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if state != "Z" and Path(cwd).is_relative_to(directory):
            found.append(int(entry.name))
    return found


def _reader(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)


def test_demo_starts_everything_and_stops_on_sigint(tmp_path: Path) -> None:
    demo = Path(sys.executable).with_name("tasknet-demo")
    data = tmp_path / "demo-data"
    proc = subprocess.Popen(
        [str(demo), "--port", "0", "--data", str(data), "--timeout", str(READY_TIMEOUT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    output: list[str] = []
    url = None
    try:
        deadline = time.monotonic() + READY_TIMEOUT + 15
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            output.append(line)
            match = re.search(r"URL: (http://127\.0\.0\.1:\d+/)", line)
            if match:
                url = match.group(1)
        assert url, "no URL line; output:\n" + "".join(output)
        banner = ""
        while "Press Ctrl-C" not in banner:
            banner += lines.get(timeout=5)
        assert f"token: {DEMO_TOKEN}" in banner

        health = request("GET", url + "healthz")
        assert health.status == 200, health.brief()
        assert health.body["recovery"] == "done"
        nodes = request("GET", url + "api/admin/nodes", token=DEMO_TOKEN)
        assert nodes.status == 200, nodes.brief()
        protocols = {n["id"]: n["protocol"] for n in nodes.body["nodes"]}
        assert protocols == {"node-1": 2, "node-2": 1, "node-3": 2}
        children = _processes_under(data)
        assert len(children) == 5, children  # upstream, site, node-1, node-2, node-3

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        leftover = _processes_under(data)
        assert leftover == [], f"children still running: {leftover}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _processes_under(data):
            os.kill(pid, signal.SIGKILL)


# -- issue 21, item 1: a child's death, --data kept across runs ---------------------


class RunningDemo:
    """``tasknet-demo`` as a subprocess, its output read line by line."""

    def __init__(self, *argv: str) -> None:
        demo = Path(sys.executable).with_name("tasknet-demo")
        self.proc = subprocess.Popen(
            [str(demo), "--port", "0", "--timeout", str(READY_TIMEOUT), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=_reader, args=(self.proc.stdout, self.lines), daemon=True).start()

    def next_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None or not self.lines.empty(), self.text
                continue
            self.output.append(line)
            return line
        raise AssertionError("the demo printed nothing more in time; output:\n" + self.text)

    def wait_for(self, needle: str, timeout: float = READY_TIMEOUT + 15) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(max(deadline - time.monotonic(), 0.1))
            if needle in line:
                return line

    def banner(self) -> str:
        start = len(self.output)
        self.wait_for("Press Ctrl-C")
        return "".join(self.output[start:])

    @property
    def text(self) -> str:
        return "".join(self.output)

    @property
    def url(self) -> str:
        match = re.search(r"URL: (http://127\.0\.0\.1:\d+/)", self.text)
        assert match, self.text
        return match.group(1)

    def stop(self, sig: int = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        rest = self.proc.stdout.read() if self.proc.stdout else ""
        while not self.lines.empty():
            self.output.append(self.lines.get())
        self.output.append(rest)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


ALL_UP = {"node-1": True, "node-2": True, "node-3": True}


def _nodes(url: str) -> dict[str, bool]:
    reply = request("GET", url + "api/admin/nodes", token=DEMO_TOKEN)
    assert reply.status == 200, reply.brief()
    return {node["id"]: node["connected"] for node in reply.body["nodes"]}


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_the_demo_survives_a_killed_node_and_shows_it_offline(tmp_path: Path) -> None:
    data = tmp_path / "demo-data"
    demo = RunningDemo("--data", str(data))
    try:
        banner = demo.banner()
        database = data / "site" / "tasknet-site.sqlite"
        assert f"database: {database}  (tasknet-admin --db {database} ...)" in banner
        assert f"logs: {data / 'logs'}" in banner
        assert f"data: {data}  (kept: start again with the same --data)" in banner
        url = demo.url
        assert _nodes(url) == ALL_UP
        [node1] = _processes_under(data / "node-1")

        os.kill(node1, signal.SIGTERM)
        line = demo.wait_for("node-1 exited", timeout=30)
        assert line.strip() == (
            "tasknet-demo: node-1 exited (killed by SIGTERM); the rest keeps running, nothing"
            f" is restarted (--restart-children would); its log: {data / 'logs' / 'node-1.log'}"
        ), line
        # The demo still serves, and its site shows the node offline by itself.
        _wait(lambda: _nodes(url).get("node-1") is False, 15, "node-1 connected: false")
        assert _nodes(url)["node-2"] is True
        health = request("GET", url + "healthz")
        assert health.status == 200 and health.body["recovery"] == "done", health.brief()
        time.sleep(2)
        assert demo.proc.poll() is None, demo.text
        assert _processes_under(data / "node-1") == []  # nothing restarted it
        assert len(_processes_under(data)) == 4  # upstream, site, node-2, node-3

        # One line per node login, and no routine noise at info (issue 21, item 9).
        logs = data / "logs"
        site_log = (logs / "site.log").read_text()
        assert site_log.count("logged in from") == 3, site_log
        for noise in ("SiteProof sent", "resent 0", "Starting factory", '"GET /healthz'):
            assert noise not in site_log, noise
        node1_log = (logs / "node-1.log").read_text()
        assert node1_log.count("logged in to the site") == 1, node1_log
        assert "DNS lookup failed" not in node1_log and "Starting factory" not in node1_log
        assert "unknown type 10" not in (logs / "node-2.log").read_text()

        assert demo.stop() == 0, demo.text
        assert database.is_file()  # --data: nothing deleted
        assert _processes_under(data) == []
    finally:
        demo.kill()
        for pid in _processes_under(data):
            os.kill(pid, signal.SIGKILL)


GID = 5151


def _completed(url: str, gid: int) -> bool:
    reply = request("GET", f"{url}api/tasks/{gid}", token=DEMO_TOKEN)
    assert reply.status == 200, reply.brief()
    return reply.body["task"]["status"] == "COMPLETED"


def create_and_complete(url: str, gid: int) -> None:
    created = request(
        "POST", url + "api/tasks", {"gid": gid, "token": "upstream-token"}, token=DEMO_TOKEN
    )
    assert created.status in (200, 201), created.brief()
    _wait(lambda: _completed(url, gid), 60, f"gid {gid} completed")


def test_data_is_kept_across_two_runs(tmp_path: Path) -> None:
    data = tmp_path / "kept"
    first = RunningDemo("--data", str(data), "--bandwidth", "0")
    try:
        first.banner()
        create_and_complete(first.url, GID)
        assert first.stop() == 0, first.text
    finally:
        first.kill()
    assert (data / "site" / "tasknet-site.sqlite").is_file()
    assert (data / "logs" / "site.log").is_file()

    second = RunningDemo("--data", str(data), "--bandwidth", "0")
    try:
        assert "(again: what it holds is kept)" in second.next_line(30)
        second.banner()
        assert _completed(second.url, GID), "the task of the first run is kept"
        create_and_complete(second.url, GID + 1)
        assert second.stop() == 0, second.text
    finally:
        second.kill()
        for pid in _processes_under(data):
            os.kill(pid, signal.SIGKILL)
    assert (data / "site" / "tasknet-site.sqlite").is_file()


def test_restart_children_brings_a_killed_node_back(tmp_path: Path) -> None:
    data = tmp_path / "restart"
    demo = RunningDemo("--data", str(data), "--restart-children")
    try:
        demo.banner()
        [node2] = _processes_under(data / "node-2")
        os.kill(node2, signal.SIGKILL)
        line = demo.wait_for("node-2 exited", timeout=30)
        assert "node-2 exited (killed by SIGKILL); restarting it in 1 s (restart 1)" in line
        assert demo.wait_for("node-2 restarted (pid", timeout=30)
        _wait(lambda: _nodes(demo.url) == ALL_UP, 30, "node-2 back")
        assert demo.stop() == 0, demo.text
    finally:
        demo.kill()
        for pid in _processes_under(data):
            os.kill(pid, signal.SIGKILL)


# -- archives: the three ways the banner prints -----------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _task(url: str, gid: int) -> dict[str, Any]:
    reply = request("GET", f"{url}api/tasks/{gid}", token=DEMO_TOKEN)
    assert reply.status == 200, reply.brief()
    return dict(reply.body["task"])


def _completed_on_each_node(url: str, first_gid: int) -> dict[str, dict[str, Any]]:
    """Completed tasks, created in batches, until each node has one (the
    dispatcher gives a task to the least busy node): node id -> its task."""
    held: dict[str, dict[str, Any]] = {}
    gid = first_gid
    while len(held) < 3:
        assert gid < first_gid + 30, f"after {gid - first_gid} tasks, completed on: {held}"
        batch = list(range(gid, gid + 6))
        gid += 6
        for each in batch:
            created = request(
                "POST", url + "api/tasks", {"gid": each, "token": "t"}, token=DEMO_TOKEN
            )
            assert created.status in (200, 201), created.brief()
        for each in batch:
            _wait(lambda each=each: _completed(url, each), 60, f"gid {each} completed")
            task = _task(url, each)
            held.setdefault(task["node"], task)
    return held


def _get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One GET, redirects not followed: (status, lower-cased headers, body)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        connection.request(
            "GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers
        )
        reply = connection.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        connection.close()


def _aria2c() -> str | None:
    found = shutil.which("aria2c")
    if found is None and os.environ.get("TASKNET_REQUIRE_ARIA2") == "1":
        pytest.fail("TASKNET_REQUIRE_ARIA2=1 but aria2c is not installed (apt-get install aria2)")
    return found


def test_the_printed_ways_to_fetch_an_archive_work(tmp_path: Path) -> None:
    """node-1 (--public-url) answers Download with a 303 to itself, node-3
    (no public URL) through the site, the legacy node-2 with
    archive_not_served; the banner's tasknet-get and curl + aria2c lines,
    run as printed, save every archive with its recorded SHA-256."""
    data = tmp_path / "archives"
    demo = RunningDemo("--data", str(data), "--bandwidth", "0")
    try:
        banner = demo.banner()
        url = demo.url
        get_line = next(line.strip() for line in banner.splitlines() if "tasknet-get " in line)
        curl_line = next(
            line.strip() for line in banner.splitlines() if line.strip().startswith("curl ")
        )
        assert f"--token-file {data / 'demo-token'}" in get_line
        assert (data / "demo-token").read_text().strip() == DEMO_TOKEN
        assert "aria2c -i links.txt" in banner
        held = _completed_on_each_node(url, 7000)
        direct, via_site, legacy = held["node-1"], held["node-3"], held["node-2"]
        for task in (direct, via_site):
            assert task["archiveSize"] > 0 and len(task["archiveSha256"]) == 64, task
        assert legacy["archiveSha256"] is None

        # By browser: Download is GET /api/tasks/{gid}/archive.
        auth = {"Authorization": f"Bearer {DEMO_TOKEN}"}
        status, headers, _ = _get(f"{url}api/tasks/{direct['gid']}/archive", auth)
        assert status == 303, (status, headers)
        location = headers["location"]
        assert location.startswith("http://127.0.0.1:") and "/archives/" in location
        assert not location.startswith(url)
        status, _, body = _get(location, {})  # the signed link needs no token
        assert status == 200 and hashlib.sha256(body).hexdigest() == direct["archiveSha256"]
        status, _, body = _get(f"{url}api/tasks/{via_site['gid']}/archive", auth)
        assert status == 200 and hashlib.sha256(body).hexdigest() == via_site["archiveSha256"]
        status, _, body = _get(
            f"{url}api/tasks/{legacy['gid']}/archive", {**auth, "Accept": "application/json"}
        )
        assert status == 409, body
        assert json.loads(body)["error"]["code"] == "archive_not_served"

        gids = f"{direct['gid']} {via_site['gid']}"
        by_get = tmp_path / "by-get"
        by_get.mkdir()
        done = subprocess.run(
            ["bash", "-c", get_line.replace(" GID", f" {gids}")],
            cwd=by_get,
            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        saved = sorted(by_get.iterdir())
        assert sorted(_sha256(p) for p in saved) == sorted(
            t["archiveSha256"] for t in (direct, via_site)
        ), saved

        aria2c = _aria2c()
        if aria2c is not None:
            by_aria2 = tmp_path / "by-aria2"
            by_aria2.mkdir()
            links = curl_line.replace("[GID]", f"[{direct['gid']}, {via_site['gid']}]")
            for command in (links, "aria2c -q -i links.txt"):
                done = subprocess.run(
                    ["bash", "-c", command],
                    cwd=by_aria2,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            saved = sorted(p for p in by_aria2.iterdir() if p.name != "links.txt")
            assert sorted(_sha256(p) for p in saved) == sorted(
                t["archiveSha256"] for t in (direct, via_site)
            ), saved
        assert demo.stop() == 0, demo.text
    finally:
        demo.kill()
        for pid in _processes_under(data):
            os.kill(pid, signal.SIGKILL)
