"""``--connect`` repeated: the node dials the sites in turn and fails over by
itself (INTERFACES.md, "Several sites on PostgreSQL").

The rules, on a ``MemoryReactorClock`` (real Twisted endpoints parsed from
their strings, every dial recorded and answered by the test, every delay read
off the clock): each attempt takes the next endpoint, whatever ended the last
one (a refused connect, a refused login, a lost link); the delays between
attempts are the node's one backoff (``login_backoff`` over the retry
policy), forgotten at the next successful login.  Then the same over real
loopback TCP with scripted sites, plain and TLS.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.application.internet import backoffPolicy
from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.endpoints import TCP4ServerEndpoint, serverFromString
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python import usage
from twisted.python.failure import Failure

from tasknet.node.link import SiteClientService, site_client_service
from tasknet.node.service import NodeService, Options, makeService
from tasknet.protocol.messages import (
    HEADER,
    Heartbeat,
    Identity,
    Login,
    LoginResult,
    NodeChallenge,
    ProtocolHello,
    SiteProof,
    decode,
    encode,
    sign_site_proof,
    verify_login,
)
from tasknet.runtime import RealThreadPools, SeededEntropy, SystemEntropy
from tests.eventually import eventually
from tests.node.harness import SECRET, quick_retry
from tests.node.site_peer import ScriptedSite
from tests.protocol.peers import NodeRecorder
from tests.tls_certs import make_ca, make_site_cert

A, B, C = "tcp:127.0.0.1:7101", "tcp:127.0.0.1:7102", "tcp:127.0.0.1:7103"
PORTS = {7101: "A", 7102: "B", 7103: "C"}


def doubling() -> Any:
    # 1, 2, 4, 8 ... for attempts 1, 2, 3, 4, without jitter: delays compare exactly.
    return backoffPolicy(initialDelay=0.5, factor=2.0, maxDelay=60.0, jitter=lambda: 0.0)


class Dialler:
    """The node's link service on a memory reactor; the test plays the sites."""

    def __init__(self, endpoints: Sequence[str], retry_policy: Any = None) -> None:
        self.reactor = MemoryReactorClock()
        self.node = NodeRecorder()
        self.service: SiteClientService = site_client_service(
            endpoints,
            "node-1",
            SECRET,
            self.node,
            reactor=self.reactor,
            entropy=SeededEntropy(0),
            retry_policy=retry_policy or doubling(),
        )
        self.protocol: Any = None
        self.transport: StringTransport | None = None

    def dialled(self) -> list[str]:
        """The sites dialled so far, in order."""
        return [PORTS[port] for _host, port, *_ in self.reactor.tcpClients]

    def retry_delay(self) -> float:
        """The delay of the one retry now scheduled (no link: nothing else runs)."""
        (call,) = self.reactor.getDelayedCalls()
        return call.getTime() - self.reactor.seconds()

    def retry(self) -> None:
        self.reactor.advance(self.retry_delay())

    # answers to the latest dial --------------------------------------------------
    def refuse_connect(self) -> None:
        _host, _port, factory, *_ = self.reactor.tcpClients[-1]
        factory.clientConnectionFailed(
            self.reactor.connectors[-1], Failure(ConnectionRefusedError())
        )

    def accept(self, site: str) -> None:
        host, port, factory, *_ = self.reactor.tcpClients[-1]
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", host, port))
        self.protocol = factory.buildProtocol(IPv4Address("TCP", host, port))
        self.protocol.makeConnection(self.transport)
        self.protocol.dataReceived(encode(Identity(site, "0" * 32)) + encode(ProtocolHello()))

    def answer_login(self, accepted: bool) -> None:
        assert self.transport is not None
        login = [m for m in frames(self.transport.value()) if isinstance(m, Login)][-1]
        assert verify_login(SECRET, "0" * 32, login.node_id, login.signature)
        self.protocol.dataReceived(encode(LoginResult(accepted, "" if accepted else "bad key")))

    def prove(self) -> None:
        """Answer the node's NodeChallenge with the site's proof."""
        assert self.transport is not None
        [challenge] = [m for m in frames(self.transport.value()) if isinstance(m, NodeChallenge)]
        proof = sign_site_proof(SECRET, challenge.nonce, "0" * 32, "node-1")
        self.protocol.dataReceived(encode(SiteProof(proof)))

    def log_in(self, site: str) -> None:
        self.accept(site)
        self.answer_login(True)
        assert self.node.link is None  # not before the site proved itself
        self.prove()
        assert self.node.link is not None

    def refuse_login(self, site: str) -> None:
        self.accept(site)
        self.answer_login(False)
        assert self.transport is not None and self.transport.disconnecting  # the node hangs up
        self.hang_up()

    def hang_up(self) -> None:
        """The connection ends (the site dropped it, or its close completed)."""
        self.protocol.connectionLost(Failure(ConnectionLost("site gone")))
        self.protocol = self.transport = None


def frames(data: bytes) -> list[Any]:
    messages = []
    while data:
        type_, length = HEADER.unpack_from(data)
        messages.append(decode(type_, data[HEADER.size : HEADER.size + length]))
        data = data[HEADER.size + length :]
    return messages


# -- rotation and backoff on the clock -----------------------------------------


def test_failed_connects_move_round_the_endpoints_with_one_growing_backoff() -> None:
    d = Dialler([A, B, C])
    d.service.startService()
    delays = []
    for _ in range(5):
        d.refuse_connect()
        delays.append(d.retry_delay())
        d.retry()
    assert d.dialled() == ["A", "B", "C", "A", "B", "C"]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_a_lost_link_moves_to_the_next_site_not_back_to_the_one_that_dropped_it() -> None:
    d = Dialler([A, B])
    d.service.startService()
    d.refuse_connect()
    d.retry()
    d.log_in("site-b")
    assert d.service.site_endpoints.dialled == B
    d.hang_up()  # site B dies under the node
    assert d.node.kinds() == ["up", "down"]
    assert d.retry_delay() == 1.0  # the first delay: the last login succeeded
    d.retry()
    d.log_in("site-a")
    assert d.dialled() == ["A", "B", "A"]


def test_a_link_that_stays_up_keeps_its_site_and_nothing_is_dialled() -> None:
    d = Dialler([A, B])
    d.service.startService()
    d.log_in("site-a")
    for _ in range(60):  # ten minutes of a healthy site heartbeating
        d.reactor.advance(10)
        d.protocol.dataReceived(encode(Heartbeat(int(d.reactor.seconds() * 1000))))
    assert d.node.kinds() == ["up"]
    assert d.dialled() == ["A"]


def test_the_backoff_is_forgotten_after_a_successful_login_wherever_it_happened() -> None:
    d = Dialler([A, B, C])
    d.service.startService()
    for _ in range(4):  # A, B, C, A refuse: the delays grew to 16 s
        d.refuse_connect()
        d.retry()
    d.log_in("site-b")
    assert d.service.link_factory.failed_logins == 0
    d.hang_up()
    assert d.retry_delay() == 1.0
    d.retry()
    d.refuse_connect()  # C is down as well: growing again from the start
    assert d.retry_delay() == 2.0
    assert d.dialled() == ["A", "B", "C", "A", "B", "C"]


def test_a_refused_login_is_a_failure_that_moves_on_and_keeps_the_backoff_growing() -> None:
    # A has the wrong key for this node (a configuration error, logged as
    # today); B is down.  Neither is dialled in a tight loop, and A keeps its
    # turn: the operator may fix its key without restarting the node.
    d = Dialler([A, B])
    d.service.startService()
    delays = []
    for _ in range(4):
        d.refuse_login("site-a")
        delays.append(d.retry_delay())
        d.retry()
        d.refuse_connect()
        delays.append(d.retry_delay())
        d.retry()
    assert d.dialled() == ["A", "B"] * 4 + ["A"]
    assert d.service.link_factory.failed_logins == 4
    assert delays == [1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0, 16.0]
    d.log_in("site-a")  # key fixed at site A
    assert d.service.link_factory.failed_logins == 0


def test_one_endpoint_is_dialled_every_time_with_the_delays_of_before() -> None:
    d = Dialler([A])
    d.service.startService()
    delays = []
    for _ in range(3):
        d.refuse_connect()
        delays.append(d.retry_delay())
        d.retry()
    d.log_in("site-a")
    d.hang_up()
    delays.append(d.retry_delay())
    assert d.dialled() == ["A"] * 4
    assert delays == [1.0, 2.0, 4.0, 1.0]


def test_a_single_endpoint_string_is_still_accepted() -> None:
    d = Dialler(A)  # type: ignore[arg-type]  # the old call form: one str
    d.service.startService()
    assert d.dialled() == ["A"]


def test_stopping_while_waiting_dials_nothing_more() -> None:
    d = Dialler([A, B])
    d.service.startService()
    d.refuse_connect()
    d.service.stopService()
    d.reactor.advance(3600)
    assert d.dialled() == ["A"]
    assert d.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("bad", ["tcp:127.0.0.1", "nope:1", "tcp:host=a:port=x"])
def test_a_bad_endpoint_among_several_is_refused_before_anything_is_dialled(bad: str) -> None:
    memory = MemoryReactorClock()
    with pytest.raises(ValueError, match=f"--connect '{bad}' is not a usable client endpoint"):
        site_client_service(
            [A, bad], "node-1", SECRET, NodeRecorder(), reactor=memory, entropy=SeededEntropy(0)
        )
    assert memory.tcpClients == []


# -- options ------------------------------------------------------------------------


def parse(*argv: str) -> Options:
    options = Options()
    options.parseOptions(["--secret", "x", *argv])
    return options


def test_connect_is_repeatable_and_keeps_its_order(tmp_path: Path) -> None:
    options = parse("--connect", B, "--connect", "tls:site-a.example:7143:trustRoots=ca")
    assert options["connect"] == (B, "tls:site-a.example:7143:trustRoots=ca")
    options["data"] = str(tmp_path)
    service = makeService(options)
    assert isinstance(service, NodeService)
    assert service.connect == (B, "tls:site-a.example:7143:trustRoots=ca")
    assert parse("--connect", A)["connect"] == (A,)
    assert parse()["connect"] == ("tcp:127.0.0.1:7100",)


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (("--connect", A, "--connect", A), f"--connect {A} is given twice"),
        (("--connect", ""), "--connect needs an endpoint"),
        (("--connect", A, "--connect", " "), "--connect needs an endpoint"),
    ],
)
def test_bad_connect_options_are_refused_clearly(argv: tuple[str, ...], complaint: str) -> None:
    with pytest.raises(usage.UsageError, match=complaint):
        parse(*argv)


@pytest_twisted.ensureDeferred
async def test_a_node_with_a_bad_endpoint_fails_to_start_before_opening_its_store(
    tmp_path: Path,
) -> None:
    node = NodeService(
        connect=[A, "tcp:127.0.0.1"],
        node_id="node-t",
        secret=SECRET,
        data=str(tmp_path / "n"),
        reactor=reactor,
        threads=RealThreadPools(),
        entropy=SystemEntropy(),
    )
    node.startService()
    with pytest.raises(ValueError, match="'tcp:127.0.0.1' is not a usable client endpoint"):
        await node.ready
    await node.stopService()
    assert not (tmp_path / "n" / "node.sqlite").exists()


# -- real loopback TCP --------------------------------------------------------------


@pytest_twisted.async_yield_fixture
async def two_sites() -> AsyncIterator[tuple[ScriptedSite, ScriptedSite]]:
    first, second = ScriptedSite(SECRET), ScriptedSite(SECRET)
    first.name, second.name = "site-a", "site-b"
    await first.listen()
    await second.listen()
    try:
        yield first, second
    finally:
        await first.stop()
        await second.stop()


def start(connect: Sequence[str], data: Path) -> NodeService:
    node = NodeService(
        connect=connect,
        node_id="node-t",
        secret=SECRET,
        data=str(data),
        retry_policy=quick_retry,
        debounce=0.05,
        reactor=reactor,
        threads=RealThreadPools(),
        entropy=SystemEntropy(),
    )
    node.startService()
    return node


@pytest_twisted.ensureDeferred
async def test_node_fails_over_to_the_second_site_then_back_to_the_first(
    tmp_path: Path, two_sites: tuple[ScriptedSite, ScriptedSite]
) -> None:
    first, second = two_sites
    endpoint_a, endpoint_b = first.endpoint, second.endpoint
    port_a = first.port.getHost().port
    await first.port.stopListening()  # site A is down: its port refuses
    first.port = None
    node = start([endpoint_a, endpoint_b], tmp_path / "node")
    try:
        await node.ready
        await second.logged_in(1)
        assert node.client.site_endpoints.dialled == endpoint_b
        # Site A comes back; site B then drops the node (dying, say).
        first.port = await TCP4ServerEndpoint(reactor, port_a, interface="127.0.0.1").listen(first)
        await second.drop_connections()
        await first.logged_in(1)
        assert node.client.site_endpoints.dialled == endpoint_a
        link: Any = await eventually(lambda: node.link, what="the link to site A")
        assert link.transport.getPeer().port == port_a
        assert (second.logins, second.connections) == (1, [])  # not redialled
    finally:
        await node.stopService()


@pytest_twisted.ensureDeferred
async def test_a_tls_endpoint_with_trust_roots_takes_its_turn(
    tmp_path: Path, two_sites: tuple[ScriptedSite, ScriptedSite]
) -> None:
    refusing, _ = two_sites
    down = refusing.endpoint
    await refusing.port.stopListening()
    refusing.port = None
    ca, ca_key = make_ca(tmp_path / "ca", "tasknet test CA")
    key, cert = make_site_cert(tmp_path, ca, ca_key)
    secure = ScriptedSite(SECRET)
    secure.port = await serverFromString(
        reactor, f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
    ).listen(secure)
    tls = f"tls:localhost:{secure.port.getHost().port}:trustRoots={tmp_path / 'ca'}"
    node = start([down, tls], tmp_path / "node")
    try:
        await node.ready
        await secure.logged_in(1)
        link: Any = await eventually(lambda: node.link, what="the link over TLS")
        assert link.transport.getPeerCertificate() is not None  # TLS, not plain TCP
    finally:
        await node.stopService()
        await secure.stop()
