"""The node's link as one machine (``SiteLink.TRANSITIONS`` in
tasknet/node/link.py, issue 37): every input in every state, and the table
against real connections.

:data:`EXPECTED` says, independently of the table, what each input does in
each state: the next state and what can be seen of it (the frames the node
sends, whether it closes, what its handler hears, the backoff count, the
log line).  ``test_every_input_in_every_state`` drives a link on a memory
transport and a ``task.Clock`` into each state through the wire, gives it
each input and compares.  The real-connection tests run the link against
the real site listener and a legacy site double in memory (iosim), and a
scripted site for the odd turns, and check that every step the link took
is the table's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.python.failure import Failure

from tasknet.node.link import PROOF_TIMEOUT, LinkInput, LinkState, SiteLink, SiteLinkFactory
from tasknet.protocol.messages import (
    HEADER,
    Error,
    Goodbye,
    Heartbeat,
    Identity,
    Login,
    LoginResult,
    Message,
    ProtocolHello,
    SiteProof,
    TaskCommand,
    decode,
    encode,
    sign_site_proof,
)
from tasknet.runtime import SeededEntropy
from tests.protocol.memory import MemoryNet
from tests.protocol.peers import SITE_KEYS, NodeRecorder, RawPeer, described

S = LinkState
I = LinkInput  # noqa: E741
NODE = "node-1"
SECRET = SITE_KEYS[NODE]
NONCE = "00112233445566778899aabbccddeeff"


# ---------------------------------------------------------------- what each cell does


@dataclass(frozen=True)
class Seen:
    """What one input visibly did."""

    #: Frames the node sent, as :func:`described`.
    sent: tuple[str, ...] = ()
    #: The node started closing the connection.
    closes: bool = False
    #: What the handler heard ("up", "message", "down").
    handler: tuple[str, ...] = ()
    #: ``failed_logins``: "same", "+1" or "reset" (to 0).
    failed: str = "same"
    #: A line of the link's log (at error or info) that says this.
    logs: str | None = None
    #: The site's Hello is kept (it decides v2 at LoginResult).
    keeps_hello: bool = False


NOTHING = Seen()


def refused(code: str, message: str, logs: str | None = None) -> Seen:
    return Seen(sent=(f"Error {code}: {message}",), closes=True, logs=logs)


def violation(message: str) -> Seen:
    return refused("protocol_violation", message)


EARLY_RESULT = violation("LoginResult before Identity")
LOST = Seen(failed="+1")

#: (state, input) -> (next state, what is seen).  The gated cells (a message
#: PeerProtocol answers before the machine) are given straight to the machine.
EXPECTED: dict[tuple[LinkState, LinkInput], tuple[LinkState, Seen]] = {
    (S.CONNECTED, I.SITE_HELLO): (S.CONNECTED, Seen(keeps_hello=True)),
    (S.CONNECTED, I.IDENTITY): (S.IDENTIFIED, Seen(sent=("Login",))),
    (S.CONNECTED, I.IDENTITY_BAD_NONCE): (
        S.REFUSED,
        refused(
            "bad_message",
            "Identity.nonce must be 32 hex characters (PROTOCOL.md); got 7 characters: 'not hex'",
        ),
    ),
    (S.CONNECTED, I.LOGIN): (S.REFUSED, violation("Login from the site")),
    (S.CONNECTED, I.LOGIN_REFUSED): (S.REFUSED, EARLY_RESULT),
    (S.CONNECTED, I.LOGIN_ACCEPTED_V2): (S.REFUSED, EARLY_RESULT),
    (S.CONNECTED, I.LOGIN_ACCEPTED_LEGACY): (S.REFUSED, EARLY_RESULT),
    (S.CONNECTED, I.LOGIN_ACCEPTED_UNTRUSTED): (S.REFUSED, EARLY_RESULT),
    (S.CONNECTED, I.SITE_PROOF_GOOD): (S.REFUSED, violation("SiteProof out of turn")),
    (S.CONNECTED, I.SITE_PROOF_BAD): (S.REFUSED, violation("SiteProof out of turn")),
    (S.CONNECTED, I.COMMAND): (S.REFUSED, violation("TaskCommand out of turn")),
    (S.CONNECTED, I.PROOF_DEADLINE): (S.CONNECTED, NOTHING),
    (S.CONNECTED, I.CONNECTION_LOST): (S.DOWN, LOST),
    (S.IDENTIFIED, I.SITE_HELLO): (S.IDENTIFIED, Seen(keeps_hello=True)),
    (S.IDENTIFIED, I.IDENTITY): (S.REFUSED, violation("a second Identity")),
    (S.IDENTIFIED, I.IDENTITY_BAD_NONCE): (S.REFUSED, violation("a second Identity")),
    (S.IDENTIFIED, I.LOGIN): (S.REFUSED, violation("Login from the site")),
    (S.IDENTIFIED, I.LOGIN_REFUSED): (
        S.REFUSED,
        Seen(closes=True, logs="refused node node-1: bad signature"),
    ),
    (S.IDENTIFIED, I.LOGIN_ACCEPTED_V2): (S.PROVING, Seen(sent=("NodeChallenge",))),
    (S.IDENTIFIED, I.LOGIN_ACCEPTED_LEGACY): (
        S.UP,
        Seen(handler=("up",), failed="reset", logs="node node-1 logged in to the site site-x"),
    ),
    (S.IDENTIFIED, I.LOGIN_ACCEPTED_UNTRUSTED): (
        S.REFUSED,
        Seen(
            sent=("Goodbye: a legacy site cannot prove itself to this node",),
            closes=True,
            logs="is a legacy site (no Hello before LoginResult)",
        ),
    ),
    (S.IDENTIFIED, I.SITE_PROOF_GOOD): (S.REFUSED, violation("SiteProof out of turn")),
    (S.IDENTIFIED, I.SITE_PROOF_BAD): (S.REFUSED, violation("SiteProof out of turn")),
    (S.IDENTIFIED, I.COMMAND): (S.REFUSED, violation("TaskCommand out of turn")),
    (S.IDENTIFIED, I.PROOF_DEADLINE): (S.IDENTIFIED, NOTHING),
    (S.IDENTIFIED, I.CONNECTION_LOST): (S.DOWN, LOST),
    (S.PROVING, I.SITE_HELLO): (S.PROVING, NOTHING),
    (S.PROVING, I.IDENTITY): (S.REFUSED, violation("Identity out of turn")),
    (S.PROVING, I.IDENTITY_BAD_NONCE): (S.REFUSED, violation("Identity out of turn")),
    (S.PROVING, I.LOGIN): (S.REFUSED, violation("Login out of turn")),
    (S.PROVING, I.LOGIN_REFUSED): (S.REFUSED, violation("LoginResult out of turn")),
    (S.PROVING, I.LOGIN_ACCEPTED_V2): (S.REFUSED, violation("LoginResult out of turn")),
    (S.PROVING, I.LOGIN_ACCEPTED_LEGACY): (S.REFUSED, violation("LoginResult out of turn")),
    (S.PROVING, I.LOGIN_ACCEPTED_UNTRUSTED): (S.REFUSED, violation("LoginResult out of turn")),
    (S.PROVING, I.SITE_PROOF_GOOD): (
        S.UP,
        Seen(handler=("up",), failed="reset", logs="node node-1 logged in to the site site-x"),
    ),
    (S.PROVING, I.SITE_PROOF_BAD): (
        S.REFUSED,
        refused("auth_failed", "wrong SiteProof", logs="sent a wrong SiteProof"),
    ),
    (S.PROVING, I.COMMAND): (
        S.REFUSED,
        refused(
            "protocol_violation",
            "TaskCommand before SiteProof",
            logs="sent TaskCommand before proving itself; closing",
        ),
    ),
    (S.PROVING, I.PROOF_DEADLINE): (
        S.REFUSED,
        refused("auth_failed", "no SiteProof within 10 s", logs="no SiteProof from the site"),
    ),
    (S.PROVING, I.CONNECTION_LOST): (S.DOWN, LOST),
    (S.UP, I.SITE_HELLO): (S.UP, NOTHING),
    (S.UP, I.IDENTITY): (S.UP, violation("Identity out of turn")),
    (S.UP, I.IDENTITY_BAD_NONCE): (S.UP, violation("Identity out of turn")),
    (S.UP, I.LOGIN): (S.UP, violation("Login out of turn")),
    (S.UP, I.LOGIN_REFUSED): (S.UP, violation("LoginResult out of turn")),
    (S.UP, I.LOGIN_ACCEPTED_V2): (S.UP, violation("LoginResult out of turn")),
    (S.UP, I.LOGIN_ACCEPTED_LEGACY): (S.UP, violation("LoginResult out of turn")),
    (S.UP, I.LOGIN_ACCEPTED_UNTRUSTED): (S.UP, violation("LoginResult out of turn")),
    (S.UP, I.SITE_PROOF_GOOD): (S.UP, violation("SiteProof without a NodeChallenge")),
    (S.UP, I.SITE_PROOF_BAD): (S.UP, violation("SiteProof without a NodeChallenge")),
    (S.UP, I.COMMAND): (S.UP, Seen(handler=("message",))),
    (S.UP, I.PROOF_DEADLINE): (S.UP, NOTHING),
    (S.UP, I.CONNECTION_LOST): (
        S.DOWN,
        Seen(handler=("down",), logs="link to the site lost: Connection was closed cleanly."),
    ),
    **{(S.REFUSED, i): (S.REFUSED, NOTHING) for i in I if i is not I.CONNECTION_LOST},
    (S.REFUSED, I.CONNECTION_LOST): (S.DOWN, LOST),
    **{(S.DOWN, i): (S.DOWN, NOTHING) for i in I},
}


# ---------------------------------------------------------------- a link in memory


def describe(message: Message) -> str:
    if isinstance(message, Error):
        return f"Error {message.code}: {message.message}"
    if isinstance(message, Goodbye):
        return f"Goodbye: {message.reason}"
    return type(message).__name__


class Rig:
    """One SiteLink on a StringTransport, its timers on a Clock."""

    def __init__(self, *, protocol: int = 2, trust_legacy_site: bool = False) -> None:
        self.clock = Clock()
        self.node = NodeRecorder()
        self.factory = SiteLinkFactory(
            NODE,
            SECRET,
            self.node,
            protocol=protocol,
            clock=self.clock,
            entropy=SeededEntropy(5),
            trust_legacy_site=trust_legacy_site,
        )
        self.factory.failed_logins = 3  # so that +1 and a reset both show
        self.transport = StringTransport()
        self.link: SiteLink = self.factory.buildProtocol(None)
        self.link.makeConnection(self.transport)

    def feed(self, *messages: Message) -> None:
        self.link.dataReceived(b"".join(encode(m) for m in messages))

    def proof(self) -> SiteProof:
        [challenge] = [m for m in self.sent_messages() if type(m).__name__ == "NodeChallenge"]
        return SiteProof(sign_site_proof(SECRET, challenge.nonce, NONCE, NODE))

    def sent_messages(self) -> list[Any]:
        data, out = self.transport.value(), []
        while data:
            type_, length = HEADER.unpack_from(data)
            out.append(decode(type_, data[HEADER.size : HEADER.size + length]))
            data = data[HEADER.size + length :]
        return out

    def lose(self) -> None:
        self.link.connectionLost(Failure(ConnectionDone()))

    def deadline_armed(self) -> bool:
        deadline = self.link._proof_deadline
        return deadline is not None and deadline.active()


def rig_in(state: LinkState) -> Rig:
    """A link brought into ``state`` through the wire (a v2 site)."""
    rig = Rig()
    if state is S.REFUSED:
        rig.feed(Identity("site-x", "not hex"))
    elif state is S.DOWN:
        rig.lose()
    elif state is not S.CONNECTED:
        rig.feed(Identity("site-x", NONCE), ProtocolHello())
        if state is not S.IDENTIFIED:
            rig.feed(LoginResult(True, ""))
            if state is S.UP:
                rig.feed(rig.proof())
    assert rig.link.state is state
    return rig


#: A message that is each input, for the cells given straight to the machine.
EVENTS: dict[LinkInput, Message] = {
    I.SITE_HELLO: ProtocolHello(),
    I.IDENTITY: Identity("site-y", "ab" * 16),
    I.IDENTITY_BAD_NONCE: Identity("site-y", "not hex"),
    I.LOGIN: Login("node-x", "0" * 64),
    I.LOGIN_REFUSED: LoginResult(False, "bad signature"),
    I.LOGIN_ACCEPTED_V2: LoginResult(True, ""),
    I.LOGIN_ACCEPTED_LEGACY: LoginResult(True, ""),
    I.LOGIN_ACCEPTED_UNTRUSTED: LoginResult(True, ""),
    I.SITE_PROOF_GOOD: SiteProof("1" * 64),
    I.SITE_PROOF_BAD: SiteProof("2" * 64),
    I.COMMAND: TaskCommand("op-1", "DELETE", 7, "g", ""),
}


def give(rig: Rig, what: LinkInput) -> None:
    """Give ``what`` to the link: the deadline by the clock when it is armed,
    the loss by ``connectionLost``, a message straight to the machine."""
    if what is I.PROOF_DEADLINE and rig.deadline_armed():
        rig.clock.advance(PROOF_TIMEOUT)
    elif what is I.CONNECTION_LOST:
        rig.lose()
    elif what is I.PROOF_DEADLINE:
        rig.link._input(what)
    else:
        rig.link._input(what, EVENTS[what])


def link_lines(logged: list[dict[str, Any]]) -> list[str]:
    return [
        formatEvent(e)
        for e in logged
        if e.get("log_namespace") == "tasknet.node.link"
        and e.get("log_level") in (LogLevel.error, LogLevel.info)
    ]


# ---------------------------------------------------------------- the table


def test_the_table_has_every_input_in_every_state_and_only_link_outputs() -> None:
    assert set(SiteLink.TRANSITIONS) == {(s, i) for s in S for i in I}
    assert set(EXPECTED) == set(SiteLink.TRANSITIONS)
    for _, outputs in SiteLink.TRANSITIONS.values():
        for output in outputs:
            assert getattr(SiteLink, output.__name__) is output


def test_no_flag_beside_the_state() -> None:
    rig = Rig()
    flags = {name for name, value in vars(rig.link).items() if isinstance(value, bool)}
    # PeerProtocol's own (strict reader, closing) and none of the link's life.
    assert not flags & {"_logged_in", "_up", "_challenge"}, flags


@pytest.mark.parametrize(
    ("state", "what"),
    [(s, i) for s in S for i in I],
    ids=[f"{s.name}-{i.name}" for s in S for i in I],
)
def test_every_input_in_every_state(state: LinkState, what: LinkInput) -> None:
    rig = rig_in(state)
    next_state, seen = EXPECTED[state, what]
    assert SiteLink.TRANSITIONS[state, what][0] is next_state
    sent_before = len(rig.transport.value())
    closed_before = rig.transport.disconnecting
    heard_before = len(rig.node.events)
    failed_before = rig.factory.failed_logins
    with capturedLogs() as logged:
        give(rig, what)

    assert rig.link.state is next_state
    assert described_frames(rig.transport.value()[sent_before:]) == list(seen.sent)
    assert (rig.transport.disconnecting and not closed_before) is seen.closes
    assert tuple(kind for kind, _, _ in rig.node.events[heard_before:]) == seen.handler
    failed = {"same": failed_before, "+1": failed_before + 1, "reset": 0}[seen.failed]
    assert rig.factory.failed_logins == failed
    if seen.logs is not None:
        assert any(seen.logs in line for line in link_lines(logged)), link_lines(logged)
    if seen.keeps_hello:
        assert rig.link._site_hello is EVENTS[I.SITE_HELLO]
    # The proof deadline is armed exactly while PROVING (while the link reads).
    assert rig.deadline_armed() is (rig.link.state is S.PROVING)


def test_a_closing_link_takes_no_input_but_its_loss() -> None:
    # The site's Error closes the link while it waits for the proof: the
    # deadline that comes before the connection is gone changes nothing.
    rig = rig_in(S.PROVING)
    rig.feed(Error("internal", "boom"))
    assert rig.link.closing and rig.link.state is S.PROVING
    sent = len(rig.transport.value())
    rig.clock.advance(PROOF_TIMEOUT)
    assert rig.link.state is S.PROVING and len(rig.transport.value()) == sent
    rig.lose()
    assert rig.link.state is S.DOWN and rig.factory.failed_logins == 4


# ---------------------------------------------------------------- the table on real connections


Step = tuple[LinkState, LinkInput, LinkState]


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[SiteLink, list[Step]]]:
    """Every step every SiteLink takes, per link, as the table saw it."""
    taken: dict[SiteLink, list[Step]] = {}
    original = SiteLink._input

    def recording(self: SiteLink, what: LinkInput, event: Any = None) -> None:
        before, closing = self.state, self.closing
        original(self, what, event)
        if not closing or what is I.CONNECTION_LOST:
            taken.setdefault(self, []).append((before, what, self.state))

    monkeypatch.setattr(SiteLink, "_input", recording)
    yield taken
    for path in taken.values():
        for before, what, after in path:
            assert EXPECTED[before, what][0] is after, (before, what, after)


@pytest.fixture
def net() -> Iterator[MemoryNet]:
    net = MemoryNet()
    yield net
    net.close()


def paths(taken: dict[SiteLink, list[Step]]) -> list[list[str]]:
    return [[f"{b.name} {w.name} {a.name}" for b, w, a in path] for path in taken.values()]


V2_LOGIN = [
    "CONNECTED IDENTITY IDENTIFIED",
    "IDENTIFIED SITE_HELLO IDENTIFIED",
    "IDENTIFIED LOGIN_ACCEPTED_V2 PROVING",
    "PROVING SITE_PROOF_GOOD UP",
]


def test_a_v2_node_and_the_real_site(net: MemoryNet, steps: dict[SiteLink, list[Step]]) -> None:
    factory, port = net.site()
    node = NodeRecorder()
    service = net.node(port, node, retry_policy=lambda attempt: 60.0)
    session = factory.nodes[NODE]
    session.send_delete("del-1", 8, "g")
    net.flush()
    session.close("site restarting")
    net.flush()
    assert node.kinds() == ["up", "message", "down"]
    assert paths(steps) == [V2_LOGIN + ["UP COMMAND UP", "UP CONNECTION_LOST DOWN"]]
    assert service.link_factory.failed_logins == 0


def test_a_refused_login_on_the_real_site(
    net: MemoryNet, steps: dict[SiteLink, list[Step]]
) -> None:
    _, port = net.site()
    service = net.node(port, NodeRecorder(), secret="wrong", retry_policy=lambda attempt: 60.0)
    assert paths(steps) == [
        [
            "CONNECTED IDENTITY IDENTIFIED",
            "IDENTIFIED SITE_HELLO IDENTIFIED",
            "IDENTIFIED LOGIN_REFUSED REFUSED",
            "REFUSED CONNECTION_LOST DOWN",
        ]
    ]
    assert service.link_factory.failed_logins == 1


def test_the_legacy_emulation_and_the_real_site(
    net: MemoryNet, steps: dict[SiteLink, list[Step]]
) -> None:
    _, port = net.site()
    node = NodeRecorder()
    net.node(port, node, protocol=1)
    assert node.kinds() == ["up"] and node.link.protocol_version == 1
    # The strict reader never sees the site's Hello.
    assert paths(steps) == [
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED LOGIN_ACCEPTED_LEGACY UP"]
    ]


@pytest.mark.parametrize("trusted", [False, True])
def test_a_legacy_site(net: MemoryNet, steps: dict[SiteLink, list[Step]], trusted: bool) -> None:
    _, port = net.legacy_site()
    node = NodeRecorder()
    net.node(port, node, trust_legacy_site=trusted, retry_policy=lambda attempt: 60.0)
    if trusted:
        assert node.kinds() == ["up"] and node.link.protocol_version == 1
        assert paths(steps) == [
            ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED LOGIN_ACCEPTED_LEGACY UP"]
        ]
    else:
        assert node.kinds() == []
        assert paths(steps) == [
            [
                "CONNECTED IDENTITY IDENTIFIED",
                "IDENTIFIED LOGIN_ACCEPTED_UNTRUSTED REFUSED",
                "REFUSED CONNECTION_LOST DOWN",
            ]
        ]


def scripted(net: MemoryNet, **options: Any) -> tuple[RawPeer, NodeRecorder]:
    """A node dialled to a raw peer that stands in for the site (it says
    nothing until the test makes it)."""
    peers: list[RawPeer] = []

    def build() -> RawPeer:
        peer = RawPeer()
        peers.append(peer)
        net.peers.append(peer)
        return peer

    port = net.listen(Factory.forProtocol(build))
    node = NodeRecorder()
    net.node(port, node, retry_policy=lambda attempt: 60.0, **options)
    [peer] = peers
    return peer, node


def hang_up(peer: RawPeer) -> None:
    transport: Any = peer.transport
    transport.loseConnection()


def prove(peer: RawPeer) -> None:
    [challenge] = [m for m in peer.messages() if type(m).__name__ == "NodeChallenge"]
    peer.send(SiteProof(sign_site_proof(SECRET, challenge.nonce, NONCE, NODE)))


def login(net: MemoryNet, peer: RawPeer, *, hello: bool = True) -> None:
    peer.send(Identity("site-x", NONCE))
    if hello:
        peer.send(ProtocolHello())
    net.flush()
    peer.send(LoginResult(True, ""))
    net.flush()


GONE = "REFUSED CONNECTION_LOST DOWN"
LOST_UP = "UP CONNECTION_LOST DOWN"
Script = tuple[Callable[[MemoryNet, RawPeer], Any], list[str], dict[str, Any]]

#: Conversations a scripted site holds with a v2 node: what it sends, the
#: steps the node's link takes (each checked against the table too), the
#: node's options.  Whatever is still open at the end, the site hangs up.
SCRIPTS: dict[str, Script] = {
    "Hello before Identity": (
        lambda net, peer: (peer.send(ProtocolHello()), login(net, peer, hello=False), prove(peer)),
        ["CONNECTED SITE_HELLO CONNECTED", "CONNECTED IDENTITY IDENTIFIED"]
        + ["IDENTIFIED LOGIN_ACCEPTED_V2 PROVING", "PROVING SITE_PROOF_GOOD UP", LOST_UP],
        {},
    ),
    "a forged nonce": (
        lambda net, peer: peer.send(Identity("site-x", "site:0123:" + 32 * "e")),
        ["CONNECTED IDENTITY_BAD_NONCE REFUSED", GONE],
        {},
    ),
    "a Login from the site": (
        lambda net, peer: peer.send(Login("node-x", "0" * 64)),
        ["CONNECTED LOGIN REFUSED", GONE],
        {},
    ),
    "a refusal before Identity": (
        lambda net, peer: peer.send(LoginResult(False, "no")),
        ["CONNECTED LOGIN_REFUSED REFUSED", GONE],
        {},
    ),
    "an acceptance before Identity, after a Hello": (
        lambda net, peer: (peer.send(ProtocolHello()), peer.send(LoginResult(True, ""))),
        ["CONNECTED SITE_HELLO CONNECTED", "CONNECTED LOGIN_ACCEPTED_V2 REFUSED", GONE],
        {},
    ),
    "an acceptance before Identity, trusted legacy": (
        lambda net, peer: peer.send(LoginResult(True, "")),
        ["CONNECTED LOGIN_ACCEPTED_LEGACY REFUSED", GONE],
        {"trust_legacy_site": True},
    ),
    "an acceptance before Identity, untrusted legacy": (
        lambda net, peer: peer.send(LoginResult(True, "")),
        ["CONNECTED LOGIN_ACCEPTED_UNTRUSTED REFUSED", GONE],
        {},
    ),
    "a second Identity": (
        lambda net, peer: (peer.send(Identity("site-x", NONCE)), peer.send(Identity("y", NONCE))),
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED IDENTITY REFUSED", GONE],
        {},
    ),
    "a second Identity, forged": (
        lambda net, peer: (peer.send(Identity("site-x", NONCE)), peer.send(Identity("y", "z"))),
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED IDENTITY_BAD_NONCE REFUSED", GONE],
        {},
    ),
    "a Login after Identity": (
        lambda net, peer: (peer.send(Identity("site-x", NONCE)), peer.send(Login("x", "0"))),
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED LOGIN REFUSED", GONE],
        {},
    ),
    "the site hangs up after Identity": (
        lambda net, peer: peer.send(Identity("site-x", NONCE)),
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED CONNECTION_LOST DOWN"],
        {},
    ),
    "the site hangs up at once": (
        lambda net, peer: None,
        ["CONNECTED CONNECTION_LOST DOWN"],
        {},
    ),
    "a wrong proof": (
        lambda net, peer: (login(net, peer), peer.send(SiteProof("0" * 64))),
        V2_LOGIN[:3] + ["PROVING SITE_PROOF_BAD REFUSED", GONE],
        {},
    ),
    "a command before the proof": (
        lambda net, peer: (login(net, peer), peer.send(EVENTS[I.COMMAND])),
        V2_LOGIN[:3] + ["PROVING COMMAND REFUSED", GONE],
        {},
    ),
    "no proof": (
        lambda net, peer: (login(net, peer), net.advance(PROOF_TIMEOUT)),
        V2_LOGIN[:3] + ["PROVING PROOF_DEADLINE REFUSED", GONE],
        {},
    ),
    "the site hangs up before its proof": (
        lambda net, peer: login(net, peer),
        V2_LOGIN[:3] + ["PROVING CONNECTION_LOST DOWN"],
        {},
    ),
    "a command after the proof": (
        lambda net, peer: (login(net, peer), prove(peer), peer.send(EVENTS[I.COMMAND])),
        V2_LOGIN + ["UP COMMAND UP", LOST_UP],
        {},
    ),
    "a second proof": (
        lambda net, peer: (login(net, peer), prove(peer), net.flush(), prove(peer)),
        V2_LOGIN + ["UP SITE_PROOF_GOOD UP", LOST_UP],
        {},
    ),
    "a wrong second proof": (
        lambda net, peer: (login(net, peer), prove(peer), peer.send(SiteProof("0" * 64))),
        V2_LOGIN + ["UP SITE_PROOF_BAD UP", LOST_UP],
        {},
    ),
    "a refused login": (
        lambda net, peer: (peer.send(Identity("site-x", NONCE)), peer.send(LoginResult(False, ""))),
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED LOGIN_REFUSED REFUSED", GONE],
        {},
    ),
    "a trusted legacy site": (
        lambda net, peer: login(net, peer, hello=False),
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED LOGIN_ACCEPTED_LEGACY UP", LOST_UP],
        {"trust_legacy_site": True},
    ),
    "an untrusted legacy site": (
        lambda net, peer: login(net, peer, hello=False),
        ["CONNECTED IDENTITY IDENTIFIED", "IDENTIFIED LOGIN_ACCEPTED_UNTRUSTED REFUSED", GONE],
        {},
    ),
    # PeerProtocol's gate answers these two: the machine never sees the message.
    "a command before login": (
        lambda net, peer: peer.send(EVENTS[I.COMMAND]),
        ["CONNECTED CONNECTION_LOST DOWN"],
        {},
    ),
    "a Hello after login": (
        lambda net, peer: (login(net, peer), peer.send(ProtocolHello()), prove(peer)),
        V2_LOGIN + [LOST_UP],
        {},
    ),
}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_a_scripted_site(net: MemoryNet, steps: dict[SiteLink, list[Step]], script: str) -> None:
    act, expected, options = SCRIPTS[script]
    peer, node = scripted(net, **options)
    act(net, peer)
    net.flush()
    if not peer.is_closed:
        hang_up(peer)
        net.flush()
    assert paths(steps) == [expected]
    heard = [kind for kind in node.kinds() if kind != "message"]
    assert heard == (["up", "down"] if LOST_UP in expected else [])
    # What the node sent the site, after its Hello: the steps' frames (kind
    # and code), as EXPECTED says of each step's cell.
    sent = [describe(m) for m in peer.messages() if type(m) not in (Heartbeat, ProtocolHello)]
    if script == "a command before login":
        expected_sent = ["Error unauthenticated: message type 11 before login"]
    else:
        cells = [(S[step.split()[0]], I[step.split()[1]]) for step in expected]
        expected_sent = [frame for cell in cells for frame in EXPECTED[cell][1].sent]
    assert [d.split(":")[0] for d in sent] == [d.split(":")[0] for d in expected_sent]


def test_the_scripts_reach_every_cell_a_site_can_reach() -> None:
    reached = {
        (S[step.split()[0]], I[step.split()[1]]) for _, path, _ in SCRIPTS.values() for step in path
    }
    pre_login = {i for i in I if i.name.startswith(("SITE_HELLO", "IDENTITY", "LOGIN"))}
    # The rest: messages PeerProtocol's gate answers first, a deadline that
    # is not armed, and a link that is closing or gone (it reads nothing).
    unreachable = (
        {(s, i) for s in (S.CONNECTED, S.IDENTIFIED) for i in (I.SITE_PROOF_GOOD, I.SITE_PROOF_BAD)}
        | {(s, I.COMMAND) for s in (S.CONNECTED, S.IDENTIFIED)}
        | {(s, i) for s in (S.PROVING, S.UP) for i in pre_login}
        | {(s, I.PROOF_DEADLINE) for s in (S.CONNECTED, S.IDENTIFIED, S.UP)}
        | {(S.REFUSED, i) for i in I if i is not I.CONNECTION_LOST}
        | {(S.DOWN, i) for i in I}
    )
    assert not reached & unreachable
    assert reached | unreachable == set(SiteLink.TRANSITIONS)


def described_frames(data: bytes) -> list[str]:
    return described(data, describe)
