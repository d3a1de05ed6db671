"""The trace digest: the same seed gives the same digest in this process,
in a new one, and under any PYTHONHASHSEED; another seed another digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.sim import scenario, upstream_scenario

ROOT = Path(__file__).resolve().parents[2]


def _in_subprocess(seed: int, directory: Path, hash_seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-m", "tests.sim.scenario", str(seed), str(directory)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_the_same_seed_gives_the_same_trace_everywhere(tmp_path: Path) -> None:
    for directory in "abcd":
        (tmp_path / directory).mkdir()
    here = scenario.run(1, str(tmp_path / "a"))
    assert here["finished"] and here["done"] == 12 and here["rows"] == 12
    assert here["faults"] and sum(here["failures"].values()) > 0  # the faults fired and hurt
    again = scenario.run(1, str(tmp_path / "b"))
    assert again["digest"] == here["digest"]
    for hash_seed, directory in (("0", "c"), ("4242", "d")):
        other = _in_subprocess(1, tmp_path / directory, hash_seed)
        assert other["digest"] == here["digest"], (hash_seed, other, here)
        assert other["events"] == here["events"]


def test_another_seed_gives_another_run(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = scenario.run(1, str(tmp_path / "a"))
    two = scenario.run(2, str(tmp_path / "b"))
    assert one["digest"] != two["digest"]


def test_the_upstreams_own_faults_replay_from_the_seed() -> None:
    """The upstream built by its root on the world: its fault draws, its
    clock, its hung requests dropped together all follow from the seed."""
    here = upstream_scenario.run(5)
    assert here["finished"] and here["downloaded"] == 10
    assert len(here["upstream_faults"]) >= 5  # most kinds fired, by the upstream's draws
    again = upstream_scenario.run(5)
    assert again["digest"] == here["digest"]
    assert again["journal"] == here["journal"]  # the same requests, faults and times
    env = {**os.environ, "PYTHONHASHSEED": "977"}
    out = subprocess.run(
        [sys.executable, "-m", "tests.sim.upstream_scenario", "5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    other = json.loads(out.stdout.splitlines()[-1])
    assert other["digest"] == here["digest"] and other["journal"] == here["journal"]
    assert upstream_scenario.run(6)["digest"] != here["digest"]
