"""The site's stream of an archive from a node without a public URL, over
real loopback HTTP (DELIVERY.md, "Getting an archive (site)"): the real site
and a scripted node announcing a ``serveUrl`` where a small twisted.web
server of the test answers as a node's serve endpoint would (it checks
each link's signature under the node's link key and serves a file with
``Range``), or breaks, refuses, holds or pauses as each test needs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.web import server, static
from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyRequest
from zope.interface import implementer

from tasknet.protocol.archive_links import ArchiveLink, link_key, verify_link
from tasknet.site.web.archive_stream import ArchiveStreams
from tasknet.site.web.errors import ApiError
from tests.eventually import eventually
from tests.site.helpers import assert_error
from tests.site.test_archive_links import JSON, Fixture, with_fixture
from tests.site_protocol.harness import secret_of

CONTENT = bytes(range(256)) * 4096  # 1 MiB


@implementer(IPushProducer)
class Endless:
    """Writes ``total`` bytes in 64 KiB pieces while not paused (a node's
    body that honours back-pressure), recording what it wrote."""

    def __init__(self, request: server.Request, total: int) -> None:
        self.request = request
        self.total = total
        self.written = 0
        self.paused = False
        self.stopped = False

    def start(self) -> None:
        self.request.registerProducer(self, True)
        self._write()

    def _write(self) -> None:
        while not self.paused and not self.stopped and self.written < self.total:
            piece = min(65536, self.total - self.written)
            self.written += piece
            self.request.write(b"x" * piece)
        if self.written >= self.total and not self.stopped:
            self.stopped = True
            self.request.unregisterProducer()
            self.request.finish()

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        reactor.callLater(0, self._write)

    def stopProducing(self) -> None:
        self.stopped = True


class FakeServe(Resource):
    """``/archives/{gid}/{operationId}?exp&user&sig``: a node's endpoint as
    the test scripts it (``mode``)."""

    isLeaf = True

    def __init__(self, node_id: str, archive: Path) -> None:
        super().__init__()
        self.node_id = node_id
        self.archive = archive
        self.mode = "file"
        self.seen: list[tuple[str, dict[str, list[str]]]] = []
        self.open: list[server.Request] = []
        self.gone: list[server.Request] = []
        self.producers: list[Endless] = []

    def render(self, request: server.Request) -> Any:
        path = request.path.decode()
        query = {k.decode(): [v.decode() for v in vs] for k, vs in request.args.items()}
        self.seen.append((path, query))
        _, _, gid, operation_id = path.split("/")
        key = link_key(secret_of(self.node_id))
        signed = verify_link(
            key,
            int(gid),
            operation_id,
            int(query["exp"][0]),
            int(query["user"][0]),
            query["sig"][0],
        )
        request.notifyFinish().addErrback(lambda _: self.gone.append(request))
        if not signed or self.mode == "refuse":
            request.setResponseCode(403)
            request.setHeader(b"content-type", b"application/json")
            return b'{"error": {"code": "link_invalid"}}'
        if self.mode == "busy":
            request.setResponseCode(503)
            request.setHeader(b"retry-after", b"7")
            return b'{"error": {"code": "busy"}}'
        if self.mode == "hold":
            request.setHeader(b"content-length", b"100")
            request.write(b"x" * 10)
            self.open.append(request)
            return server.NOT_DONE_YET
        if self.mode == "endless":
            request.setHeader(b"content-type", b"application/zip")
            request.setHeader(b"content-length", str(256 * 1024 * 1024).encode())
            producer = Endless(request, 256 * 1024 * 1024)
            self.producers.append(producer)
            producer.start()
            return server.NOT_DONE_YET
        if self.mode == "break":
            request.setHeader(b"content-length", str(len(CONTENT)).encode())
            request.write(CONTENT[:1000])
            request.transport.loseConnection()  # type: ignore[union-attr]
            return server.NOT_DONE_YET
        file = static.File(str(self.archive), defaultType="application/zip")
        request.setHeader(
            b"etag", b'"sha256-' + hashlib.sha256(CONTENT).hexdigest().encode() + b'"'
        )
        request.setHeader(
            b"content-disposition", b"attachment; filename=\"a.zip\"; filename*=UTF-8''a.zip"
        )
        return file.render(request)


async def serve_fake(tmp_path: Path) -> tuple[FakeServe, Any]:
    archive = tmp_path / "archive.zip"
    archive.write_bytes(CONTENT)
    resource = FakeServe("n1", archive)
    site = server.Site(resource)
    site.noisy = False
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    return resource, port


def _headers(headers: Any, name: str) -> str | None:
    values = headers.getRawHeaders(name.encode())
    return values[0].decode() if values else None


async def _stream_fixture(tmp_path: Path, db_target: str, test: Any, *extra: str) -> None:
    fake, port = await serve_fake(tmp_path)
    serve_url = f"http://127.0.0.1:{port.getHost().port}/"

    async def run(f: Fixture) -> None:
        node = await f.connect("n1", serve_url=serve_url)
        await f.completed(node, 501, name="Streamed")
        await test(f, fake)

    try:
        await with_fixture(db_target, run, *extra)
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_whole_ranged_conditional_and_head_through_the_site(
    tmp_path: Path, db_target: str
) -> None:
    async def test(f: Fixture, fake: FakeServe) -> None:
        before = await f.metric("tasknet_archive_stream_bytes_total")
        links = await f.metric("tasknet_archive_links_total", via="site")
        status, headers, body = await f.http("GET", "/api/tasks/501/archive", f.alice)
        assert status == 200 and body == CONTENT
        assert _headers(headers, "content-type") == "application/zip"
        assert _headers(headers, "accept-ranges") == "bytes"
        etag = _headers(headers, "etag")
        assert etag == f'"sha256-{hashlib.sha256(CONTENT).hexdigest()}"'
        assert _headers(headers, "content-disposition").startswith("attachment;")
        assert _headers(headers, "last-modified")
        # The node saw a link signed for alice (FakeServe checked the signature).
        assert fake.seen[-1][1]["user"] == [str(f.user_id("alice"))]
        assert await f.metric("tasknet_archive_stream_bytes_total") == before + len(CONTENT)
        assert await f.metric("tasknet_archive_links_total", via="site") == links + 1

        # Resumed from a byte offset: 206 with the rest.
        status, headers, body = await f.http(
            "GET", "/api/tasks/501/archive", f.alice, {"Range": ["bytes=1000-"]}
        )
        assert status == 206 and body == CONTENT[1000:]
        assert _headers(headers, "content-range") == f"bytes 1000-{len(CONTENT) - 1}/{len(CONTENT)}"
        # Past the end: 416 with bytes */SIZE.
        status, headers, _ = await f.http(
            "GET", "/api/tasks/501/archive", f.alice, {"Range": [f"bytes={len(CONTENT) + 5}-"]}
        )
        assert status == 416 and _headers(headers, "content-range") == f"bytes */{len(CONTENT)}"
        # HEAD: the headers only.
        status, headers, body = await f.http("HEAD", "/api/tasks/501/archive", f.alice)
        assert status == 200 and body == b""
        assert _headers(headers, "content-length") == str(len(CONTENT))
        # The JSON form names the site's own URL.
        status, _, link = await f.http("GET", "/api/tasks/501/archive", f.alice, JSON)
        assert status == 200 and link["via"] == "site"
        assert link["url"] == f"{f.site.base_url}/api/tasks/501/archive"
        # Range, If-Range and If-None-Match reach the node.
        await f.http(
            "GET",
            "/api/tasks/501/archive",
            f.alice,
            {"Range": ["bytes=0-9"], "If-Range": [etag], "If-None-Match": ['"other"']},
        )
        assert f.site.site.web.archives.streams.active() == 0

    await _stream_fixture(tmp_path, db_target, test)


@pytest_twisted.ensureDeferred
async def test_node_failures_are_clear_errors(tmp_path: Path, db_target: str) -> None:
    async def test(f: Fixture, fake: FakeServe) -> None:
        fake.mode = "refuse"
        status, _, answer = await f.http("GET", "/api/tasks/501/archive", f.alice)
        assert_error((status, answer), 502, "node_error")
        assert "403" in answer["error"]["message"] and "link_invalid" in answer["error"]["message"]
        fake.mode = "busy"
        status, headers, answer = await f.http("GET", "/api/tasks/501/archive", f.alice)
        assert_error((status, answer), 503, "node_busy")
        assert _headers(headers, "retry-after") == "7"
        # Broken off after the headers: the client's connection ends short.
        fake.mode = "break"
        failure = None
        try:
            await f.http("GET", "/api/tasks/501/archive", f.alice)
        except Exception as e:  # treq: the body ended before Content-Length
            failure = e
        assert failure is not None
        assert f.site.site.web.archives.streams.active() == 0

    await _stream_fixture(tmp_path, db_target, test)


@pytest_twisted.ensureDeferred
async def test_an_unreachable_node_is_502_with_retry_after(tmp_path: Path, db_target: str) -> None:
    # A port nothing listens on (taken, then closed).
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        server.Site(Resource())
    )
    closed = port.getHost().port
    await port.stopListening()

    async def test(f: Fixture) -> None:
        node = await f.connect("n1", serve_url=f"http://127.0.0.1:{closed}/")
        await f.completed(node, 502)
        status, headers, answer = await f.http("GET", "/api/tasks/502/archive", f.alice)
        assert_error((status, answer), 502, "node_unreachable")
        assert int(_headers(headers, "retry-after") or 0) > 0

    await with_fixture(db_target, test)


class Reader(Protocol):
    """A raw HTTP client that can stop reading (its transport paused)."""

    def __init__(self) -> None:
        self.received = 0
        self.data = b""
        self.lost: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += len(data)
        if len(self.data) < 4096:
            self.data += data[:4096]

    def connectionLost(self, reason: Any = None) -> None:
        self.lost.callback(None)


async def _raw_get(f: Fixture, path: str) -> Reader:
    host, port = f.site.base_url.removeprefix("http://").split(":")
    reader = Reader()
    await connectProtocol(TCP4ClientEndpoint(reactor, host, int(port)), reader)
    reader.transport.write(  # type: ignore[union-attr]
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {f.alice}\r\n\r\n".encode()
    )
    return reader


@pytest_twisted.ensureDeferred
async def test_back_pressure_and_a_client_going_away(tmp_path: Path, db_target: str) -> None:
    async def test(f: Fixture, fake: FakeServe) -> None:
        fake.mode = "endless"
        reader = await _raw_get(f, "/api/tasks/501/archive")
        await eventually(lambda: reader.received > 0)
        reader.transport.pauseProducing()  # type: ignore[union-attr]
        (producer,) = await eventually(lambda: fake.producers)
        # The client reads nothing more: the node is paused, the site holds
        # at most what the sockets' buffers do, not the archive.
        await eventually(lambda: producer.paused, what="the node's body paused")
        assert producer.written < 64 * 1024 * 1024
        assert b"HTTP/1.1 200" in reader.data
        # The client reads again, then goes away: the node's transfer is closed.
        reader.transport.resumeProducing()  # type: ignore[union-attr]
        await eventually(lambda: reader.received > 16 * 1024 * 1024)
        reader.transport.abortConnection()  # type: ignore[union-attr]
        await reader.lost
        await eventually(lambda: producer.stopped and fake.gone, what="the node's transfer closed")
        await eventually(lambda: f.site.site.web.archives.streams.active() == 0)

    await _stream_fixture(tmp_path, db_target, test)


@pytest_twisted.ensureDeferred
async def test_streams_per_user_are_bounded(tmp_path: Path, db_target: str) -> None:
    async def test(f: Fixture, fake: FakeServe) -> None:
        fake.mode = "hold"
        first = await _raw_get(f, "/api/tasks/501/archive")
        second = await _raw_get(f, "/api/tasks/501/archive")
        await eventually(lambda: len(fake.open) == 2)
        assert await f.metric("tasknet_archive_streams") == 2
        status, headers, answer = await f.http("GET", "/api/tasks/501/archive", f.alice)
        assert_error((status, answer), 429, "too_many_streams")
        assert _headers(headers, "retry-after")
        # Links as JSON are not streams; another user (the admin) has streams of their own.
        assert (await f.http("GET", "/api/tasks/501/archive", f.alice, JSON))[0] == 200
        fake.mode = "file"
        status, _, body = await f.http("GET", "/api/tasks/501/archive", f.admin)
        assert status == 200 and body == CONTENT
        # One ends: alice may stream again.
        first.transport.abortConnection()  # type: ignore[union-attr]
        await first.lost
        await eventually(lambda: f.site.site.web.archives.streams.active() == 1)
        status, _, body = await f.http("GET", "/api/tasks/501/archive", f.alice)
        assert status == 200 and body == CONTENT
        for request in fake.open:
            if not request.finished and request not in fake.gone:
                request.write(b"y" * 90)
                request.finish()
        await eventually(lambda: second.received >= 100)
        second.transport.loseConnection()  # type: ignore[union-attr]
        await second.lost

    await _stream_fixture(tmp_path, db_target, test, "--archive-streams-per-user", "2")


class Silent(Protocol):
    """A node's serve endpoint that accepts and never answers."""

    connected: list[Silent] = []

    def connectionMade(self) -> None:
        Silent.connected.append(self)


@pytest_twisted.ensureDeferred
async def test_a_node_that_never_answers_is_502_at_the_headers_timeout() -> None:
    factory = Factory.forProtocol(Silent)
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    clock = Clock()
    streams = ArchiveStreams(reactor, clock, per_user=1, headers_timeout=30.0)
    request = DummyRequest([b"archives"])
    url = f"http://127.0.0.1:{port.getHost().port}/archives/1/op?exp=1&user=1&sig=x"
    try:
        relayed = Deferred.fromCoroutine(streams.relay(request, url))
        await eventually(lambda: Silent.connected)
        clock.advance(29.0)
        assert not relayed.called
        clock.advance(1.0)
        with pytest.raises(ApiError) as refused:
            await relayed
        assert refused.value.code == "node_unreachable" and refused.value.retry_after
        assert not request.written  # nothing went to the client
    finally:
        for protocol in Silent.connected:
            protocol.transport.loseConnection()  # type: ignore[union-attr]
        Silent.connected.clear()
        await port.stopListening()


def test_the_streams_per_user_bound() -> None:
    streams = ArchiveStreams(reactor, Clock(), per_user=2)
    with streams.slot(1), streams.slot(1):
        with pytest.raises(ApiError) as refused, streams.slot(1):
            pass
        assert refused.value.code == "too_many_streams"
        with streams.slot(2):  # another user's own
            assert streams.active(1) == 2 and streams.active() == 3
    assert streams.active() == 0


class Relaying(Resource):
    """A site of the test's own: every GET relays ``url`` through ``streams``."""

    isLeaf = True

    def __init__(self, streams: ArchiveStreams, url: str) -> None:
        super().__init__()
        self.streams = streams
        self.url = url

    def render_GET(self, request: server.Request) -> Any:
        relayed = Deferred.fromCoroutine(self.streams.relay(request, self.url))
        relayed.addCallbacks(lambda _: request.finish(), lambda _: None)
        return server.NOT_DONE_YET


@pytest_twisted.ensureDeferred
async def test_a_node_that_stalls_mid_body_is_cut_at_the_idle_timeout(tmp_path: Path) -> None:
    fake, node_port = await serve_fake(tmp_path)
    fake.mode = "hold"  # 10 of 100 bytes, then nothing
    clock = Clock()
    streams = ArchiveStreams(reactor, clock, per_user=1, body_idle_timeout=60.0)
    signed = ArchiveLink.sign(link_key(secret_of("n1")), 1, "op", 1, 1)
    url = signed.url(f"http://127.0.0.1:{node_port.getHost().port}/")
    site = server.Site(Relaying(streams, url))
    site.noisy = False
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    try:
        reader = Reader()
        where = TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port)
        await connectProtocol(where, reader)
        reader.transport.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # type: ignore[union-attr]
        await eventually(lambda: reader.data.endswith(b"x" * 10))
        clock.advance(40.0)
        fake.open[0].write(b"z" * 10)  # the node sends a little more
        await eventually(lambda: reader.data.endswith(b"z" * 10))
        clock.advance(40.0)  # 80 s since the start, 40 since the last bytes
        assert not reader.lost.called
        clock.advance(20.0)
        await reader.lost  # cut short: 20 of the 100 bytes Content-Length promised
        assert b"Content-Length: 100" in reader.data
        await eventually(lambda: fake.gone, what="the node's transfer closed")
    finally:
        await port.stopListening()
        await node_port.stopListening()
