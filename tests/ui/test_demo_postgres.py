"""``tasknet-demo --postgres`` as a real subprocess: a throwaway PostgreSQL
server, two sites on one database of it, three nodes each given both sites; a
task created through one site completes as seen through the other; SIGTERM
stops every process (the server included) and removes the temp directory;
with ``--data DIR`` the cluster is kept and reused by the next run.

Skipped without PostgreSQL installed (an error under
``TASKNET_REQUIRE_POSTGRES=1``, as the suite's backend fixtures).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tasknet.cli.demo import DEMO_TOKEN
from tasknet.cli.jsonhttp import request
from tasknet.drill.pgserver import INSTALL_HINT, installed
from tests.ui.test_demo import RunningDemo, _processes_under, _reader, create_and_complete

pytestmark = pytest.mark.slow

READY_TIMEOUT = 60.0
COMPLETE_TIMEOUT = 30.0
GID = 4242


@pytest.fixture(autouse=True)
def _postgres_installed() -> None:
    if not installed():
        if os.environ.get("TASKNET_REQUIRE_POSTGRES") == "1":
            pytest.fail(
                f"TASKNET_REQUIRE_POSTGRES=1 but PostgreSQL is not installed: {INSTALL_HINT}"
            )
        pytest.skip(f"PostgreSQL is not installed ({INSTALL_HINT})")


def _next_line(lines: queue.Queue[str], output: list[str], deadline: float) -> str:
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        output.append(line)
        return line
    raise AssertionError("the demo printed nothing more in time; output:\n" + "".join(output))


def _wait_completed(url: str, gid: int) -> dict[str, object]:
    deadline = time.monotonic() + COMPLETE_TIMEOUT
    task: dict[str, object] = {}
    while time.monotonic() < deadline:
        reply = request("GET", f"{url}api/tasks/{gid}", token=DEMO_TOKEN)
        assert reply.status == 200, reply.brief()
        task = reply.body["task"]
        if task["status"] == "COMPLETED":
            return task
        time.sleep(0.25)
    raise AssertionError(f"task {gid} not COMPLETED through {url} in time: {task}")


def test_postgres_demo_runs_two_sites_and_stops_on_sigterm() -> None:
    demo = Path(sys.executable).with_name("tasknet-demo")
    proc = subprocess.Popen(
        [
            str(demo),
            "--postgres",
            "--port",
            "0",
            "--bandwidth",
            "0",
            "--timeout",
            str(READY_TIMEOUT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    output: list[str] = []
    data: Path | None = None
    try:
        deadline = time.monotonic() + READY_TIMEOUT + 15
        while "Press Ctrl-C" not in (line := _next_line(lines, output, deadline)):
            if data is None and (started := re.search(r"starting tasknet demo in (\S+)", line)):
                data = Path(started.group(1))
            assert proc.poll() is None, "the demo exited; output:\n" + "".join(output)
        assert data is not None, "".join(output)
        banner = "".join(output)
        urls = re.findall(r"URL: (http://127\.0\.0\.1:\d+/)\s+\((site-[12])\)", banner)
        assert [name for _, name in urls] == ["site-1", "site-2"], banner
        (site1, _), (site2, _) = urls
        assert f"token: {DEMO_TOKEN}" in banner
        assert "database: postgresql://" in banner

        for url, name in urls:
            health = request("GET", url + "healthz")
            assert health.status == 200, health.brief()
            assert health.body["site"] == name
            assert health.body["backend"] == "postgresql"
            assert health.body["dispatch"] == "enabled"
        # The nodes start with different sites first; either site lists them all.
        nodes = request("GET", site2 + "api/admin/nodes", token=DEMO_TOKEN)
        assert nodes.status == 200, nodes.brief()
        connected = {n["id"]: n["site"] for n in nodes.body["nodes"] if n["connected"]}
        assert set(connected) == {"node-1", "node-2", "node-3"}, nodes.body
        assert set(connected.values()) == {"site-1", "site-2"}, nodes.body

        created = request(
            "POST", site1 + "api/tasks", {"gid": GID, "token": "upstream-token"}, token=DEMO_TOKEN
        )
        assert created.status in (200, 201), created.brief()
        task = _wait_completed(site2, GID)
        assert task["node"] in ("node-1", "node-2", "node-3")

        children = _processes_under(data)
        # upstream, two sites, three nodes, and the PostgreSQL server's processes.
        assert len(children) > 6, children

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(output)
        leftover = _processes_under(data)
        assert leftover == [], f"processes still running: {leftover}"
        assert not data.exists(), f"{data} was not removed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if data is not None:
            for pid in _processes_under(data):
                os.kill(pid, signal.SIGKILL)


def test_postgres_demo_keeps_its_database_across_two_runs() -> None:
    """``--postgres --data DIR``: the cluster lives in DIR/postgres and is
    started again as it is; a task created in the first run is there in the
    second; nothing under DIR is deleted on SIGTERM."""
    # Under /tmp, reachable by the postgres user the server runs as under root
    # (pytest's own temporary directories are not).
    base = Path(tempfile.mkdtemp(prefix="tasknet-demo-pg-"))
    base.chmod(0o711)
    try:
        _two_runs(base / "kept")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _two_runs(data: Path) -> None:
    first = RunningDemo("--postgres", "--data", str(data), "--bandwidth", "0")
    try:
        banner = first.banner()
        assert re.search(r"database: postgresql://postgres@127\.0\.0\.1:\d+/tasknet  ", banner)
        create_and_complete(first.url, GID)
        assert first.stop(signal.SIGTERM) == 0, first.text
    finally:
        first.kill()
    assert (data / "postgres" / "data" / "PG_VERSION").is_file(), "the cluster is kept"
    assert _processes_under(data) == []

    second = RunningDemo("--postgres", "--data", str(data), "--bandwidth", "0")
    try:
        second.banner()
        urls = re.findall(r"URL: (http://127\.0\.0\.1:\d+/)", second.text)
        for url in urls:  # both sites see the first run's task
            task = _wait_completed(url, GID)
            assert task["gid"] == GID
        assert second.stop(signal.SIGTERM) == 0, second.text
    finally:
        second.kill()
        for pid in _processes_under(data):
            os.kill(pid, signal.SIGKILL)
    assert (data / "postgres" / "data" / "PG_VERSION").is_file()
