"""Process control with real twistd processes, and the database-lock helper."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasknet.cli.jsonhttp import request
from tasknet.drill.procs import DrillError, Proc, ProcessDied, wait_for
from tasknet.process import free_port, port_open

pytestmark = pytest.mark.slow


def upstream(tmp_path: Path, *extra: str) -> tuple[Proc, str]:
    port = free_port()
    args = ["--http", f"tcp:{port}:interface=127.0.0.1", *extra]
    return Proc(
        "upstream", "tasknet-upstream", args, tmp_path / "upstream"
    ), f"http://127.0.0.1:{port}"


def test_start_kill_restart_a_real_upstream(tmp_path: Path) -> None:
    proc, url = upstream(tmp_path)
    proc.start()
    try:
        proc.wait_ready(lambda: request("GET", url + "/_drill/stats").ok, 30, "HTTP")
        assert request("POST", url + "/api/galleries/7/archive").status == 200
        assert request("GET", url + "/_drill/stats").body["posts"] == {"7": 1}
        first_pid = proc.pid

        proc.kill()  # SIGKILL: gone at once, its port is free again
        assert not proc.alive and proc.returncode == -9
        assert request("GET", url + "/_drill/stats").status == 0

        proc.start()
        proc.wait_ready(lambda: request("GET", url + "/_drill/stats").ok, 30, "HTTP again")
        assert proc.pid != first_pid and proc.starts == 2
        # A fresh process: the in-memory counts died with the old one.
        assert request("GET", url + "/_drill/stats").body["posts"] == {}
        assert "start #2" in proc.log_text()
    finally:
        proc.terminate()
    assert not proc.alive
    assert (tmp_path / "upstream" / "twistd.log").exists()


def test_a_process_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    proc, url = upstream(tmp_path, "--bandwidth", "-5")
    proc.start()
    with pytest.raises(ProcessDied, match="bandwidth"):
        proc.wait_ready(lambda: request("GET", url + "/_drill/stats").ok, 30, "HTTP")
    assert not proc.alive


def test_wait_for_times_out_with_a_clear_message() -> None:
    started = time.monotonic()
    with pytest.raises(DrillError, match="timed out after 0.2s waiting for the moon"):
        wait_for(lambda: False, 0.2, "the moon")
    assert time.monotonic() - started < 2


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert not port_open(port)


def test_dblock_holds_an_exclusive_lock_then_releases(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
    ready = tmp_path / "ready"
    helper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tasknet.drill.dblock",
            "--db",
            str(db),
            "--seconds",
            "1.5",
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        wait_for(ready.exists, 15, "the lock")
        writer = sqlite3.connect(db, timeout=0.1, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            writer.execute("BEGIN IMMEDIATE")
        # Readers still see the database (WAL): only writers wait.
        assert writer.execute("SELECT count(*) FROM t").fetchone() == (0,)
        assert helper.wait(15) == 0
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO t VALUES (1)")
        writer.execute("COMMIT")
        writer.close()
        assert helper.stdout is not None and helper.stdout.read().strip() == b"LOCKED"
    finally:
        if helper.poll() is None:
            helper.kill()
        helper.wait(5)
        if helper.stdout is not None:
            helper.stdout.close()


def test_dblock_refuses_a_missing_database(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasknet.drill.dblock",
            "--db",
            str(tmp_path / "nope"),
            "--seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "no database" in result.stderr
    assert not (tmp_path / "nope").exists()
