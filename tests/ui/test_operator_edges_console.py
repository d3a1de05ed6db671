"""Operator edges of issue 36 (item 12), as an operator meets them: real
processes of this tree's code (``PYTHONPATH`` names it, whatever tree the
console scripts were installed from).

The TLS failure's reason is checked in tests/node/test_tls.py and the one
summary line of DOWNLOADs sent again in tests/node/test_commands.py (both
over real TCP).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tasknet import __version__
from tasknet.node.link import refused_connect, unsafe_connect
from tasknet.site.storage.engine.schema import prepare_database

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODE_UNIT = REPO / "deploy" / "systemd" / "tasknet-node@.service"


def _tool(tmp_path: Path, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / name), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_tasknet_sim_version_exits_0(tmp_path: Path) -> None:
    result = _tool(tmp_path, "tasknet-sim", "--version")
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"tasknet-sim {__version__}\n",
        "",
    )


def test_tasknet_migrate_leaves_no_lock_file_after_a_refusal(tmp_path: Path) -> None:
    (tmp_path / "junk.sqlite").write_text("not a database\n")
    result = _tool(tmp_path, "tasknet-migrate", "--db", "junk.sqlite")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "tasknet-migrate: cannot migrate junk.sqlite: file is not a database"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.sqlite"]  # no junk.sqlite.lock


def test_tasknet_migrate_keeps_a_lock_file_it_did_not_make(tmp_path: Path) -> None:
    # A lock file a site made stays (it is never unlinked under a running site).
    db = tmp_path / "site.sqlite"
    assert prepare_database(str(db)) is True
    (tmp_path / "site.sqlite.lock").write_text("")
    result = _tool(tmp_path, "tasknet-migrate", "--db", "site.sqlite")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site.sqlite.lock").exists()


def test_the_node_units_connect_example_is_accepted_by_the_node() -> None:
    text = NODE_UNIT.read_text()
    [example] = re.findall(r"^#\s+TASKNET_NODE_OPTIONS=(.*)$", text, re.MULTILINE)
    words = shlex.split(example)
    connects = [words[i + 1] for i, word in enumerate(words) if word == "--connect"]
    assert connects, example
    plaintext = "--plaintext" in words
    for connect in connects:
        assert refused_connect(connect) is None, connect
        assert plaintext or unsafe_connect(connect) is None, connect
