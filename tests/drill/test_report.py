"""Report formatting: the table, the evidence of a FAIL, the JSON, the progress line."""

from __future__ import annotations

import io
import json

from tasknet.drill.invariants import FAIL, NA, PASS, Verdict
from tasknet.drill.report import Progress, RunResult, failures, table, to_json


def result(failed: bool) -> RunResult:
    verdicts = [Verdict("E", PASS, "3 expectation(s) met")]
    verdicts += [Verdict(f"D{i}", PASS, "ok") for i in range(1, 11)]
    verdicts[3] = Verdict("D3", NA, "nothing completed")
    if failed:
        verdicts[1] = Verdict(
            "D1",
            FAIL,
            "gid 77: 2 upstream POSTs for 1 generation(s)",
            [{"what": "gid 77: 2 upstream POSTs", "gid": 77, "journal": [{"seq": 1}, {"seq": 2}]}],
        )
    return RunResult("S1", "upstream timeout", 1, verdicts, 4.25, directory="/tmp/x/S1-1")


def test_table_has_one_row_per_run_and_a_cell_per_invariant() -> None:
    text = table([result(False), result(True)])
    lines = text.splitlines()
    assert lines[0].split() == [
        "scenario",
        "run",
        "E",
        "D1",
        "D2",
        "D3",
        "D4",
        "D5",
        "D6",
        "D7",
        "D8",
        "D9",
        "D10",
        "time",
    ]
    assert lines[2].split() == [
        "S1",
        "1",
        "PASS",
        "PASS",
        "PASS",
        "–",
        "PASS",
        "PASS",
        "PASS",
        "PASS",
        "PASS",
        "PASS",
        "PASS",
        "4.2s",
    ]
    assert lines[3].split()[3] == "FAIL"
    assert "1/2 run(s) passed" in text
    assert "D1–D10 = DRILLS.md invariants" in text


def test_failures_carry_the_evidence_and_the_directory() -> None:
    assert failures([result(False)]) == ""
    text = failures([result(True)])
    assert text.startswith("FAIL S1 run 1 D1: gid 77: 2 upstream POSTs for 1 generation(s)")
    assert '"gid": 77' in text and '"seq": 2' in text
    assert "logs and databases of S1 run 1: /tmp/x/S1-1" in text


def test_a_failed_run_on_postgresql_names_its_kept_database() -> None:
    failed = result(True)
    failed.database = "postgresql://tasknet_drill@127.0.0.1:5/drill_s1_1_ab12cd34"
    assert f"site database of S1 run 1: {failed.database}" in failures([failed])
    assert to_json([failed], 1.0, [])["runs"][0]["database"] == failed.database
    failed.database = "/tmp/x/S1-1/site/site.sqlite"  # in the directory already named
    assert "site database of" not in failures([failed])


def test_json_report_round_trips() -> None:
    report = json.loads(json.dumps(to_json([result(True)], 1.0, ["--quick"])))
    assert report["passed"] is False
    assert report["summary"]["failed"] == 1
    assert report["summary"]["table"]["S1#1"]["D1"] == "FAIL"
    run = report["runs"][0]
    assert run["verdicts"]["D1"]["evidence"][0]["gid"] == 77
    assert run["result"] == FAIL
    assert set(report["machine"]) == {"python", "sqlite", "platform", "nproc"}


def test_progress_writes_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out)
    progress.begin("S1#1")
    progress.update("create gid 5")
    progress.end(result(False))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[1].startswith("S1#1") and lines[1].endswith("create gid 5")
    assert "ok" in lines[2] and "D1:PASS" in lines[2] and "D3:–" in lines[2]
    assert "\r" not in out.getvalue()
