"""Site listener and node link over real loopback TCP: the integration set.

The connection logic is tested in memory (test_connections.py, iosim on one
clock); these keep what only real sockets show: a v2 node and a v2 site
negotiating, proving and exchanging commands, reports and ACKs through the
kernel; a legacy site; the newest of two real connections winning; a node
dialling again once a restarted listener binds the same port; ``close_all``
firing once every real socket is gone; a frame refused on its 5-byte
header alone, the rest never sent; and twenty real peers that never log in,
each held to 64 KiB until the 30 s deadline (test_prelogin.py in memory)."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from tasknet.protocol.messages import (
    HEADER,
    DeleteGallery,
    DownloadPost,
    Error,
    Goodbye,
    Heartbeat,
    StatusReport,
    TaskCommand,
    TaskEntry,
    TaskReport,
    TaskReportAck,
)
from tasknet.site.session_states import SessionState
from tests.eventually import eventually
from tests.protocol.peers import (
    Harness,
    Listener,
    NodeRecorder,
    RawPeer,
    SiteRecorder,
    login_raw,
    site_factory,
)


@pytest_twisted.ensureDeferred
async def test_v2_site_and_v2_node_speak_v2(harness: Harness) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    node = NodeRecorder()
    harness.node(port, node)
    await eventually(lambda: node.kinds() == ["up"] and "node-1" in factory.nodes)
    session = factory.nodes["node-1"]
    assert (session.protocol_version, session.features) == (
        2,
        ("reliable-task-v2", "site-proof", "archive-inventory"),
    )
    # The node asked, the site proved itself.
    assert session.life.state is SessionState.CURRENT_PROVEN
    assert node.link.protocol_version == 2
    assert site_handler.kinds() == ["attached"]

    session.send_download("op-1", 7, "tok", "name", "http://127.0.0.1/f", 632255)
    session.send_delete("del-1", 8, "other")
    await eventually(lambda: len(node.messages()) == 2)
    assert node.messages() == [
        TaskCommand("op-1", "DOWNLOAD", 7, "name", "http://127.0.0.1/f", 632255),
        TaskCommand("del-1", "DELETE", 8, "other", "", 0),
    ]
    report = TaskReport("r-1", 5, (TaskEntry(7, 1, 0.5),), {7: "op-1"}, ())
    node.link.send(report)
    await eventually(lambda: site_handler.messages())
    assert site_handler.messages() == [report]
    session.send_ack("r-1", "APPLIED")
    await eventually(lambda: len(node.messages()) == 3)
    assert node.messages()[-1] == TaskReportAck("r-1", "APPLIED")


@pytest_twisted.ensureDeferred
async def test_legacy_site_and_v2_node_use_legacy_messages(harness: Harness) -> None:
    def commands(site: Any) -> None:
        site.send(DownloadPost(7, "tok", "n", "u"))
        site.send(TaskCommand("op", "DOWNLOAD", 9, "n", "u"))  # not in force: refused by node

    doubles, port = await harness.legacy_site(commands)
    node = NodeRecorder()
    harness.node(port, node, trust_legacy_site=True)
    await eventually(lambda: node.kinds()[:2] == ["up", "message"])
    link = node.events[0][1]
    assert link.protocol_version == 1
    assert node.messages()[0] == DownloadPost(7, "tok", "n", "u")
    site = doubles[0]
    # The v2 node said Hello before Login, then (legacy site) only legacy types.
    assert site.types()[:2] == [10, 1]
    await eventually(lambda: site.of_type(Error))
    assert site.of_type(Error)[0].code == "protocol_violation"


@pytest_twisted.ensureDeferred
async def test_newest_connection_wins(harness: Harness) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    old = await harness.raw(port)
    await login_raw(old, hello=True)
    old_session = factory.nodes["node-1"]
    new = await harness.raw(port)
    await login_raw(new)
    new_session = factory.nodes["node-1"]
    assert new_session is not old_session
    await old.closed
    assert old.of_type(Goodbye) == [Goodbye("replaced by a newer connection")]
    assert [(k, s) for k, s, _ in site_handler.events] == [
        ("attached", old_session),
        ("detached", old_session),
        ("attached", new_session),
    ]
    new.send(StatusReport(()))
    await eventually(lambda: site_handler.messages())
    new_session.close("bye")
    await new.closed
    await eventually(lambda: site_handler.kinds()[-1] == "detached")
    assert new.of_type(Goodbye) == [Goodbye("bye")]
    assert factory.nodes == {}


@pytest_twisted.ensureDeferred
async def test_node_reconnects_after_the_site_listener_restarts(harness: Harness) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    node = NodeRecorder()
    harness.node(port, node)
    await eventually(lambda: node.kinds() == ["up"])
    await harness.listeners[0].stop()
    await eventually(lambda: node.kinds() == ["up", "down"])
    assert site_handler.kinds() == ["attached", "detached"]

    again = SiteRecorder()
    restarted = Listener(site_factory(again))
    harness.listeners.append(restarted)
    await restarted.start(port)
    await eventually(lambda: node.kinds() == ["up", "down", "up"])
    assert again.kinds() == ["attached"]
    assert restarted.factory.nodes["node-1"].protocol_version == 2


@pytest_twisted.ensureDeferred
async def test_close_all_says_goodbye_and_fires_when_every_connection_is_gone(
    harness: Harness,
) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    peers = [await harness.raw(port) for _ in range(3)]
    await login_raw(peers[0], hello=True)
    await login_raw(peers[1], "node-2")
    await eventually(lambda: len(factory.connections) == 3)
    await factory.close_all("site stopping")
    assert factory.connections == {} and factory.nodes == {}
    for peer in peers:
        await peer.closed
        assert peer.of_type(Goodbye) == [Goodbye("site stopping")]
    assert sorted(site_handler.kinds()) == ["attached"] * 2 + ["detached"] * 2
    await factory.close_all("again")  # nothing left: fires at once


@pytest_twisted.ensureDeferred
async def test_oversize_frame_is_refused_on_its_header_alone(harness: Harness) -> None:
    factory, port = await harness.site(max_payload=1024)
    peer = await harness.raw(port)
    await login_raw(peer, hello=True)
    peer.send_raw(HEADER.pack(12, 1025))  # only the 5-byte header goes out
    await peer.closed
    assert peer.of_type(Error) == [
        Error("frame_too_large", "declared payload of 1025 bytes exceeds 1024")
    ]


@pytest_twisted.ensureDeferred
async def test_legacy_site_and_legacy_node(harness: Harness) -> None:
    doubles, port = await harness.legacy_site(lambda site: site.send(DeleteGallery(3)))
    node = NodeRecorder()
    harness.node(port, node, protocol=1)
    await eventually(lambda: node.kinds() == ["up", "message"])
    assert node.link.protocol_version == 1
    assert node.messages() == [DeleteGallery(3)]
    assert doubles[0].types() == [1]  # Login only: a legacy node never says Hello


KIB = 1024


async def closed(peer: RawPeer, timeout: float = 5.0) -> None:
    """Wait for ``peer``'s connection to close (fails, rather than hangs, if it stays)."""
    await peer.closed.addTimeout(timeout, reactor)


@pytest_twisted.ensureDeferred
async def test_twenty_peers_that_never_log_in_cost_at_most_64_kib_each(harness: Harness) -> None:
    """The issue's case: 20 unauthenticated peers made the site hold 16 MiB each."""
    clock = Clock()  # the session's timers; the bytes go over real TCP
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler, clock=clock)
    # Ten declare a 16 MiB frame and start sending it: refused on the header.
    greedy = [await harness.raw(port) for _ in range(10)]
    for peer in greedy:
        # One small write, read at once: nothing is left unread (and reset) at the close.
        peer.send_raw(HEADER.pack(StatusReport.TYPE, 16 * 1024 * KIB) + b"x" * KIB)
    # Ten hold a partial frame just under the cap: kept, but only until 30 s.
    patient = [await harness.raw(port) for _ in range(10)]
    for peer in patient:
        peer.send_raw(HEADER.pack(Heartbeat.TYPE, 64 * KIB) + b"x" * (64 * KIB - 1))
    for peer in greedy:
        await closed(peer)
        assert [e.code for e in peer.of_type(Error)] == ["frame_too_large"]
    await eventually(
        lambda: (
            len(factory.connections) == 10
            and all(len(s._buffer) == 5 + 64 * KIB - 1 for s in factory.connections)
        )
    )
    held = sum(len(s._buffer) for s in factory.connections)
    assert held <= 10 * (64 * KIB + 5)
    clock.advance(30)
    for peer in patient:
        await closed(peer)
        assert peer.of_type(Error) == [Error("unauthenticated", "no login within 30 s")]
    assert factory.connections == {} and site_handler.events == []
