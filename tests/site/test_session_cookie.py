"""The web UI's session: ``POST /api/session`` puts the token in an
``HttpOnly; SameSite=Strict`` cookie, the API and the WebSocket accept it,
cross-origin unsafe calls made with it are ``403``, ``DELETE`` clears it."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import reactor

from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, running_site, site_options
from tests.site.rawhttp import exchange, request_bytes
from tests.site_protocol.harness import TIMEOUT, EventsClient, events_client
from tests.tls_certs import make_ca, make_site_cert


async def _with_site(target, test):
    upstream = await start_upstream()
    path = target
    try:
        async with running_site(site_options(path, upstream.base_url)) as site:
            _, token = add_user(path, "alice")
            await test(site, path, token, site.service.http_port.getHost().port)
    finally:
        await upstream.stop()


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()


async def _sign_in(port: int, token: str, **headers: str):
    answer, _ = await exchange(
        port,
        request_bytes(
            "POST",
            "/api/session",
            {"Content-Type": "application/json", **headers},
            _json({"token": token}),
        ),
    )
    return answer


@pytest_twisted.ensureDeferred
async def test_sign_in_sets_an_httponly_strict_cookie_and_only_for_a_valid_token(db_target):
    async def test(site, path, token, port):
        answer = await _sign_in(port, "not-a-token")
        assert answer.status == 401
        assert answer.json()["error"]["code"] == "unauthorized"
        assert "set-cookie" not in answer.headers

        answer = await _sign_in(port, token)
        assert answer.status == 200, answer.body
        assert answer.json() == {"user": {"name": "alice", "admin": False}}
        (cookie,) = answer.headers["set-cookie"]
        parts = [p.strip() for p in cookie.split(";")]
        assert parts[0] == f"tasknet_session={token}"
        # Attribute names and the SameSite value are case-insensitive.
        assert {p.lower() for p in parts[1:]} == {"path=/", "httponly", "samesite=strict"}
        # (no Secure: this came over plain HTTP)

        answer, _ = await exchange(
            port, request_bytes("GET", "/api/me", {"Cookie": f"tasknet_session={token}"})
        )
        assert (answer.status, answer.json()) == (200, {"user": {"name": "alice", "admin": False}})
        answer, _ = await exchange(port, request_bytes("GET", "/api/me"))
        assert answer.status == 401
        answer, _ = await exchange(
            port, request_bytes("GET", "/api/me", {"Cookie": "tasknet_session=forged"})
        )
        assert answer.status == 401

        answer, _ = await exchange(port, request_bytes("DELETE", "/api/session"))
        assert answer.status == 200
        (cleared,) = answer.headers["set-cookie"]
        assert cleared.startswith("tasknet_session=;")
        assert "Max-Age=0" in cleared and "HttpOnly" in cleared

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_cookie_calls_from_another_origin_are_refused_and_change_nothing(db_target):
    async def test(site, path, token, port):
        host = f"127.0.0.1:{port}"
        cookie = f"tasknet_session={token}"

        async def create(gid: int, **headers: str):
            answer, _ = await exchange(
                port,
                request_bytes(
                    "POST",
                    "/api/tasks",
                    {"Host": host, "Content-Type": "application/json", **headers},
                    _json({"gid": gid, "token": "t"}),
                ),
            )
            return answer

        answer = await create(11, Cookie=cookie, Origin="http://evil.example")
        assert answer.status == 403
        assert answer.json()["error"]["code"] == "forbidden"
        answer = await create(11, Cookie=cookie, Origin="null")
        assert answer.status == 403
        assert one(path, "SELECT COUNT(*) FROM gallery")[0] == 0

        answer = await create(11, Cookie=cookie, Origin=f"http://{host}")
        assert answer.status == 201, answer.body
        answer = await create(12, Cookie=cookie)  # no Origin: a non-browser client
        assert answer.status == 201, answer.body
        # A bearer token is not sent by a browser on its own: no origin rule.
        answer = await create(13, Authorization=f"Bearer {token}", Origin="http://evil.example")
        assert answer.status == 201, answer.body
        # A cross-origin read with the cookie is harmless (the answer is not
        # readable cross-origin): allowed.
        answer, _ = await exchange(
            port,
            request_bytes(
                "GET", "/api/me", {"Host": host, "Cookie": cookie, "Origin": "http://evil.example"}
            ),
        )
        assert answer.status == 200
        # Nor can another origin sign someone in or out.
        answer = await _sign_in(port, token, Host=host, Origin="http://evil.example")
        assert answer.status == 403 and "set-cookie" not in answer.headers
        answer, _ = await exchange(
            port,
            request_bytes(
                "DELETE", "/api/session", {"Host": host, "Origin": "http://evil.example"}
            ),
        )
        assert answer.status == 403 and "set-cookie" not in answer.headers

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_the_websocket_authenticates_from_the_cookie(db_target):
    async def test(site, path, token, port):
        client = await events_client(port, headers={"Cookie": f"tasknet_session={token}"})
        try:
            answer, _ = await exchange(
                port,
                request_bytes(
                    "POST",
                    "/api/tasks",
                    {"Authorization": f"Bearer {token}"},
                    _json({"gid": 21, "token": "t"}),
                ),
            )
            assert answer.status == 201
            push = await client.next()
            assert push["type"] == "task" and push["task"]["gid"] == 21
        finally:
            await client.shut()

        with pytest.raises(ConnectionError):
            await events_client(port, headers={"Cookie": "tasknet_session=forged"})
        # A bearer header works for a program; it wins over a cookie.
        client = await events_client(
            port, headers={"Authorization": f"Bearer {token}", "Cookie": "tasknet_session=forged"}
        )
        await client.shut()
        with pytest.raises(ConnectionError):
            await events_client(
                port,
                headers={"Authorization": "Bearer forged", "Cookie": f"tasknet_session={token}"},
            )
        # A cookie-authenticated handshake from another origin is refused.
        with pytest.raises(ConnectionError):
            await events_client(
                port,
                headers={"Cookie": f"tasknet_session={token}", "Origin": "http://evil.example"},
            )

    await _with_site(db_target, test)


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


def _https_sign_in(port: int, token: str) -> tuple[int, list[str]]:
    return _https_post(port, "/api/session", _json({"token": token}), {})


def _https_create(port: int, token: str, gid: int) -> tuple[None, int]:
    status, _ = _https_post(
        port, "/api/tasks", _json({"gid": gid, "token": "t"}), {"Authorization": f"Bearer {token}"}
    )
    return None, status


async def _events_over_tls(port: int, token: str) -> EventsClient:
    from twisted.internet.endpoints import SSL4ClientEndpoint
    from twisted.internet.ssl import CertificateOptions

    factory = WebSocketClientFactory(
        f"wss://127.0.0.1:{port}/api/events", headers={"Cookie": f"tasknet_session={token}"}
    )
    factory.protocol = EventsClient
    endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, CertificateOptions())
    client = await endpoint.connect(factory)
    await client.opened.addTimeout(TIMEOUT, reactor)
    return client


@pytest_twisted.ensureDeferred
async def test_over_tls_the_cookie_is_also_secure(tmp_path):
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
            status, cookies = await deferToThread(_https_sign_in, port, token)
            assert status == 200
            (cookie,) = cookies
            attributes = {p.strip().lower() for p in cookie.split(";")[1:]}
            assert attributes == {"path=/", "httponly", "samesite=strict", "secure"}
            # The WebSocket works over TLS too (its send-buffer watch is the
            # TLS transport's producer then), with the cookie.
            client = await _events_over_tls(port, token)
            try:
                _, created = await deferToThread(_https_create, port, token, 31)
                assert created == 201
                push = await client.next()
                assert push["task"]["gid"] == 31
            finally:
                await client.shut()
    finally:
        await upstream.stop()
