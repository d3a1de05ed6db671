"""``python -m bench --db postgres-ha|postgres+ha``: B1 and B2 against a
primary with a synchronous standby, beside the single server in one run;
the other benchmarks never run on the failover cluster.  And
``python -m bench.commit_cost``: the price of a commit, both ways."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.__main__ import parse_args
from bench.b1_reports import backend_title, row_id
from bench.commit_cost import measure
from bench.harness import POSTGRES, POSTGRES_HA, SQLITE, Context


def test_postgres_plus_ha_runs_b1_and_b2_on_both_and_b9_on_the_single_server() -> None:
    args = parse_args(["B1", "B2", "B9", "--db", "postgres+ha"])
    assert args.plan == [
        ("B1", POSTGRES),
        ("B1", POSTGRES_HA),
        ("B2", POSTGRES),
        ("B2", POSTGRES_HA),
        ("B9", POSTGRES),
    ]
    assert parse_args(["B1", "B9", "B3", "--db", "postgres-ha"]).plan == [
        ("B1", POSTGRES_HA),
        ("B3", SQLITE),
    ]


def test_the_standby_rows_are_named_apart_and_use_the_cluster(tmp_path: Path) -> None:
    single = Context(quick=True, workdir=tmp_path, backend=POSTGRES)
    standby = Context(quick=True, workdir=tmp_path, backend=POSTGRES_HA)
    assert (row_id(single, "B1"), row_id(standby, "B1")) == ("B1-pg", "B1-pg-sync")
    assert row_id(standby, "B2a") == "B2a-pg-sync"
    assert backend_title(standby) == " (PostgreSQL, synchronous standby)"
    assert standby.on_postgres and standby.postgres is standby.pg_ha
    assert standby.pg_ha.standby and not single.postgres.standby


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_commit_cost_measures_both_ways_in_one_run() -> None:
    """``python -m bench.commit_cost`` at a tiny size: a server and a
    primary with a synchronous standby side by side, every commit timed."""
    from tasknet.drill.pgcluster import INSTALL_HINT, installed

    if not installed():
        if os.environ.get("TASKNET_REQUIRE_PG_AUTO_FAILOVER") == "1":
            pytest.fail(f"TASKNET_REQUIRE_PG_AUTO_FAILOVER=1 but: {INSTALL_HINT}")
        pytest.skip(f"pg_auto_failover is not installed ({INSTALL_HINT})")
    result = measure(batch=3, rounds=2)
    assert result["single"]["commits"] == result["standby"]["commits"] == 6
    for name in ("single", "standby"):
        assert 0 < result[name]["p50_ms"] <= result[name]["p99_ms"]
    assert result["added_p50_ms"] == round(
        result["standby"]["p50_ms"] - result["single"]["p50_ms"], 2
    )
