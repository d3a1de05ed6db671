"""Drill S23 against real processes: `tasknet-drill --db postgres S23`.

Two sites on a throwaway PostgreSQL; site A stops itself (SIGSTOP, the
site's fault point) with a POST's connection up and nothing written, its
lease is ended by hand and site B reaps it; (a) A is continued at once;
(b) in a second run of A, ``not_submitted`` is refused until ``notBefore``,
then taken, the gid is re-created through B, and A is continued.  The run
must pass: one POST for the gid in all (B's), none from A, nothing A writes
after its reap committed, A exiting non-zero, D1–D10.  Without PostgreSQL
installed it is skipped, unless TASKNET_REQUIRE_POSTGRES=1 (CI) makes that a
failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasknet.drill.pgserver import INSTALL_HINT, installed

pytestmark = pytest.mark.slow


@pytest.mark.timeout(70)
def test_s23_a_site_stopped_mid_post_sends_nothing_once_reaped(tmp_path: Path) -> None:
    if not installed():
        if os.environ.get("TASKNET_REQUIRE_POSTGRES") == "1":
            pytest.fail(
                f"TASKNET_REQUIRE_POSTGRES=1 but PostgreSQL is not installed: {INSTALL_HINT}"
            )
        pytest.skip(f"PostgreSQL is not installed ({INSTALL_HINT})")
    report = tmp_path / "drill.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasknet.cli.drill",
            "--db",
            "postgres",
            "S23",
            "--report",
            str(report),
            "--root",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.exists(), proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["db"] == "postgresql"
    assert [r["scenario"] for r in data["runs"]] == ["S23"]
    assert proc.returncode == 0 and data["passed"], proc.stdout[-6000:]
    [run] = data["runs"]
    verdicts = run["verdicts"]
    # Both variants reaped a stopped A: two SUBMITTING settled, each of a
    # run the drill had fenced (D9 held and was exercised).
    assert verdicts["D9"]["status"] == "PASS", verdicts["D9"]
    settled = verdicts["D9"]["evidence"]
    assert [e["from_state"] for e in settled] == ["SUBMITTING", "SUBMITTING"]
    assert len({e["instance"] for e in settled}) == 2
    assert len({e["reaped_by"] for e in settled}) == 1
    fenced = [r for r in run["ledger"]["site_runs"] if r["fenced"] is not None]
    assert len(fenced) == 2 and all(r["how"] == "exited" for r in fenced)
    # One POST in all: the re-created gid's, through B (D1 exercised).
    assert verdicts["D1"]["status"] == "PASS", verdicts["D1"]
    assert verdicts["D1"]["detail"].startswith("1 gid(s)")
