"""``tasknet-admin`` against real databases (``db_target``: a SQLite file,
a PostgreSQL database), through its ``main``.

Setup uses the storage functions (as the site would); every check reads the
database back through them too, so the CLI is tested end to end on a real
database with real transactions and the v2 triggers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.web.client import HTTPConnectionPool

from tasknet.cli import admin
from tasknet.process import free_port
from tasknet.site.storage import create, reconcile, sessions, throughput, usage, users, views
from tasknet.site.storage.engine import database as db
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.upstream.testing import running_upstream
from tests.site_protocol.harness import add_task


@pytest.fixture
def dbpath(db_target: str) -> str:
    assert prepare_database(db_target) is True
    return db_target


def _cli(dbpath: str, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = admin.main(["--db", dbpath, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _read(dbpath: str, fn, *args):  # type: ignore[no-untyped-def]
    with closing(db.connect(dbpath)) as connection:
        return db.run_read(connection, fn, *args)


def _write(dbpath: str, fn, *args):  # type: ignore[no-untyped-def]
    with closing(db.connect(dbpath)) as connection:
        return db.run_write(connection, fn, *args)


def _make_unknown(dbpath: str, gid: int, user_name: str = "alice", cost: int = 7) -> str:
    """A task left UNKNOWN after its POST, via the lifecycle's own transactions."""
    user = _read(dbpath, users.get_user, user_name)
    week = usage.iso_week()
    op = _write(dbpath, create.reserve, gid, user.id, "", "upstream-token", week)
    assert _write(dbpath, create.begin_submit, gid, op, cost, f"title {gid}", week)
    assert _write(dbpath, create.mark_unknown, gid, op, "submit", "timed out after 30s")
    return op


def test_user_add_prints_a_token_that_is_stored_hashed(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(dbpath, "user", "add", "alice", "--admin", "--quota", "40", capsys=capsys)
    assert code == 0, err
    token = out.strip()
    assert len(token) >= 20
    user = _read(dbpath, users.user_by_token, token)
    assert user is not None and user.name == "alice" and user.is_admin and user.quota == 40
    with closing(db.connect(dbpath)) as connection:
        raw = connection.execute("SELECT token_hash FROM \"user\" WHERE name='alice'").fetchone()[0]
    assert raw != token and token not in raw


def test_user_list_quota_and_token_rotation(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = _cli(dbpath, "user", "add", "bob", capsys=capsys)
    old_token = out.strip()
    code, out, _ = _cli(dbpath, "user", "list", capsys=capsys)
    assert code == 0
    assert "bob" in out and str(users.DEFAULT_QUOTA) in out

    code, out, _ = _cli(dbpath, "user", "quota", "bob", "12", capsys=capsys)
    assert code == 0 and "12" in out
    assert _read(dbpath, users.get_user, "bob").quota == 12

    code, out, _ = _cli(dbpath, "user", "token", "bob", capsys=capsys)
    new_token = out.strip()
    assert code == 0 and new_token != old_token
    assert _read(dbpath, users.user_by_token, old_token) is None
    assert _read(dbpath, users.user_by_token, new_token).name == "bob"


@pytest.mark.parametrize(
    "argv, message",
    [
        (("user", "add", "bad name!"), "user name must match"),
        (("user", "quota", "nobody", "5"), "no user 'nobody'"),
        (("user", "token", "nobody"), "no user 'nobody'"),
    ],
)
def test_user_refusals_change_nothing(
    dbpath: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    before = _read(dbpath, users.list_users)
    code, out, err = _cli(dbpath, *argv, capsys=capsys)
    assert code == 1
    assert message in err and out == ""
    assert _read(dbpath, users.list_users) == before


def test_duplicate_user_is_refused(dbpath: str, capsys: pytest.CaptureFixture[str]) -> None:
    _cli(dbpath, "user", "add", "carol", capsys=capsys)
    code, _, err = _cli(dbpath, "user", "add", "carol", capsys=capsys)
    assert code == 1 and "already exists" in err
    assert [u.name for u in _read(dbpath, users.list_users)] == ["carol"]


def test_bad_usage_exits_2_without_touching_the_database(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        admin.main(["--db", dbpath, "user", "quota", "alice", "-3"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        admin.main(["--db", dbpath, "resolve", "12", "maybe"])
    assert "invalid choice" in capsys.readouterr().err


def test_missing_database_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # SQLite only: a file that is not there (a PostgreSQL database is created
    # by its server's administrator, never by a typo).
    path = tmp_path / "typo.sqlite"
    code, _, err = _cli(str(path), "user", "list", capsys=capsys)
    assert code == 1 and "no database" in err
    assert not path.exists()


def test_node_keys_add_list_remove(dbpath: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(dbpath, "node-key", "add", "node-1", "s3cret-value", capsys=capsys)
    assert code == 0 and out.strip() == "s3cret-value"
    code, out, _ = _cli(dbpath, "node-key", "add", "node-2", capsys=capsys)
    generated = out.strip()
    assert code == 0 and len(generated) >= 16
    assert _read(dbpath, users.node_keys) == {"node-1": "s3cret-value", "node-2": generated}

    _, listed, _ = _cli(dbpath, "node-key", "list", capsys=capsys)
    assert "node-1" in listed and "node-2" in listed and "s3cret-value" not in listed
    _, shown, _ = _cli(dbpath, "node-key", "list", "--show-secrets", capsys=capsys)
    assert "s3cret-value" in shown

    code, _, _ = _cli(dbpath, "node-key", "remove", "node-1", capsys=capsys)
    assert code == 0
    assert set(_read(dbpath, users.node_keys)) == {"node-2"}
    code, _, err = _cli(dbpath, "node-key", "remove", "node-1", capsys=capsys)
    assert code == 1 and "no node key" in err
    code, _, err = _cli(dbpath, "node-key", "add", "bad id", "x", capsys=capsys)
    assert code == 1 and "node id must match" in err


def _cli_process(dbpath: str, *argv: str, upstream: str) -> subprocess.CompletedProcess[str]:
    """``tasknet-admin`` as a real process (unknown/resolve run their own reactor)."""
    script = Path(sys.executable).with_name("tasknet-admin")
    return subprocess.run(
        [str(script), "--db", dbpath, "--upstream", upstream, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _run(dbpath: str, *argv: str, upstream: str) -> subprocess.CompletedProcess[str]:
    # In a thread, so the in-process upstream keeps answering meanwhile.
    return await deferToThread(_cli_process, dbpath, *argv, upstream=upstream)


async def _post_archive(base_url: str, gid: int) -> None:
    """One real archive POST, so the upstream's audit shows a submission."""
    pool = HTTPConnectionPool(reactor, persistent=False)
    response = await treq.post(f"{base_url}/api/galleries/{gid}/archive", pool=pool)
    assert response.code == 200
    await response.content()


@pytest_twisted.ensureDeferred
async def test_unknown_lists_evidence_with_the_upstream_audit(dbpath: str) -> None:
    _write(dbpath, users.create_user, "alice")
    async with running_upstream() as up:
        result = await _run(dbpath, "unknown", upstream=up.base_url)
        assert result.returncode == 0, result.stderr
        assert "no UNKNOWN operations" in result.stdout

        op = _make_unknown(dbpath, 4242)
        await _post_archive(up.base_url, 4242)
        result = await _run(dbpath, "unknown", upstream=up.base_url)
        assert result.returncode == 0, result.stderr
        assert "gid 4242" in result.stdout and "timed out after 30s" in result.stdout
        assert op in result.stdout

        result = await _run(dbpath, "unknown", "--json", upstream=up.base_url)
        listed = json.loads(result.stdout)["tasks"]
        assert [t["gid"] for t in listed] == [4242]
        assert listed[0]["status"] == "SUBMIT_UNKNOWN"
        evidence = listed[0]["evidence"]
        assert evidence["step"] == "submit"
        assert evidence["upstream"]["available"] is True
        assert evidence["upstream"]["audit"]["submissions"] == 1
        assert up.stats()["posts"] == {"4242": 1}  # the listing POSTed nothing


@pytest_twisted.ensureDeferred
async def test_resolve_submitted_meters_once_and_repeats_harmlessly(dbpath: str) -> None:
    _write(dbpath, users.create_user, "alice")
    _make_unknown(dbpath, 5151, cost=7)
    alice = _read(dbpath, users.get_user, "alice")
    async with running_upstream() as up:
        await _post_archive(up.base_url, 5151)
        result = await _run(
            dbpath, "resolve", "5151", "submitted", "--note", "audit: 1 POST", upstream=up.base_url
        )
        assert result.returncode == 0, result.stderr
        # The UI's words for the task, not the operation's state name.
        assert "now 已提交 / Submitted" in result.stdout, result.stdout
        assert "SUBMITTED" not in result.stdout
        assert _read(dbpath, views.task_view, 5151)["state"] == "SUBMITTED"
        assert _read(dbpath, usage.usage, alice.id)["used"] == 7
        # The same verdict again answers the same and meters nothing more.
        result = await _run(dbpath, "resolve", "5151", "submitted", upstream=up.base_url)
        assert result.returncode == 0, result.stderr
        assert _read(dbpath, usage.usage, alice.id)["used"] == 7
        # The other verdict on a settled task is a conflict that changes nothing.
        result = await _run(dbpath, "resolve", "5151", "not_submitted", upstream=up.base_url)
        assert result.returncode == 1, result.stderr
        assert "gid 5151 is 已提交 / Submitted, not 提交未知 / Submission unknown" in result.stderr
        assert _read(dbpath, views.task_view, 5151)["state"] == "SUBMITTED"
        assert up.stats()["posts"] == {"5151": 1}  # resolving never POSTs
    with closing(db.connect(dbpath)) as connection:
        audit = connection.execute(
            "SELECT verdict, actor, note, evidence FROM reconciliation_audit WHERE gid = 5151"
        ).fetchall()
    assert len(audit) == 1
    verdict, actor, note, evidence = audit[0]
    assert (verdict, note) == ("submitted", "audit: 1 POST")
    assert actor.startswith("tasknet-admin")
    assert json.loads(evidence)["upstream"]["audit"]["submissions"] == 1


@pytest_twisted.ensureDeferred
async def test_resolve_not_submitted_frees_the_gid_even_without_the_upstream(dbpath: str) -> None:
    _write(dbpath, users.create_user, "alice")
    _make_unknown(dbpath, 6161)
    alice = _read(dbpath, users.get_user, "alice")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: the audit is unavailable
    result = await _run(
        dbpath, "resolve", "6161", "not_submitted", "--note", "no POST", upstream=closed
    )
    assert result.returncode == 0, result.stderr
    assert "gid is free" in result.stdout
    assert _read(dbpath, views.task_view, 6161) is None
    assert _read(dbpath, usage.usage, alice.id)["used"] == 0
    assert _read(dbpath, reconcile.unknown_operations) == []


@pytest_twisted.ensureDeferred
async def test_resolve_unknown_gid_is_not_found(dbpath: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    result = await _run(dbpath, "resolve", "999", "submitted", upstream=closed)
    assert result.returncode == 1 and "no task 999" in result.stderr


def test_console_script_is_installed(dbpath: str) -> None:
    script = Path(sys.executable).with_name("tasknet-admin")
    result = subprocess.run(
        [str(script), "--db", dbpath, "user", "add", "dave"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert _read(dbpath, users.user_by_token, result.stdout.strip()).name == "dave"


def _set_wait(dbpath: str, gid: int, not_before: str) -> None:
    """``verdict_not_before`` as a reap writes it."""
    _write(
        dbpath,
        lambda c: c.execute(
            "UPDATE task_operation SET verdict_not_before = ? WHERE gid = ?", (not_before, gid)
        ),
    )


@pytest_twisted.ensureDeferred
async def test_resolve_not_submitted_during_the_verdict_wait_exits_1_naming_the_time(
    dbpath: str,
) -> None:
    _write(dbpath, users.create_user, "alice")
    _make_unknown(dbpath, 7171)
    ahead = throughput.iso(time.time() + 3600)
    _set_wait(dbpath, 7171, ahead)
    async with running_upstream() as up:  # the audit: no POST, no contradiction
        result = await _run(dbpath, "resolve", "7171", "not_submitted", upstream=up.base_url)
        assert result.returncode == 1, result.stdout
        assert ahead in result.stderr and "nothing changed" in result.stderr
        assert _read(dbpath, views.task_view, 7171)["state"] == "UNKNOWN"
        listed = await _run(dbpath, "unknown", "--json", upstream=up.base_url)
        evidence = json.loads(listed.stdout)["tasks"][0]["evidence"]
        assert evidence["notBefore"] == ahead and evidence["verdictWaitSeconds"] > 3000
        # Once the wait is over, the same command is taken.
        _set_wait(dbpath, 7171, throughput.iso(time.time() - 1))
        result = await _run(dbpath, "resolve", "7171", "not_submitted", upstream=up.base_url)
        assert result.returncode == 0, result.stderr
        assert _read(dbpath, views.task_view, 7171) is None


@pytest_twisted.ensureDeferred
async def test_resolve_submitted_is_allowed_during_the_verdict_wait(dbpath: str) -> None:
    _write(dbpath, users.create_user, "alice")
    _make_unknown(dbpath, 7272)
    _set_wait(dbpath, 7272, throughput.iso(time.time() + 3600))
    async with running_upstream() as up:
        await _post_archive(up.base_url, 7272)
        result = await _run(dbpath, "resolve", "7272", "submitted", upstream=up.base_url)
        assert result.returncode == 0, result.stderr
        assert _read(dbpath, views.task_view, 7272)["state"] == "SUBMITTED"


@pytest_twisted.ensureDeferred
async def test_resolve_against_the_audit_requires_a_note(dbpath: str) -> None:
    _write(dbpath, users.create_user, "alice")
    _make_unknown(dbpath, 7373)
    async with running_upstream() as up:
        await _post_archive(up.base_url, 7373)  # the audit: 1 POST
        result = await _run(dbpath, "resolve", "7373", "not_submitted", upstream=up.base_url)
        assert result.returncode == 1
        assert "--note" in result.stderr and "1 archive POST(s)" in result.stderr
        assert _read(dbpath, views.task_view, 7373)["state"] == "UNKNOWN"
        result = await _run(
            dbpath,
            "resolve",
            "7373",
            "not_submitted",
            "--note",
            "a test POST by hand, not this task's",
            upstream=up.base_url,
        )
        assert result.returncode == 0, result.stderr
    with closing(db.connect(dbpath)) as connection:
        note, evidence = connection.execute(
            "SELECT note, evidence FROM reconciliation_audit WHERE gid = 7373"
        ).fetchone()
    assert note == "a test POST by hand, not this task's"
    assert json.loads(evidence)["contradicts"] is True


# -- user disable | enable | remove (issue 21, item 8) ------------------------------------


def _session(dbpath: str, name: str) -> str:
    """A browser session of ``name``, as ``POST /api/session`` makes one."""
    user = _read(dbpath, users.get_user, name)
    session_id = sessions.new_session_id()
    _write(
        dbpath,
        sessions.start_session,
        user.id,
        sessions.hash_session_id(session_id),
        time.time(),
        3600.0,
        86400.0,
    )
    return session_id


def _session_user(dbpath: str, session_id: str):  # type: ignore[no-untyped-def]
    return _read(dbpath, users.user_by_session, sessions.hash_session_id(session_id), time.time())


def test_user_disable_locks_the_user_out_and_enable_lets_it_in(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, token = _write(dbpath, users.create_user, "alice")
    with closing(db.connect(dbpath)) as connection:
        add_task(connection, 4101, _read(dbpath, users.get_user, "alice").id)
    session_id = _session(dbpath, "alice")

    code, out, err = _cli(dbpath, "user", "disable", "alice", capsys=capsys)
    assert code == 0, err
    assert out.startswith("user alice: disabled; its token and browser sessions no longer work")
    assert "1 session(s) ended" in out and "its tasks stay" in out
    assert _read(dbpath, users.user_by_token, token) is None
    assert _session_user(dbpath, session_id) is None
    assert _read(dbpath, views.task_view, 4101) is not None  # the task stays
    code, out, _ = _cli(dbpath, "user", "list", capsys=capsys)
    assert code == 0 and "disabled since 20" in out
    code, out, _ = _cli(dbpath, "user", "disable", "alice", capsys=capsys)
    assert code == 0 and "already disabled since" in out

    code, out, _ = _cli(dbpath, "user", "enable", "alice", capsys=capsys)
    assert code == 0 and out.strip() == "user alice: enabled; its token works again"
    assert _read(dbpath, users.user_by_token, token).name == "alice"
    assert _session_user(dbpath, session_id) is None  # ended sessions stay ended
    code, out, _ = _cli(dbpath, "user", "enable", "alice", capsys=capsys)
    assert code == 0 and "already enabled; nothing changed" in out
    code, out, _ = _cli(dbpath, "user", "list", capsys=capsys)
    assert "disabled since" not in out and "enabled" in out


def test_user_remove_is_refused_while_the_user_has_live_tasks(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    alice, _ = _write(dbpath, users.create_user, "alice")
    with closing(db.connect(dbpath)) as connection:
        add_task(connection, 4201, alice.id)  # SUBMITTED: live
        add_task(connection, 4202, alice.id, "DELETED")  # a tombstone: not live
        add_task(connection, 4203, alice.id, "UNKNOWN")  # live
    code, out, err = _cli(dbpath, "user", "remove", "alice", capsys=capsys)
    assert code == 1 and out == ""
    assert "user 'alice' has 2 live task(s): delete them first" in err
    assert "nothing changed" in err
    assert _read(dbpath, users.get_user, "alice") is not None

    def settle(cursor: Any) -> None:
        cursor.execute("DELETE FROM gallery WHERE gid IN (4201, 4203)")
        cursor.execute(
            "UPDATE task_operation SET state = 'DELETE_PENDING', delete_operation_id = 'd1'"
            " WHERE gid = 4201"
        )
        cursor.execute("UPDATE task_operation SET state = 'DELETED' WHERE gid = 4201")

    _write(dbpath, settle)
    # 4203 still UNKNOWN (its task row gone): a live operation, still refused.
    code, _, err = _cli(dbpath, "user", "remove", "alice", capsys=capsys)
    assert code == 1 and "1 live task(s)" in err
    _write(dbpath, reconcile.resolve_unknown, 4203, "not_submitted", "test", "gone", None)

    _write(dbpath, users.create_user, "bob")
    session_id = _session(dbpath, "alice")
    code, out, err = _cli(dbpath, "user", "remove", "alice", capsys=capsys)
    assert code == 0, err
    assert out.strip() == f"user alice (id {alice.id}) removed"
    assert _read(dbpath, users.get_user, "alice") is None
    assert _session_user(dbpath, session_id) is None
    # The tombstones stay (owned by nobody), so their gids stay settled.
    assert _read(dbpath, views.task_view, 4202)["state"] == "DELETED"
    assert [u.name for u in _read(dbpath, users.list_users)] == ["bob"]
    code, _, err = _cli(dbpath, "user", "remove", "alice", capsys=capsys)
    assert code == 1 and "no user 'alice'" in err


def test_node_key_list_says_when_there_are_none(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(dbpath, "node-key", "list", capsys=capsys)
    assert code == 0
    assert out.startswith("no node keys in this database")


def test_an_unknown_flag_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--bogus"], ["--db", "x.sqlite", "user", "list", "--bogus=1"]):
        with pytest.raises(SystemExit) as exit_info:
            admin.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "tasknet-admin: error: unrecognized arguments: --bogus" in err, err
        assert "required" not in err
    # A known option's prefix is still an option (argparse allows it) and a
    # negative number a value: neither is called unknown.
    with pytest.raises(SystemExit):
        admin.main(["--db", "x.sqlite", "user", "quota", "alice", "-3"])
    assert "unrecognized" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        admin.main(["--d"])
    assert "unrecognized" not in capsys.readouterr().err


def test_a_directory_is_not_called_a_missing_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(str(tmp_path), "user", "list", capsys=capsys)
    assert code == 1 and out == ""
    assert err.strip() == (
        f"tasknet-admin: --db {tmp_path} is a directory, not a site database: give the"
        " database file (the path the site was started with, tasknet-site --db FILE)"
    )
    assert "start tasknet-site" not in err
    missing = tmp_path / "no" / "such" / "site.sqlite"
    code, _, err = _cli(str(missing), "user", "list", capsys=capsys)
    assert code == 1
    assert err.strip() == (
        f"tasknet-admin: no database at {str(missing)!r}: there is no directory"
        f" {str(missing.parent)!r}"
    )
