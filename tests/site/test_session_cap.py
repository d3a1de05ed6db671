"""Issue 38, Build 3: a per-user cap on live sessions, the oldest ended
first (storage on either backend; the real site over HTTP).

Before: 3,000 sign-ins left 3,000 live sessions.  Now a user has at most
20 usable sessions (``sessions.DEFAULT_MAX_LIVE``); a sign-in past that
ends the user's oldest, saying why, and leaves other users' alone."""

from __future__ import annotations

import time
from typing import Any

import pytest
import pytest_twisted
import treq

from tasknet.site.storage import sessions, users
from tasknet.site.storage.engine import database as dbmod
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import SiteWithUsers, running_site, site_options


def _sign_in(conn: Any, user_id: int, now: float, max_live: int) -> tuple[str, int]:
    session_id = sessions.new_session_id()
    ended = dbmod.run_write(
        conn,
        sessions.start_session,
        user_id,
        sessions.hash_session_id(session_id),
        now,
        3600.0,
        86400.0,
        None,
        max_live,
    )
    return session_id, ended


def _usable(conn: Any, session_id: str, now: float) -> bool:
    found = dbmod.run_read(conn, users.user_by_session, sessions.hash_session_id(session_id), now)
    return found is not None


def test_a_sign_in_past_the_cap_ends_the_oldest(conn: Any) -> None:
    alice = dbmod.run_write(conn, users.create_user, "alice")[0].id
    bob = dbmod.run_write(conn, users.create_user, "bob")[0].id
    now = time.time()
    bobs, _ = _sign_in(conn, bob, now, 3)
    signed = []
    for n in range(7):
        session_id, ended = _sign_in(conn, alice, now + n, 3)
        signed.append(session_id)
        assert ended == (1 if n >= 3 else 0)
    later = now + 10
    assert [_usable(conn, s, later) for s in signed] == [False] * 4 + [True] * 3
    assert _usable(conn, bobs, later)  # another user's sessions are its own
    listed = dbmod.run_read(conn, lambda c: sessions.list_sessions(c, later, include_unusable=True))
    ended_why = {row.ended_why for row in listed if row.user == "alice" and row.ended_at}
    assert ended_why == {sessions.ENDED_BY_CAP.format(limit=3)}


def test_the_cap_counts_only_usable_sessions(conn: Any) -> None:
    """A session already ended or expired leaves room."""
    alice = dbmod.run_write(conn, users.create_user, "alice")[0].id
    now = time.time()
    first, _ = _sign_in(conn, alice, now - 7200, 2)  # idle for 2 h: expired (1 h idle)
    second, _ = _sign_in(conn, alice, now, 2)
    third, ended = _sign_in(conn, alice, now + 1, 2)
    assert ended == 0
    assert [_usable(conn, s, now + 2) for s in (first, second, third)] == [False, True, True]


def test_a_cap_below_one_is_refused(conn: Any) -> None:
    alice = dbmod.run_write(conn, users.create_user, "alice")[0].id
    with pytest.raises(sessions.SessionError):
        _sign_in(conn, alice, time.time(), 0)


async def with_fixture(target: str, test: Any) -> None:
    upstream = await start_upstream()
    try:
        async with running_site(site_options(target, upstream.base_url, "--demo")) as site:
            await test(SiteWithUsers(site, target, upstream))
    finally:
        await upstream.stop()


@pytest_twisted.ensureDeferred
async def test_http_sign_ins_past_the_cap_end_the_oldest(db_target):
    async def test(f: SiteWithUsers) -> None:
        base = f.site.base_url
        cookies = []
        for _ in range(sessions.DEFAULT_MAX_LIVE + 5):
            response = await treq.post(
                f"{base}/api/session",
                json={"token": f.alice},
                headers={"Origin": [base]},
                pool=f.site.pool,
            )
            assert response.code == 200
            await treq.content(response)
            (cookie,) = response.headers.getRawHeaders("Set-Cookie")
            cookies.append(cookie.split(";", 1)[0])
        codes = []
        for cookie in cookies:
            response = await treq.get(
                f"{base}/api/me", headers={"Cookie": [cookie]}, pool=f.site.pool
            )
            await treq.content(response)
            codes.append(response.code)
        assert codes == [401] * 5 + [200] * sessions.DEFAULT_MAX_LIVE

    await with_fixture(db_target, test)
