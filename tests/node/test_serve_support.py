"""What the ``--serve`` tests share: a real node store with archives in it,
the endpoint listening on loopback (TCP or TLS) on a clock the test turns,
and a raw HTTP/1.1 client (so a test says exactly what goes on the wire:
``..``, ``%2f``, odd methods, several requests on one connection).

No tests here: ``test_serve.py``, ``test_serve_bounds.py`` and
``test_sendfile.py`` use it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, serverFromString
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from tasknet.node.paths import DataDir
from tasknet.node.serve import ArchiveServer
from tasknet.node.store import ArchiveRow, NodeStore
from tasknet.protocol.archive_links import ArchiveLink, link_key
from tasknet.runtime import RealThreadPools
from tests.tls_certs import make_ca, make_site_cert

SECRET = "serve-test-secret"
#: The test clock's "now" (Unix seconds) when a server starts.
NOW = 1_900_000_000
USER = 7


@dataclass
class Answer:
    """One HTTP response as it came over the wire."""

    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def parse_answers(data: bytes, *, head: bool = False) -> list[Answer]:
    """The responses in ``data`` (each framed by its Content-Length)."""
    answers = []
    while data:
        top, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"no end of headers in {data[:200]!r}"
        lines = top.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if head or status == 304 else int(headers.get("content-length", len(rest)))
        answers.append(Answer(status, headers, rest[:length]))
        data = rest[length:]
    return answers


class RawClient(Protocol):
    """Writes ``request`` bytes, keeps every byte received until the close."""

    def __init__(
        self, request: bytes, *, read_at_most: int | None = None, pause_at: int | None = None
    ) -> None:
        self.request = request
        self.data = bytearray()
        self.read_at_most = read_at_most
        #: Stop reading once this many bytes came (``reading(True)`` goes on).
        self.pause_at = pause_at
        self.closed: Deferred[bytes] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if self.read_at_most is not None and len(self.data) >= self.read_at_most:
            assert self.transport is not None
            self.transport.abortConnection()  # a client that goes away mid-body
        if self.pause_at is not None and len(self.data) >= self.pause_at:
            self.reading(False)

    def reading(self, on: bool) -> None:
        """Read (or stop reading: a client that stalls)."""
        transport: Any = self.transport
        if on:
            self.pause_at = None
            transport.resumeProducing()
        else:
            transport.pauseProducing()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closed.callback(bytes(self.data))


def request_bytes(
    target: bytes | str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    close: bool = True,
) -> bytes:
    if isinstance(target, str):
        target = target.encode("ascii")
    lines = [method.encode("ascii") + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}".encode("latin-1"))
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class Archive:
    gid: int
    operation_id: str
    content: bytes
    row: ArchiveRow

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass
class Served:
    """A running endpoint and what a test needs around it."""

    server: ArchiveServer
    port: Any
    store: NodeStore
    data: DataDir
    clock: Clock
    tls: Any = None  # client TLS options when serving ssl:
    archives: dict[int, Archive] = field(default_factory=dict)

    @property
    def port_number(self) -> int:
        return int(self.port.getHost().port)

    def link(
        self, gid: int, operation_id: str | None = None, *, user: int = USER, exp: int | None = None
    ) -> ArchiveLink:
        if operation_id is None:
            operation_id = self.archives[gid].operation_id
        exp = NOW + 600 if exp is None else exp
        return ArchiveLink.sign(link_key(SECRET), gid, operation_id, exp, user)

    def client(self, request: bytes, **kwargs: Any) -> Deferred[Any]:
        endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port_number)
        if self.tls is not None:
            from twisted.internet.endpoints import wrapClientTLS

            endpoint = wrapClientTLS(self.tls, endpoint)
        protocol = RawClient(request, **kwargs)
        return connectProtocol(endpoint, protocol).addCallback(lambda _: protocol)

    async def exchange(self, request: bytes, *, head: bool = False) -> list[Answer]:
        """Send ``request`` (one or more requests) and read until the close."""
        protocol = await self.client(request)
        return parse_answers(await protocol.closed, head=head)

    async def get(
        self,
        target: bytes | str,
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
    ) -> Answer:
        request = request_bytes(target, method=method, headers=headers)
        (answer,) = await self.exchange(request, head=method == "HEAD")
        return answer

    async def hold(
        self,
        gid: int,
        content: bytes,
        *,
        name: str = "",
        operation_id: str = "",
        sha256: str | None = None,
    ) -> Archive:
        """An archive completed in the store, its file on disk."""
        operation_id = operation_id or f"op-{gid}"
        await self.store.accept_download(
            gid,
            operation_id,
            name or f"gallery {gid}",
            "http://upstream.invalid/f",
            2,
            size=len(content),
        )
        path = self.data.archive_path(gid, operation_id)
        path.write_bytes(content)
        digest = hashlib.sha256(content).hexdigest() if sha256 is None else sha256
        assert await self.store.complete(
            gid, operation_id, path.name, size=len(content), sha256=digest
        )
        row = await self.store.archive(gid, operation_id)
        assert row is not None
        archive = self.archives[gid] = Archive(gid, operation_id, content, row)
        return archive


def content_of(size: int, seed: int = 1) -> bytes:
    """``size`` bytes that differ at every offset of interest (not all zeros)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def open_files_of(path: Path) -> int:
    """How many descriptors of this process have ``path`` open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            continue
    return count


@asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    serve_max: int = 64,
    idle_timeout: float = 60.0,
    header_timeout: float = 30.0,
    secret: str = SECRET,
    tls: bool = False,
) -> AsyncIterator[Served]:
    """The endpoint on loopback over a real store in ``tmp_path``; the
    clock starts at :data:`NOW`."""
    clock = Clock()
    clock.advance(NOW)
    data = DataDir(tmp_path / "node")
    store = NodeStore(data, reactor=reactor, clock=clock, threads=RealThreadPools())
    await store.create_schema()
    server = ArchiveServer(
        store,
        data,
        secret,
        clock=clock,
        serve_max=serve_max,
        idle_timeout=idle_timeout,
        header_timeout=header_timeout,
    )
    description = "tcp:0:interface=127.0.0.1"
    client_tls = None
    if tls:
        ca, ca_key = make_ca(tmp_path / "ca", "serve test CA")
        key, cert = make_site_cert(tmp_path, ca, ca_key)
        description = f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
        authority = Certificate.loadPEM((tmp_path / "ca" / "ca.pem").read_bytes())
        client_tls = optionsForClientTLS("localhost", trustRoot=authority)
    port = await serverFromString(reactor, description).listen(server.site())
    try:
        yield Served(server, port, store, data, clock, client_tls)
    finally:
        await port.stopListening()
        store.close()
