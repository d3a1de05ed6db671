"""`tasknet-drill` argument handling (the drills themselves: test_quick_set.py)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tasknet.cli.drill import _backend, _chosen, _parser, main
from tasknet.drill.databases import (
    POSTGRES_CHOICE,
    POSTGRES_HA_CHOICE,
    SQLITE_CHOICE,
    DatabaseChoiceError,
    ExistingServer,
    FailoverClusters,
    SqliteFiles,
    ThrowawayServer,
    databases_for,
    parse_db_option,
    run_database_name,
    with_database,
)
from tasknet.drill.scenarios import QUICK, QUICK_FAILOVER, QUICK_POSTGRES, SCENARIOS
from tasknet.process import free_port

MULTI_SITE = ("S20", "S21", "S22", "S23")
FAILOVER = ("S24", "S25", "S26")


def test_list_names_every_scenario_and_marks_the_quick_sets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines][:26] == [f"S{i}" for i in range(1, 27)]
    assert [line.split()[0] for line in lines if line.endswith("(quick)")] == list(QUICK)
    assert [line.split()[0] for line in lines if "postgres only" in line] == list(MULTI_SITE)
    assert [
        line.split()[0] for line in lines if re.search(r"quick with --db postgres\b(?!-)", line)
    ] == list(QUICK_POSTGRES)
    assert [line.split()[0] for line in lines if "postgres-ha only" in line] == list(FAILOVER)
    assert [line.split()[0] for line in lines if "quick with --db postgres-ha" in line] == list(
        QUICK_FAILOVER
    )
    assert set(QUICK) | set(QUICK_POSTGRES) | set(QUICK_FAILOVER) <= set(SCENARIOS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["S99"], "unknown scenario(s) S99"),
        (["--repeat", "0", "S1"], "--repeat must be >= 1"),
        (["--repeat", "x"], "invalid int value"),
        (["--db", "mysql", "S1"], "--db 'mysql': use sqlite (the default), postgres"),
        (["--db", "/tmp/site.sqlite"], "use sqlite (the default), postgres"),
        (["--db", "postgresql:///nohost"], "the URL names no server (host)"),
        (["S20"], "S20 run(s) only with --db postgres"),
        (["--db", "sqlite", "S1", "s21", "S22"], "S21, S22 run(s) only with --db postgres"),
        (["S23"], "S23 run(s) only with --db postgres"),
        (["S24"], "S24 run(s) only with --db postgres-ha"),
        (["--db", "postgres", "S20", "S25", "S26"], "S25, S26 run(s) only with --db postgres-ha"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("sqlite", SQLITE_CHOICE),
        ("SQLite", SQLITE_CHOICE),
        ("postgres", POSTGRES_CHOICE),
        ("postgresql", POSTGRES_CHOICE),
        ("postgres-ha", POSTGRES_HA_CHOICE),
        ("Postgres-HA", POSTGRES_HA_CHOICE),
        (
            "postgresql://drill@127.0.0.1:5432/postgres",
            "postgresql://drill@127.0.0.1:5432/postgres",
        ),
        (
            "postgres://u:pw@db.example/maint?sslmode=require",
            "postgres://u:pw@db.example/maint?sslmode=require",
        ),
        (
            "postgresql://u@/maint?host=/run/postgresql",
            "postgresql://u@/maint?host=/run/postgresql",
        ),
    ],
)
def test_db_option_forms(value: str, parsed: str) -> None:
    assert parse_db_option(value) == parsed


def test_db_option_chooses_where_databases_come_from() -> None:
    assert isinstance(databases_for(SQLITE_CHOICE), SqliteFiles)
    assert isinstance(databases_for(POSTGRES_CHOICE), ThrowawayServer)
    assert isinstance(databases_for(POSTGRES_HA_CHOICE), FailoverClusters)
    existing = databases_for("postgresql://u@db.example:6543/maint")
    assert isinstance(existing, ExistingServer)
    assert existing.describe() == "PostgreSQL at db.example:6543, a database per run"
    several = databases_for(
        "postgresql://u:pw@h1:5432,h2:5433/maint?target_session_attrs=read-write"
    )
    assert several.describe() == "PostgreSQL at h1:5432,h2:5433, a database per run"
    with pytest.raises(DatabaseChoiceError):
        parse_db_option("oracle://x")


def test_netns_with_postgres_ha_says_why_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--db postgres-ha --netns`` (S24's host cut off) needs root: without
    it the drill says why and runs nothing (not the SIGKILL run instead)."""
    import tasknet.cli.drill as drill

    monkeypatch.setattr(drill, "netns_available", lambda: "--netns needs root (test)")
    assert main(["--db", "postgres-ha", "--netns", "S24"]) == 2
    assert "--db postgres-ha --netns: --netns needs root (test)" in capsys.readouterr().err


def test_each_run_gets_its_own_database_name_and_url() -> None:
    first, second = run_database_name("S20", 1), run_database_name("S20", 1)
    assert first.startswith("drill_s20_1_") and first != second
    assert (
        with_database("postgresql://u:pw@h:5/maint?sslmode=require", first)
        == f"postgresql://u:pw@h:5/{first}?sslmode=require"
    )


def _choose(argv: list[str]) -> tuple[list[str], str]:
    parser = _parser()
    args = parser.parse_args(argv)
    backend = _backend(args.db)
    return [s.id for s in _chosen(parser, args, backend)], args.db


def test_the_default_set_is_the_databases_own() -> None:
    sqlite_set, db = _choose([])
    custody = ["S27", "S28", "S29"]  # issue 34: on either database, not quick
    assert db == SQLITE_CHOICE and sqlite_set == [f"S{i}" for i in range(1, 20)] + custody
    postgres_set, db = _choose(["--db", "postgres"])
    assert db == POSTGRES_CHOICE and postgres_set == [f"S{i}" for i in range(1, 24)] + custody
    assert not set(custody) & (set(QUICK) | set(QUICK_POSTGRES))
    failover_set, db = _choose(["--db", "postgres-ha"])
    assert db == POSTGRES_HA_CHOICE and failover_set == list(FAILOVER)


def test_quick_is_the_ci_set_of_the_database() -> None:
    assert _choose(["--quick"])[0] == list(QUICK)
    assert _choose(["--quick", "--db", "postgres"])[0] == list(QUICK_POSTGRES)
    assert _choose(["--quick", "--db", "postgres-ha"])[0] == list(QUICK_FAILOVER) == ["S24"]
    assert _choose(["--db", "postgres", "s1", "S20"])[0] == ["S1", "S20"]
    assert _choose(["--db", "postgres", "s23"])[0] == ["S23"]


def test_an_unreachable_server_is_a_usage_error_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    url = f"postgresql://drill@127.0.0.1:{free_port()}/postgres"  # nothing listens there
    assert main(["--db", url, "S1", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tasknet-drill: --db {url}: cannot use it: ")
    assert "refused" in err.lower()
    assert not root.exists()  # nothing ran, nothing was made


def test_db_option_is_validated_by_argparse() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--db", "nonsense"])
    assert isinstance(_parser().parse_args([]), argparse.Namespace)
