"""The site's archive stream moves the body in the kernel (os.splice through
a pipe) when both sockets are plain TCP, over real loopback: whole files and
ranges hash right, the headers go out before a body the node sends later,
a client going away closes the node's transfer and frees
the slot, a node stopping mid-body cuts the client short, and under TLS the
relay through Python still serves (no splice)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import (
    TCP4ClientEndpoint,
    TCP4ServerEndpoint,
    connectProtocol,
    serverFromString,
    wrapClientTLS,
)
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.web import server
from twisted.web.resource import Resource

from tasknet.protocol.archive_links import ArchiveLink, link_key
from tasknet.site.web import splice
from tasknet.site.web.archive_stream import ArchiveStreams
from tests.eventually import eventually
from tests.site.test_archive_stream import CONTENT, serve_fake
from tests.site_protocol.harness import secret_of
from tests.tls_certs import make_ca, make_site_cert

USER = 1


@pytest.fixture
def splice_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes moved by each ``os.splice`` call of the splicer (the real call):
    each body byte twice, into the pipe and out of it."""
    calls: list[int] = []
    real: Callable[..., int] = os.splice

    def counted(src: int, dst: int, count: int, *args: Any, **kwargs: Any) -> int:
        moved = real(src, dst, count, *args, **kwargs)
        calls.append(moved)
        return moved

    monkeypatch.setattr(splice.os, "splice", counted)
    return calls


class Relaying(Resource):
    """The site's part in miniature: a slot, then the relay of one link."""

    isLeaf = True

    def __init__(self, streams: ArchiveStreams, url: str) -> None:
        super().__init__()
        self.streams = streams
        self.url = url

    def render_GET(self, request: server.Request) -> Any:
        async def answer() -> None:
            with self.streams.slot(USER):
                await self.streams.relay(request, self.url)

        relayed = Deferred.fromCoroutine(answer())
        relayed.addCallbacks(lambda _: request.finish(), lambda _: None)
        return server.NOT_DONE_YET


class Whole(Protocol):
    """A raw HTTP client: everything received until the connection closes;
    it may stop after ``read_at_most`` bytes (then it aborts)."""

    def __init__(self, read_at_most: int | None = None) -> None:
        self.data = bytearray()
        self.read_at_most = read_at_most
        self.lost: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if self.read_at_most is not None and len(self.data) >= self.read_at_most:
            self.transport.abortConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: Any = None) -> None:
        self.lost.callback(None)

    def answer(self) -> tuple[bytes, bytes]:
        head, _, body = bytes(self.data).partition(b"\r\n\r\n")
        return head, body


class Running:
    def __init__(self, streams: ArchiveStreams, fake: Any, port: Any, tls: Any) -> None:
        self.streams = streams
        self.fake = fake
        self.port = port
        self.tls = tls

    async def get(self, headers: str = "", read_at_most: int | None = None) -> Whole:
        whole = Whole(read_at_most)
        endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port)
        if self.tls is not None:
            endpoint = wrapClientTLS(self.tls, endpoint)
        await connectProtocol(endpoint, whole)
        whole.transport.write(  # type: ignore[union-attr]
            f"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode()
        )
        return whole


async def _running(tmp_path: Path, test: Any, *, tls: bool = False) -> None:
    fake, node_port = await serve_fake(tmp_path)
    streams = ArchiveStreams(reactor, reactor, per_user=2)
    signed = ArchiveLink.sign(link_key(secret_of("n1")), 1, "op", 2**40, USER)
    url = signed.url(f"http://127.0.0.1:{node_port.getHost().port}/")
    site = server.Site(Relaying(streams, url))
    site.noisy = False
    description = "tcp:0:interface=127.0.0.1"
    client_tls = None
    if tls:
        ca, ca_key = make_ca(tmp_path / "ca", "splice test CA")
        key, cert = make_site_cert(tmp_path, ca, ca_key)
        description = f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
        authority = Certificate.loadPEM((tmp_path / "ca" / "ca.pem").read_bytes())
        client_tls = optionsForClientTLS("localhost", trustRoot=authority)
    port = await serverFromString(reactor, description).listen(site)
    try:
        await test(Running(streams, fake, port, client_tls))
    finally:
        await port.stopListening()
        await node_port.stopListening()


@pytest_twisted.ensureDeferred
async def test_whole_files_and_ranges_go_through_the_kernel(
    tmp_path: Path, splice_calls: list[int]
) -> None:
    async def test(run: Running) -> None:
        whole = await run.get()
        await whole.lost
        head, body = whole.answer()
        assert head.startswith(b"HTTP/1.1 200")
        assert hashlib.sha256(body).hexdigest() == hashlib.sha256(CONTENT).hexdigest()
        for first, last in ((1000, len(CONTENT) - 1), (7, 700_006), (5, 5)):
            part = await run.get(f"Range: bytes={first}-{last}\r\n")
            await part.lost
            head, body = part.answer()
            assert head.startswith(b"HTTP/1.1 206"), head
            assert body == CONTENT[first : last + 1], (first, last)
        assert sum(splice_calls) > 0  # the kernel moved body bytes
        await eventually(lambda: run.streams.active() == 0, what="the slots freed")

    await _running(tmp_path, test)


@pytest_twisted.ensureDeferred
async def test_a_client_gone_mid_body_closes_the_node_transfer(
    tmp_path: Path, splice_calls: list[int]
) -> None:
    async def test(run: Running) -> None:
        run.fake.mode = "endless"  # 256 MiB
        gone = await run.get(read_at_most=16 * 1024 * 1024)
        await gone.lost
        assert sum(splice_calls) > 4 * 1024 * 1024
        (producer,) = run.fake.producers
        await eventually(lambda: producer.stopped and run.fake.gone, what="the node's closed")
        await eventually(lambda: run.streams.active() == 0, what="the slot freed")
        assert producer.written < 256 * 1024 * 1024

    await _running(tmp_path, test)


@pytest_twisted.ensureDeferred
async def test_a_node_stopping_mid_body_cuts_the_client_short(
    tmp_path: Path, splice_calls: list[int]
) -> None:
    async def test(run: Running) -> None:
        run.fake.mode = "hold"  # 10 of 100 bytes, then what the test writes
        client = await run.get()
        await eventually(lambda: client.data.endswith(b"x" * 10))
        (held,) = run.fake.open
        held.write(b"z" * 30)
        await eventually(lambda: client.data.endswith(b"z" * 30))
        assert sum(splice_calls) >= 30  # after the take-over, by the kernel
        held.transport.loseConnection()  # the node stops mid-body
        await client.lost
        head, body = client.answer()
        assert b"Content-Length: 100" in head
        assert body == b"x" * 10 + b"z" * 30  # short: never taken for the whole file
        await eventually(lambda: run.streams.active() == 0, what="the slot freed")

    await _running(tmp_path, test)


@pytest_twisted.ensureDeferred
async def test_under_tls_the_relay_serves_without_splice(
    tmp_path: Path, splice_calls: list[int]
) -> None:
    async def test(run: Running) -> None:
        whole = await run.get()
        await whole.lost
        head, body = whole.answer()
        assert head.startswith(b"HTTP/1.1 200")
        assert body == CONTENT
        part = await run.get("Range: bytes=1000-\r\n")
        await part.lost
        assert part.answer()[1] == CONTENT[1000:]
        assert splice_calls == []
        await eventually(lambda: run.streams.active() == 0, what="the slots freed")

    await _running(tmp_path, test, tls=True)


class HeadersFirst(Protocol):
    """A scripted node: on the request, headers only; the body when told."""

    answering: list[HeadersFirst] = []

    def dataReceived(self, data: bytes) -> None:
        if b"\r\n\r\n" in data and self not in self.answering:
            self.transport.write(  # type: ignore[union-attr]
                b"HTTP/1.1 200 OK\r\nContent-Length: 65536\r\nContent-Type: application/zip\r\n\r\n"
            )
            self.answering.append(self)


@pytest_twisted.ensureDeferred
async def test_headers_go_out_before_a_body_that_comes_later(
    tmp_path: Path, splice_calls: list[int]
) -> None:
    node_port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        Factory.forProtocol(HeadersFirst)
    )
    HeadersFirst.answering = []
    streams = ArchiveStreams(reactor, reactor, per_user=1)
    site = server.Site(Relaying(streams, f"http://127.0.0.1:{node_port.getHost().port}/a"))
    site.noisy = False
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    try:
        run = Running(streams, None, port, None)
        client = await run.get()
        # The node sent its headers only: the client has them, and nothing else.
        await eventually(lambda: bytes(client.data).endswith(b"\r\n\r\n"), what="the headers")
        assert client.data.startswith(b"HTTP/1.1 200")
        (node,) = HeadersFirst.answering
        body = os.urandom(65536)
        node.transport.write(body)  # type: ignore[union-attr]
        await client.lost
        assert client.answer()[1] == body
        assert sum(splice_calls) == 2 * 65536  # into the pipe, then out of it
        await eventually(lambda: streams.active() == 0, what="the slot freed")
    finally:
        await port.stopListening()
        await node_port.stopListening()
