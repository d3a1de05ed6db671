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

from tasknet.node.private import tighten
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
    data = tmp_path / "data"
    log = tmp_path / "node.log"
    # What an older release left: open to others; the node takes it in.
    (data / "corrupt").mkdir(parents=True)
    data.chmod(0o755)
    (data / "corrupt").chmod(0o755)
    old = data / "corrupt" / "7000-000000000000.zip"
    old.write_bytes(b"set aside by an older release")
    old.chmod(0o644)
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
            assert old.read_bytes() == b"set aside by an older release"
        finally:
            process.signalProcess("TERM")
            await ended.ended
    assert not_private(data) == {}
    assert stat.S_IMODE(log.stat().st_mode) == 0o600, ended.output
    assert "Server Shut Down" in log.read_text()


def test_tighten_takes_in_what_an_older_release_left(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for directory in ("archives", "partial", "corrupt"):
        (data / directory).mkdir(parents=True)
        (data / directory).chmod(0o755)
    data.chmod(0o755)
    files = [
        data / "node.sqlite",
        data / "node.sqlite-wal",
        data / "archives" / "1-000000000000.zip",
        data / "partial" / "2-000000000000.part",
        data / "corrupt" / "3-000000000000.zip",
    ]
    for path in files:
        path.write_bytes(b"x")
        path.chmod(0o644)
    outside = tmp_path / "elsewhere.txt"
    outside.write_bytes(b"not the node's")
    outside.chmod(0o644)
    (data / "archives" / "link.zip").symlink_to(outside)
    (data / "archives" / "private.zip").write_bytes(b"x")
    (data / "archives" / "private.zip").chmod(0o600)

    assert tighten(data) == 4 + len(files)  # the four directories and the files
    assert not_private(data) == {"archives/link.zip": "0o777"}  # the link itself, untouched
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644  # nor its target
    assert tighten(data) == 0  # once is enough
    assert tighten(tmp_path / "not yet") == 0
