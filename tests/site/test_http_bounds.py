"""HTTP bounds (INTERFACES.md, "Bounds, failures and secrets"): the body
limit before buffering and before auth, the request deadline and the idle
timeout, over real loopback TCP against the real site, and on
``task.Clock`` for the timers."""

from __future__ import annotations

import json

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.static import Data

from tasknet.site.web.http import IDLE_TIMEOUT, REQUEST_TIMEOUT, BoundedSite
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, running_site, site_options
from tests.site.rawhttp import connect, exchange, request_bytes


async def _with_site(target, test, *extra):
    upstream = await start_upstream()
    path = target
    try:
        async with running_site(site_options(path, upstream.base_url, *extra)) as site:
            _, token = add_user(path, "alice")
            await test(site, path, token, site.service.http_port.getHost().port)
    finally:
        await upstream.stop()


def _assert_error(answer, status, code):
    assert answer.status == status, (answer.status, answer.body)
    document = answer.json()
    assert document["error"]["code"] == code, document
    assert document["error"]["message"]
    assert answer.header("content-type") == "application/json; charset=utf-8"


@pytest_twisted.ensureDeferred
async def test_a_300_mb_content_length_is_refused_with_413_before_the_body_and_auth(db_target):
    async def test(site, path, token, port):
        head = request_bytes(
            "POST",
            "/api/tasks",
            {"Content-Length": str(300 * 1024 * 1024), "Content-Type": "application/json"},
        )
        # Only the headers and the first bytes of the body: the answer must
        # not wait for (or buffer) the rest, and it comes before the 401 an
        # anonymous caller would get.
        answer, client = await exchange(port, head + b"x" * 1000)
        _assert_error(answer, 413, "payload_too_large")
        assert answer.header("connection") == "close"
        await client.closed  # the site closed the connection
        assert one(path, "SELECT COUNT(*) FROM gallery")[0] == 0

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_max_body_option_is_the_exact_limit(db_target):
    async def test(site, path, token, port):
        body = b"{" + b" " * 1998 + b"}"  # 2000 bytes: allowed, then judged
        answer, _ = await exchange(
            port, request_bytes("POST", "/api/tasks", {"Authorization": f"Bearer {token}"}, body)
        )
        _assert_error(answer, 400, "invalid_request")  # 'gid' is required
        answer, client = await exchange(
            port,
            request_bytes("POST", "/api/tasks", {"Authorization": f"Bearer {token}"}, body + b" "),
        )
        _assert_error(answer, 413, "payload_too_large")
        assert "2000 bytes" in answer.json()["error"]["message"]
        await client.closed

    await _with_site(db_target, test, "--max-body", "2000")


@pytest_twisted.ensureDeferred
async def test_a_chunked_body_is_cut_off_at_the_running_total(db_target):
    async def test(site, path, token, port):
        head = request_bytes(
            "POST",
            "/api/tasks",
            {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked"},
        )
        client = await connect(port)
        chunk = b'{"gid": 7, "token": "t", "name": "' + b"n" * 1400
        client.send(head + b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        client.send(b"%x\r\n" % 1000 + b"n" * 1000 + b"\r\n")  # total 2434 > 2000
        # No terminating chunk: the answer comes on the running total alone.
        answer = await client.response()
        _assert_error(answer, 413, "payload_too_large")
        await client.closed
        assert one(path, "SELECT COUNT(*) FROM gallery")[0] == 0

        # Under the limit, a chunked create goes through.
        body = json.dumps({"gid": 8, "token": "t"}).encode()
        answer, _ = await exchange(
            port,
            head
            + b"%x\r\n" % 5
            + body[:5]
            + b"\r\n"
            + b"%x\r\n" % (len(body) - 5)
            + body[5:]
            + b"\r\n0\r\n\r\n",
        )
        assert answer.status == 201, answer.body
        assert answer.json()["task"]["gid"] == 8

    await _with_site(db_target, test, "--max-body", "2000")


@pytest_twisted.ensureDeferred
async def test_a_client_still_sending_a_large_body_gets_the_413(db_target):
    """treq streams a 5 MiB body; the site answers early, keeps reading and
    dropping for a moment (lingering close), so the client reads the 413
    instead of a connection reset."""

    async def test(site, path, token, port):
        pool = HTTPConnectionPool(reactor, persistent=False)
        try:
            response = await treq.post(
                f"{site.base_url}/api/tasks",
                data=b"x" * (5 * 1024 * 1024),
                headers={"Content-Type": ["application/json"]},
                pool=pool,
            )
            document = json.loads(await treq.content(response))
        finally:
            await pool.closeCachedConnections()
        assert response.code == 413
        assert document["error"]["code"] == "payload_too_large"

    await _with_site(db_target, test)


# -- timers on task.Clock ---------------------------------------------------------


def _clock_site() -> tuple[Clock, BoundedSite]:
    clock = Clock()
    root = Resource()
    root.putChild(b"hello", Data(b"hi", "text/plain"))
    return clock, BoundedSite(root, reactor=clock)


def _connect(site: BoundedSite) -> tuple[object, StringTransport]:
    channel = site.buildProtocol(None)
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport


def test_a_request_not_complete_within_30_s_is_closed_though_bytes_trickle_in():
    clock, site = _clock_site()
    channel, transport = _connect(site)
    # One header byte every 10 s resets twisted's idle timer each time; only
    # the request deadline catches this client.
    channel.dataReceived(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
    for _ in range(int(REQUEST_TIMEOUT // 10) - 1):
        clock.advance(10)
        channel.dataReceived(b"X")
        assert not transport.disconnecting
    clock.advance(REQUEST_TIMEOUT - (REQUEST_TIMEOUT // 10 - 1) * 10 - 0.5)
    assert not transport.disconnecting
    clock.advance(0.5)
    assert transport.disconnecting
    assert transport.value().startswith(b"HTTP/1.1 408 ")
    assert b'"request_timeout"' in transport.value()


def test_a_connection_that_sends_nothing_is_closed_at_the_request_deadline():
    clock, site = _clock_site()
    _, transport = _connect(site)
    clock.advance(REQUEST_TIMEOUT - 0.1)
    assert not transport.disconnecting
    clock.advance(0.1)
    assert transport.disconnecting


def test_an_idle_keep_alive_connection_is_closed_after_60_s():
    clock, site = _clock_site()
    channel, transport = _connect(site)
    channel.dataReceived(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 200 ")
    assert transport.value().endswith(b"hi")
    # Answered: the request deadline is off; the idle timer runs.
    clock.advance(IDLE_TIMEOUT - 1)
    assert not transport.disconnecting
    clock.advance(1)
    assert transport.disconnecting


def test_the_deadline_restarts_with_the_next_request_on_a_kept_connection():
    clock, site = _clock_site()
    channel, transport = _connect(site)
    channel.dataReceived(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    clock.advance(40)  # idle, under 60 s
    transport.clear()
    channel.dataReceived(b"GET /hello HTTP/1.1\r\n")  # starts the next request
    clock.advance(REQUEST_TIMEOUT - 0.1)
    assert not transport.disconnecting
    clock.advance(0.1)
    assert transport.disconnecting
    assert transport.value().startswith(b"HTTP/1.1 408 ")


@pytest_twisted.ensureDeferred
async def test_a_slow_client_over_tcp_gets_408_and_is_closed():
    root = Resource()
    root.putChild(b"hello", Data(b"hi", "text/plain"))
    site = BoundedSite(root, request_timeout=0.3, linger=0.2, reactor=reactor)
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    try:
        client = await connect(port.getHost().port)
        client.send(b"GET /hello HTTP/1.1\r\n")
        for _ in range(10):  # trickles for 1 s, never finishes the headers
            if client.closed.called:
                break
            client.send(b"X-Slow: 1\r\n")
            await deferLater(reactor, 0.1, lambda: None)
        await client.closed
        answer = await client.response()
        assert answer.status == 408
        assert answer.json()["error"]["code"] == "request_timeout"
    finally:
        await port.stopListening()


def test_max_body_option_defaults_to_1_mib_and_must_be_positive():
    from twisted.python.usage import UsageError

    assert site_options("x.sqlite", "http://127.0.0.1:1")["max-body"] == 1024 * 1024
    for bad in ("0", "-5", "lots"):
        try:
            site_options("x.sqlite", "http://127.0.0.1:1", "--max-body", bad)
        except UsageError:
            continue
        raise AssertionError(f"--max-body {bad} was accepted")


class _Args(Resource):
    isLeaf = True

    def render_POST(self, request):
        request.setHeader(b"content-type", b"application/json")
        args = {k.decode(): [v.decode() for v in vs] for k, vs in request.args.items()}
        return json.dumps({"args": args, "body": request.content.read().decode()}).encode()


@pytest_twisted.ensureDeferred
async def test_a_form_body_is_never_parsed_into_the_request_args():
    # request.args holds the query only: a form body's "token" is not a
    # credential (web/auth.py reads args for ?token=), and no body is parsed
    # before its endpoint reads it as JSON.
    site = BoundedSite(_Args(), reactor=reactor)
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    try:
        for content_type, body in (
            ("application/x-www-form-urlencoded", b"token=secret&x=1"),
            (
                "multipart/form-data; boundary=b",
                b'--b\r\nContent-Disposition: form-data; name="token"\r\n\r\nsecret\r\n--b--\r\n',
            ),
        ):
            answer, _ = await exchange(
                port.getHost().port,
                request_bytes("POST", "/echo?view=1", {"Content-Type": content_type}, body),
            )
            assert answer.status == 200
            assert answer.json() == {"args": {"view": ["1"]}, "body": body.decode()}
    finally:
        await port.stopListening()
