"""``--serve`` bounds: ``--serve-max`` concurrent transfers (past it ``503
busy``), a client that stalls mid-body dropped after the idle timeout, the
header deadline, the idle timeout between requests, no request body.  Real
sockets on loopback; every timer on the test's clock."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_twisted

from tests.eventually import eventually
from tests.node.test_serve_support import (
    Served,
    content_of,
    open_files_of,
    parse_answers,
    request_bytes,
    serving,
)

GID = 6060
#: Far more than a stalled reader's socket buffers hold.
SIZE = 8 * 1024 * 1024


@asynccontextmanager
async def stalled_readers(
    served: Served, count: int, target: str, *, receive_buffer: int | None = 4096
) -> AsyncIterator[list[socket.socket]]:
    """``count`` clients that ask for ``target`` and read nothing (a small
    receive buffer, so the server soon waits on each; None: the kernel's
    own), each one's transfer under way before the next connects; closed
    on exit."""
    sockets: list[socket.socket] = []
    try:
        for number in range(1, count + 1):
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(client)
            if receive_buffer is not None:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", served.port_number))
            await eventually(
                lambda c=client, r=request_bytes(target): _sent(c, r),  # type: ignore[misc]
                what="the request sent",
            )
            await eventually(
                lambda n=number: served.server.transfers == n,  # type: ignore[misc]
                what=f"transfer #{number}",
            )
        yield sockets
    finally:
        for client in sockets:
            client.close()


def _sent(client: socket.socket, request: bytes) -> bool:
    """Send ``request`` once the (non-blocking) connection is up."""
    try:
        client.send(request)  # a few hundred bytes: all or nothing
    except (BlockingIOError, OSError):
        return False
    return True


def drain(client: socket.socket, at_most: int = 256 * 1024) -> bytes:
    """Up to ``at_most`` bytes the kernel holds for ``client`` now."""
    try:
        return client.recv(at_most)
    except BlockingIOError:
        return b""


def closed_by_server(client: socket.socket) -> bool:
    try:
        while client.recv(1 << 20):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True  # EOF


@pytest_twisted.ensureDeferred
async def test_past_serve_max_transfers_a_request_is_503_busy(tmp_path: Path) -> None:
    async with serving(tmp_path, serve_max=64) as served:
        archive = await served.hold(GID, content_of(SIZE))
        path = served.data.archive_file(archive.row)
        link = served.link(GID)
        async with stalled_readers(served, 64, link.path) as held:
            assert len(held) == 64 and served.server.transfers == 64
            busy = await served.get(link.path)
            assert busy.status == 503
            assert busy.header("retry-after") == "1"
            assert json.loads(busy.body)["error"]["code"] == "busy"
            # HEAD sends no body: it takes no slot.
            assert (await served.get(link.path, method="HEAD")).status == 200
            health = json.loads((await served.get("/healthz")).body)
            assert (health["transfers"], health["serveMax"]) == (64, 64)
        # The 64 clients went away: every slot and every file let go.
        await eventually(lambda: served.server.transfers == 0, what="the slots freed")
        await eventually(lambda: open_files_of(path) == 0, what="the files closed")
        again = await served.get(link.path)
        assert (again.status, again.body == archive.content) == (200, True)
        assert served.server.completed == 1


def server_waits(served: Served) -> Callable[[], bool]:
    """A check that holds once the one transfer sends nothing more (no
    byte since the previous check: the client's buffers are full)."""
    last = [-1]

    def check() -> bool:
        sent = served.server.bytes_sent
        same, last[0] = sent == last[0], sent
        return same and sent > 0 and served.server.transfers == 1

    return check


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest_twisted.ensureDeferred
async def test_a_client_that_stalls_mid_body_is_dropped_and_its_slot_freed(
    tmp_path: Path, tls: bool
) -> None:
    async with serving(tmp_path, serve_max=1, idle_timeout=60.0, tls=tls) as served:
        archive = await served.hold(GID, content_of(8 * SIZE))
        path = served.data.archive_file(archive.row)
        target = served.link(GID).path
        client = await served.client(request_bytes(target), pause_at=1)
        await eventually(server_waits(served), what="the server waiting on the client")
        served.clock.advance(59)
        assert served.server.transfers == 1
        # Reading makes room: the server sends more (more than the buffers
        # on both sides hold), which feeds its timer.
        client.reading(True)
        await eventually(lambda: len(client.data) > 2 * SIZE, what="more bytes read")
        client.reading(False)
        served.clock.advance(59)
        assert served.server.transfers == 1
        assert (await served.get(target)).status == 503
        # Then nothing is read for 60 s: dropped.
        await eventually(server_waits(served), what="the server waiting again")
        served.clock.advance(60)
        assert served.server.transfers == 0
        client.reading(True)  # to see the connection go
        received = await client.closed
        assert len(received) < len(archive.content)
        await eventually(lambda: open_files_of(path) == 0, what="the file closed")
        answer = await served.get(target)
        assert answer.status == 200 and answer.body == archive.content
        row = await served.store.archive(GID, archive.operation_id)
        assert row is not None and served.server.completed == 1


@pytest_twisted.ensureDeferred
async def test_a_request_not_complete_within_the_header_timeout_is_closed(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, header_timeout=30.0, idle_timeout=60.0) as served:
        client = socket.create_connection(("127.0.0.1", served.port_number))
        try:
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no end
            client.setblocking(False)
            await eventually(lambda: served.server.connections == 1, what="the connection")
            served.clock.advance(29.5)
            assert served.server.connections == 1
            served.clock.advance(0.5)
            await eventually(lambda: served.server.connections == 0, what="the close")
            await eventually(lambda: closed_by_server(client), what="the client sees it")
        finally:
            client.close()


@pytest_twisted.ensureDeferred
async def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path) -> None:
    async with serving(tmp_path, header_timeout=30.0, idle_timeout=60.0) as served:
        protocol = await served.client(request_bytes("/healthz", close=False))
        await eventually(lambda: b"serveMax" in protocol.data, what="the answer")
        (answer,) = parse_answers(bytes(protocol.data))
        assert answer.status == 200
        served.clock.advance(59)
        assert served.server.connections == 1
        served.clock.advance(1)
        await protocol.closed
        await eventually(lambda: served.server.connections == 0, what="the close")


@pytest_twisted.ensureDeferred
async def test_a_request_body_is_not_accepted(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        await served.hold(GID, content_of(100))
        link = served.link(GID)
        request = request_bytes(link.path, headers={"Content-Length": "100000000"})
        protocol = await served.client(request)
        assert await protocol.closed == b""
        chunked = request_bytes(link.path, method="POST", headers={"Transfer-Encoding": "chunked"})
        protocol = await served.client(chunked + b"%x\r\n" % (64 * 1024) + b"x" * 64 * 1024)
        assert await protocol.closed == b""
        assert served.server.transfers == 0
