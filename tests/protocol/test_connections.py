"""Site listener and node link over real loopback TCP."""

from __future__ import annotations

from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.task import Clock

from tasknet.node.link import SiteLinkFactory
from tasknet.protocol.messages import (
    HEADER,
    DeleteGallery,
    DownloadPost,
    Error,
    Goodbye,
    Heartbeat,
    Identity,
    Login,
    LoginResult,
    ProtocolHello,
    StatusReport,
    TaskCommand,
    TaskEntry,
    TaskReport,
    TaskReportAck,
    sign_login,
)
from tests.protocol.peers import (
    SITE_KEYS,
    Harness,
    Listener,
    NodeRecorder,
    RawPeer,
    SiteRecorder,
    eventually,
    login_raw,
    site_factory,
)
from tests.protocol.vectors import VECTORS, case_id, frame

# ---------------------------------------------------------------- negotiation matrix


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
        ("reliable-task-v2", "site-proof"),
    )
    assert session.proved  # the node asked, the site proved itself
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
async def test_v2_site_and_legacy_node_fall_back_to_legacy(harness: Harness) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    node = NodeRecorder()
    harness.node(port, node, protocol=1)
    await eventually(lambda: node.kinds() == ["up"] and "node-1" in factory.nodes)
    session = factory.nodes["node-1"]
    assert (session.protocol_version, session.features) == (1, ())
    assert node.link.protocol_version == 1

    session.send_download("op-1", 7, "tok", "name", "http://127.0.0.1/f")
    session.send_delete("del-1", 8, "other")
    session.send_ack("r-1", "APPLIED")  # dropped: never a type >= 10 to a legacy node
    node.link.send(StatusReport((TaskEntry(7, 4, 1.0),)))
    await eventually(lambda: len(node.messages()) == 2 and site_handler.messages())
    assert node.messages() == [
        DownloadPost(7, "tok", "name", "http://127.0.0.1/f"),
        DeleteGallery(8),
    ]
    assert site_handler.messages() == [StatusReport((TaskEntry(7, 4, 1.0),))]
    # The strict node would have closed on an unknown field: the link is still up.
    assert node.kinds() == ["up", "message", "message"]
    with pytest.raises(ValueError):
        node.link.send(TaskReport("r", 1, (), {}, ()))


@pytest_twisted.ensureDeferred
async def test_v2_site_sends_a_legacy_node_nothing_of_v2_after_login(harness: Harness) -> None:
    factory, port = await harness.site(heartbeat_interval=0.02)
    peer = await harness.raw(port)  # a legacy node: Login without a Hello
    await login_raw(peer)
    session = factory.nodes["node-1"]
    session.send_download("op-1", 7, "tok", "n", "u")
    session.send_delete("del-1", 7, "n")
    session.send_ack("r-1", "APPLIED")
    await eventually(lambda: peer.of_type(DeleteGallery) and peer.of_type(Heartbeat))
    types = peer.types()
    assert types[:3] == [0, 10, 2]  # the pre-login Hello, which a legacy node ignores
    assert all(t < 10 for t in types[3:]), types
    for type_, message in peer.frames:
        assert message is not None
        if type_ < 10:
            # what a strict legacy reader would have accepted: no unknown field
            from tasknet.protocol.messages import decode, encode_payload

            decode(type_, encode_payload(message), strict=True)


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
async def test_legacy_site_and_v2_node_link_refuses_v2_messages(harness: Harness) -> None:
    doubles, port = await harness.legacy_site()
    node = NodeRecorder()
    harness.node(port, node, trust_legacy_site=True)
    await eventually(lambda: node.kinds() == ["up"])
    with pytest.raises(ValueError):
        node.link.send(TaskReport("r", 1, (), {}, ()))
    node.link.send(StatusReport(()))
    await eventually(lambda: doubles[0].of_type(StatusReport))
    assert all(t < 10 for t in doubles[0].types()[1:])


@pytest_twisted.ensureDeferred
async def test_legacy_site_and_legacy_node(harness: Harness) -> None:
    doubles, port = await harness.legacy_site(lambda site: site.send(DeleteGallery(3)))
    node = NodeRecorder()
    harness.node(port, node, protocol=1)
    await eventually(lambda: node.kinds() == ["up", "message"])
    assert node.link.protocol_version == 1
    assert node.messages() == [DeleteGallery(3)]
    assert doubles[0].types() == [1]  # Login only: a legacy node never says Hello


# ---------------------------------------------------------------- strict legacy node


@pytest.mark.parametrize("case", VECTORS["legacy_strict"], ids=case_id)
@pytest_twisted.ensureDeferred
async def test_legacy_strict_vector_closes_a_legacy_node_but_not_a_v2_one(
    harness: Harness, case: dict[str, Any]
) -> None:
    doubles, port = await harness.legacy_site(lambda site: site.send_raw(frame(case)))
    legacy, tolerant = NodeRecorder(), NodeRecorder()
    harness.node(port, legacy, protocol=1)
    await eventually(lambda: legacy.kinds() == ["up", "down"])
    errors = [m for d in doubles for m in d.of_type(Error)]
    assert [e.code for e in errors] == ["bad_message"]
    await harness.services.pop().stopService()

    harness.node(port, tolerant, protocol=2, trust_legacy_site=True)
    await eventually(lambda: tolerant.kinds() == ["up", "message"])
    assert tolerant.messages()[0].TYPE == frame(case)[0]


@pytest_twisted.ensureDeferred
async def test_legacy_node_ignores_v2_types_after_login(harness: Harness) -> None:
    def send_v2(site: Any) -> None:
        site.send(TaskCommand("op", "DOWNLOAD", 1, "n", "u"))
        site.send(TaskReportAck("r", "APPLIED"))
        site.send(DeleteGallery(1))

    doubles, port = await harness.legacy_site(send_v2)
    node = NodeRecorder()
    harness.node(port, node, protocol=1)
    await eventually(lambda: node.kinds() == ["up", "message"])
    assert node.messages() == [DeleteGallery(1)]
    assert not doubles[0].of_type(Error)


# ---------------------------------------------------------------- login failures


@pytest.mark.parametrize(
    ("node_id", "secret", "reason"),
    [
        ("node-1", "wrong", "bad signature"),
        ("node-9", "s3cret", "unknown node"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_login_refused_then_closed(
    harness: Harness, node_id: str, secret: str, reason: str
) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    peer = await harness.raw(port)
    await eventually(lambda: peer.of_type(Identity))
    nonce = peer.of_type(Identity)[0].nonce
    assert len(nonce) == 32 and int(nonce, 16) >= 0
    peer.send(Login(node_id, sign_login(secret, nonce, node_id)))
    await peer.closed
    assert peer.of_type(LoginResult) == [LoginResult(False, reason)]
    assert site_handler.events == [] and factory.nodes == {}


@pytest_twisted.ensureDeferred
async def test_each_connection_gets_a_fresh_nonce_and_old_signatures_fail(harness: Harness) -> None:
    factory, port = await harness.site()
    first = await harness.raw(port)
    await login_raw(first)
    second = await harness.raw(port)
    await eventually(lambda: second.of_type(Identity))
    old_nonce = first.of_type(Identity)[0].nonce
    assert second.of_type(Identity)[0].nonce != old_nonce
    second.send(Login("node-1", sign_login("s3cret", old_nonce, "node-1")))  # a replay
    await second.closed
    assert second.of_type(LoginResult) == [LoginResult(False, "bad signature")]


async def login_with(port: int, harness: Harness, node_id: str, secret: str) -> RawPeer:
    peer = await harness.raw(port)
    await eventually(lambda: peer.of_type(Identity))
    peer.send(Login(node_id, sign_login(secret, peer.of_type(Identity)[0].nonce, node_id)))
    await eventually(lambda: peer.of_type(LoginResult))
    return peer


@pytest_twisted.ensureDeferred
async def test_node_keys_are_read_at_each_login(harness: Harness) -> None:
    factory, port = await harness.site()
    factory.node_keys["node-3"] = "new-key"  # added while running
    added = await login_with(port, harness, "node-3", "new-key")
    assert added.of_type(LoginResult) == [LoginResult(True, "")]

    del factory.node_keys["node-2"]  # removed while running
    removed = await login_with(port, harness, "node-2", SITE_KEYS["node-2"])
    assert removed.of_type(LoginResult) == [LoginResult(False, "unknown node")]

    factory.node_keys = {"node-1": "rotated"}  # a whole new mapping
    old = await login_with(port, harness, "node-1", SITE_KEYS["node-1"])
    assert old.of_type(LoginResult) == [LoginResult(False, "bad signature")]
    new = await login_with(port, harness, "node-1", "rotated")
    assert new.of_type(LoginResult) == [LoginResult(True, "")]
    assert sorted(factory.nodes) == ["node-1", "node-3"]


@pytest.mark.parametrize(
    "message",
    [DownloadPost(1, "t", "n", "u"), StatusReport(()), TaskReport("r", 1, (), {}, ())],
    ids=lambda m: type(m).__name__,
)
@pytest_twisted.ensureDeferred
async def test_traffic_before_login_is_unauthenticated(harness: Harness, message: Any) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    peer = await harness.raw(port)
    peer.send(message)
    await peer.closed
    assert [e.code for e in peer.of_type(Error)] == ["unauthenticated"]
    assert site_handler.events == []


@pytest_twisted.ensureDeferred
async def test_unknown_type_before_login_is_unauthenticated_after_login_ignored(
    harness: Harness,
) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    early = await harness.raw(port)
    early.send_raw(HEADER.pack(99, 2) + b"{}")
    await early.closed
    assert [e.code for e in early.of_type(Error)] == ["unauthenticated"]

    late = await harness.raw(port)
    await login_raw(late, hello=True)
    late.send_raw(HEADER.pack(99, 2) + b"{}")
    late.send(StatusReport(()))
    await eventually(lambda: site_handler.messages())
    assert site_handler.messages() == [StatusReport(())]
    assert not late.is_closed and not late.of_type(Error)


@pytest_twisted.ensureDeferred
async def test_v2_report_on_a_legacy_connection_is_a_violation(harness: Harness) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    peer = await harness.raw(port)
    await login_raw(peer)  # no Hello: legacy
    peer.send(TaskReport("r", 1, (), {}, ()))
    await peer.closed
    assert [e.code for e in peer.of_type(Error)] == ["protocol_violation"]
    assert site_handler.kinds() == ["attached", "detached"]


@pytest_twisted.ensureDeferred
async def test_site_ignores_a_late_hello_and_refuses_a_site_message_from_a_node(
    harness: Harness,
) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    peer = await harness.raw(port)
    await login_raw(peer, hello=True)
    peer.send(ProtocolHello())  # after login: ignored, the connection stays
    peer.send(StatusReport(()))
    await eventually(lambda: site_handler.messages())
    peer.send(DownloadPost(1, "t", "n", "u"))  # a site → node message
    await peer.closed
    assert peer.of_type(Error) == [
        Error("protocol_violation", "DownloadPost is not a node message on a protocol 2 connection")
    ]
    assert site_handler.messages() == [StatusReport(())]


@pytest_twisted.ensureDeferred
async def test_node_ignores_a_late_hello_and_refuses_a_node_message_from_the_site(
    harness: Harness,
) -> None:
    def after_login(site: Any) -> None:
        site.send(ProtocolHello())  # after LoginResult: ignored
        site.send(DeleteGallery(4))
        site.send(StatusReport(()))  # a node → site message

    doubles, port = await harness.legacy_site(after_login)
    node = NodeRecorder()
    harness.node(port, node, trust_legacy_site=True)
    await eventually(lambda: doubles and doubles[0].of_type(Error))
    assert doubles[0].of_type(Error) == [
        Error("protocol_violation", "StatusReport is not a site message on a protocol 1 connection")
    ]
    await eventually(lambda: node.kinds()[:3] == ["up", "message", "down"])
    assert node.messages()[0] == DeleteGallery(4)


@pytest.mark.parametrize("farewell", [Goodbye("bye"), Error("internal", "oops")], ids=repr)
@pytest_twisted.ensureDeferred
async def test_goodbye_or_error_before_login_closes_quietly(
    harness: Harness, farewell: Any
) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    peer = await harness.raw(port)
    peer.send(farewell)
    await peer.closed
    assert peer.of_type(Error) == [] and site_handler.events == []


# ---------------------------------------------------------------- malformed frames


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=case_id)
@pytest_twisted.ensureDeferred
async def test_invalid_vector_over_tcp_gets_its_error_and_a_close(
    harness: Harness, case: dict[str, Any]
) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    peer = await harness.raw(port)
    await login_raw(peer, hello=True)
    peer.send_raw(frame(case))
    await peer.closed
    assert [e.code for e in peer.of_type(Error)] == [case["error"]]
    assert site_handler.messages() == []
    assert site_handler.kinds() == ["attached", "detached"]


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


# ---------------------------------------------------------------- liveness


def idle_deadline(clock: Clock) -> float:
    """When the one connection timed by ``clock`` will be dropped for silence.

    Its delayed calls are the next Heartbeat (now + 15 s at most) and the
    idle timeout (last frame + 45 s): the later one is the timeout."""
    return max(call.getTime() for call in clock.calls)


@pytest_twisted.ensureDeferred
async def test_heartbeats_flow_and_a_silent_peer_is_dropped_after_45_s(harness: Harness) -> None:
    site_handler = SiteRecorder()
    clock = Clock()  # the session's timers; the bytes go over real TCP
    factory, port = await harness.site(site_handler, clock=clock)
    peer = await harness.raw(port)
    await login_raw(peer, hello=True)  # at clock time 0
    session = factory.nodes["node-1"]
    clock.advance(10)
    peer.send(Heartbeat(10_000))  # our last frame, at 10 s
    await eventually(lambda: idle_deadline(clock) == 55)
    for _ in range(3):  # the site's Heartbeats at 15, 30 and 45 s
        clock.advance(15 - clock.seconds() % 15)
    await eventually(lambda: len(peer.of_type(Heartbeat)) == 3)
    clock.advance(9)  # 54 s: whole seconds, so the float sums stay exact
    assert not session.closing
    clock.advance(1)  # 45 s without a frame from us: the site gives up
    assert session.closing
    await peer.closed
    assert site_handler.kinds() == ["attached", "detached"]
    assert factory.nodes == {}


@pytest_twisted.ensureDeferred
async def test_heartbeating_node_stays_connected_past_the_idle_timeout(harness: Harness) -> None:
    site_clock, node_clock = Clock(), Clock()
    factory, port = await harness.site(clock=site_clock)
    node = NodeRecorder()
    link_factory = SiteLinkFactory("node-1", SITE_KEYS["node-1"], node, clock=node_clock)
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    link: Any = await endpoint.connect(cast(Any, link_factory))
    try:
        await eventually(lambda: node.kinds() == ["up"])
        session = factory.nodes["node-1"]
        for _ in range(7):  # 105 s: more than two idle timeouts
            site_clock.advance(15)
            node_clock.advance(15)
            # Each side's Heartbeat reaches the other and pushes its timeout back.
            await eventually(
                lambda: (
                    idle_deadline(site_clock) == site_clock.seconds() + 45
                    and idle_deadline(node_clock) == node_clock.seconds() + 45
                )
            )
            assert not session.closing and not link.closing
        assert node.kinds() == ["up"] and factory.nodes["node-1"] is session
    finally:
        link.transport.abortConnection()
        await eventually(lambda: node.kinds() == ["up", "down"] and not factory.connections)


@pytest_twisted.ensureDeferred
async def test_node_drops_a_silent_site_and_reconnects(harness: Harness) -> None:
    doubles, port = await harness.legacy_site()  # never heartbeats
    node = NodeRecorder()
    harness.node(port, node, heartbeat_interval=10, idle_timeout=0.2, trust_legacy_site=True)
    await eventually(lambda: node.kinds()[:3] == ["up", "down", "up"])
    assert len(doubles) >= 2


# ---------------------------------------------------------------- sessions


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
    assert factory.nodes == {"node-1": new_session}
    assert (old_session.protocol_version, new_session.protocol_version) == (2, 1)
    # The new session still works; closing it detaches it exactly once.
    new.send(StatusReport(()))
    await eventually(lambda: site_handler.messages())
    new_session.close("bye")
    await new.closed
    await eventually(lambda: site_handler.kinds()[-1] == "detached")
    assert site_handler.kinds() == ["attached", "detached", "attached", "message", "detached"]
    assert new.of_type(Goodbye) == [Goodbye("bye")]
    assert factory.nodes == {}


@pytest_twisted.ensureDeferred
async def test_goodbye_from_node_closes_and_detaches(harness: Harness) -> None:
    site_handler = SiteRecorder()
    factory, port = await harness.site(site_handler)
    node = NodeRecorder()
    service = harness.node(port, node)
    await eventually(lambda: node.kinds() == ["up"])
    node.link.close("node shutting down")
    await eventually(lambda: site_handler.kinds() == ["attached", "detached"])
    await eventually(lambda: node.kinds()[:2] == ["up", "down"])
    await service.stopService()


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
    assert factory.connections == set() and factory.nodes == {}
    for peer in peers:
        await peer.closed
        assert peer.of_type(Goodbye) == [Goodbye("site stopping")]
    assert sorted(site_handler.kinds()) == ["attached"] * 2 + ["detached"] * 2
    await factory.close_all("again")  # nothing left: fires at once
