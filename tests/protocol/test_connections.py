"""Site listener and node link: negotiation, login, bad frames, liveness and
sessions, in memory (``net``: iosim pumps and one clock, tests/protocol/
memory.py).  The real listener factory, sessions and link service; the bytes
and every timer go through ``net`` instead of the kernel and the reactor, so
each step is seen when it happens.  test_connections_tcp.py keeps a set of
these over real loopback TCP."""

from __future__ import annotations

from typing import Any

import pytest

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
    decode,
    encode_payload,
    sign_login,
)
from tasknet.runtime import SeededEntropy
from tasknet.site.session_states import SessionState
from tests.protocol.memory import MemoryNet, result_of
from tests.protocol.peers import SITE_KEYS, NodeRecorder, RawPeer, SiteRecorder, site_factory
from tests.protocol.vectors import VECTORS, case_id, frame


def login_raw(
    net: MemoryNet, peer: RawPeer, node_id: str = "node-1", *, hello: bool = False
) -> None:
    """Log ``peer`` in as ``node_id`` (a Hello first: v2; none: legacy)."""
    net.flush()
    nonce = peer.of_type(Identity)[0].nonce
    if hello:
        peer.send(ProtocolHello())
    peer.send(Login(node_id, sign_login(SITE_KEYS[node_id], nonce, node_id)))
    net.flush()
    assert peer.of_type(LoginResult) == [LoginResult(True, "")]


# ---------------------------------------------------------------- negotiation matrix


def test_v2_site_and_v2_node_speak_v2(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    node = NodeRecorder()
    net.node(port, node)
    assert node.kinds() == ["up"] and "node-1" in factory.nodes
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
    net.flush()
    assert node.messages() == [
        TaskCommand("op-1", "DOWNLOAD", 7, "name", "http://127.0.0.1/f", 632255),
        TaskCommand("del-1", "DELETE", 8, "other", "", 0),
    ]
    report = TaskReport("r-1", 5, (TaskEntry(7, 1, 0.5),), {7: "op-1"}, ())
    node.link.send(report)
    net.flush()
    assert site_handler.messages() == [report]
    session.send_ack("r-1", "APPLIED")
    net.flush()
    assert len(node.messages()) == 3
    assert node.messages()[-1] == TaskReportAck("r-1", "APPLIED")


def test_v2_site_and_legacy_node_fall_back_to_legacy(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    node = NodeRecorder()
    net.node(port, node, protocol=1)
    assert node.kinds() == ["up"] and "node-1" in factory.nodes
    session = factory.nodes["node-1"]
    assert (session.protocol_version, session.features) == (1, ())
    assert node.link.protocol_version == 1

    session.send_download("op-1", 7, "tok", "name", "http://127.0.0.1/f")
    session.send_delete("del-1", 8, "other")
    session.send_ack("r-1", "APPLIED")  # dropped: never a type >= 10 to a legacy node
    node.link.send(StatusReport((TaskEntry(7, 4, 1.0),)))
    net.flush()
    assert node.messages() == [
        DownloadPost(7, "tok", "name", "http://127.0.0.1/f"),
        DeleteGallery(8),
    ]
    assert site_handler.messages() == [StatusReport((TaskEntry(7, 4, 1.0),))]
    # The strict node would have closed on an unknown field: the link is still up.
    assert node.kinds() == ["up", "message", "message"]
    with pytest.raises(ValueError):
        node.link.send(TaskReport("r", 1, (), {}, ()))


def test_v2_site_sends_a_legacy_node_nothing_of_v2_after_login(net: MemoryNet) -> None:
    factory, port = net.site(heartbeat_interval=0.02)
    peer = net.raw(port)  # a legacy node: Login without a Hello
    login_raw(net, peer)
    session = factory.nodes["node-1"]
    session.send_download("op-1", 7, "tok", "n", "u")
    session.send_delete("del-1", 7, "n")
    session.send_ack("r-1", "APPLIED")
    net.advance(0.02)  # and a Heartbeat
    assert peer.of_type(DeleteGallery) and peer.of_type(Heartbeat)
    types = peer.types()
    assert types[:3] == [0, 10, 2]  # the pre-login Hello, which a legacy node ignores
    assert all(t < 10 for t in types[3:]), types
    for type_, message in peer.frames:
        assert message is not None
        if type_ < 10:
            # what a strict legacy reader would have accepted: no unknown field
            decode(type_, encode_payload(message), strict=True)


def test_legacy_site_and_v2_node_use_legacy_messages(net: MemoryNet) -> None:
    def commands(site: Any) -> None:
        site.send(DownloadPost(7, "tok", "n", "u"))
        site.send(TaskCommand("op", "DOWNLOAD", 9, "n", "u"))  # not in force: refused by node

    doubles, port = net.legacy_site(commands)
    node = NodeRecorder()
    net.node(port, node, trust_legacy_site=True)
    assert node.kinds()[:2] == ["up", "message"]
    link = node.events[0][1]
    assert link.protocol_version == 1
    assert node.messages()[0] == DownloadPost(7, "tok", "n", "u")
    site = doubles[0]
    # The v2 node said Hello before Login, then (legacy site) only legacy types.
    assert site.types()[:2] == [10, 1]
    assert site.of_type(Error)[0].code == "protocol_violation"


def test_legacy_site_and_v2_node_link_refuses_v2_messages(net: MemoryNet) -> None:
    doubles, port = net.legacy_site()
    node = NodeRecorder()
    net.node(port, node, trust_legacy_site=True)
    assert node.kinds() == ["up"]
    with pytest.raises(ValueError):
        node.link.send(TaskReport("r", 1, (), {}, ()))
    node.link.send(StatusReport(()))
    net.flush()
    assert doubles[0].of_type(StatusReport)
    assert all(t < 10 for t in doubles[0].types()[1:])


def test_legacy_site_and_legacy_node(net: MemoryNet) -> None:
    doubles, port = net.legacy_site(lambda site: site.send(DeleteGallery(3)))
    node = NodeRecorder()
    net.node(port, node, protocol=1)
    assert node.kinds() == ["up", "message"]
    assert node.link.protocol_version == 1
    assert node.messages() == [DeleteGallery(3)]
    assert doubles[0].types() == [1]  # Login only: a legacy node never says Hello


# ---------------------------------------------------------------- strict legacy node


@pytest.mark.parametrize("case", VECTORS["legacy_strict"], ids=case_id)
def test_legacy_strict_vector_closes_a_legacy_node_but_not_a_v2_one(
    net: MemoryNet, case: dict[str, Any]
) -> None:
    doubles, port = net.legacy_site(lambda site: site.send_raw(frame(case)))
    legacy, tolerant = NodeRecorder(), NodeRecorder()
    service = net.node(port, legacy, protocol=1)
    # The legacy node closed (its Error reached the site first), and has not
    # dialled again yet (its retry is 20 ms off).
    assert legacy.kinds() == ["up", "down"]
    errors = [m for d in doubles for m in d.of_type(Error)]
    assert [e.code for e in errors] == ["bad_message"]
    net.services.remove(service)
    stopped = service.stopService()
    net.flush()
    result_of(stopped)

    net.node(port, tolerant, protocol=2, trust_legacy_site=True)
    assert tolerant.kinds() == ["up", "message"]
    assert tolerant.messages()[0].TYPE == frame(case)[0]


def test_legacy_node_ignores_v2_types_after_login(net: MemoryNet) -> None:
    def send_v2(site: Any) -> None:
        site.send(TaskCommand("op", "DOWNLOAD", 1, "n", "u"))
        site.send(TaskReportAck("r", "APPLIED"))
        site.send(DeleteGallery(1))

    doubles, port = net.legacy_site(send_v2)
    node = NodeRecorder()
    net.node(port, node, protocol=1)
    assert node.kinds() == ["up", "message"]
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
def test_login_refused_then_closed(net: MemoryNet, node_id: str, secret: str, reason: str) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    nonce = peer.of_type(Identity)[0].nonce
    assert len(nonce) == 32 and int(nonce, 16) >= 0
    peer.send(Login(node_id, sign_login(secret, nonce, node_id)))
    net.flush()
    assert peer.is_closed
    assert peer.of_type(LoginResult) == [LoginResult(False, reason)]
    assert site_handler.events == [] and factory.nodes == {}


def test_each_connection_gets_a_fresh_nonce_and_old_signatures_fail(net: MemoryNet) -> None:
    factory, port = net.site()
    first = net.raw(port)
    login_raw(net, first)
    second = net.raw(port)
    old_nonce = first.of_type(Identity)[0].nonce
    assert second.of_type(Identity)[0].nonce != old_nonce
    second.send(Login("node-1", sign_login("s3cret", old_nonce, "node-1")))  # a replay
    net.flush()
    assert second.is_closed
    assert second.of_type(LoginResult) == [LoginResult(False, "bad signature")]


def login_with(net: MemoryNet, port: int, node_id: str, secret: str) -> RawPeer:
    peer = net.raw(port)
    peer.send(Login(node_id, sign_login(secret, peer.of_type(Identity)[0].nonce, node_id)))
    net.flush()
    return peer


def test_node_keys_are_read_at_each_login(net: MemoryNet) -> None:
    factory, port = net.site()
    factory.node_keys["node-3"] = "new-key"  # added while running
    added = login_with(net, port, "node-3", "new-key")
    assert added.of_type(LoginResult) == [LoginResult(True, "")]

    del factory.node_keys["node-2"]  # removed while running
    removed = login_with(net, port, "node-2", SITE_KEYS["node-2"])
    assert removed.of_type(LoginResult) == [LoginResult(False, "unknown node")]

    factory.node_keys = {"node-1": "rotated"}  # a whole new mapping
    old = login_with(net, port, "node-1", SITE_KEYS["node-1"])
    assert old.of_type(LoginResult) == [LoginResult(False, "bad signature")]
    new = login_with(net, port, "node-1", "rotated")
    assert new.of_type(LoginResult) == [LoginResult(True, "")]
    assert sorted(factory.nodes) == ["node-1", "node-3"]


@pytest.mark.parametrize(
    "message",
    [DownloadPost(1, "t", "n", "u"), StatusReport(()), TaskReport("r", 1, (), {}, ())],
    ids=lambda m: type(m).__name__,
)
def test_traffic_before_login_is_unauthenticated(net: MemoryNet, message: Any) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    peer.send(message)
    net.flush()
    assert peer.is_closed
    assert [e.code for e in peer.of_type(Error)] == ["unauthenticated"]
    assert site_handler.events == []


def test_unknown_type_before_login_is_unauthenticated_after_login_ignored(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    early = net.raw(port)
    early.send_raw(HEADER.pack(99, 2) + b"{}")
    net.flush()
    assert early.is_closed
    assert [e.code for e in early.of_type(Error)] == ["unauthenticated"]

    late = net.raw(port)
    login_raw(net, late, hello=True)
    late.send_raw(HEADER.pack(99, 2) + b"{}")
    late.send(StatusReport(()))
    net.flush()
    assert site_handler.messages() == [StatusReport(())]
    assert not late.is_closed and not late.of_type(Error)


def test_v2_report_on_a_legacy_connection_is_a_violation(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    login_raw(net, peer)  # no Hello: legacy
    peer.send(TaskReport("r", 1, (), {}, ()))
    net.flush()
    assert peer.is_closed
    assert [e.code for e in peer.of_type(Error)] == ["protocol_violation"]
    assert site_handler.kinds() == ["attached", "detached"]


def test_site_ignores_a_late_hello_and_refuses_a_site_message_from_a_node(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    login_raw(net, peer, hello=True)
    peer.send(ProtocolHello())  # after login: ignored, the connection stays
    peer.send(StatusReport(()))
    net.flush()
    assert site_handler.messages() == [StatusReport(())]
    assert not peer.is_closed
    peer.send(DownloadPost(1, "t", "n", "u"))  # a site → node message
    net.flush()
    assert peer.is_closed
    assert peer.of_type(Error) == [
        Error("protocol_violation", "DownloadPost is not a node message on a protocol 2 connection")
    ]
    assert site_handler.messages() == [StatusReport(())]


def test_node_ignores_a_late_hello_and_refuses_a_node_message_from_the_site(
    net: MemoryNet,
) -> None:
    def after_login(site: Any) -> None:
        site.send(ProtocolHello())  # after LoginResult: ignored
        site.send(DeleteGallery(4))
        site.send(StatusReport(()))  # a node → site message

    doubles, port = net.legacy_site(after_login)
    node = NodeRecorder()
    net.node(port, node, trust_legacy_site=True)
    assert doubles[0].of_type(Error) == [
        Error("protocol_violation", "StatusReport is not a site message on a protocol 1 connection")
    ]
    assert node.kinds()[:3] == ["up", "message", "down"]
    assert node.messages()[0] == DeleteGallery(4)


@pytest.mark.parametrize("farewell", [Goodbye("bye"), Error("internal", "oops")], ids=repr)
def test_goodbye_or_error_before_login_closes_quietly(net: MemoryNet, farewell: Any) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    peer.send(farewell)
    net.flush()
    assert peer.is_closed
    assert peer.of_type(Error) == [] and site_handler.events == []


# ---------------------------------------------------------------- malformed frames


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=case_id)
def test_invalid_vector_gets_its_error_and_a_close(net: MemoryNet, case: dict[str, Any]) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    login_raw(net, peer, hello=True)
    peer.send_raw(frame(case))
    net.flush()
    assert peer.is_closed
    assert [e.code for e in peer.of_type(Error)] == [case["error"]]
    assert site_handler.messages() == []
    assert site_handler.kinds() == ["attached", "detached"]


def test_oversize_frame_is_refused_on_its_header_alone(net: MemoryNet) -> None:
    factory, port = net.site(max_payload=1024)
    peer = net.raw(port)
    login_raw(net, peer, hello=True)
    peer.send_raw(HEADER.pack(12, 1025))  # only the 5-byte header goes out
    net.flush()
    assert peer.is_closed
    assert peer.of_type(Error) == [
        Error("frame_too_large", "declared payload of 1025 bytes exceeds 1024")
    ]


# ---------------------------------------------------------------- liveness


def idle_deadline(net: MemoryNet) -> float:
    """When the one connection timed by the clock will be dropped for silence.

    Its delayed calls are the next Heartbeat (now + 15 s at most) and the
    idle timeout (last frame + 45 s): the later one is the timeout."""
    return max(call.getTime() for call in net.clock.getDelayedCalls())


def test_heartbeats_flow_and_a_silent_peer_is_dropped_after_45_s(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    login_raw(net, peer, hello=True)  # at clock time 0
    session = factory.nodes["node-1"]
    net.advance(10)
    peer.send(Heartbeat(10_000))  # our last frame, at 10 s
    net.flush()
    assert idle_deadline(net) == 55
    net.advance(35)  # 45 s: the site's Heartbeats at 15, 30 and 45 s
    assert len(peer.of_type(Heartbeat)) == 3
    net.advance(9)  # 54 s: whole seconds, so the float sums stay exact
    assert not session.closing and not peer.is_closed
    net.clock.advance(1)  # 45 s without a frame from us: the site gives up
    assert session.closing
    net.flush()
    assert peer.is_closed
    assert site_handler.kinds() == ["attached", "detached"]
    assert factory.nodes == {}


def test_heartbeating_node_stays_connected_past_the_idle_timeout(net: MemoryNet) -> None:
    factory, port = net.site()
    node = NodeRecorder()
    link_factory = SiteLinkFactory(
        "node-1", SITE_KEYS["node-1"], node, clock=net.clock, entropy=SeededEntropy(0)
    )
    link = net.dial(port, link_factory)
    assert node.kinds() == ["up"]
    session = factory.nodes["node-1"]
    for _ in range(7):  # 105 s: more than two idle timeouts
        net.advance(15)
        # Each side's Heartbeat reached the other and pushed its timeout back.
        deadlines = sorted({c.getTime() for c in net.clock.getDelayedCalls()})
        assert deadlines[-1] == net.clock.seconds() + 45, deadlines
        assert not session.closing and not link.closing
    assert node.kinds() == ["up"] and factory.nodes["node-1"] is session
    link.close("done")
    net.flush()
    assert node.kinds() == ["up", "down"] and not factory.connections


def test_node_drops_a_silent_site_and_reconnects(net: MemoryNet) -> None:
    doubles, port = net.legacy_site()  # never heartbeats
    node = NodeRecorder()
    net.node(port, node, heartbeat_interval=10, idle_timeout=0.2, trust_legacy_site=True)
    assert node.kinds() == ["up"]
    net.advance(0.19)
    assert node.kinds() == ["up"]  # not yet: 0.2 s of silence
    net.advance(0.01)
    assert node.kinds() == ["up", "down"]
    net.advance(0.02)  # the retry policy's delay
    assert node.kinds() == ["up", "down", "up"]
    assert len(doubles) == 2


# ---------------------------------------------------------------- sessions


def test_newest_connection_wins(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    old = net.raw(port)
    login_raw(net, old, hello=True)
    old_session = factory.nodes["node-1"]
    new = net.raw(port)
    login_raw(net, new)
    new_session = factory.nodes["node-1"]
    assert new_session is not old_session
    assert old.is_closed
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
    net.flush()
    assert site_handler.messages() == [StatusReport(())]
    new_session.close("bye")
    net.flush()
    assert new.is_closed
    assert site_handler.kinds() == ["attached", "detached", "attached", "message", "detached"]
    assert new.of_type(Goodbye) == [Goodbye("bye")]
    assert factory.nodes == {}


def test_goodbye_from_node_closes_and_detaches(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    node = NodeRecorder()
    service = net.node(port, node)
    assert node.kinds() == ["up"]
    node.link.close("node shutting down")
    net.flush()
    assert site_handler.kinds() == ["attached", "detached"]
    assert node.kinds() == ["up", "down"]
    net.services.remove(service)
    stopped = service.stopService()
    net.flush()
    result_of(stopped)


def test_node_reconnects_after_the_site_listener_restarts(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    node = NodeRecorder()
    net.node(port, node)
    assert node.kinds() == ["up"]
    net.stop_listening(port)
    assert node.kinds() == ["up", "down"]
    assert site_handler.kinds() == ["attached", "detached"]
    net.advance(0.1)  # dials again every 20 ms: refused while nobody listens
    assert node.kinds() == ["up", "down"]

    again = SiteRecorder()
    restarted = site_factory(again, clock=net.clock)
    net.listen(restarted, port)
    net.advance(0.02)
    assert node.kinds() == ["up", "down", "up"]
    assert again.kinds() == ["attached"]
    assert restarted.nodes["node-1"].protocol_version == 2


def test_close_all_says_goodbye_and_fires_when_every_connection_is_gone(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peers = [net.raw(port) for _ in range(3)]
    login_raw(net, peers[0], hello=True)
    login_raw(net, peers[1], "node-2")
    assert len(factory.connections) == 3
    closed = factory.close_all("site stopping")
    assert not closed.called  # not before the connections are gone
    net.flush()
    result_of(closed)
    assert factory.connections == {} and factory.nodes == {}
    for peer in peers:
        assert peer.is_closed
        assert peer.of_type(Goodbye) == [Goodbye("site stopping")]
    assert sorted(site_handler.kinds()) == ["attached"] * 2 + ["detached"] * 2
    result_of(factory.close_all("again"))  # nothing left: fires at once
