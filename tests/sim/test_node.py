"""A real node, built by its composition root (``makeService``) on the
world's reactor, threads and a seeded entropy source, against the scripted
site and the real mock upstream (tests/sim/node_world.py): the same seed
gives the same run, trace and bytes on the wire twice in this process and
in new processes under other PYTHONHASHSEED values, none of which touches
Twisted's global reactor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.sim import node_world

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


def _same_run(one: dict, other: dict) -> None:
    for key in ("digest", "events", "frames", "report_ids", "archives", "simulated"):
        assert other[key] == one[key], key


def test_a_real_node_downloads_compresses_and_reports_in_the_simulation(tmp_path: Path) -> None:
    first = node_world.run(3, str(tmp_path / "one"))
    assert first["finished"] and first["stopped"]
    assert first["logins"] == 1
    assert first["statuses"] == {"11": 4, "12": 4}
    assert [name.split("-")[0] for name in first["archives"]] == ["11", "12"]
    _same_run(first, node_world.run(3, str(tmp_path / "two")))
    for hash_seed, directory in (("1", "three"), ("31337", "four")):
        other = _node_world(3, tmp_path / directory, hash_seed)
        assert other["global_reactor_used"] == []
        _same_run(first, other)


def test_another_seed_gives_the_node_other_ids(tmp_path: Path) -> None:
    one = node_world.run(3, str(tmp_path / "one"))
    two = node_world.run(4, str(tmp_path / "two"))
    assert two["finished"] and two["statuses"] == one["statuses"]
    assert two["report_ids"] != one["report_ids"] and two["digest"] != one["digest"]
