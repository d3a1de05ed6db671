"""Bad input is never a 500 (INTERFACES.md, "Bounds, failures and
secrets"): each case over real HTTP against the real site gets a 4xx with
the error envelope and commits nothing."""

from __future__ import annotations

import json

import pytest_twisted

from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, running_site, site_options
from tests.site.rawhttp import exchange, request_bytes


async def _with_site(target, test):
    upstream = await start_upstream()
    path = target
    try:
        async with running_site(site_options(path, upstream.base_url, "--demo")) as site:
            _, token = add_user(path, "alice")
            await test(site, path, token, site.service.http_port.getHost().port)
    finally:
        await upstream.stop()


def _assert_error(answer, status, code):
    assert answer.status == status, (answer.status, answer.body[:300])
    document = answer.json()
    assert document["error"]["code"] == code, document
    assert document["error"]["message"]


def _create(token: str, body: bytes) -> bytes:
    return request_bytes(
        "POST",
        "/api/tasks",
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        body,
    )


@pytest_twisted.ensureDeferred
async def test_bad_json_strings_and_nesting_are_400(db_target):
    async def test(site, path, token, port):
        cases = {
            # A lone surrogate escape: valid JSON syntax, not Unicode text.
            "lone surrogate in a value": b'{"gid": 5, "token": "t", "name": "a\\ud800b"}',
            "lone surrogate in a key": b'{"gid": 5, "token": "t", "\\udfff": 1}',
            "invalid UTF-8": b'{"gid": 5, "token": "t", "name": "\xff\xfe"}',
            "truncated UTF-8": b'{"gid": 5, "token": "t", "name": "\xe4\xb8"}',
            "nested 100000 deep": b'{"gid": 5, "token": "t", "x": '
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}",
            "nested 65 deep": b'{"x": ' + b"[" * 64 + b"]" * 64 + b"}",
        }
        for name, body in cases.items():
            answer, _ = await exchange(port, _create(token, body))
            assert answer.status == 400, (name, answer.status, answer.body[:200])
            _assert_error(answer, 400, "invalid_request")
        # 64 levels are fine: the body is judged on its fields.
        answer, _ = await exchange(port, _create(token, b'{"x": ' + b"[" * 63 + b"]" * 63 + b"}"))
        _assert_error(answer, 400, "invalid_request")
        assert "'gid' is required" in answer.json()["error"]["message"]
        assert one(path, "SELECT COUNT(*) FROM gallery")[0] == 0
        assert one(path, "SELECT COUNT(*) FROM task_operation")[0] == 0
        # And a proper create still works.
        answer, _ = await exchange(
            port, _create(token, json.dumps({"gid": 5, "token": "t"}).encode())
        )
        assert answer.status == 201, answer.body

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_a_nul_in_any_json_string_is_400_and_stores_nothing(db_target):
    """INTERFACES.md "NUL": on PostgreSQL a NUL reached the database (its
    text cannot hold one) and the create answered 500; on either backend it
    is now refused before anything is read or written."""

    async def test(site, path, token, port):
        creates = {
            "in the name": b'{"gid": 5, "token": "t", "name": "a\\u0000b"}',
            "in the upstream token": b'{"gid": 5, "token": "t\\u0000"}',
            "alone": b'{"gid": 5, "token": "t", "name": "\\u0000"}',
            "in a key": b'{"gid": 5, "token": "t", "na\\u0000me": "x"}',
            "in a nested list": b'{"gid": 5, "token": "t", "x": [["\\u0000"]]}',
        }
        for name, body in creates.items():
            answer, _ = await exchange(port, _create(token, body))
            _assert_error(answer, 400, "invalid_request")
            assert "NUL" in answer.json()["error"]["message"], name
        admin = {"Authorization": "Bearer demo", "Content-Type": "application/json"}
        others = {
            "sign-in token": (
                "/api/session",
                {"Origin": "http://127.0.0.1", "Content-Type": "application/json"},
                b'{"token": "demo\\u0000"}',
            ),
            "resolve note": (
                "/api/admin/tasks/5/resolve",
                admin,
                b'{"verdict": "submitted", "note": "\\u0000"}',
            ),
            "force-delete note": (
                "/api/admin/tasks/5/force-delete",
                admin,
                b'{"note": "x\\u0000"}',
            ),
        }
        for name, (target, headers, body) in others.items():
            answer, _ = await exchange(port, request_bytes("POST", target, headers, body))
            _assert_error(answer, 400, "invalid_request")
            assert "set-cookie" not in answer.headers, name
        for table in ("gallery", "task_operation", "web_session", "weekly_usage"):
            assert one(path, f"SELECT COUNT(*) FROM {table}")[0] == 0, table
        # The same bodies without the NUL are fine.
        answer, _ = await exchange(
            port, _create(token, b'{"gid": 5, "token": "t", "name": "a\\u0001b"}')
        )
        assert answer.status == 201, answer.body

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_lone_surrogate_in_an_admin_note_is_400(db_target):
    async def test(site, path, token, port):
        answer, _ = await exchange(
            port,
            request_bytes(
                "POST",
                "/api/admin/tasks/5/resolve",
                {"Authorization": "Bearer demo"},
                b'{"verdict": "submitted", "note": "\\ud83d"}',
            ),
        )
        _assert_error(answer, 400, "invalid_request")

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_a_non_utf8_authorization_header_is_401(db_target):
    async def test(site, path, token, port):
        for path_ in ("/api/tasks", "/api/me", "/api/events"):
            answer, _ = await exchange(
                port, request_bytes("GET", path_, {"Authorization": b"Bearer \xff\xfe\x80"})
            )
            _assert_error(answer, 401, "unauthorized")
        answer, _ = await exchange(
            port, request_bytes("GET", "/api/tasks", {"Cookie": b"tasknet_session=\xff\x80"})
        )
        _assert_error(answer, 401, "unauthorized")

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_nul_and_control_characters_in_a_path_are_404(db_target):
    async def test(site, path, token, port):
        for target in (
            b"/%00",
            b"/index.html%00",
            b"/%00/app.js",
            b"/app%01.js",
            b"/style.css%1f",
            b"/%7f",
            b"/api/tasks/%00",
            b"/api/tasks/1%0a",
            b"/api/%00",
        ):
            answer, _ = await exchange(
                port, request_bytes("GET", target, {"Authorization": f"Bearer {token}"})
            )
            assert answer.status == 404, (target, answer.status, answer.body[:200])
            _assert_error(answer, 404, "not_found")

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_other_odd_paths_and_malformed_requests_are_4xx_with_the_envelope(db_target):
    async def test(site, path, token, port):
        for target in (b"/%ff", b"/api/tasks/%ff", b"/api/%c3%28", b"/..%2f..%2fetc%2fpasswd"):
            answer, _ = await exchange(
                port, request_bytes("GET", target, {"Authorization": f"Bearer {token}"})
            )
            assert 400 <= answer.status < 500, (target, answer.status, answer.body[:200])
            assert answer.json()["error"]["code"], target
        # twisted.web's own 400s (a malformed request line, a header with no
        # colon) carry the envelope too.
        for raw in (
            b"GARBAGE\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
        ):
            answer, client = await exchange(port, raw)
            _assert_error(answer, 400, "invalid_request")
            await client.closed

    await _with_site(db_target, test)
