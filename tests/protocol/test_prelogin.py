"""Before login, in memory (``net``: iosim and one clock, tests/protocol/
memory.py): the 64 KiB frame cap, the 30 s login deadline that no pre-login
frame extends, the full-length signature check, and the rate-limited log of
refused logins (PROTOCOL.md, "Bounds").

Every timer of both sides runs on the one clock, so the 30 s rule is checked
exactly; test_connections_tcp.py keeps the twenty peers that never log in
over real loopback TCP.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.protocol import Factory
from twisted.logger import LogLevel, capturedLogs, formatEvent

from tasknet.protocol.messages import (
    HEADER,
    Error,
    Heartbeat,
    Identity,
    Login,
    LoginResult,
    StatusReport,
    TaskEntry,
    sign_login,
)
from tests.protocol.memory import MemoryNet, result_of
from tests.protocol.peers import (
    SITE_KEYS,
    LegacySiteDouble,
    NodeRecorder,
    RawPeer,
    SiteRecorder,
)
from tests.protocol.test_connections import login_raw

KIB = 1024


def closed(net: MemoryNet, peer: RawPeer) -> None:
    """``peer``'s connection is closed once all is said."""
    net.flush()
    assert peer.is_closed


def padded_heartbeat(payload_size: int) -> bytes:
    """A Heartbeat frame whose payload is exactly ``payload_size`` bytes."""
    base = json.dumps({"time": 1, "pad": ""}, separators=(",", ":")).encode()
    body = base[:-2] + b"x" * (payload_size - len(base)) + b'"}'
    assert len(body) == payload_size
    return HEADER.pack(Heartbeat.TYPE, len(body)) + body


# ---------------------------------------------------------------- frame cap


def test_before_login_a_frame_over_64_kib_is_refused_on_its_header(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    peer.send_raw(HEADER.pack(Heartbeat.TYPE, 64 * KIB + 1))  # the header alone
    closed(net, peer)
    assert peer.of_type(Error) == [
        Error("frame_too_large", f"declared payload of {64 * KIB + 1} bytes exceeds {64 * KIB}")
    ]
    assert site_handler.events == []


def test_before_login_a_frame_of_exactly_64_kib_is_read(net: MemoryNet) -> None:
    factory, port = net.site()
    peer = net.raw(port)
    peer.send_raw(padded_heartbeat(64 * KIB))
    login_raw(net, peer, hello=True)  # still connected, and the login works
    assert not peer.of_type(Error)


def test_after_login_the_configured_maximum_applies(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    login_raw(net, peer)  # legacy: StatusReport is its report
    tasks = tuple(TaskEntry(gid, 1, 0.5) for gid in range(1, 20_001))  # about 900 KiB
    report = StatusReport(tasks)
    peer.send(report)
    net.flush()
    assert site_handler.messages() == [report]
    assert not peer.is_closed


def scripted_site(net: MemoryNet, build: Callable[[], RawPeer]) -> tuple[list[Any], int]:
    """A listener whose every connection is a scripted site ``build()`` makes."""
    sites: list[Any] = []

    def one() -> RawPeer:
        site = build()
        sites.append(site)
        net.peers.append(site)
        return site

    return sites, net.listen(Factory.forProtocol(one))  # type: ignore[arg-type]


class OversizeSite(RawPeer):
    """Greets with a frame header over the pre-login cap."""

    def connectionMade(self) -> None:
        self.send_raw(HEADER.pack(Identity.TYPE, 64 * KIB + 1))


class MuteSite(LegacySiteDouble):
    """Sends Identity, then never answers the Login."""

    def frame_received(self, type_: int, message: Any) -> None:
        pass


def test_the_node_applies_the_same_cap_to_a_site_before_login(net: MemoryNet) -> None:
    sites, port = scripted_site(net, OversizeSite)
    node = NodeRecorder()
    net.node(port, node)
    assert sites[0].of_type(Error)[0].code == "frame_too_large"
    assert node.kinds() == []


# ---------------------------------------------------------------- login deadline


def test_heartbeats_before_login_do_not_extend_the_30_s_deadline(net: MemoryNet) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    assert peer.of_type(Identity)
    (session,) = factory.connections
    clock = net.clock
    for _ in range(29):  # a Heartbeat every second: each resets only the idle timer
        net.advance(1)
        peer.send(Heartbeat(int(clock.seconds() * 1000)))
        net.flush()
        # The idle timeout (the latest of the session's timers) moved to now + 45 s.
        assert max(c.getTime() for c in clock.getDelayedCalls()) == clock.seconds() + 45
    assert not session.closing
    clock.advance(1)  # 30 s after connecting
    closed(net, peer)
    assert peer.of_type(Error) == [Error("unauthenticated", "no login within 30 s")]
    assert site_handler.events == [] and factory.connections == {}
    assert clock.getDelayedCalls() == []


def test_a_login_just_before_the_deadline_is_kept_past_it(net: MemoryNet) -> None:
    factory, port = net.site()
    peer = net.raw(port)
    net.advance(29)
    login_raw(net, peer, hello=True)
    for _ in range(6):  # 90 s more, heartbeating: the deadline is gone for good
        net.advance(15)
        peer.send(Heartbeat(int(net.clock.seconds() * 1000)))
        net.flush()
        assert len(peer.of_type(Heartbeat)) >= 1
    assert "node-1" in factory.nodes and not peer.is_closed
    assert not peer.of_type(Error)


def test_the_node_drops_a_site_that_never_completes_the_login(net: MemoryNet) -> None:
    sites, port = scripted_site(net, lambda: MuteSite(dict(SITE_KEYS), lambda site: None))
    node = NodeRecorder()
    service = net.node(port, node)
    assert sites[0].of_type(Login)
    net.advance(29)
    assert not sites[0].is_closed
    net.clock.advance(1)
    closed(net, sites[0])
    assert sites[0].of_type(Error) == [Error("unauthenticated", "no login within 30 s")]
    assert node.kinds() == []
    net.services.remove(service)
    stopped = service.stopService()
    net.flush()
    result_of(stopped)


# ---------------------------------------------------------------- 20 peers that never log in


def test_twenty_peers_that_never_log_in_cost_at_most_64_kib_each(net: MemoryNet) -> None:
    """The issue's case: 20 unauthenticated peers made the site hold 16 MiB each."""
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    # Ten declare a 16 MiB frame and start sending it: refused on the header.
    greedy = [net.raw(port) for _ in range(10)]
    for peer in greedy:
        peer.send_raw(HEADER.pack(StatusReport.TYPE, 16 * 1024 * KIB) + b"x" * KIB)
    # Ten hold a partial frame just under the cap: kept, but only until 30 s.
    patient = [net.raw(port) for _ in range(10)]
    for peer in patient:
        peer.send_raw(HEADER.pack(Heartbeat.TYPE, 64 * KIB) + b"x" * (64 * KIB - 1))
    for peer in greedy:
        closed(net, peer)
        assert [e.code for e in peer.of_type(Error)] == ["frame_too_large"]
    assert len(factory.connections) == 10
    assert all(len(s._buffer) == 5 + 64 * KIB - 1 for s in factory.connections)
    held = sum(len(s._buffer) for s in factory.connections)
    assert held <= 10 * (64 * KIB + 5)
    net.clock.advance(30)
    for peer in patient:
        closed(net, peer)
        assert peer.of_type(Error) == [Error("unauthenticated", "no login within 30 s")]
    assert factory.connections == {} and site_handler.events == []


# ---------------------------------------------------------------- signatures (mutation gaps)


def mutations(good: str) -> dict[str, str]:
    flipped = "".join("0" if c != "0" else "1" for c in good[8:])
    return {
        "only the first 8 hex characters match": good[:8] + flipped,
        "truncated to 63": good[:63],
        "truncated to 8": good[:8],
        "empty": "",
        "one character longer": good + "0",
        "twice as long": good + good,
        "the last character changed": good[:-1] + ("0" if good[-1] != "0" else "1"),
        "non-ASCII of the same length": "é" * len(good),
    }


@pytest.mark.parametrize("mutation", list(mutations("0" * 64)), ids=lambda m: m.replace(" ", "-"))
def test_a_signature_that_is_not_exactly_right_is_refused(net: MemoryNet, mutation: str) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    good = sign_login(SITE_KEYS["node-1"], peer.of_type(Identity)[0].nonce, "node-1")
    signature = mutations(good)[mutation]
    assert signature != good
    peer.send(Login("node-1", signature))
    closed(net, peer)
    assert peer.of_type(LoginResult) == [LoginResult(False, "bad signature")]
    assert site_handler.events == [] and factory.nodes == {}


def test_the_exact_signature_is_accepted(net: MemoryNet) -> None:
    # The control for the test above: the same peer with the right signature logs in.
    factory, port = net.site()
    peer = net.raw(port)
    login_raw(net, peer)
    assert "node-1" in factory.nodes


@pytest.mark.parametrize("node_id", ["bad id!", "x" * 65, ""], ids=repr)
def test_a_node_id_outside_its_pattern_is_bad_message(net: MemoryNet, node_id: str) -> None:
    site_handler = SiteRecorder()
    factory, port = net.site(site_handler)
    peer = net.raw(port)
    peer.send(Login(node_id, sign_login("s3cret", peer.of_type(Identity)[0].nonce, node_id)))
    closed(net, peer)
    assert [e.code for e in peer.of_type(Error)] == ["bad_message"]
    assert peer.of_type(LoginResult) == [] and site_handler.events == []


# ---------------------------------------------------------------- refusals, rate-limited


def refusal_lines(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e.get("log_namespace") == "tasknet.site.node_listener"
        and "login refused" in e.get("log_format", "")
    ]


def refused_login(net: MemoryNet, port: int, node_id: str = "node-1") -> None:
    peer = net.raw(port)
    peer.send(Login(node_id, sign_login("wrong", peer.of_type(Identity)[0].nonce, node_id)))
    closed(net, peer)
    assert peer.of_type(LoginResult) == [LoginResult(False, "bad signature")]


def test_repeated_refusals_are_logged_once_per_interval_with_a_count(net: MemoryNet) -> None:
    factory, port = net.site(log_interval=60.0)
    with capturedLogs() as events:
        for _ in range(10):  # one a second, as a node with a wrong secret did
            refused_login(net, port)
            net.advance(1)
        refused_login(net, port, "node-2")  # another node: its own line
        first = refusal_lines(list(events))
        net.advance(50)  # 60 s after the first line
        refused_login(net, port)
        lines = refusal_lines(list(events))
    assert len(first) == 2
    assert [(e["node_id"], e["repeats"], e["log_level"]) for e in first] == [
        ("node-1", 0, LogLevel.warn),
        ("node-2", 0, LogLevel.warn),
    ]
    assert len(lines) == 3
    summary = lines[-1]
    assert (summary["node_id"], summary["repeats"]) == ("node-1", 9)
    assert "9 more since the last line" in formatEvent(summary)
    assert "bad signature" in formatEvent(summary)
