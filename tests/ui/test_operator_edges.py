"""Operator edges (issue 21, item 8): each one clear line and a non-zero exit,
never a traceback, and nothing left behind by a start that fails.

Real processes: ``twistd -n tasknet-site`` and ``tasknet-migrate`` as an
operator runs them (``tasknet-admin``'s edges are in test_admin_cli.py).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasknet.process import LOOPBACK
from tasknet.site.storage.engine.schema import prepare_database

BIN = Path(sys.executable).parent


def _site(tmp_path: Path, db: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(BIN / "twistd"),
            "-n",
            "--pidfile=",
            "tasknet-site",
            "--db",
            db,
            "--nodes",
            f"tcp:0:interface={LOOPBACK}",
            "--upstream",
            "http://127.0.0.1:1",
            *extra,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something listens on."""
    with socket.socket() as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen(1)
        yield listener.getsockname()[1]


def test_a_database_in_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    result = _site(tmp_path, "/nonexistent/dir/x.sqlite", "--http", "tcp:0")
    assert result.returncode == 1
    assert _lines(result) == [
        "tasknet-site could not start: --db /nonexistent/dir/x.sqlite: there is no directory"
        " /nonexistent/dir; create it first (the site creates the database file, not its"
        " directory)"
    ]


def test_a_directory_as_database_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    result = _site(tmp_path, "data", "--http", "tcp:0")
    assert result.returncode == 1
    assert _lines(result) == [
        "tasknet-site could not start: --db data is a directory, not a database file: name a"
        " file in it, e.g. --db data/site.sqlite (created on the first start)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no data.lock
    assert list((tmp_path / "data").iterdir()) == []


def test_a_start_that_fails_on_a_taken_port_leaves_no_database(
    tmp_path: Path, taken_port: int
) -> None:
    result = _site(tmp_path, "site.sqlite", "--http", f"tcp:{taken_port}:interface={LOOPBACK}")
    assert result.returncode == 1
    text = result.stdout + result.stderr
    assert "Traceback" not in text
    failed = [line for line in _lines(result) if "could not start" in line]
    assert len(failed) == 1, text
    assert f"Couldn't listen on {LOOPBACK}:{taken_port}" in failed[0]
    assert "Address already in use" in failed[0]
    assert (
        f"removed {tmp_path / 'site.sqlite'}, {tmp_path / 'site.sqlite.lock'}: created by" in text
    )
    assert list(tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.iterdir())


def test_a_failed_start_keeps_a_database_that_was_there(tmp_path: Path, taken_port: int) -> None:
    db = tmp_path / "site.sqlite"
    assert prepare_database(str(db)) is True
    before = db.read_bytes()
    result = _site(tmp_path, str(db), "--http", f"tcp:{taken_port}:interface={LOOPBACK}")
    assert result.returncode == 1
    assert db.exists() and "removed" not in result.stdout + result.stderr
    assert len(db.read_bytes()) >= len(before)


def _migrate(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "tasknet-migrate"), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_tasknet_migrate_on_a_wrong_path_says_so_plainly(tmp_path: Path) -> None:
    result = _migrate(tmp_path, "--db", "typo.sqlite")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "tasknet-migrate: no database at 'typo.sqlite', nothing to migrate (a site started on"
        " a new path creates its database at the current schema by itself)"
    )
    assert "Error" not in result.stderr  # no exception class
    assert not (tmp_path / "typo.sqlite").exists()

    result = _migrate(tmp_path, "--db", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"tasknet-migrate: --db {tmp_path} is a directory, not a database file: give the"
        " site's database file (the path given to tasknet-site --db)"
    )

    (tmp_path / "junk.sqlite").write_text("not a database\n")
    result = _migrate(tmp_path, "--db", "junk.sqlite")
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "tasknet-migrate: cannot migrate junk.sqlite: file is not a database"
    )


def test_tasknet_migrate_names_an_unknown_flag(tmp_path: Path) -> None:
    result = _migrate(tmp_path, "--bogus")
    assert result.returncode == 2
    assert "tasknet-migrate: error: unrecognized arguments: --bogus" in result.stderr
    assert "required" not in result.stderr
