"""``python -m bench --quick`` still runs every benchmark end to end.

A smoke test only: it starts the real processes at tiny sizes and checks that
six rows come out, in the table and in the JSON file, with the machine facts.
It asserts nothing about speed (CI machines are shared and noisy).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IDS = ["B1", "B2", "B3", "B4", "B5", "B6"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_run_prints_six_rows_and_writes_results(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "all",
            "--quick",
            f"--workdir={tmp_path / 'work'}",
            f"--results={results}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"

    table_rows = [line for line in done.stdout.splitlines() if re.match(r"^B[1-6]  ", line)]
    assert [line.split()[0] for line in table_rows] == IDS
    assert not any("ERROR" in line for line in table_rows)

    document = json.loads(results.read_text())
    assert document["quick"] is True
    assert [row["bench"] for row in document["rows"]] == IDS
    for row in document["rows"]:
        assert row["error"] is None
        assert row["figure"] is not None and row["figure"] > 0
    for bench_id in ("B1", "B2", "B3", "B6"):  # the rows with a same-run baseline
        row = next(r for r in document["rows"] if r["bench"] == bench_id)
        assert row["baseline"] > 0 and row["ratio"] > 0
    machine = document["machine"]
    for key in ("nproc", "python", "sqlite", "twisted", "synchronous"):
        assert machine[key], key
    assert machine["synchronous"].startswith("FULL")


def test_unknown_benchmark_is_refused_with_the_valid_names() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "B9"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "unknown benchmark(s) B9" in done.stderr
    assert "B1, B2, B3, B4, B5, B6" in done.stderr


def test_single_codec_run_writes_one_row(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "b3", "--quick", f"--results={results}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(results.read_text())["rows"]
    assert [r["bench"] for r in rows] == ["B3"]
    assert rows[0]["unit"] == "frames/s" and rows[0]["ratio"] > 0
