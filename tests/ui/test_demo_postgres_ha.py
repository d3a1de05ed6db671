"""``tasknet-demo --postgres --ha`` as a real subprocess: pg_auto_failover's
monitor, a primary and a synchronous standby, two sites on the multi-host
URL and two nodes; the banner says how to watch the formation and kill the
primary; the kill command it prints, run as printed, ends the primary, the
standby is promoted and both sites answer again (the demo restarts a site
that exits), with the task created before the kill still there; SIGTERM
stops every process and removes the temp directory.

Skipped without pg_auto_failover installed (an error under
``TASKNET_REQUIRE_PG_AUTO_FAILOVER=1``, as CI sets).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tasknet.cli.demo import DEMO_TOKEN
from tasknet.cli.jsonhttp import request
from tests.ui.test_demo import RunningDemo, _processes_under, create_and_complete

pytestmark = pytest.mark.slow

GID = 4343
#: The failover's bound (SCALE.md) and the sites' restarts after it.
BACK_TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def _failover_installed() -> None:
    from tasknet.drill.pgcluster import INSTALL_HINT, installed

    if not installed():
        if os.environ.get("TASKNET_REQUIRE_PG_AUTO_FAILOVER") == "1":
            pytest.fail(
                "TASKNET_REQUIRE_PG_AUTO_FAILOVER=1 but pg_auto_failover is not installed:"
                f" {INSTALL_HINT}"
            )
        pytest.skip(f"pg_auto_failover is not installed ({INSTALL_HINT})")


def _serving(url: str) -> bool:
    health = request("GET", url + "healthz", timeout=3)
    return health.status == 200 and health.body.get("database") == "ok"


@pytest.mark.timeout(420)
def test_ha_demo_survives_the_kill_it_prints_and_stops_on_sigterm() -> None:
    demo = RunningDemo("--postgres", "--ha", "--bandwidth", "0")
    data: Path | None = None
    try:
        banner = demo.banner()
        started = re.search(r"starting tasknet demo in (\S+)", demo.text)
        assert started, demo.text
        data = Path(started.group(1))
        assert "two sites on a PostgreSQL primary with a synchronous standby" in banner
        urls = re.findall(r"URL: (http://127\.0\.0\.1:\d+/)\s+\((site-[12])\)", banner)
        assert [name for _, name in urls] == ["site-1", "site-2"], banner
        assert re.search(r"database: postgres://tasknet@127\.0\.0\.1:\d+,127\.0\.0\.1:\d+/", banner)
        assert "target_session_attrs=read-write" in banner
        assert "pg_autoctl show state --monitor 'postgres://autoctl_node@" in banner
        kill = re.search(r"node1 \(primary now\): (kill -KILL -- -\d+)", banner)
        assert kill, banner
        assert re.search(r"node2 \(standby now\): kill -KILL -- -\d+", banner), banner

        for url, name in urls:
            health = request("GET", url + "healthz")
            assert health.status == 200, health.brief()
            assert health.body["site"] == name and health.body["backend"] == "postgresql"
        nodes = request("GET", urls[1][0] + "api/admin/nodes", token=DEMO_TOKEN)
        connected = {n["id"] for n in nodes.body["nodes"] if n["connected"]}
        assert connected == {"node-1", "node-3"}, nodes.body
        create_and_complete(urls[0][0], GID)

        # The printed kill, as printed: the primary's postmaster and keeper go.
        done = subprocess.run(["bash", "-c", kill.group(1)], capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + BACK_TIMEOUT
        # Each site's lease session died with the primary: each exits and the
        # demo restarts it.  Until then the old process may still answer
        # /healthz "ok" (its pooled connection not yet found dead), so
        # "serving" counts only once both were restarted.
        restarted: set[str] = set()
        while restarted != {"site-1", "site-2"}:
            line = demo.next_line(max(deadline - time.monotonic(), 0.1))
            found = re.search(r"tasknet-demo: (site-[12]) restarted", line)
            if found:
                restarted.add(found.group(1))
        while not all(_serving(url) for url, _ in urls):
            assert time.monotonic() < deadline, "the sites did not come back:\n" + demo.text
            assert demo.proc.poll() is None, demo.text
            time.sleep(1)
        # A restarted site listens only once it holds its lease on the new
        # primary (storage.lease waits for a writable one), so it answers now.
        task = request("GET", f"{urls[1][0]}api/tasks/{GID}", token=DEMO_TOKEN)
        assert task.status == 200 and task.body["task"]["status"] == "COMPLETED", task.brief()
        created = request(
            "POST", urls[1][0] + "api/tasks", {"gid": GID + 1, "token": "t"}, token=DEMO_TOKEN
        )
        assert created.status in (200, 201), created.brief()

        assert demo.stop(signal.SIGTERM) == 0, demo.text
        assert _processes_under(data) == [], "processes still running"
        assert not data.exists(), f"{data} was not removed"
    finally:
        demo.kill()
        if data is not None:
            for pid in _processes_under(data):
                os.kill(pid, signal.SIGKILL)
