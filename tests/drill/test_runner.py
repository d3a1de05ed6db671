"""The runner's handling of the run's site database (the drills themselves:
test_quick_set.py)."""

from __future__ import annotations

import io
from pathlib import Path

from tasknet.drill.cluster import SiteDatabase
from tasknet.drill.invariants import FAIL, INVARIANTS
from tasknet.drill.report import Progress
from tasknet.drill.runner import run_one
from tasknet.drill.scenarios import SCENARIOS
from tasknet.site.storage.engine.database import POSTGRESQL


class NoRoomForDatabases:
    """A server that refuses every CREATE DATABASE."""

    backend = POSTGRESQL

    def __init__(self) -> None:
        self.released: list[SiteDatabase] = []

    def start(self) -> None:
        pass

    def new(self, name: str, directory: Path) -> SiteDatabase:
        raise OSError(f'could not create database "{name}": disk full')

    def release(self, database: SiteDatabase, *, keep: bool) -> None:
        self.released.append(database)

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "a full server"


def test_a_run_without_its_database_fails_and_says_why(tmp_path: Path) -> None:
    out = io.StringIO()
    databases = NoRoomForDatabases()
    result = run_one(
        SCENARIOS["S1"],
        1,
        tmp_path,
        keep=False,
        progress=Progress(out),
        seed=1,
        databases=databases,
    )
    assert result.failed
    expectations = result.verdicts[0]
    assert expectations.invariant == "E" and expectations.status == FAIL
    assert "could not create the run's site database" in expectations.detail
    assert "disk full" in expectations.detail
    assert [v.invariant for v in result.verdicts[1:]] == list(INVARIANTS)
    assert all(v.status == FAIL for v in result.verdicts[1:])
    assert "FAIL" in out.getvalue().splitlines()[-1]
    assert not (tmp_path / "S1-1").exists() and databases.released == []
