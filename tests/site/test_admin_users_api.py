"""The admin UI's Users section over the API (issue 36, items 7 and 8), at
the real site on both backends: add, quota, disable/enable, rotate a token,
end sessions; a disabled user's sign-in says the account is disabled; every
bad input is a clear 4xx that changes nothing; GET /api/session says whether
the site runs with --demo."""

from __future__ import annotations

import json

import pytest_twisted

from tasknet.site.storage import users
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, running_site, site_options
from tests.site.test_session_cookie import _call, _json, _own, _sign_in, _signed_in, _with_site


def _body(answer) -> dict:
    return json.loads(answer.body)


async def _admin(port: int, token: str, method: str, path: str, body: dict | None = None):
    return await _call(
        port, method, path, bearer=token, body=_json(body) if body is not None else b""
    )


@pytest_twisted.ensureDeferred
async def test_an_admin_manages_users_through_the_api(db_target):
    async def test(site, path, alice_token, port):
        _, root = add_user(path, "root", admin=True)

        listed = _body(await _admin(port, root, "GET", "/api/admin/users"))["users"]
        assert [(u["name"], u["admin"], u["disabledAt"], u["sessions"]) for u in listed] == [
            ("alice", False, None, 0),
            ("root", True, None, 0),
        ]
        # Not an admin: refused.
        answer = await _admin(port, alice_token, "GET", "/api/admin/users")
        assert answer.status == 403

        # Add: the token once, the site's default quota.
        added = await _admin(port, root, "POST", "/api/admin/users", {"name": "bob"})
        assert added.status == 201, added.body
        bob = _body(added)
        assert bob["user"]["name"] == "bob" and bob["user"]["quota"] == 5000
        assert (await _call(port, "GET", "/api/me", bearer=bob["token"])).status == 200
        again = await _admin(port, root, "POST", "/api/admin/users", {"name": "bob"})
        assert (again.status, _body(again)["error"]["code"]) == (409, "conflict")

        # Quota.
        answer = await _admin(port, root, "PUT", "/api/admin/users/bob/quota", {"quota": 120})
        assert (answer.status, _body(answer)["user"]["quota"]) == (200, 120)
        answer = await _admin(port, root, "PUT", "/api/admin/users/bob/quota", {"quota": 130.0})
        assert (answer.status, _body(answer)["user"]["quota"]) == (200, 130)

        # Sessions: counted, then ended.
        await _signed_in(port, bob["token"])
        await _signed_in(port, bob["token"])
        listed = _body(await _admin(port, root, "GET", "/api/admin/users"))["users"]
        assert {u["name"]: u["sessions"] for u in listed}["bob"] == 2
        answer = await _admin(port, root, "DELETE", "/api/admin/users/bob/sessions")
        assert _body(answer) == {"name": "bob", "sessionsEnded": 2}

        # Disable: the sign-in is told the account is disabled.
        session = await _signed_in(port, bob["token"])
        answer = await _admin(port, root, "POST", "/api/admin/users/bob/disable")
        assert _body(answer)["changed"] is True and _body(answer)["sessionsEnded"] == 1
        assert _body(answer)["user"]["disabledAt"] is not None
        refused = await _sign_in(port, bob["token"])
        assert refused.status == 403
        assert _body(refused)["error"] == {
            "code": "account_disabled",
            "message": "the account bob is disabled: an admin can enable it again",
        }
        assert (await _call(port, "GET", "/api/me", cookie=session)).status == 401
        again = await _admin(port, root, "POST", "/api/admin/users/bob/disable")
        assert _body(again)["changed"] is False
        # An admin cannot lock themselves out.
        answer = await _admin(port, root, "POST", "/api/admin/users/root/disable")
        assert answer.status == 409
        answer = await _admin(port, root, "POST", "/api/admin/users/root/token")
        assert answer.status == 409
        assert "tasknet-admin user token root" in _body(answer)["error"]["message"]

        # Enable, then rotate: the old token stops.
        answer = await _admin(port, root, "POST", "/api/admin/users/bob/enable")
        assert _body(answer)["changed"] is True
        assert (await _sign_in(port, bob["token"])).status == 200
        rotated = _body(await _admin(port, root, "POST", "/api/admin/users/bob/token"))
        assert rotated["name"] == "bob" and rotated["token"] != bob["token"]
        assert (await _call(port, "GET", "/api/me", bearer=bob["token"])).status == 401
        assert (await _call(port, "GET", "/api/me", bearer=rotated["token"])).status == 200

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_bad_user_requests_are_clear_and_change_nothing(db_target):
    async def test(site, path, alice_token, port):
        _, root = add_user(path, "root", admin=True)
        before = _body(await _admin(port, root, "GET", "/api/admin/users"))
        for method, where, body, status, words in [
            ("POST", "/api/admin/users", {"name": "a b"}, 400, "user name"),
            ("POST", "/api/admin/users", {}, 400, "'name' is required"),
            ("POST", "/api/admin/users", {"name": "c", "quota": -1}, 400, "'quota'"),
            ("POST", "/api/admin/users", {"name": "c", "quota": "9"}, 400, "'quota'"),
            ("POST", "/api/admin/users", {"name": "c", "admin": "yes"}, 400, "'admin'"),
            ("PUT", "/api/admin/users/alice/quota", {}, 400, "'quota' is required"),
            ("PUT", "/api/admin/users/alice/quota", {"quota": 10**12}, 400, "1,000,000,000"),
            ("PUT", "/api/admin/users/alice/quota", {"quota": 1.5}, 400, "whole number"),
            ("PUT", "/api/admin/users/nobody/quota", {"quota": 1}, 404, "no user"),
            ("POST", "/api/admin/users/nobody/disable", None, 404, "no user"),
            ("POST", "/api/admin/users/nobody/enable", None, 404, "no user"),
            ("POST", "/api/admin/users/nobody/token", None, 404, "no user"),
            ("DELETE", "/api/admin/users/nobody/sessions", None, 404, "no user"),
        ]:
            answer = await _admin(port, root, method, where, body)
            assert answer.status == status, (where, body, answer.body)
            assert words in _body(answer)["error"]["message"], (where, answer.body)
        assert _body(await _admin(port, root, "GET", "/api/admin/users")) == before
        assert [u.name for u in _users(path)] == ["alice", "root"]

    await _with_site(db_target, test)


def _users(path: str) -> list[users.User]:
    from tests.site.test_session_cookie import _write

    return _write(path, users.list_users)


@pytest_twisted.ensureDeferred
async def test_the_sign_in_page_names_the_demo_token_only_with_demo(tmp_path):
    upstream = await start_upstream()
    try:
        for extra, demo in (((), False), (("--demo",), True)):
            path = str(tmp_path / f"site-{demo}.sqlite")
            async with running_site(site_options(path, upstream.base_url, *extra)) as site:
                port = site.service.http_port.getHost().port
                answer = await _call(port, "GET", "/api/session", origin=_own(port))
                assert (answer.status, _body(answer)) == (200, {"demo": demo})
    finally:
        await upstream.stop()
