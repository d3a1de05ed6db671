"""A real node (its NodeService) in a simulated world, run in a process of
its own (tests/sim/node_world.py says why), twice under different
PYTHONHASHSEED values: the same run, the same trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _node_world(seed: int, data: Path, hash_seed: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.sim.node_world", str(seed), str(data)],
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_a_real_node_downloads_compresses_and_reports_in_the_simulation(tmp_path: Path) -> None:
    first = _node_world(3, tmp_path / "one", "1")
    assert first["finished"] and first["stopped"]
    assert first["logins"] == 1
    assert first["statuses"] == {"11": 4, "12": 4}
    assert [name.split("-")[0] for name in first["archives"]] == ["11", "12"]
    second = _node_world(3, tmp_path / "two", "31337")
    assert second["digest"] == first["digest"]
    assert second["events"] == first["events"]
