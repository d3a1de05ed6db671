"""The site's side of mutual authentication (PROTOCOL.md, "Mutual
authentication (v2)"), over real loopback TCP with raw node peers: a node
that announces ``site-proof`` is attached (and so sent anything) only after
the site answered its NodeChallenge; a node of the previous release gets no
proof and is served as before.
"""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet.task import Clock

from tasknet.protocol.messages import (
    FEATURE_RELIABLE,
    FEATURE_SITE_PROOF,
    Error,
    Identity,
    Login,
    LoginResult,
    NodeChallenge,
    ProtocolHello,
    SiteProof,
    StatusReport,
    TaskCommand,
    TaskReport,
    sign_login,
    verify_site_proof,
)
from tasknet.site.session_states import SessionState
from tests.protocol.peers import (
    SITE_KEYS,
    Harness,
    NodeRecorder,
    RawPeer,
    SiteRecorder,
    eventually,
    login_raw,
)

PROVING = ProtocolHello(2, (FEATURE_RELIABLE, FEATURE_SITE_PROOF))
NODE_NONCE = "ffeeddccbbaa99887766554433221100"


async def login_asking_for_proof(peer: RawPeer, node_id: str = "node-1") -> str:
    """Hello with site-proof, then Login; returns the site's Identity nonce."""
    await eventually(lambda: peer.of_type(Identity))
    nonce = peer.of_type(Identity)[0].nonce
    peer.send(PROVING)
    peer.send(Login(node_id, sign_login(SITE_KEYS[node_id], nonce, node_id)))
    await eventually(lambda: peer.of_type(LoginResult))
    assert peer.of_type(LoginResult) == [LoginResult(True, "")]
    return str(nonce)


@pytest_twisted.ensureDeferred
async def test_the_site_proves_itself_and_attaches_the_node_only_then(harness: Harness) -> None:
    handler = SiteRecorder()
    factory, port = await harness.site(handler)
    peer = await harness.raw(port)
    site_nonce = await login_asking_for_proof(peer)
    # Logged in, not attached: the dispatcher cannot know it, nothing is sent.
    assert handler.events == [] and "node-1" not in factory.nodes
    peer.send(NodeChallenge(NODE_NONCE))
    await eventually(lambda: peer.of_type(SiteProof))
    [proof] = peer.of_type(SiteProof)
    assert verify_site_proof(SITE_KEYS["node-1"], NODE_NONCE, site_nonce, "node-1", proof.signature)
    await eventually(lambda: handler.kinds() == ["attached"])
    session = factory.nodes["node-1"]
    assert session.features == (FEATURE_RELIABLE, FEATURE_SITE_PROOF)
    # Nothing but the proof came between LoginResult and the first command.
    session.send_download("op-1", 7, "tok", "n", "http://127.0.0.1/f", 100)
    await eventually(lambda: peer.of_type(TaskCommand))
    after = peer.types()[peer.types().index(LoginResult.TYPE) + 1 :]
    assert [t for t in after if t != 3] == [SiteProof.TYPE, TaskCommand.TYPE]
    assert peer.of_type(TaskCommand) == [
        TaskCommand("op-1", "DOWNLOAD", 7, "n", "http://127.0.0.1/f", 100)
    ]


@pytest_twisted.ensureDeferred
async def test_a_report_before_the_challenge_is_a_violation(harness: Harness) -> None:
    handler = SiteRecorder()
    factory, port = await harness.site(handler)
    peer = await harness.raw(port)
    await login_asking_for_proof(peer)
    peer.send(TaskReport("r", 1, (), {}, ()))
    await peer.closed
    assert [e.code for e in peer.of_type(Error)] == ["protocol_violation"]
    assert handler.events == [] and not peer.of_type(SiteProof)


@pytest_twisted.ensureDeferred
async def test_a_second_challenge_is_a_violation(harness: Harness) -> None:
    handler = SiteRecorder()
    _factory, port = await harness.site(handler)
    peer = await harness.raw(port)
    await login_asking_for_proof(peer)
    peer.send(NodeChallenge(NODE_NONCE))
    peer.send(NodeChallenge("00" * 16))  # asking the site to sign a nonce of our choosing
    await peer.closed
    assert len(peer.of_type(SiteProof)) == 1
    assert peer.of_type(Error) == [Error("protocol_violation", "a second NodeChallenge")]
    assert handler.kinds() == ["attached", "detached"]


@pytest_twisted.ensureDeferred
async def test_no_challenge_within_the_login_timeout_closes(harness: Harness) -> None:
    handler = SiteRecorder()
    clock = Clock()
    factory, port = await harness.site(handler, clock=clock)
    peer = await harness.raw(port)
    await login_asking_for_proof(peer)
    clock.advance(factory.login_timeout - 1)
    assert not peer.is_closed
    clock.advance(1)
    await peer.closed
    assert [e.code for e in peer.of_type(Error)] == ["protocol_violation"]
    assert handler.events == []


@pytest_twisted.ensureDeferred
async def test_a_node_of_the_previous_release_gets_no_proof_and_is_served(
    harness: Harness,
) -> None:
    handler = SiteRecorder()
    factory, port = await harness.site(handler)
    peer = await harness.raw(port)
    await login_raw(peer, hello=True)  # Hello ["reliable-task-v2"]: no site-proof
    await eventually(lambda: handler.kinds() == ["attached"])  # at login, as before
    session = factory.nodes["node-1"]
    session.send_download("op-1", 7, "tok", "n", "http://127.0.0.1/f")
    peer.send(StatusReport(()))
    await eventually(lambda: peer.of_type(TaskCommand) and handler.messages())
    assert not peer.of_type(SiteProof)
    # size 0 on its wire: a field that release's tolerant reader ignores.
    assert peer.of_type(TaskCommand)[0].size == 0


@pytest_twisted.ensureDeferred
async def test_type_14_before_login_is_unauthenticated(harness: Harness) -> None:
    handler = SiteRecorder()
    _factory, port = await harness.site(handler)
    peer = await harness.raw(port)
    await eventually(lambda: peer.of_type(Identity))
    peer.send(PROVING)
    peer.send(NodeChallenge(NODE_NONCE))
    await peer.closed
    assert [e.code for e in peer.of_type(Error)] == ["unauthenticated"]
    assert not peer.of_type(SiteProof) and handler.events == []


@pytest_twisted.ensureDeferred
async def test_a_challenge_on_a_legacy_connection_is_a_violation(harness: Harness) -> None:
    _factory, port = await harness.site()
    peer = await harness.raw(port)
    await login_raw(peer)  # no Hello: legacy; types 14 and 15 are v2 only
    peer.send(NodeChallenge(NODE_NONCE))
    await peer.closed
    assert [e.code for e in peer.of_type(Error)] == ["protocol_violation"]
    assert not peer.of_type(SiteProof)


@pytest_twisted.ensureDeferred
async def test_the_real_node_and_the_real_listener_authenticate_each_other(
    harness: Harness,
) -> None:
    handler = SiteRecorder()
    factory, port = await harness.site(handler)
    node = NodeRecorder()
    harness.node(port, node)
    await eventually(lambda: node.kinds() == ["up"] and "node-1" in factory.nodes)
    session: Any = factory.nodes["node-1"]
    assert session.life.state is SessionState.CURRENT_PROVEN  # proved, then attached
    assert handler.kinds() == ["attached"]


@pytest_twisted.ensureDeferred
async def test_an_older_connection_proven_after_a_newer_login_is_not_attached(
    harness: Harness,
) -> None:
    # Newest wins by login: the connection that logged in first but asked
    # for its proof last must not replace the newer one.
    handler = SiteRecorder()
    factory, port = await harness.site(handler)
    older, newer = await harness.raw(port), await harness.raw(port)
    await login_asking_for_proof(older)
    await login_asking_for_proof(newer)
    newer.send(NodeChallenge(NODE_NONCE))
    await eventually(lambda: handler.kinds() == ["attached"])
    current = factory.nodes["node-1"]
    older.send(NodeChallenge(NODE_NONCE))
    await eventually(lambda: older.is_closed)
    assert factory.nodes["node-1"] is current
    assert handler.kinds() == ["attached"]
