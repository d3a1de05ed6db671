"""``tasknet-get`` and ``aria2c -i`` against the real thing: a site, a node
serving its archives (``--serve``) and the mock upstream, on loopback.

A task is created through the API, the node downloads and compresses it, and
the client (a child process: it is blocking code, and the reactor must keep
serving meanwhile) fetches the archive; its bytes hash to what the site
recorded.  Both ways an archive travels are run: ``via: node`` (the node
has a public URL: the link is the node's own) and ``via: site`` (it has
none: the site streams it).

aria2: skipped when ``aria2c`` is not installed, unless
``TASKNET_REQUIRE_ARIA2=1`` (CI installs Debian's ``aria2``): then a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tasknet.node.service import NodeService
from tasknet.process import free_port
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.node.harness import SECRET, start_node
from tests.site.helpers import RunningSite, running_site, site_options

pytestmark = pytest.mark.slow

NODE = "node-t"  # the node id tests.node.harness.start_node uses
TOKEN = "demo"  # --demo's admin user and token
GID = 4242


@dataclass
class Stack:
    site: RunningSite
    node: NodeService
    upstream: RunningUpstream


@pytest_twisted.async_yield_fixture(params=["node", "site"])
async def stack(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stack]:
    """A site, a node serving archives (with a public URL: ``node``; without:
    ``site``) and the upstream; one task completed through the API."""
    up = await start_upstream()
    try:
        options = site_options(
            str(tmp_path / "site.sqlite"), up.base_url, "--demo", "--node-key", f"{NODE}:{SECRET}"
        )
        async with running_site(options) as site:
            nodes = f"tcp:127.0.0.1:{site.service.nodes_port.getHost().port}"
            port = free_port()
            serving: dict[str, Any] = {"serve": f"tcp:{port}:interface=127.0.0.1"}
            if request.param == "node":
                serving["public_url"] = f"http://127.0.0.1:{port}/"
            node = await start_node(nodes, tmp_path / "node", secret=SECRET, **serving)
            try:
                status, body = await site.request(
                    "POST", "/api/tasks", token=TOKEN, body={"gid": GID, "token": "t"}
                )
                assert status == 201, body
                await _completed(site, GID)
                yield Stack(site, node, up)
            finally:
                await node.stopService()
    finally:
        await up.stop()


async def _completed(site: RunningSite, gid: int, timeout: float = 30.0) -> None:
    """Polls the task (the API has no signal for it; the node works in real time)."""
    deadline = time.monotonic() + timeout
    body: Any = None
    while time.monotonic() < deadline:
        status, body = await site.request("GET", f"/api/tasks/{gid}", token=TOKEN)
        task = body.get("task") if status == 200 else None
        if task and task["status"] == "COMPLETED" and task["archiveSha256"] is not None:
            return
        await deferLater(reactor, 0.05, lambda: None)
    raise AssertionError(f"task {gid} not completed within {timeout} s: {body}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TASKNET_TOKEN": TOKEN}
    return await deferToThread(
        subprocess.run, list(argv), capture_output=True, text=True, timeout=60, env=env
    )


@pytest_twisted.ensureDeferred
async def test_tasknet_get_fetches_and_verifies_a_completed_archive(
    stack: Stack, tmp_path: Path
) -> None:
    status, body = await stack.site.request("GET", f"/api/tasks/{GID}", token=TOKEN)
    task = body["task"]
    out = tmp_path / "out"
    done = await _run(
        sys.executable, "-m", "tasknet.cli.get", "--site", stack.site.base_url, "-d", str(out),
        str(GID), "999999",
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)  # 999999: no such task
    assert "failed 999999: no such task (or not yours) [not_found]" in done.stderr
    (saved,) = out.iterdir()
    assert saved.suffix == ".zip" and not saved.name.endswith(".zip.zip")
    assert _sha256(saved) == task["archiveSha256"]
    assert saved.stat().st_size == task["archiveSize"]
    assert zipfile.is_zipfile(saved)
    assert "SHA-256 verified" in done.stdout

    again = await _run(
        sys.executable, "-m", "tasknet.cli.get", "--site", stack.site.base_url, "-d", str(out),
        "--completed", "--since", "1h",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"skip {GID}: {saved} already there (SHA-256 matches)" in again.stdout
    assert "1 archive: 0 saved, 1 already there, 0 failed" in again.stderr


@pytest_twisted.ensureDeferred
async def test_tasknet_get_resumes_a_partial_file_from_the_real_server(
    stack: Stack, tmp_path: Path
) -> None:
    """The node (or the site's stream) answers the Range and If-Range the
    client sends: half a file on disk, the other half fetched."""
    out = tmp_path / "out"
    first = await _run(
        sys.executable, "-m", "tasknet.cli.get", "--site", stack.site.base_url, "-d", str(out),
        str(GID),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    (saved,) = out.iterdir()
    whole = saved.read_bytes()
    saved.unlink()
    half = len(whole) // 2
    part = saved.with_name(saved.name + ".part")
    part.write_bytes(whole[:half])

    resumed = await _run(
        sys.executable, "-m", "tasknet.cli.get", "--site", stack.site.base_url, "-d", str(out),
        str(GID),
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at" in resumed.stdout and "from zero" not in resumed.stdout
    assert saved.read_bytes() == whole and not part.exists()


@pytest_twisted.ensureDeferred
async def test_aria2_fetches_and_verifies_the_links_file(stack: Stack, tmp_path: Path) -> None:
    aria2c = shutil.which("aria2c")
    if aria2c is None:
        if os.environ.get("TASKNET_REQUIRE_ARIA2") == "1":
            pytest.fail("aria2c is not installed and TASKNET_REQUIRE_ARIA2=1")
        pytest.skip("aria2c is not installed (Debian: apt-get install aria2)")
    status, links = await stack.site.request(
        "POST",
        "/api/tasks/archive-links",
        token=TOKEN,
        body={"gids": [GID]},
        headers={"Accept": ["text/plain"]},
    )
    assert status == 200, links
    text = links.decode() if isinstance(links, bytes) else str(links)
    assert "  checksum=sha-256=" in text and "  out=" in text
    listing = tmp_path / "links.txt"
    listing.write_text(text)
    out = tmp_path / "aria2"
    done = await _run(
        aria2c, "-i", str(listing), "-d", str(out), "--console-log-level=warn",
        "--summary-interval=0", "--allow-overwrite=false", "--auto-file-renaming=false",
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    status, body = await stack.site.request("GET", f"/api/tasks/{GID}", token=TOKEN)
    (saved,) = out.iterdir()
    assert _sha256(saved) == body["task"]["archiveSha256"]
