"""Everything a node creates is private (issue 38: ``node.sqlite`` and its
``-wal``/``-shm``, ``node.log``, ``archives/*.zip`` were 0644, directories
0755): under twistd the node runs with umask 077, so files are 0600 and
directories 0700.  Its own endpoint serves the archives; no other reader
needs them.

A real ``twistd -n tasknet-node`` process dials a scripted site over
loopback TCP and downloads a task from the real mock upstream; the modes
are read while it runs (the SQLite WAL files exist then) and after it
stopped (the log).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol

from tasknet.node.service import SECRET_ENV
from tests.eventually import eventually
from tests.node.harness import SECRET, running

REPO = str(Path(__file__).resolve().parents[2])
TWISTD = str(Path(sys.executable).with_name("twistd"))
GID = 7411


class Ended(ProcessProtocol):
    def __init__(self) -> None:
        self.ended: Deferred[None] = Deferred()
        self.output = b""

    def outReceived(self, data: bytes) -> None:
        self.output += data

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)


def modes(root: Path) -> dict[str, int]:
    """The permission bits of ``root`` and everything under it, by relative path."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def not_private(root: Path) -> dict[str, str]:
    wrong = {}
    for name, mode in modes(root).items():
        path = root / name
        want = 0o700 if path.is_dir() else 0o600
        if mode != want:
            wrong[name] = oct(mode)
    return wrong


@pytest_twisted.ensureDeferred
async def test_every_file_and_directory_the_node_creates_is_private(tmp_path: Path) -> None:
    data = tmp_path / "data"  # the node creates it
    log = tmp_path / "node.log"
    async with running(tmp_path) as (site, up):
        ended = Ended()
        process = reactor.spawnProcess(
            ended,
            TWISTD,
            [
                TWISTD,
                "-n",
                "--pidfile=",
                f"--logfile={log}",
                "tasknet-node",
                "--data",
                str(data),
                "--node-id",
                "node-t",
                "--connect",
                site.endpoint,
            ],
            # The test's own umask is the usual 022: the node must not rely on it.
            env={**os.environ, "PYTHONPATH": REPO, SECRET_ENV: SECRET},
            path=REPO,
        )
        try:
            await site.logged_in()
            site.download("op-1", GID, up.file_url(GID), name="private task")
            await eventually(
                lambda: (e := site.latest_entry(GID)) is not None and e.status == 4,
                what="the completion",
                timeout=60,
            )
            created = modes(data)
            assert any(name.startswith("archives/") for name in created), created
            assert {"node.sqlite", "node.sqlite-wal", "node.sqlite-shm"} <= set(created)
            assert not_private(data) == {}
        finally:
            process.signalProcess("TERM")
            await ended.ended
    assert not_private(data) == {}
    assert stat.S_IMODE(log.stat().st_mode) == 0o600, ended.output
    assert "Server Shut Down" in log.read_text()
