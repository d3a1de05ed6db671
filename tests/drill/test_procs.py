"""Process control with real twistd processes, and the database-lock helper."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasknet.cli.jsonhttp import request
from tasknet.drill.procs import (
    DrillError,
    Proc,
    ProcessDied,
    process_state,
    tcp_connections,
    wait_for,
)
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


def test_extra_environment_stop_continue_and_tcp_sockets(tmp_path: Path) -> None:
    """S23's process helpers: an extra variable reaches the process (and
    its start banner), a SIGSTOP shows as ``stopped`` until ``cont()``,
    ``tcp_connections`` finds its listening port and a client's
    connection, and SIGTERM ends even a stopped process."""
    proc, url = upstream(tmp_path)
    proc.env = {"TASKNET_DRILL_TEST_VARIABLE": "42"}
    proc.start()
    try:
        proc.wait_ready(lambda: request("GET", url + "/_drill/stats").ok, 30, "HTTP")
        assert proc.pid is not None
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert b"TASKNET_DRILL_TEST_VARIABLE=42" in environ
        assert "TASKNET_DRILL_TEST_VARIABLE=42 " in proc.log_text()
        port = int(url.rsplit(":", 1)[1])
        sockets = tcp_connections(proc.pid)
        assert any(t.local[1] == port and t.state == "LISTEN" for t in sockets), sockets
        with socket.create_connection(("127.0.0.1", port)) as client:
            ours = client.getsockname()[1]
            wait_for(
                lambda: any(
                    t.remote[1] == ours and t.state == "ESTABLISHED"
                    for t in tcp_connections(proc.pid or 0)
                ),
                10,
                "the upstream's end of our connection",
            )
        assert process_state(proc.pid) in ("S", "R")
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: proc.stopped, 10, "the upstream to stop")
        assert request("GET", url + "/_drill/stats", timeout=0.5).status == 0
        proc.cont()
        wait_for(lambda: not proc.stopped, 10, "the upstream to continue")
        assert request("GET", url + "/_drill/stats").ok
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: proc.stopped, 10, "the upstream to stop again")
        started = time.monotonic()
        proc.terminate(10)  # SIGTERM, then SIGCONT so that it can act on it
        assert not proc.alive and time.monotonic() - started < 9
        assert proc.runs[-1].how == "SIGTERM" and proc.runs[-1].fenced is None
    finally:
        proc.terminate()
    assert process_state(2**22 + 1) is None and tcp_connections(2**22 + 1) == []


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
