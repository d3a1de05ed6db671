"""``tasknet-admin session list|end`` and ``user token|revoke`` against real
databases (``db_target``: a SQLite file, a PostgreSQL database): sessions
are listed by a prefix of their stored hash (never the hash in full, never
the cookie's id), ended one by one or by user, and a rotated or revoked
token ends every session of its user."""

from __future__ import annotations

import time
from contextlib import closing

import pytest

from tasknet.cli import admin
from tasknet.site.storage import sessions, users
from tasknet.site.storage.engine import database as db
from tasknet.site.storage.engine.schema import prepare_database


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


def _sign_in(dbpath: str, name: str, *, now: float | None = None) -> str:
    """A session as ``POST /api/session`` makes one; its id (the cookie)."""
    user = _read(dbpath, users.get_user, name)
    session_id = sessions.new_session_id()
    _write(
        dbpath,
        sessions.start_session,
        user.id,
        sessions.hash_session_id(session_id),
        time.time() if now is None else now,
        3600.0,
        86400.0,
    )
    return session_id


def _usable(dbpath: str, session_id: str) -> bool:
    found = _read(dbpath, users.user_by_session, sessions.hash_session_id(session_id), time.time())
    return found is not None


def _prefix(session_id: str) -> str:
    return sessions.hash_session_id(session_id)[: sessions.PREFIX_LENGTH]


def test_session_list_shows_a_prefix_never_the_hash_or_the_id(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(dbpath, users.create_user, "alice")
    _write(dbpath, users.create_user, "bob")
    alice = _sign_in(dbpath, "alice")
    bob = _sign_in(dbpath, "bob")
    old = _sign_in(dbpath, "bob", now=time.time() - 2 * 86400)  # expired

    code, out, err = _cli(dbpath, "session", "list", capsys=capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "USER", "CREATED"]
    assert "LAST SEEN" in lines[0] and "EXPIRES" in lines[0]
    assert [line.split()[:2] for line in lines[1:]] == [
        [_prefix(alice), "alice"],
        [_prefix(bob), "bob"],
    ]
    for session_id in (alice, bob, old):
        assert session_id not in out
        assert sessions.hash_session_id(session_id) not in out

    code, out, _ = _cli(dbpath, "session", "list", "--all", capsys=capsys)
    assert code == 0
    states = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:]}
    assert states == {_prefix(alice): "active", _prefix(bob): "active", _prefix(old): "expired"}


def test_session_end_by_id_and_by_user(dbpath: str, capsys: pytest.CaptureFixture[str]) -> None:
    _write(dbpath, users.create_user, "alice")
    _write(dbpath, users.create_user, "bob")
    first = _sign_in(dbpath, "alice")
    second = _sign_in(dbpath, "alice")
    bob = _sign_in(dbpath, "bob")

    code, out, err = _cli(dbpath, "session", "end", _prefix(first), capsys=capsys)
    assert code == 0, err
    assert f"session {_prefix(first)} of alice ended" in out
    assert not _usable(dbpath, first) and _usable(dbpath, second) and _usable(dbpath, bob)
    # An ended session is not ended twice.
    code, _, err = _cli(dbpath, "session", "end", _prefix(first), capsys=capsys)
    assert code == 1 and "no open session" in err

    code, out, _ = _cli(dbpath, "session", "end", "--user", "alice", capsys=capsys)
    assert code == 0 and "1 session(s) ended" in out
    assert not _usable(dbpath, second) and _usable(dbpath, bob)
    with closing(db.connect(dbpath)) as connection:
        why = connection.execute(
            "SELECT ended_why FROM web_session WHERE ended_at IS NOT NULL"
        ).fetchall()
    assert all(row[0].startswith("ended by tasknet-admin") for row in why)


@pytest.mark.parametrize(
    "argv, message",
    [
        (("session", "end", "abc"), "at least 6 hex characters"),
        (("session", "end", "zzzzzzzz"), "at least 6 hex characters"),
        (("session", "end", "--user", "nobody"), "no user 'nobody'"),
    ],
)
def test_session_end_refusals_change_nothing(
    dbpath: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    _write(dbpath, users.create_user, "alice")
    session_id = _sign_in(dbpath, "alice")
    code, out, err = _cli(dbpath, *argv, capsys=capsys)
    assert code == 1 and message in err and out == ""
    assert _usable(dbpath, session_id)


def test_an_ambiguous_prefix_is_refused(dbpath: str, capsys: pytest.CaptureFixture[str]) -> None:
    _write(dbpath, users.create_user, "alice")
    made = [_sign_in(dbpath, "alice") for _ in range(2)]
    # Two hashes sharing 6 hex digits by chance are rare: make the second
    # share the first one's.
    shared = _prefix(made[0])[:6]
    with closing(db.connect(dbpath)) as connection:
        db.run_write(
            connection,
            lambda c: c.execute(
                "UPDATE web_session SET id_hash = ? WHERE id_hash = ?",
                (shared + "0" * 58, sessions.hash_session_id(made[1])),
            ),
        )
    code, _, err = _cli(dbpath, "session", "end", shared, capsys=capsys)
    assert code == 1 and "2 open sessions start with" in err
    assert _usable(dbpath, made[0])


def test_session_usage_needs_an_id_or_a_user(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        admin.main(["--db", dbpath, "session", "end"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        admin.main(["--db", dbpath, "session", "end", "abcdef", "--user", "alice"])


def test_rotating_or_revoking_a_token_ends_the_users_sessions(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, token = _write(dbpath, users.create_user, "alice")
    _write(dbpath, users.create_user, "bob")
    alice = _sign_in(dbpath, "alice")
    bob = _sign_in(dbpath, "bob")

    code, out, err = _cli(dbpath, "user", "token", "alice", capsys=capsys)
    assert code == 0 and "browser sessions no longer work" in err
    new_token = out.strip()
    assert not _usable(dbpath, alice) and _usable(dbpath, bob)
    assert _read(dbpath, users.user_by_token, token) is None

    again = _sign_in(dbpath, "alice")
    code, out, err = _cli(dbpath, "user", "revoke", "alice", capsys=capsys)
    assert code == 0, err
    assert "token revoked" in out and new_token not in out
    assert not _usable(dbpath, again) and _usable(dbpath, bob)
    assert _read(dbpath, users.user_by_token, new_token) is None
    code, _, err = _cli(dbpath, "user", "revoke", "nobody", capsys=capsys)
    assert code == 1 and "no user 'nobody'" in err
