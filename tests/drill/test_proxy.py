"""The fault proxy, each fault against real loopback TCP peers."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from tasknet.drill.proxy import HEADER, TO_CLIENT, TO_SERVER, FaultProxy, FrameSplitter
from tests.eventually import eventually


def frame(type_: int, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return HEADER.pack(type_, len(body)) + body


class Peer(protocol.Protocol):
    """Records every byte it receives and when its connection ends."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.lost: defer.Deferred[None] = defer.Deferred()
        self.is_lost = False

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.is_lost = True
        self.lost.callback(None)

    def send(self, data: bytes) -> None:
        self._t.write(data)

    def abort(self) -> None:
        self._t.abortConnection()

    @property
    def _t(self) -> Any:  # a TCP transport: more than ITransport declares
        return self.transport

    def types(self) -> list[int]:
        return [t for t, _ in FrameSplitter().feed(bytes(self.received))]


class PeerFactory(protocol.ServerFactory):
    def __init__(self) -> None:
        self.peers: list[Peer] = []

    def buildProtocol(self, addr: Any) -> Peer:
        peer = Peer()
        self.peers.append(peer)
        return peer


class Rig:
    """A server peer, the proxy in front of it, and helpers to dial through it."""

    def __init__(self) -> None:
        self.servers = PeerFactory()
        self.listening: Any = cast(Any, reactor).listenTCP(0, self.servers, interface="127.0.0.1")
        self.proxy = FaultProxy("127.0.0.1", self.listening.getHost().port, reactor=reactor)
        self.proxy.start()
        self.clients: list[Peer] = []

    async def dial(self) -> tuple[Peer, Peer]:
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.proxy.port)
        client = await connectProtocol(endpoint, Peer())
        self.clients.append(client)
        n = len(self.servers.peers)
        await eventually(lambda: len(self.servers.peers) > n)
        return client, self.servers.peers[-1]

    async def close(self) -> None:
        await self.proxy.stop()
        for peer in self.clients + self.servers.peers:
            if not peer.is_lost:
                peer.abort()
                await peer.lost
        await self.listening.stopListening()


@pytest_twisted.async_yield_fixture
async def rig() -> AsyncIterator[Rig]:
    r = Rig()
    yield r
    await r.close()


def test_splitter_is_incremental() -> None:
    data = frame(3, {"time": 1}) + frame(12, {"reportId": "r"}) + frame(13, {})
    splitter = FrameSplitter()
    out = []
    for i in range(len(data)):
        out += splitter.feed(data[i : i + 1])
    assert [t for t, _ in out] == [3, 12, 13]
    assert b"".join(f for _, f in out) == data
    assert splitter.pending == 0


@pytest_twisted.ensureDeferred
async def test_pass_through_counts_frames_both_ways(rig: Rig) -> None:
    client, server = await rig.dial()
    client.send(frame(1, {"nodeId": "n"}) + frame(12, {"reportId": "a"}))
    server.send(frame(0, {"name": "s"}) + frame(13, {"reportId": "a"}))
    await eventually(lambda: server.types() == [1, 12] and client.types() == [0, 13])
    stats = rig.proxy.stats()
    assert stats["forwarded"] == {
        "to_client:0": 1,
        "to_client:13": 1,
        "to_server:1": 1,
        "to_server:12": 1,
    }
    reports = rig.proxy.frames(12, TO_SERVER)
    assert [r.payload for r in reports] == [{"reportId": "a"}]


@pytest_twisted.ensureDeferred
async def test_delay_holds_frames_and_keeps_order(rig: Rig) -> None:
    client, server = await rig.dial()
    rig.proxy.delay(300)
    started = time.monotonic()
    for i in range(5):
        client.send(frame(3, {"time": i}))
    await eventually(lambda: len(server.types()) == 5)
    assert time.monotonic() - started >= 0.29
    times = [json.loads(f[5:])["time"] for _, f in FrameSplitter().feed(bytes(server.received))]
    assert times == [0, 1, 2, 3, 4]
    rig.proxy.heal()
    started = time.monotonic()
    client.send(frame(3, {"time": 9}))
    await eventually(lambda: len(server.types()) == 6)
    assert time.monotonic() - started < 0.25


@pytest_twisted.ensureDeferred
async def test_drop_removes_whole_frames_of_one_type_and_direction(rig: Rig) -> None:
    client, server = await rig.dial()
    rig.proxy.drop(13, TO_CLIENT, count=1)
    server.send(frame(3, {}) + frame(13, {"reportId": "x"}) + frame(13, {"reportId": "y"}))
    client.send(frame(13, {"reportId": "up"}))  # other direction: untouched
    await eventually(lambda: client.types() == [3, 13] and server.types() == [13])
    got = FrameSplitter().feed(bytes(client.received))[1][1]
    assert json.loads(got[5:]) == {"reportId": "y"}
    assert rig.proxy.stats()["dropped"] == {"to_client:13": 1}
    assert [r.action for r in rig.proxy.frames(13, TO_CLIENT)] == ["dropped", "forwarded"]


@pytest_twisted.ensureDeferred
async def test_drop_without_count_holds_until_heal(rig: Rig) -> None:
    client, server = await rig.dial()
    rig.proxy.drop(12, TO_SERVER)
    client.send(frame(12, {}) + frame(12, {}) + frame(3, {}))
    await eventually(lambda: server.types() == [3])
    rig.proxy.heal()
    client.send(frame(12, {}))
    await eventually(lambda: server.types() == [3, 12])
    assert rig.proxy.dropped[(TO_SERVER, 12)] == 2


@pytest_twisted.ensureDeferred
async def test_cut_after_n_bytes_of_a_frame_type(rig: Rig) -> None:
    client, server = await rig.dial()
    first = frame(3, {"time": 1})
    report = frame(12, {"reportId": "r" * 50})
    rig.proxy.cut_after(20, TO_SERVER, msg_type=12)
    client.send(first + report)
    await server.lost
    await client.lost
    assert bytes(server.received) == first + report[:20]
    assert rig.proxy.stats()["cuts"] == 1
    # The rule fired once: the next connection passes whole reports.
    client2, server2 = await rig.dial()
    client2.send(report)
    await eventually(lambda: bytes(server2.received) == report)


@pytest_twisted.ensureDeferred
async def test_drop_and_cut_can_match_the_payload(rig: Rig) -> None:
    client, server = await rig.dial()
    rig.proxy.drop(13, TO_CLIENT, count=1, match=lambda p: p.get("reportId") == "b")
    server.send(frame(13, {"reportId": "a"}) + frame(13, {"reportId": "b"}))
    server.send(frame(13, {"reportId": "b"}))
    await eventually(lambda: len(client.types()) == 2)
    ids = [json.loads(f[5:])["reportId"] for _, f in FrameSplitter().feed(bytes(client.received))]
    assert ids == ["a", "b"]
    rig.proxy.cut_after(6, TO_SERVER, 12, match=lambda p: p.get("reportId") == "y")
    client.send(frame(12, {"reportId": "x"}) + frame(12, {"reportId": "y"}))
    await server.lost
    assert bytes(server.received) == frame(12, {"reportId": "x"}) + frame(12, {"reportId": "y"})[:6]


@pytest_twisted.ensureDeferred
async def test_cut_after_bytes_counts_across_frames(rig: Rig) -> None:
    client, server = await rig.dial()
    rig.proxy.cut_after(7, TO_CLIENT)
    data = frame(3, {}) + frame(3, {})  # 7 bytes each
    server.send(data + frame(3, {}))
    await client.lost
    assert bytes(client.received) == data[:7]


@pytest_twisted.ensureDeferred
async def test_blackhole_forwards_nothing_and_heal_resets_tainted_links(rig: Rig) -> None:
    client, server = await rig.dial()
    rig.proxy.blackhole()
    client.send(frame(12, {}))
    server.send(frame(13, {}))
    await eventually(lambda: sum(rig.proxy.blackholed_bytes.values()) == 14)
    assert client.received == b"" and server.received == b""
    rig.proxy.heal()
    await client.lost
    await server.lost
    client2, server2 = await rig.dial()
    client2.send(frame(12, {}))
    await eventually(lambda: server2.types() == [12])


@pytest_twisted.ensureDeferred
async def test_disconnect_all_resets_both_sides(rig: Rig) -> None:
    client, server = await rig.dial()
    rig.proxy.disconnect_all()
    await client.lost
    await server.lost
    assert rig.proxy.stats()["open_links"] == 0


@pytest_twisted.ensureDeferred
async def test_target_down_closes_the_client() -> None:
    from tasknet.process import free_port

    proxy = FaultProxy("127.0.0.1", free_port(), reactor=reactor)
    proxy.start()
    try:
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", proxy.port)
        client = await connectProtocol(endpoint, Peer())
        await client.lost
        assert proxy.target_failures == 1
    finally:
        await proxy.stop()


def test_bad_fault_arguments_are_refused() -> None:
    proxy = FaultProxy("127.0.0.1", 1, reactor=reactor)
    with pytest.raises(ValueError, match="direction"):
        proxy.drop(12, "sideways")
    with pytest.raises(ValueError, match="one byte"):
        proxy.drop(300, TO_SERVER)
    with pytest.raises(ValueError, match="count"):
        proxy.drop(12, TO_SERVER, count=0)
    with pytest.raises(ValueError, match=">= 0"):
        proxy.delay(-1)
    with pytest.raises(ValueError, match="n_bytes"):
        proxy.cut_after(-1, TO_CLIENT)
    with pytest.raises(ValueError, match="match needs msg_type"):
        proxy.cut_after(1, TO_CLIENT, match=lambda p: True)
    assert proxy.faults.drops == [] and proxy.faults.cuts == []
