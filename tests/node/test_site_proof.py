"""The node's side of mutual authentication (PROTOCOL.md, "Mutual
authentication (v2)"): it runs nothing a site sends before that site proved
it knows the node's secret.

A real NodeService dials a scripted listener over loopback TCP: one that is
not the site (accepts any login, cannot prove anything), one that proves
wrongly, a legacy site.  The 10 s proof deadline is checked on a
``task.Clock`` (the link's timers; the bytes still go over real TCP).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import ISSLTransport
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, capturedLogs, formatEvent
from zope.interface import directlyProvides

from tasknet.node.link import PROOF_TIMEOUT, SiteLinkFactory
from tasknet.protocol.messages import (
    FEATURE_SITE_PROOF,
    HEADER,
    DeleteGallery,
    DownloadPost,
    Error,
    Goodbye,
    Identity,
    Login,
    LoginResult,
    NodeChallenge,
    ProtocolHello,
    TaskCommand,
    TaskReport,
    decode,
    encode,
)
from tasknet.runtime import SeededEntropy
from tests.eventually import eventually
from tests.node.harness import SECRET, node_rows, start_node
from tests.node.site_peer import ScriptedSite
from tests.protocol.peers import NodeRecorder

GID = 7300


def archive_of(data: Path, gid: int) -> Path:
    """A file the node already holds for ``gid`` (a DELETE that ran would remove it)."""
    (data / "archives").mkdir(parents=True, exist_ok=True)
    path = data / "archives" / f"{gid}-000000000000.zip"
    path.write_bytes(b"kept")
    return path


def errors(logged: list[dict[str, Any]]) -> list[str]:
    return [formatEvent(e) for e in logged if e.get("log_level") is LogLevel.error]


async def listening(site: ScriptedSite) -> ScriptedSite:
    await site.listen()
    return site


@pytest_twisted.ensureDeferred
async def test_a_listener_that_is_not_the_site_gets_the_login_but_no_command_runs(
    tmp_path: Path,
) -> None:
    # It accepts any Login (it cannot check it) and cannot answer the
    # challenge: it sends a DELETE and a legacy DeleteGallery instead.
    fake = await listening(ScriptedSite("unknown", accept_any=True, proof="none"))
    data = tmp_path / "node"
    kept = archive_of(data, GID)
    with capturedLogs() as logged:
        node = await start_node(fake, data)
        try:
            await eventually(lambda: fake.challenges >= 1, what="the challenge")
            connection = fake.connections[-1]
            connection.send(TaskCommand("del-x", "DELETE", GID, "g", ""))
            connection.send(DeleteGallery(GID))
            await connection.closed  # the node hangs up
            await eventually(lambda: node.client.link_factory.failed_logins >= 1, what="backoff")
            assert node.link is None
        finally:
            await node.stopService()
            await fake.stop()
    assert fake.of_type(Login), "the node did log in: the listener has its Login"
    assert kept.exists(), "the DELETE deleted nothing"
    assert node_rows(data, "SELECT * FROM received_command") == []
    assert node_rows(data, "SELECT * FROM deletion") == []
    # Nothing but the challenge (and heartbeats, Goodbye, Error) after the Login.
    after = fake.frame_types[fake.frame_types.index(Login.TYPE) + 1 :]
    assert set(after) <= {NodeChallenge.TYPE, 3, Error.TYPE, Goodbye.TYPE}, after
    assert not fake.of_type(TaskReport)
    assert any("before proving itself" in line for line in errors(logged))


@pytest_twisted.ensureDeferred
async def test_a_wrong_site_proof_closes_the_connection(tmp_path: Path) -> None:
    wrong = await listening(ScriptedSite(SECRET, proof="wrong"))
    data = tmp_path / "node"
    with capturedLogs() as logged:
        node = await start_node(wrong, data)
        try:
            await eventually(lambda: wrong.challenges >= 2, what="a redial after the close")
            assert node.link is None and wrong.logins == 0
        finally:
            await node.stopService()
            await wrong.stop()
    [error, *_] = wrong.of_type(Error)
    assert (error.code, error.message) == ("auth_failed", "wrong SiteProof")
    assert not wrong.of_type(TaskReport)
    assert any("wrong SiteProof" in line for line in errors(logged))


@pytest_twisted.ensureDeferred
async def test_the_real_kind_of_proof_brings_the_link_up(tmp_path: Path) -> None:
    site = await listening(ScriptedSite(SECRET))
    try:
        node = await start_node(site, tmp_path / "node")
        try:
            await site.logged_in()
            await eventually(lambda: node.link, what="link up")
            [hello] = site.of_type(ProtocolHello)
            assert FEATURE_SITE_PROOF in hello.features
            [challenge] = site.of_type(NodeChallenge)
            assert len(challenge.nonce) == 32 and int(challenge.nonce, 16) >= 0
            assert node.client.link_factory.failed_logins == 0
        finally:
            await node.stopService()
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_no_proof_within_10_s_on_the_nodes_clock_closes() -> None:
    silent = await listening(ScriptedSite(SECRET, proof="none"))
    clock = Clock()
    node = NodeRecorder()
    factory = SiteLinkFactory("node-1", SECRET, node, clock=clock, entropy=SeededEntropy(0))
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", silent.port.getHost().port)
    link: Any = await endpoint.connect(cast(Any, factory))
    try:
        await eventually(lambda: silent.challenges == 1, what="the challenge")
        clock.advance(PROOF_TIMEOUT - 0.5)
        assert not link.closing
        clock.advance(0.5)
        assert link.closing
        await silent.connections[-1].closed
    finally:
        await silent.stop()
    assert PROOF_TIMEOUT == 10.0
    assert silent.of_type(Error) == [Error("auth_failed", "no SiteProof within 10 s")]
    assert node.events == [] and factory.failed_logins == 1


@pytest_twisted.ensureDeferred
async def test_a_legacy_site_is_refused_after_login_unless_trusted(tmp_path: Path) -> None:
    def commands(connection: Any) -> None:  # right behind its LoginResult
        connection.send(DeleteGallery(GID))
        connection.send(DownloadPost(GID + 1, "t", "n", "http://127.0.0.1:9/x"))

    legacy = await listening(ScriptedSite(SECRET, legacy=True, on_login=commands))
    data = tmp_path / "node"
    kept = archive_of(data, GID)
    try:
        with capturedLogs() as logged:
            node = await start_node(legacy, data)
            try:
                await eventually(lambda: node.client.link_factory.failed_logins >= 1)
                assert node.link is None and legacy.logins >= 1
            finally:
                await node.stopService()
        legacy.on_login = None
        assert any("legacy site" in line for line in errors(logged))
        assert Goodbye("a legacy site cannot prove itself to this node") in legacy.received
        assert kept.exists()
        assert node_rows(data, "SELECT * FROM received_command") == []

        # --trust-legacy-site: served as before.
        node = await start_node(legacy, data, trust_legacy_site=True)
        try:
            await eventually(lambda: node.link, what="link up")
            legacy.legacy_delete(GID)
            await eventually(lambda: not kept.exists(), what="the delete ran")
        finally:
            await node.stopService()
    finally:
        await legacy.stop()


def frames(data: bytes) -> list[Any]:
    out = []
    while data:
        type_, length = HEADER.unpack_from(data)
        out.append(decode(type_, data[HEADER.size : HEADER.size + length]))
        data = data[HEADER.size + length :]
    return out


def legacy_login(*, tls: bool, dialled_tls: bool) -> tuple[NodeRecorder, StringTransport]:
    """A link logging in to a legacy site (Identity, no Hello) on a memory transport."""
    node = NodeRecorder()
    factory = SiteLinkFactory("node-1", SECRET, node, clock=Clock(), entropy=SeededEntropy(1))
    factory.dialled_tls = lambda: dialled_tls
    transport = StringTransport()
    if tls:
        directlyProvides(transport, ISSLTransport)
    link: Any = factory.buildProtocol(None)
    link.makeConnection(transport)
    link.dataReceived(encode(Identity("legacy", "0" * 32)) + encode(LoginResult(True, "")))
    return node, transport


def test_a_legacy_site_over_a_verified_tls_link_is_served() -> None:
    node, _ = legacy_login(tls=True, dialled_tls=True)
    assert node.kinds() == ["up"] and node.link.protocol_version == 1
    # TLS without tls: (ssl: verifies nothing) or tls: over plain TCP: refused.
    for tls, dialled_tls in ((True, False), (False, True)):
        node, transport = legacy_login(tls=tls, dialled_tls=dialled_tls)
        assert node.kinds() == [] and transport.disconnecting
        assert Goodbye("a legacy site cannot prove itself to this node") in frames(
            transport.value()
        )


def test_the_legacy_emulation_never_challenges() -> None:
    node = NodeRecorder()
    factory = SiteLinkFactory(
        "node-1", SECRET, node, protocol=1, clock=Clock(), entropy=SeededEntropy(2)
    )
    transport = StringTransport()
    link: Any = factory.buildProtocol(None)
    link.makeConnection(transport)
    link.dataReceived(
        encode(Identity("site", "0" * 32)) + encode(ProtocolHello()) + encode(LoginResult(True, ""))
    )
    assert node.kinds() == ["up"]
    assert [type(m) for m in frames(transport.value())] == [Login]
