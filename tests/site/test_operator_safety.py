"""One site per SQLite database, start-up failure, secrets on disk and in
``ps`` (INTERFACES.md, "Bounds, failures and secrets"): real twistd
processes, real SQLite files, real ports.

SQLite only, by nature: the one-site lock is a flock on ``PATH.lock`` (on
PostgreSQL several sites share one database, SCALE.md), the modes are those
of the database file and its ``-wal``/``-shm``, and the v1 migration is
SQLite's."""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python import usage

from tasknet.cli import admin
from tasknet.cli.migrate import main as migrate_main
from tasknet.site.root import build_site
from tasknet.site.service import Options, read_node_key_file
from tasknet.site.storage import create
from tasknet.site.storage import usage as usage_weeks
from tasknet.site.storage.engine import file_lock as lock
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.storage.engine.migrate import migrate
from tasknet.site.storage.engine.schema import load_script, prepare_database
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, running_site, site_options

TWISTD = str(Path(sys.executable).with_name("twistd"))
REPO = str(Path(__file__).resolve().parents[2])


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def _twistd_site(tmp_path: Path, db: str, *args: str) -> tuple[int, str]:
    """Run ``twistd -n tasknet-site`` to its end; (exit status, stderr + log)."""
    log = tmp_path / f"twistd-{os.urandom(4).hex()}.log"
    argv = ["-n", "--pidfile=", f"--logfile={log}", "tasknet-site", "--db", db, *args]
    # A site that starts instead of refusing would run forever: bounded.
    out, err, code = await getProcessOutputAndValue(
        TWISTD, argv, env={**os.environ, "PYTHONPATH": REPO}, path=REPO, reactor=reactor
    ).addTimeout(60, reactor)
    text = err.decode() + out.decode() + (log.read_text() if log.exists() else "")
    return code, text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- one site per database ----------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_second_site_is_refused_before_recovery_naming_the_holder(tmp_path: Path) -> None:
    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    user_id, _ = add_user(path, "alice")
    upstream = await start_upstream()
    try:
        async with running_site(site_options(path, upstream.base_url)):
            # A submission in flight on the live site (its POST not answered yet).
            week = usage_weeks.iso_week()
            connection = connect(path)
            try:
                op = run_write(connection, create.reserve, 9, user_id, "", "t", week)
                run_write(connection, create.begin_submit, 9, op, 2, "", week)
            finally:
                connection.close()
            code, text = await _twistd_site(
                tmp_path,
                path,
                "--http",
                "tcp:0:interface=127.0.0.1",
                "--nodes",
                "tcp:0:interface=127.0.0.1",
                "--upstream",
                upstream.base_url,
            )
            assert code == 1, text
            assert f"pid {os.getpid()} on host {socket.gethostname()} since 20" in text
            assert "in use by tasknet-site" in text
            assert "recovery" not in text
            # No recovery ran: the live site's in-flight submission is untouched.
            row = one(path, "SELECT state, step FROM task_operation WHERE gid = 9")
            assert tuple(row) == ("SUBMITTING", "submit")
            # tasknet-admin keeps working beside the running site.
            assert admin.main(["--db", path, "user", "list"]) == 0
            # tasknet-migrate refuses, changes nothing, writes no backup.
            assert migrate_main(["--db", path]) == 1
            assert list(tmp_path.glob("site.sqlite.bak-*")) == []
        # Once the site stopped, the lock is free again.
        lock.acquire(path).release()
    finally:
        await upstream.stop()


def test_lock_names_its_holder_and_is_released(tmp_path: Path) -> None:
    path = str(tmp_path / "a.sqlite")
    held = lock.acquire(path)
    assert _mode(lock.lock_path(path)) == 0o600
    # Another spelling of the same file (a symlink) shares the lock.
    os.symlink(path, tmp_path / "b.sqlite")
    with pytest.raises(lock.DatabaseInUse) as busy:
        lock.acquire(str(tmp_path / "b.sqlite"), role="tasknet-migrate")
    assert busy.value.holder.pid == os.getpid()
    assert busy.value.holder.role == "tasknet-site"
    held.release()
    held.release()  # idempotent
    lock.acquire(str(tmp_path / "b.sqlite")).release()


# -- start-up failure ---------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_taken_http_port_exits_non_zero_and_undoes_the_start(tmp_path: Path) -> None:
    path = str(tmp_path / "site.sqlite")
    nodes_port = _free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http_port = taken.getsockname()[1]
        code, text = await _twistd_site(
            tmp_path,
            path,
            "--http",
            f"tcp:{http_port}:interface=127.0.0.1",
            "--nodes",
            f"tcp:{nodes_port}:interface=127.0.0.1",
        )
    assert code == 1, text
    assert "tasknet-site could not start" in text and "Address already in use" in text
    assert f"(TCP Port {nodes_port} Closed)" in text
    lock.acquire(path).release()


@pytest_twisted.ensureDeferred
async def test_failed_start_in_process_releases_listener_database_and_lock(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "site.sqlite")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        options = Options()
        options.parseOptions(
            [
                "--db",
                path,
                "--http",
                f"tcp:{taken.getsockname()[1]}:interface=127.0.0.1",
                "--nodes",
                "tcp:0:interface=127.0.0.1",
            ]
        )
        service = build_site(options)
        service.startService()
        with pytest.raises(Exception, match="Address already in use"):
            await service.ready
    assert service.nodes_port is not None
    assert not service.nodes_port.connected  # the node listener was stopped again
    assert not service.running
    lock.acquire(path).release()
    await service.stopService()  # twistd's shutdown stops it again: harmless


# -- migrate ------------------------------------------------------------------


def test_migrate_backs_up_before_switching_to_wal_and_the_backup_is_private(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "old.sqlite")
    connection = sqlite3.connect(path)
    connection.executescript(load_script("schema_v1.sql"))
    connection.close()
    assert Path(path).read_bytes()[18:20] == b"\x01\x01"  # rollback journal, not WAL
    result = migrate(path, progress=lambda line: None)
    assert result.backup is not None
    # The copy is the database as it was: still a rollback-journal file.
    assert Path(result.backup).read_bytes()[18:20] == b"\x01\x01"
    assert _mode(result.backup) == 0o600
    assert Path(path).read_bytes()[18:20] == b"\x02\x02"  # the migrated one is WAL


# -- secrets on disk ----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_database_and_its_wal_and_shm_are_created_private(tmp_path: Path) -> None:
    os.umask(old := os.umask(0o022))
    path = str(tmp_path / "site.sqlite")
    upstream = await start_upstream()
    try:
        async with running_site(site_options(path, upstream.base_url, "--demo")) as site:
            status, _ = await site.request("GET", "/api/tasks", token="demo")
            assert status == 200
            for name in (path, path + "-wal", path + "-shm"):
                assert _mode(name) == 0o600, name
    finally:
        os.umask(old)
        await upstream.stop()


@pytest_twisted.ensureDeferred
async def test_an_existing_world_readable_database_is_tightened(tmp_path: Path) -> None:
    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    os.chmod(path, 0o644)
    upstream = await start_upstream()
    try:
        async with running_site(site_options(path, upstream.base_url)):
            assert _mode(path) == 0o600
    finally:
        await upstream.stop()


# -- node keys off the command line ---------------------------------------------


def test_node_key_file(tmp_path: Path) -> None:
    keys = tmp_path / "node-keys"
    keys.write_text("# nodes of rack 1\n\nn1:s3cret\n  n.2 : with:colon  \n")
    options = Options()
    options.parseOptions(["--node-key-file", str(keys), "--node-key", "n3:x"])
    assert options["node-keys"] == {"n1": "s3cret", "n.2": "with:colon", "n3": "x"}


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("n1:a\nnocolon\n", "line 2: expected ID:SECRET"),
        ("n1:\n", "line 1: expected ID:SECRET"),
        (":secret\n", "line 1: expected ID:SECRET"),
        ("bad id:x\n", "line 1: bad node id 'bad id'"),
        ("n1:a\n# c\nn1:b\n", "line 3: node id 'n1' appears twice"),
        (b"n1:\xff\n", "cannot read it"),
    ],
)
def test_bad_node_key_file_lines_are_refused_clearly(
    tmp_path: Path, content: str | bytes, complaint: str
) -> None:
    keys = tmp_path / "node-keys"
    if isinstance(content, bytes):
        keys.write_bytes(content)
    else:
        keys.write_text(content)
    with pytest.raises(usage.UsageError, match=complaint) as refused:
        read_node_key_file(str(keys))
    assert "secret" not in str(refused.value).replace("ID:SECRET", "")


def test_missing_node_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(usage.UsageError, match="cannot read it"):
        Options().parseOptions(["--node-key-file", str(tmp_path / "absent")])
