"""The CI drill: `tasknet-drill --quick` against real processes.

It runs the quick set (S1 S2 S4 S7 S10 S12 S13 S16 S17 S18) as a subprocess and
requires every run to pass.  It always runs: a part it drives that went
missing must fail CI, not skip it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.timeout(450)
def test_quick_drill_set_passes(tmp_path: Path) -> None:
    report = tmp_path / "drill.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasknet.cli.drill",
            "--quick",
            "--report",
            str(report),
            "--root",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=440,
    )
    assert report.exists(), proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert [r["scenario"] for r in data["runs"]] == [
        "S1",
        "S2",
        "S4",
        "S7",
        "S10",
        "S12",
        "S13",
        "S16",
        "S17",
        "S18",
    ]
    assert proc.returncode == 0 and data["passed"], proc.stdout[-6000:]
