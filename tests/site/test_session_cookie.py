"""The web UI's sessions (INTERFACES.md, "Sessions and downloads"), over
real HTTP against the real site: ``POST /api/session`` (JSON only, from
the site's own origin) creates a server-side session whose random id is the
cookie's value (never the token; stored as its sha256), the API and the
WebSocket accept it, ``DELETE`` ends it on the server, rotating or revoking
the token ends all of the user's sessions and their sockets, and the
expiries run on the clock the site's authenticator is given.

The same-origin rule for cookie writes and for the cookie WebSocket
handshake has one test per compared part (scheme, host, port), each of
which a check that ignored that part would fail, plus a missing ``Origin``
and a cross-site ``text/plain`` simple request."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater

from tasknet.site.storage import sessions, users
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.web.auth import DEFAULT_SESSION_IDLE, DEFAULT_SESSION_MAX_AGE, TOUCH_INTERVAL
from tasknet.site.web.events import CLOSE_TOKEN_INVALID, TOKEN_CHECK_INTERVAL
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, query, running_site, site_options
from tests.site.rawhttp import Answer, exchange, request_bytes
from tests.site_protocol.harness import TIMEOUT, EventsClient, events_client
from tests.tls_certs import make_ca, make_site_cert

#: These tests create tasks only to see a session accepted; none waits on an
#: upstream timeout, so the helper's 0.5 s (which a loaded machine can
#: exceed: CI once saw a create answered upstream_unavailable) is raised.
UPSTREAM_TIMEOUT = ("--upstream-timeout", "10")


async def _with_site(target, test, *extra: str):
    upstream = await start_upstream()
    path = target
    try:
        options = site_options(path, upstream.base_url, *UPSTREAM_TIMEOUT, *extra)
        async with running_site(options) as site:
            _, token = add_user(path, "alice")
            await test(site, path, token, site.service.http_port.getHost().port)
    finally:
        await upstream.stop()


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()


def _own(port: int) -> str:
    return f"http://127.0.0.1:{port}"


async def _call(
    port: int,
    method: str,
    path: str,
    *,
    cookie: str | None = None,
    origin: str | None = None,
    body: bytes = b"",
    content_type: str | None = "application/json",
    bearer: str | None = None,
    host: str | None = None,
) -> Answer:
    """One request as a browser on ``http://127.0.0.1:port`` would send it
    (``Host`` with the port), with what is given."""
    headers: dict[str, bytes | str] = {"Host": host or f"127.0.0.1:{port}"}
    if cookie is not None:
        headers["Cookie"] = f"tasknet_session={cookie}"
    if origin is not None:
        headers["Origin"] = origin
    if body and content_type is not None:
        headers["Content-Type"] = content_type
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    answer, _ = await exchange(port, request_bytes(method, path, headers, body))
    return answer


async def _sign_in(port: int, token: str, **kw) -> Answer:
    kw.setdefault("origin", _own(port))
    return await _call(port, "POST", "/api/session", body=_json({"token": token}), **kw)


def _cookie(answer: Answer) -> str:
    (cookie,) = answer.headers["set-cookie"]
    name, _, value = cookie.split(";")[0].partition("=")
    assert name == "tasknet_session"
    return value


async def _signed_in(port: int, token: str) -> str:
    answer = await _sign_in(port, token)
    assert answer.status == 200, answer.body
    return _cookie(answer)


async def _me(port: int, cookie: str) -> int:
    return (await _call(port, "GET", "/api/me", cookie=cookie)).status


def _rows(path: str) -> list:
    return query(path, "SELECT * FROM web_session ORDER BY id")


def _write(path: str, fn, *args):
    connection = connect(path)
    try:
        return run_write(connection, fn, *args)
    finally:
        connection.close()


# -- sessions -------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_sign_in_creates_a_server_side_session_whose_random_id_is_the_cookie(db_target):
    async def test(site, path, token, port):
        answer = await _sign_in(port, "not-a-token")
        assert answer.status == 401
        assert answer.json()["error"]["code"] == "unauthorized"
        assert "set-cookie" not in answer.headers
        assert _rows(path) == []

        answer = await _sign_in(port, token)
        assert answer.status == 200, answer.body
        assert answer.json() == {"user": {"name": "alice", "admin": False}}
        (cookie,) = answer.headers["set-cookie"]
        parts = [p.strip() for p in cookie.split(";")]
        # Attribute names and the SameSite value are case-insensitive; no
        # Secure over plain HTTP, no expiry of the cookie's own.
        assert {p.lower() for p in parts[1:]} == {"path=/", "httponly", "samesite=strict"}
        session_id = _cookie(answer)
        assert token not in cookie
        assert sessions.well_formed(session_id)  # 32 random bytes, URL-safe
        (row,) = _rows(path)
        # Stored as its sha256 only; neither the id nor the token is in the row.
        assert row["id_hash"] == hashlib.sha256(session_id.encode()).hexdigest()
        assert session_id not in [str(v) for v in row] and token not in [str(v) for v in row]
        assert row["ended_at"] is None
        assert row["created_at"] < row["idle_until"] < row["expires_at"]

        answer = await _call(port, "GET", "/api/me", cookie=session_id)
        assert answer.status == 200
        assert answer.json() == {
            "user": {"name": "alice", "admin": False},
            "site": site.site.health.site,
            "upstreamTimeout": site.site.lifecycle.upstream_timeout,
        }
        # The token itself is not a session id; nor is a forged one.
        assert await _me(port, token) == 401
        assert await _me(port, "A" * 43) == 401
        assert await _me(port, "forged") == 401
        assert (await _call(port, "GET", "/api/me")).status == 401

        # Sign-out ends the session on the server: the old cookie is refused.
        answer = await _call(port, "DELETE", "/api/session", cookie=session_id, origin=_own(port))
        assert answer.status == 200
        (cleared,) = answer.headers["set-cookie"]
        assert cleared.startswith("tasknet_session=;")
        assert "Max-Age=0" in cleared and "HttpOnly" in cleared
        assert await _me(port, session_id) == 401
        (row,) = _rows(path)
        assert row["ended_at"] is not None and row["ended_why"] == "signed out"

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_sign_in_takes_only_a_json_body(tmp_path):
    async def test(site, path, token, port):
        cases = {
            "text/plain": ("text/plain", _json({"token": token})),
            "form": ("application/x-www-form-urlencoded", f"token={token}".encode()),
            "multipart": ("multipart/form-data; boundary=x", _json({"token": token})),
            "no type": (None, _json({"token": token})),
            "latin-1 JSON": ("application/json; charset=iso-8859-1", _json({"token": token})),
        }
        for what, (content_type, body) in cases.items():
            answer = await _call(
                port,
                "POST",
                "/api/session",
                origin=_own(port),
                body=body,
                content_type=content_type,
            )
            assert answer.status == 400, (what, answer.status, answer.body)
            assert answer.json()["error"]["code"] == "invalid_request", what
            assert "set-cookie" not in answer.headers, what
        assert _rows(path) == []
        answer = await _call(
            port,
            "POST",
            "/api/session",
            origin=_own(port),
            body=_json({"token": token}),
            content_type="Application/JSON; charset=UTF-8",
        )
        assert answer.status == 200, answer.body

    await _with_site(str(tmp_path / "site.sqlite"), test)


@pytest_twisted.ensureDeferred
async def test_signing_in_again_ends_the_browsers_previous_session(tmp_path):
    async def test(site, path, token, port):
        first = await _signed_in(port, token)
        answer = await _sign_in(port, token, cookie=first)
        second = _cookie(answer)
        assert second != first
        assert await _me(port, first) == 401
        assert await _me(port, second) == 200
        ended = [row["ended_why"] for row in _rows(path)]
        assert ended == ["signed in again", None]

    await _with_site(str(tmp_path / "site.sqlite"), test)


@pytest_twisted.ensureDeferred
async def test_rotating_or_revoking_the_token_ends_all_of_the_users_sessions(db_target):
    async def test(site, path, token, port):
        bob_id, bob_token = add_user(path, "bob")
        one_tab = await _signed_in(port, token)
        other_tab = await _signed_in(port, token)
        bob = await _signed_in(port, bob_token)

        _write(path, users.rotate_token, "alice")
        assert await _me(port, one_tab) == 401
        assert await _me(port, other_tab) == 401
        assert await _me(port, bob) == 200  # another user's session stays
        assert {row["ended_why"] for row in _rows(path) if row["user_id"] != bob_id} == {
            "token rotated"
        }

        _write(path, users.revoke_token, "bob")
        assert await _me(port, bob) == 401
        answer = await _call(port, "GET", "/api/me", bearer=bob_token)
        assert answer.status == 401  # and the token with it

    await _with_site(db_target, test)


def _factory(site):
    return site.site.web.events.factory


async def _cookie_socket(port: int, session_id: str) -> EventsClient:
    return await events_client(
        port, headers={"Cookie": f"tasknet_session={session_id}", "Origin": _own(port)}
    )


@pytest_twisted.ensureDeferred
async def test_a_sessions_websocket_closes_when_the_session_ends(db_target):
    """Within one re-check (2.5 s on the factory's clock, driven here):
    rotation, sign-out and an admin's end each close the session's sockets."""

    async def test(site, path, token, port):
        clock = Clock()
        _factory(site).clock = clock
        _, bob_token = add_user(path, "bob")
        _, carol_token = add_user(path, "carol")
        alice = await _signed_in(port, token)
        bob = await _signed_in(port, bob_token)
        carol = await _signed_in(port, carol_token)
        sockets = {
            "rotated": await _cookie_socket(port, alice),
            "signed out": await _cookie_socket(port, bob),
            "ended by an admin": await _cookie_socket(port, carol),
        }
        try:
            _write(path, users.rotate_token, "alice")
            answer = await _call(port, "DELETE", "/api/session", cookie=bob, origin=_own(port))
            assert answer.status == 200
            _write(path, sessions.end_sessions_of, "carol", "ended by a test")
            await deferLater(reactor, 0.2, lambda: None)
            assert not any(s.closed.called for s in sockets.values())
            clock.advance(TOKEN_CHECK_INTERVAL)
            for what, socket in sockets.items():
                code = await socket.closed.addTimeout(5, reactor)
                assert code == CLOSE_TOKEN_INVALID, what
        finally:
            for socket in sockets.values():
                await socket.shut()

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_the_websocket_authenticates_from_the_session_cookie(db_target):
    async def test(site, path, token, port):
        session_id = await _signed_in(port, token)
        client = await _cookie_socket(port, session_id)
        try:
            answer = await _call(
                port, "POST", "/api/tasks", bearer=token, body=_json({"gid": 21, "token": "t"})
            )
            assert answer.status == 201
            push = await client.next()
            assert push["type"] == "task" and push["task"]["gid"] == 21
        finally:
            await client.shut()

        with pytest.raises(ConnectionError):
            await _cookie_socket(port, "forged")
        with pytest.raises(ConnectionError):
            await _cookie_socket(port, token)  # a token is not a session id
        # A bearer header works for a program; it wins over a cookie.
        client = await events_client(
            port, headers={"Authorization": f"Bearer {token}", "Cookie": "tasknet_session=forged"}
        )
        await client.shut()
        with pytest.raises(ConnectionError):
            await events_client(
                port,
                headers={
                    "Authorization": "Bearer forged",
                    "Cookie": f"tasknet_session={session_id}",
                    "Origin": _own(port),
                },
            )

    await _with_site(db_target, test)


# -- expiry, on the authenticator's clock -----------------------------------------


def _clocked(site) -> Clock:
    """Give the site's authenticator a test clock, set to now."""
    clock = Clock()
    clock.advance(float(int(reactor.seconds())))  # whole seconds: exact sums
    site.site.web.auth.clock = clock
    return clock


@pytest_twisted.ensureDeferred
async def test_the_idle_expiry_slides_with_use_at_most_once_a_minute(db_target):
    async def test(site, path, token, port):
        clock = _clocked(site)
        session_id = await _signed_in(port, token)
        (row,) = _rows(path)
        signed_in_at = row["last_seen_at"]

        # Used within the minute: valid, and nothing written.
        clock.advance(TOUCH_INTERVAL - 1)
        assert await _me(port, session_id) == 200
        assert _rows(path)[0]["last_seen_at"] == signed_in_at
        # Used after it: the slide is written.
        clock.advance(2)  # sign-in + 61 s
        assert await _me(port, session_id) == 200
        assert _rows(path)[0]["last_seen_at"] > signed_in_at

        # Past the sign-in's own idle expiry, the slide keeps it usable
        # (and this use slides it again).
        clock.advance(DEFAULT_SESSION_IDLE - 31)  # sign-in + idle + 30 s
        assert await _me(port, session_id) == 200
        # Unused for a whole idle period since: gone.
        clock.advance(DEFAULT_SESSION_IDLE)
        assert await _me(port, session_id) == 401

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_the_absolute_expiry_holds_however_often_the_session_is_used(db_target):
    async def test(site, path, token, port):
        clock = _clocked(site)
        session_id = await _signed_in(port, token)
        step = DEFAULT_SESSION_IDLE / 2
        used = 0.0
        while used + step < DEFAULT_SESSION_MAX_AGE:
            clock.advance(step)
            used += step
            assert await _me(port, session_id) == 200, used
        clock.advance(DEFAULT_SESSION_MAX_AGE - used)
        assert await _me(port, session_id) == 401

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_session_options_set_the_expiries(tmp_path):
    async def test(site, path, token, port):
        clock = _clocked(site)
        session_id = await _signed_in(port, token)
        clock.advance(99)
        assert await _me(port, session_id) == 200
        clock.advance(99)  # within the 100 s slid at 99 s
        assert await _me(port, session_id) == 200
        clock.advance(200)  # past the 300 s absolute expiry
        assert await _me(port, session_id) == 401
        other = await _signed_in(port, token)
        clock.advance(101)  # idle 100 s
        assert await _me(port, other) == 401

    await _with_site(
        str(tmp_path / "site.sqlite"), test, "--session-idle", "100", "--session-max-age", "300"
    )


# -- the Secure flag ----------------------------------------------------------------


@pytest.mark.parametrize(
    "extra", [("--cookie-secure",), ("--public-url", "https://tasks.example")], ids=str
)
@pytest_twisted.ensureDeferred
async def test_cookie_secure_and_an_https_public_url_mark_the_cookie_secure(tmp_path, extra):
    async def test(site, path, token, port):
        origin = "https://tasks.example" if "--public-url" in extra else _own(port)
        answer = await _sign_in(port, token, origin=origin)
        assert answer.status == 200, answer.body
        (cookie,) = answer.headers["set-cookie"]
        attributes = {p.strip().lower() for p in cookie.split(";")[1:]}
        assert attributes == {"path=/", "httponly", "samesite=strict", "secure"}

    await _with_site(str(tmp_path / "site.sqlite"), test, *extra)


# -- same origin: writes ------------------------------------------------------------


def _other_origins(port: int) -> dict[str, str]:
    """Origins that differ from ``http://127.0.0.1:port`` in one part each."""
    return {
        "scheme": f"https://127.0.0.1:{port}",
        "host": f"http://localhost:{port}",
        "port": f"http://127.0.0.1:{port + 1}",
    }


@pytest.mark.parametrize("part", ["scheme", "host", "port"])
@pytest_twisted.ensureDeferred
async def test_a_cookie_write_from_an_origin_differing_only_in_one_part_is_refused(tmp_path, part):
    async def test(site, path, token, port):
        session_id = await _signed_in(port, token)
        other = _other_origins(port)[part]

        async def write(method: str, target: str, origin: str, body: bytes = b"") -> Answer:
            return await _call(port, method, target, cookie=session_id, origin=origin, body=body)

        create = _json({"gid": 11, "token": "t"})
        answer = await write("POST", "/api/tasks", other, create)
        assert answer.status == 403, (part, answer.body)
        assert answer.json()["error"]["code"] == "forbidden"
        assert (await write("PUT", "/api/favorites/11", other)).status == 403
        assert (await write("DELETE", "/api/tasks/11", other)).status == 403
        assert (await write("DELETE", "/api/session", other)).status == 403
        assert one(path, "SELECT COUNT(*) FROM gallery")[0] == 0
        assert await _me(port, session_id) == 200  # the sign-out did not happen
        # Nor can that origin sign anyone in.
        answer = await _sign_in(port, token, origin=other)
        assert answer.status == 403 and "set-cookie" not in answer.headers
        assert len(_rows(path)) == 1

        # The very same request from the site's own origin is accepted.
        answer = await write("POST", "/api/tasks", _own(port), create)
        assert answer.status == 201, answer.body

    await _with_site(str(tmp_path / "site.sqlite"), test)


@pytest_twisted.ensureDeferred
async def test_a_cookie_write_without_origin_is_refused(tmp_path):
    async def test(site, path, token, port):
        session_id = await _signed_in(port, token)
        create = _json({"gid": 12, "token": "t"})
        answer = await _call(port, "POST", "/api/tasks", cookie=session_id, body=create)
        assert answer.status == 403
        assert answer.json()["error"]["code"] == "forbidden"
        for origin in ("null", "http://127.0.0.1", "garbage"):
            answer = await _call(
                port, "POST", "/api/tasks", cookie=session_id, origin=origin, body=create
            )
            assert answer.status == 403, origin
        answer = await _sign_in(port, token, origin=None)
        assert answer.status == 403 and "set-cookie" not in answer.headers
        answer = await _call(port, "DELETE", "/api/session", cookie=session_id)
        assert answer.status == 403
        assert one(path, "SELECT COUNT(*) FROM gallery")[0] == 0
        assert len(_rows(path)) == 1 and await _me(port, session_id) == 200

        # A bearer token needs no Origin, and any Origin is fine for it.
        answer = await _call(port, "POST", "/api/tasks", bearer=token, body=create)
        assert answer.status == 201, answer.body
        answer = await _call(
            port,
            "POST",
            "/api/tasks",
            bearer=token,
            origin="http://evil.example",
            body=_json({"gid": 13, "token": "t"}),
        )
        assert answer.status == 201, answer.body
        # A cookie read needs none either (its answer is not readable cross-origin).
        answer = await _call(
            port, "GET", "/api/me", cookie=session_id, origin="http://evil.example"
        )
        assert answer.status == 200

    await _with_site(str(tmp_path / "site.sqlite"), test)


@pytest_twisted.ensureDeferred
async def test_a_text_plain_simple_request_with_the_cookie_creates_nothing(tmp_path):
    """What a page of another site can send without a preflight: a POST
    with a ``text/plain`` body (JSON inside), the browser adding the cookie
    (were it not SameSite) and its own Origin."""

    async def test(site, path, token, port):
        session_id = await _signed_in(port, token)
        create = _json({"gid": 14, "token": "t"})
        for origin in ("http://evil.example", None, _own(port)):
            answer = await _call(
                port,
                "POST",
                "/api/tasks",
                cookie=session_id,
                origin=origin,
                body=create,
                content_type="text/plain",
            )
            # Refused by the origin rule, or (same origin) by the body's type.
            assert answer.status == (400 if origin == _own(port) else 403), (origin, answer.body)
            assert "error" in answer.json()
        assert one(path, "SELECT COUNT(*) FROM gallery")[0] == 0
        assert one(path, "SELECT COUNT(*) FROM task_operation")[0] == 0

    await _with_site(str(tmp_path / "site.sqlite"), test)


@pytest_twisted.ensureDeferred
async def test_the_public_url_is_the_origin_when_set(tmp_path):
    async def test(site, path, token, port):
        public = "http://tasks.example:8443"
        answer = await _sign_in(port, token, origin=_own(port))
        assert answer.status == 403  # Host is no longer what counts
        session_id = _cookie(await _sign_in(port, token, origin=public))
        for other in ("https://tasks.example:8443", "http://tasks.example", _own(port)):
            answer = await _call(
                port,
                "POST",
                "/api/tasks",
                cookie=session_id,
                origin=other,
                body=_json({"gid": 15, "token": "t"}),
            )
            assert answer.status == 403, other
        answer = await _call(
            port,
            "POST",
            "/api/tasks",
            cookie=session_id,
            origin=public,
            body=_json({"gid": 15, "token": "t"}),
        )
        assert answer.status == 201, answer.body

    await _with_site(
        str(tmp_path / "site.sqlite"), test, "--public-url", "http://Tasks.Example:8443/"
    )


def test_a_bad_public_url_is_a_usage_error():
    from twisted.python import usage

    for bad in ("tasks.example", "ftp://tasks.example", "http://tasks.example/app", "http://"):
        with pytest.raises(usage.UsageError):
            site_options("x.sqlite", "http://127.0.0.1:1", "--public-url", bad)
    with pytest.raises(usage.UsageError):
        site_options("x.sqlite", "http://127.0.0.1:1", "--session-idle", "0")


# -- same origin: the WebSocket handshake ---------------------------------------------


def _handshake(port: int, headers: dict[str, str]) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return request_bytes(
        "GET",
        "/api/events",
        {
            "Host": f"127.0.0.1:{port}",
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": key,
            "Sec-WebSocket-Version": "13",
            **headers,
        },
        close=False,
    )


async def _handshake_status(port: int, headers: dict[str, str]) -> Answer:
    answer, client = await exchange(port, _handshake(port, headers))
    client.abort()
    await client.closed
    return answer


@pytest.mark.parametrize("part", ["scheme", "host", "port"])
@pytest_twisted.ensureDeferred
async def test_a_cookie_websocket_from_an_origin_differing_only_in_one_part_is_refused(
    tmp_path, part
):
    async def test(site, path, token, port):
        session_id = await _signed_in(port, token)
        cookie = f"tasknet_session={session_id}"
        answer = await _handshake_status(
            port, {"Cookie": cookie, "Origin": _other_origins(port)[part]}
        )
        assert answer.status == 403, (part, answer.body)
        assert answer.json()["error"]["code"] == "forbidden"
        answer = await _handshake_status(port, {"Cookie": cookie, "Origin": _own(port)})
        assert answer.status == 101

    await _with_site(str(tmp_path / "site.sqlite"), test)


@pytest_twisted.ensureDeferred
async def test_a_cookie_websocket_without_origin_is_refused_a_token_one_is_not(tmp_path):
    async def test(site, path, token, port):
        session_id = await _signed_in(port, token)
        answer = await _handshake_status(port, {"Cookie": f"tasknet_session={session_id}"})
        assert answer.status == 403
        assert answer.json()["error"]["code"] == "forbidden"
        # A bearer header or ?token= needs no Origin (a program), whatever it says.
        for headers in (
            {"Authorization": f"Bearer {token}"},
            {"Authorization": f"Bearer {token}", "Origin": "http://evil.example"},
        ):
            answer = await _handshake_status(port, headers)
            assert answer.status == 101, headers
        client = await events_client(port, token)
        await client.shut()

    await _with_site(str(tmp_path / "site.sqlite"), test)


# -- over TLS ---------------------------------------------------------------------


def _https_post(
    port: int, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, list[str]]:
    """POST over TLS with the stdlib (blocking; run in a thread): the status
    and the Set-Cookie headers.  The certificate is a throwaway: only the
    cookie's flags are under test."""
    import http.client
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        response.read()
        return response.status, response.headers.get_all("Set-Cookie") or []
    finally:
        connection.close()


def _https_sign_in(port: int, token: str, origin: str) -> tuple[int, list[str]]:
    return _https_post(port, "/api/session", _json({"token": token}), {"Origin": origin})


def _https_create(port: int, token: str, gid: int) -> tuple[None, int]:
    status, _ = _https_post(
        port, "/api/tasks", _json({"gid": gid, "token": "t"}), {"Authorization": f"Bearer {token}"}
    )
    return None, status


async def _events_over_tls(port: int, session_id: str) -> EventsClient:
    from twisted.internet.endpoints import SSL4ClientEndpoint
    from twisted.internet.ssl import CertificateOptions

    factory = WebSocketClientFactory(
        f"wss://127.0.0.1:{port}/api/events",
        origin=f"https://127.0.0.1:{port}",
        headers={"Cookie": f"tasknet_session={session_id}"},
    )
    factory.protocol = EventsClient
    endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, CertificateOptions())
    client = await endpoint.connect(factory)
    await client.opened.addTimeout(TIMEOUT, reactor)
    return client


@pytest_twisted.ensureDeferred
async def test_over_tls_the_cookie_is_also_secure_and_the_origin_https(tmp_path):
    from twisted.internet.threads import deferToThread

    ca, ca_key = make_ca(tmp_path / "ca", "throwaway CA")
    key, cert = make_site_cert(tmp_path, ca, ca_key)
    upstream = await start_upstream()
    path = str(tmp_path / "site.sqlite")
    options = site_options(path, upstream.base_url)
    options["http"] = f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
    try:
        async with running_site(options) as site:
            _, token = add_user(path, "alice")
            port = site.service.http_port.getHost().port
            # Over TLS the site's own origin is https: http is another origin.
            status, cookies = await deferToThread(_https_sign_in, port, token, _own(port))
            assert (status, cookies) == (403, [])
            status, cookies = await deferToThread(
                _https_sign_in, port, token, f"https://127.0.0.1:{port}"
            )
            assert status == 200
            (cookie,) = cookies
            attributes = {p.strip().lower() for p in cookie.split(";")[1:]}
            assert attributes == {"path=/", "httponly", "samesite=strict", "secure"}
            session_id = cookie.split(";")[0].partition("=")[2]
            # The WebSocket works over TLS too (its send-buffer watch is the
            # TLS transport's producer then), with the cookie.
            client = await _events_over_tls(port, session_id)
            try:
                _, created = await deferToThread(_https_create, port, token, 31)
                assert created == 201
                push = await client.next()
                assert push["task"]["gid"] == 31
            finally:
                await client.shut()
    finally:
        await upstream.stop()
