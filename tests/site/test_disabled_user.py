"""A disabled user (``tasknet-admin user disable``) authenticates nothing at
the real site: its token, its browser sessions and a new sign-in are all
refused; enabled again, its token works (issue 21, item 8)."""

from __future__ import annotations

import json

import pytest_twisted

from tasknet.site.storage import users
from tests.site.test_session_cookie import _call, _me, _sign_in, _signed_in, _with_site, _write


@pytest_twisted.ensureDeferred
async def test_a_disabled_users_token_and_sessions_are_refused(db_target):
    async def test(site, path, token, port):
        session = await _signed_in(port, token)
        assert await _me(port, session) == 200

        _write(path, users.disable_user, "alice")
        assert await _me(port, session) == 401
        # Its token is refused, and says why (issue 36, item 8).
        for refused in (
            await _call(port, "GET", "/api/me", bearer=token),
            await _sign_in(port, token),
        ):
            assert refused.status == 403
            assert json.loads(refused.body)["error"]["code"] == "account_disabled"

        _write(path, users.enable_user, "alice")
        answer = await _call(port, "GET", "/api/me", bearer=token)
        assert answer.status == 200, answer.body
        assert await _me(port, session) == 401  # ended by the disable: sign in again
        assert await _me(port, await _signed_in(port, token)) == 200

    await _with_site(db_target, test)
