"""``python -m bench --quick`` still runs every benchmark end to end.

A smoke test only: it starts the real processes at tiny sizes and checks that
every row comes out (B1-B7, B9, B10; B1, B2 (open and closed loop: B2a,
B2b) and B9 on both backends), in the table and in the JSON file, with the
machine facts.  Without PostgreSQL installed it runs ``--db sqlite``,
unless ``TASKNET_REQUIRE_POSTGRES=1`` makes that an error, as the suite's
backend fixtures do.  It asserts nothing about speed (CI machines are
shared and noisy).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.b11_serving import nginx_binary
from tasknet.drill.pgserver import INSTALL_HINT, installed

REPO = Path(__file__).resolve().parents[2]
SQLITE_IDS = ["B1", "B2a", "B2b", "B3", "B4", "B5", "B6", "B8", "B9", "B10", "B11a", "B11b", "B11c"]
ALL_IDS = [
    "B1",
    "B1-pg",
    "B2a",
    "B2b",
    "B2a-pg",
    "B2b-pg",
    "B3",
    "B4",
    "B5",
    "B6",
    "B7",
    "B8",
    "B9",
    "B9-pg",
    "B10",
    "B11a",
    "B11b",
    "B11c",
]
# The rows with a same-run baseline.
WITH_BASELINE = (
    "B1",
    "B1-pg",
    "B2a",
    "B2b",
    "B2a-pg",
    "B2b-pg",
    "B3",
    "B6",
    "B7",
    "B9",
    "B9-pg",
    "B11a",
    "B11b",
)
ROW = re.compile(r"^B\d+[abc]?(-pg)?  ")
#: B11's rows whose part of the feature may not be in the tree yet say so in
#: their first note instead of a figure (bench/b11_serving.py NOT_MEASURED).
MAY_BE_UNMEASURED = ("B11a", "B11b", "B11c")


def _with_postgres() -> bool:
    if installed():
        return True
    if os.environ.get("TASKNET_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"TASKNET_REQUIRE_POSTGRES=1 but PostgreSQL is not installed: {INSTALL_HINT}")
    return False


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quick_run_prints_every_row_and_writes_results(tmp_path: Path) -> None:
    postgres = _with_postgres()
    ids = ALL_IDS if postgres else SQLITE_IDS
    results = tmp_path / "results.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "all",
            "--quick",
            f"--db={'both' if postgres else 'sqlite'}",
            f"--workdir={tmp_path / 'work'}",
            f"--results={results}",
            # Seeded databases are not kept anywhere outside the test's own directory.
            f"--cache={tmp_path / 'cache'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"

    table_rows = [line for line in done.stdout.splitlines() if ROW.match(line)]
    assert [line.split()[0] for line in table_rows] == ids
    assert not any("ERROR" in line for line in table_rows)
    # B1 prints its ceiling and the site's share of it beside the ratio.
    b1_line = next(line for line in table_rows if line.startswith("B1 "))
    assert "ceiling" in b1_line and "% of it" in b1_line

    document = json.loads(results.read_text())
    assert document["quick"] is True
    assert [row["bench"] for row in document["rows"]] == ids
    for row in document["rows"]:
        assert row["error"] is None
        if row["bench"] in MAY_BE_UNMEASURED and row["figure"] is None:
            assert row["notes"][0].startswith("not measured: "), row
            continue
        assert row["figure"] is not None
        # B5 is the CPU share of a site holding idle connections: in a
        # quick run's 2 s it may use less than one clock tick (0.0).
        assert row["figure"] >= 0 if row["bench"] == "B5" else row["figure"] > 0
        assert row["target"], row["bench"]
    # B11's baseline is Debian's nginx: without it B11a/B11b run alone (and say so).
    with_nginx = nginx_binary() is not None
    for bench_id in WITH_BASELINE:
        if bench_id in ("B11a", "B11b") and not with_nginx:
            continue
        if bench_id in ids:
            row = next(r for r in document["rows"] if r["bench"] == bench_id)
            if bench_id in MAY_BE_UNMEASURED and row["figure"] is None:
                continue
            assert row["baseline"] > 0 and row["ratio"] > 0
    machine = document["machine"]
    for key in ("nproc", "python", "sqlite", "twisted", "synchronous", "postgresql"):
        assert machine[key], key
    assert machine["synchronous"].startswith("FULL")
    rows = {row["bench"]: row for row in document["rows"]}
    # B2a: an open loop, latency from the intended start, p99.9 and the rate reached.
    b2a = rows["B2a"]["details"]
    assert b2a["arrival_rate"] > 0 and b2a["rate_reached"] > 0 and b2a["p999_ms"] > 0
    # B9: every view measured on the site and on the raw driver, 1 and 8 clients.
    queries = rows["B9"]["details"]["queries"]
    names = {q["name"] for q in queries}
    assert {"heavy: first page", "admin: node panel", "admin: stats 24 h"} <= names
    for q in queries:
        for clients in ("1", "8"):
            assert q[clients]["n"] > 0 and q[clients]["raw_n"] > 0, q
    # B8: the simulator's block passed, with its events a second and time ratio.
    b8 = rows["B8"]["details"]
    assert b8["events_per_s"] > 0 and b8["time_ratio"] > 0
    # B10: every node came back after the kill, with per-process CPU.
    b10 = rows["B10"]["details"]
    assert b10["everyone_back"], rows["B10"]["notes"]
    assert len(b10["cpu_fraction_by_process"]) >= 2
    if postgres:
        assert machine["postgresql_server"]["synchronous_commit"] == "on"
        b7 = next(r for r in document["rows"] if r["bench"] == "B7")
        windows = b7["details"]["windows"]
        assert set(windows) == {"one-before", "two", "one-after"}
        # Per-process CPU: both sites in the two-site window, and the server.
        assert {"bench-site-a", "bench-site-b", "postgres"} <= set(
            windows["two"]["cpu_fraction_by_process"]
        )
        assert b7["details"]["nodes_per_site_two_sites"] == {"bench-site-a": 2, "bench-site-b": 2}


def test_unknown_benchmark_is_refused_with_the_valid_names() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "B12"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "unknown benchmark(s) B12" in done.stderr
    assert "B1, B2, B3, B4, B5, B6, B7, B8, B9, B10, B11" in done.stderr


def test_load_nodes_reconnect_with_the_real_nodes_backoff() -> None:
    """B10's load nodes use the real node's retry policy (``retry_policy_of``,
    which the node's ClientService gets by default) and debounce."""
    from bench import loadnode
    from tasknet.node import link, reporter
    from tasknet.runtime import SeededEntropy

    assert loadnode.retry_policy_of is link.retry_policy_of
    policy = link.retry_policy_of(SeededEntropy(7))
    delays = [policy(attempt) for attempt in range(14)]
    # backoffPolicy: min(0.5 * 1.5**attempt, 5) plus up to a second of jitter.
    assert 0.5 <= delays[0] <= 1.5
    assert all(5.0 <= d <= 6.0 for d in delays[6:])
    assert reporter.DEBOUNCE == loadnode.DEBOUNCE


def test_b7_is_refused_on_sqlite() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "b7", "--db", "sqlite"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "B7 runs on PostgreSQL only" in done.stderr


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
