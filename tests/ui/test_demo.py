"""``tasknet-demo`` as a real subprocess: ready banner, /healthz, clean Ctrl-C.

Needs the site, node and upstream twistd plugins; it starts five real
processes, so it is marked slow.
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
from pathlib import Path

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
        assert protocols == {"node-1": 2, "node-2": 1}
        children = _processes_under(data)
        assert len(children) == 4, children  # upstream, site, node-1, node-2

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
