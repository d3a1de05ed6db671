"""A node session's life at the site as one machine (``TRANSITIONS`` in
tasknet/site/session_states.py, issue 37): every input in every state, and
the table against real connections.

:data:`EXPECTED` says, independently of the table, what each input does in
each state: the next state and the outputs that run, in order, or
:data:`REFUSED` (``IllegalSessionTransition``, nothing changes).
``test_every_input_in_every_state`` checks the table against it.
:data:`SEEN` says what can be seen of each cell a session without an
ownership reaches (the frames the site sends, whether it closes, what the
handler hears, whether the registry holds it); ``test_every_reachable_cell
_on_a_real_session`` drives a :class:`NodeSession` on a memory transport
and a ``task.Clock`` into each such state through the wire, gives it each
input and compares.  The real-connection tests run scripted nodes against
a site over TCP and a real database, and check that every step each
session took is the table's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from tasknet.protocol.connection import LOGIN_TIMEOUT
from tasknet.protocol.messages import (
    FEATURE_RELIABLE,
    FEATURE_SITE_PROOF,
    ArchiveInventory,
    Error,
    Goodbye,
    Identity,
    Login,
    Message,
    NodeChallenge,
    ProtocolHello,
    StatusReport,
    encode,
    sign_login,
)
from tasknet.runtime import SeededEntropy
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.node_listener import (
    LOGINS_PER_TURN,
    AcceptedLogin,
    NodeListenerFactory,
    NodeSession,
)
from tasknet.site.session_states import (
    TRANSITIONS,
    IllegalSessionTransition,
    SessionInput,
    SessionLife,
    SessionState,
)
from tasknet.site.storage.node_sessions import Holding
from tests.eventually import eventually
from tests.protocol.peers import SITE_KEYS, SiteRecorder, described
from tests.site.helpers import RecordedOutputs
from tests.site_protocol.harness import Site

S = SessionState
I = SessionInput  # noqa: E741
NODE = "node-1"
SECRET = SITE_KEYS[NODE]


# ---------------------------------------------------------------- the table, cell by cell

#: A cell the table refuses.
REFUSED = None
Cell = tuple[SessionState, tuple[str, ...]] | None

ATTACH = ("_believe_urls", "_attach", "_take", "_tell_attached")
LOST_ATTACHED = ("_log_disconnected", "_leave_registry", "_tell_detached", "_forget_connection")
LOST_HELD = (
    "_log_disconnected",
    "_leave_registry",
    "_tell_detached",
    "_give_back",
    "_forget_connection",
)
LOST_DETACHED = ("_log_disconnected", "_forget_connection")
GONE = ("_forget_connection",)
TO_REPLACED = (S.REPLACED, ("_log_reconnected", "_tell_detached", "_say_replaced"))
TO_MOVED = (S.MOVED, ("_leave_registry", "_tell_detached", "_say_replaced"))
TO_DROPPED = (
    S.DROPPED,
    ("_log_take_failed", "_leave_registry", "_tell_detached", "_say_busy", "_begin_grace"),
)
SECOND_CHALLENGE = ("_refuse_second_challenge",)
ANSWER = ("_send_proof", "_log_unasked_challenge")


def attached(
    state: SessionState, *, proven: SessionState | None, held: SessionState | None
) -> dict[SessionInput, Cell]:
    """An attached state's row: ``proven`` is where a first NodeChallenge
    takes it (``None``: it is a second one), ``held`` where its committed
    take does (``None``: it holds its node already)."""
    challenge: Cell = (proven, ANSWER) if proven is not None else (state, SECOND_CHALLENGE)
    row: dict[SessionInput, Cell] = {
        I.CHALLENGE: challenge,
        I.CHALLENGE_AFTER_NEWER_LOGIN: challenge,
        I.REPORT: (state, ("_hand_up",)),
        I.INVENTORY_PART: (state, ("_take_inventory_part",)),
        I.REPLACED: TO_REPLACED,
        I.REPORT_ACKED: (state, ("_settle_login",)),
    }
    if held is not None:
        row |= {
            I.TAKE_COMMITTED: (held, ("_begin_grace",)),
            I.TAKE_FAILED: TO_DROPPED,
            I.CONNECTION_LOST: (S.CLOSED, LOST_ATTACHED),
        }
    else:
        row |= {
            I.TAKEN_ELSEWHERE: TO_MOVED,
            I.GRACE_OVER: (state, ("_settle_login",)),
            I.CONNECTION_LOST: (S.CLOSED, LOST_HELD),
        }
    return row


#: state -> input -> the cell; an input not in a state's row is refused.
ROWS: dict[SessionState, dict[SessionInput, Cell]] = {
    S.CONNECTED: {
        I.HELLO: (S.CONNECTED, ("_keep_hello",)),
        I.LOGIN: (S.WAITING, ("_queue_login",)),
        I.NOT_FROM_A_NODE: (S.REFUSED, ("_refuse_not_from_a_node",)),
        I.CONNECTION_LOST: (S.CLOSED, GONE),
    },
    S.WAITING: {
        I.HELLO: (S.WAITING, ("_keep_hello",)),
        I.LOGIN: (S.REFUSED, ("_refuse_second_login",)),
        I.NOT_FROM_A_NODE: (S.REFUSED, ("_refuse_not_from_a_node",)),
        I.LOGIN_SLOWED: (S.REFUSED, ("_refuse_slowed",)),
        I.LOGIN_UNKNOWN_NODE: (S.REFUSED, ("_refuse_unknown_node",)),
        I.LOGIN_BAD_SIGNATURE: (S.REFUSED, ("_refuse_bad_signature",)),
        I.LOGIN_ACCEPTED: (S.CURRENT, ("_log_in", *ATTACH)),
        I.LOGIN_ACCEPTED_PROOF_ASKED: (S.PROVING, ("_log_in", "_arm_challenge_deadline")),
        I.CONNECTION_LOST: (S.CLOSED, GONE),
    },
    S.REFUSED: {I.CONNECTION_LOST: (S.CLOSED, GONE)},
    S.PROVING: {
        I.CHALLENGE: (
            S.CURRENT_PROVEN,
            ("_send_proof", "_cancel_challenge_deadline", "_log_proof_sent", *ATTACH),
        ),
        I.CHALLENGE_AFTER_NEWER_LOGIN: (
            S.REPLACED,
            ("_send_proof", "_cancel_challenge_deadline", "_log_proof_sent", "_say_replaced"),
        ),
        I.REPORT: (S.PROVING, ("_refuse_before_challenge",)),
        I.INVENTORY_PART: (S.PROVING, ("_refuse_before_challenge",)),
        I.CHALLENGE_DEADLINE: (S.PROVING, ("_refuse_no_challenge",)),
        I.CONNECTION_LOST: (
            S.CLOSED,
            ("_cancel_challenge_deadline", "_log_disconnected", "_forget_connection"),
        ),
    },
    S.CURRENT: attached(S.CURRENT, proven=S.CURRENT_PROVEN, held=S.HELD),
    S.CURRENT_PROVEN: attached(S.CURRENT_PROVEN, proven=None, held=S.HELD_PROVEN),
    S.HELD: attached(S.HELD, proven=S.HELD_PROVEN, held=None),
    S.HELD_PROVEN: attached(S.HELD_PROVEN, proven=None, held=None),
    S.REPLACED: {
        I.TAKE_COMMITTED: (S.REPLACED, ("_give_back", "_begin_grace")),
        I.TAKE_FAILED: (S.REPLACED, ("_log_take_failed", "_begin_grace")),
        I.REPORT_ACKED: (S.REPLACED, ("_settle_login",)),
        I.GRACE_OVER: (S.REPLACED, ("_settle_login",)),
        I.CONNECTION_LOST: (S.CLOSED, LOST_DETACHED),
    },
    S.MOVED: {
        I.REPORT_ACKED: (S.MOVED, ("_settle_login",)),
        I.GRACE_OVER: (S.MOVED, ("_settle_login",)),
        I.CONNECTION_LOST: (S.CLOSED, LOST_DETACHED),
    },
    S.DROPPED: {
        I.REPORT_ACKED: (S.DROPPED, ("_settle_login",)),
        I.GRACE_OVER: (S.DROPPED, ("_settle_login",)),
        I.CONNECTION_LOST: (S.CLOSED, LOST_DETACHED),
    },
    S.CLOSED: {
        I.TAKE_COMMITTED: (S.CLOSED, ("_give_back",)),
        I.TAKE_FAILED: (S.CLOSED, ("_log_take_failed",)),
        I.REPORT_ACKED: (S.CLOSED, ()),
    },
}

EXPECTED: dict[tuple[SessionState, SessionInput], Cell] = {
    (s, i): ROWS[s].get(i, REFUSED) for s in S for i in I
}

#: Inputs that bring a life to each state through the table.
PATHS: dict[SessionState, tuple[SessionInput, ...]] = {
    S.CONNECTED: (),
    S.WAITING: (I.LOGIN,),
    S.REFUSED: (I.NOT_FROM_A_NODE,),
    S.PROVING: (I.LOGIN, I.LOGIN_ACCEPTED_PROOF_ASKED),
    S.CURRENT: (I.LOGIN, I.LOGIN_ACCEPTED),
    S.CURRENT_PROVEN: (I.LOGIN, I.LOGIN_ACCEPTED_PROOF_ASKED, I.CHALLENGE),
    S.HELD: (I.LOGIN, I.LOGIN_ACCEPTED, I.TAKE_COMMITTED),
    S.HELD_PROVEN: (I.LOGIN, I.LOGIN_ACCEPTED, I.TAKE_COMMITTED, I.CHALLENGE),
    S.REPLACED: (I.LOGIN, I.LOGIN_ACCEPTED, I.REPLACED),
    S.MOVED: (I.LOGIN, I.LOGIN_ACCEPTED, I.TAKE_COMMITTED, I.TAKEN_ELSEWHERE),
    S.DROPPED: (I.LOGIN, I.LOGIN_ACCEPTED, I.TAKE_FAILED),
    S.CLOSED: (I.CONNECTION_LOST,),
}
HOLDING = Holding(NODE, 3, 7)


def test_the_table_has_only_session_outputs() -> None:
    assert set(TRANSITIONS) <= set(EXPECTED)
    for _, outputs in TRANSITIONS.values():
        for output in outputs:
            assert callable(getattr(NodeSession, output)), output


def test_no_flag_beside_the_state() -> None:
    session = Rig().session
    flags = {name for name, value in vars(session).items() if isinstance(value, bool)}
    # PeerProtocol's own (closing) and none of the session's life.
    assert not flags & {"proved", "login_waiting", "_proved", "_waiting"}, flags
    assert not hasattr(session, "login_grace") and not hasattr(session, "proved")


@pytest.mark.parametrize(
    ("state", "what"),
    [(s, i) for s in S for i in I],
    ids=[f"{s.name}-{i.name}" for s in S for i in I],
)
def test_every_input_in_every_state(state: SessionState, what: SessionInput) -> None:
    outputs = RecordedOutputs()
    life = SessionLife(outputs)
    for step in PATHS[state]:
        life.handle(step, HOLDING if step is I.TAKE_COMMITTED else None)
    assert life.state is state
    before = len(outputs.ran)
    expected = EXPECTED[state, what]
    if expected is REFUSED:
        assert (state, what) not in TRANSITIONS
        with pytest.raises(IllegalSessionTransition):
            life.handle(what)
        assert life.state is state and len(outputs.ran) == before
        return
    assert TRANSITIONS[state, what] == expected
    life.handle(what, HOLDING if what is I.TAKE_COMMITTED else None)
    next_state, ran = expected
    assert life.state is next_state
    assert tuple(outputs.ran[before:]) == ran


# ---------------------------------------------------------------- the cells on a real session


@dataclass(frozen=True)
class Seen:
    """What one input visibly did to a session without an ownership."""

    #: Frames the site sent, as :func:`described`.
    sent: tuple[str, ...] = ()
    #: The site started closing the connection.
    closes: bool = False
    #: What the handler heard ("attached", "message", "detached").
    handler: tuple[str, ...] = ()


NOTHING = Seen()


def violation(message: str) -> Seen:
    return Seen(sent=(f"Error protocol_violation: {message}",), closes=True)


REPLACED_GOODBYE = "Goodbye: replaced by a newer connection"

#: What each cell a session without an ownership reaches shows (the other
#: cells need an ownership: its take, its holding).
SEEN: dict[tuple[SessionState, SessionInput], Seen] = {
    (S.CONNECTED, I.HELLO): NOTHING,
    (S.CONNECTED, I.LOGIN): NOTHING,
    (S.CONNECTED, I.NOT_FROM_A_NODE): violation("Identity from a node"),
    (S.CONNECTED, I.CONNECTION_LOST): NOTHING,
    (S.WAITING, I.HELLO): NOTHING,
    (S.WAITING, I.LOGIN): violation("a second Login"),
    (S.WAITING, I.NOT_FROM_A_NODE): violation("Identity from a node"),
    (S.WAITING, I.LOGIN_SLOWED): Seen(
        sent=("LoginResult false: too many failed logins from this address: retry in 3 s",),
        closes=True,
    ),
    (S.WAITING, I.LOGIN_UNKNOWN_NODE): Seen(sent=("LoginResult false: unknown node",), closes=True),
    (S.WAITING, I.LOGIN_BAD_SIGNATURE): Seen(
        sent=("LoginResult false: bad signature",), closes=True
    ),
    (S.WAITING, I.LOGIN_ACCEPTED): Seen(sent=("LoginResult true",), handler=("attached",)),
    (S.WAITING, I.LOGIN_ACCEPTED_PROOF_ASKED): Seen(sent=("LoginResult true",)),
    (S.WAITING, I.CONNECTION_LOST): NOTHING,
    (S.REFUSED, I.CONNECTION_LOST): NOTHING,
    (S.PROVING, I.CHALLENGE): Seen(sent=("SiteProof",), handler=("attached",)),
    (S.PROVING, I.CHALLENGE_AFTER_NEWER_LOGIN): Seen(
        sent=("SiteProof", REPLACED_GOODBYE), closes=True
    ),
    (S.PROVING, I.REPORT): violation(
        "StatusReport before NodeChallenge (the node announced site-proof)"
    ),
    (S.PROVING, I.INVENTORY_PART): violation(
        "ArchiveInventory before NodeChallenge (the node announced site-proof)"
    ),
    (S.PROVING, I.CHALLENGE_DEADLINE): violation(f"no NodeChallenge within {LOGIN_TIMEOUT:g} s"),
    (S.PROVING, I.CONNECTION_LOST): NOTHING,
    **{
        (state, what): seen
        for state in (S.CURRENT, S.CURRENT_PROVEN)
        for what, seen in {
            I.CHALLENGE: (
                Seen(sent=("SiteProof",))
                if state is S.CURRENT
                else violation("a second NodeChallenge")
            ),
            I.REPORT: Seen(handler=("message",)),
            # Not announced archive-inventory (the rig's node did not).
            I.INVENTORY_PART: violation(
                "ArchiveInventory from a node that did not announce archive-inventory"
            ),
            # The handler sees it go, then the newer connection come.
            I.REPLACED: Seen(
                sent=(REPLACED_GOODBYE,), closes=True, handler=("detached", "attached")
            ),
            I.REPORT_ACKED: NOTHING,
            I.CONNECTION_LOST: Seen(handler=("detached",)),
        }.items()
    },
    (S.REPLACED, I.REPORT_ACKED): NOTHING,
    (S.REPLACED, I.CONNECTION_LOST): NOTHING,
    (S.CLOSED, I.REPORT_ACKED): NOTHING,
}
SEEN[S.CURRENT, I.CHALLENGE_AFTER_NEWER_LOGIN] = SEEN[S.CURRENT, I.CHALLENGE]
SEEN[S.CURRENT_PROVEN, I.CHALLENGE_AFTER_NEWER_LOGIN] = SEEN[S.CURRENT_PROVEN, I.CHALLENGE]


def describe(message: Message) -> str:
    if isinstance(message, Error):
        return f"Error {message.code}: {message.message}"
    if isinstance(message, Goodbye):
        return f"Goodbye: {message.reason}"
    if type(message).__name__ == "LoginResult":
        accepted: Any = message
        if accepted.accepted:
            return "LoginResult true"
        return f"LoginResult false: {accepted.reason}"
    return type(message).__name__


class Rig:
    """One NodeSession of a listener without an ownership, on a
    StringTransport, its timers on a Clock."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.handler = SiteRecorder()
        self.nodes = ConnectedNodes()
        self.factory = NodeListenerFactory(
            self.handler,
            self.nodes,
            dict(SITE_KEYS),
            "site-x",
            clock=self.clock,
            entropy=SeededEntropy(3),
        )
        self.session = self.connect()
        self.transport: StringTransport = self.session.transport  # type: ignore[assignment]

    def connect(self) -> NodeSession:
        session: NodeSession = self.factory.buildProtocol(None)
        session.makeConnection(StringTransport())
        return session

    def feed(self, *messages: Message, to: NodeSession | None = None) -> None:
        (to or self.session).dataReceived(b"".join(encode(m) for m in messages))

    def login(self, session: NodeSession, *, site_proof: bool) -> None:
        features = (FEATURE_RELIABLE, FEATURE_SITE_PROOF) if site_proof else (FEATURE_RELIABLE,)
        hello = ProtocolHello(features=features)
        self.feed(hello, Login(NODE, sign_login(SECRET, session.nonce, NODE)), to=session)

    def lose(self, session: NodeSession | None = None) -> None:
        (session or self.session).connectionLost(Failure(ConnectionDone()))

    def deadline_armed(self) -> bool:
        deadline = self.session._challenge_deadline
        return deadline is not None and deadline.active()


def rig_in(state: SessionState) -> Rig:
    """A session brought into ``state`` through the wire (and, for
    REPLACED, a newer connection of its node)."""
    rig = Rig()
    session = rig.session
    if state is S.WAITING:
        rig.factory._admitted = LOGINS_PER_TURN  # this turn's logins all admitted: it waits
        rig.feed(Login(NODE, "0" * 64))
    elif state is S.REFUSED:
        rig.feed(Identity("x", "0" * 32))
    elif state is S.CLOSED:
        rig.lose()
    elif state is not S.CONNECTED:
        rig.login(session, site_proof=state in (S.PROVING, S.CURRENT_PROVEN))
        if state is S.CURRENT_PROVEN:
            rig.feed(NodeChallenge("ab" * 16))
        if state is S.REPLACED:
            rig.login(rig.connect(), site_proof=False)
    assert session.life.state is state
    return rig


#: A message, or another event, that is each input, for the cells given
#: straight to the machine.
EVENTS: dict[SessionInput, Any] = {
    I.HELLO: ProtocolHello(),
    I.LOGIN: Login(NODE, "0" * 64),
    I.NOT_FROM_A_NODE: Identity("x", "0" * 32),
    I.LOGIN_SLOWED: 2.5,
    I.LOGIN_UNKNOWN_NODE: Login("node-x", "0" * 64),
    I.LOGIN_BAD_SIGNATURE: Login(NODE, "0" * 64),
    I.LOGIN_ACCEPTED: AcceptedLogin(Login(NODE, "0" * 64), SECRET),
    I.LOGIN_ACCEPTED_PROOF_ASKED: AcceptedLogin(Login(NODE, "0" * 64), SECRET),
    I.CHALLENGE: NodeChallenge("cd" * 16),
    I.CHALLENGE_AFTER_NEWER_LOGIN: NodeChallenge("cd" * 16),
    I.REPORT: StatusReport(()),
    I.INVENTORY_PART: ArchiveInventory("inv-1", 1, 2, ()),
    I.TAKE_COMMITTED: HOLDING,
}


def give(rig: Rig, what: SessionInput) -> None:
    """Give ``what`` to the session: the deadline by the clock when it is
    armed, the loss by ``connectionLost``, REPLACED by a newer connection of
    its node (the registry feeds it), the rest straight to its life (a
    Login waits for a turn that does not come)."""
    if what is I.CHALLENGE_DEADLINE and rig.deadline_armed():
        rig.clock.advance(LOGIN_TIMEOUT)
    elif what is I.CONNECTION_LOST:
        rig.lose()
    elif what is I.REPLACED:
        rig.login(rig.connect(), site_proof=False)
    else:
        if what is I.LOGIN:
            rig.factory._admitted = LOGINS_PER_TURN
        rig.session.life.handle(what, EVENTS.get(what))


def test_seen_covers_the_cells_a_session_without_ownership_reaches() -> None:
    without_ownership = {
        S.CONNECTED,
        S.WAITING,
        S.REFUSED,
        S.PROVING,
        S.CURRENT,
        S.CURRENT_PROVEN,
        S.REPLACED,
        S.CLOSED,
    }
    # What needs an ownership: its take's news, its grace, the holding.
    needs_ownership = {I.TAKE_COMMITTED, I.TAKE_FAILED, I.GRACE_OVER, I.TAKEN_ELSEWHERE}
    reachable = {
        (s, i)
        for (s, i), cell in EXPECTED.items()
        if cell is not REFUSED and s in without_ownership and i not in needs_ownership
    }
    assert set(SEEN) == reachable


@pytest.mark.parametrize(("state", "what"), list(SEEN), ids=[f"{s.name}-{i.name}" for s, i in SEEN])
def test_every_reachable_cell_on_a_real_session(state: SessionState, what: SessionInput) -> None:
    rig = rig_in(state)
    sent_before = len(rig.transport.value())
    closed_before = rig.transport.disconnecting
    heard_before = len(rig.handler.events)
    seen = SEEN[state, what]
    give(rig, what)

    cell = EXPECTED[state, what]
    assert cell is not REFUSED
    assert rig.session.life.state is cell[0]
    assert described_frames(rig.transport.value()[sent_before:]) == list(seen.sent)
    assert (rig.transport.disconnecting and not closed_before) is seen.closes
    assert tuple(kind for kind, _, _ in rig.handler.events[heard_before:]) == seen.handler
    # The registry holds it exactly while it says it is attached.
    assert rig.nodes.is_current(rig.session) is rig.session.life.attached
    # The challenge deadline is armed exactly while PROVING (while it reads).
    if not rig.session.closing:
        assert rig.deadline_armed() is (rig.session.life.state is S.PROVING)


def test_a_closing_session_takes_no_input_of_its_own_but_its_loss() -> None:
    rig = rig_in(S.PROVING)
    rig.feed(Error("internal", "boom"))  # the node closes it
    assert rig.session.closing and rig.session.life.state is S.PROVING
    sent = len(rig.transport.value())
    rig.clock.advance(LOGIN_TIMEOUT)  # its deadline changes nothing
    assert rig.session.life.state is S.PROVING and len(rig.transport.value()) == sent
    rig.lose()
    assert rig.session.life.state is S.CLOSED and rig.factory.connections == {}


def test_a_login_whose_connection_went_while_it_waited_is_not_judged() -> None:
    rig = rig_in(S.WAITING)
    rig.lose()
    rig.factory._turn()
    assert rig.session.life.state is S.CLOSED
    assert described_frames(rig.transport.value()) == ["Identity", "ProtocolHello"]


# ---------------------------------------------------------------- the table on real connections


Step = tuple[SessionState, SessionInput, SessionState]


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[SessionLife, list[Step]]]:
    """Every step every session's life takes, per life, as the table saw it."""
    taken: dict[SessionLife, list[Step]] = {}
    original = SessionLife.handle

    def recording(self: SessionLife, what: SessionInput, event: Any = None) -> None:
        # Recorded as it is taken, before its outputs feed any other input.
        before = self.state
        if (before, what) in TRANSITIONS:
            taken.setdefault(self, []).append((before, what, TRANSITIONS[before, what][0]))
        original(self, what, event)

    monkeypatch.setattr(SessionLife, "handle", recording)
    yield taken
    for path in taken.values():
        for before, what, after in path:
            cell = EXPECTED[before, what]
            assert cell is not REFUSED and cell[0] is after, (before, what, after)


def paths(taken: dict[SessionLife, list[Step]]) -> list[list[str]]:
    """Each life's steps, but for its login's settling (when a grace ends
    and the first ACK goes depend on the machine's pace)."""
    pace = (I.GRACE_OVER, I.REPORT_ACKED)
    return [
        [f"{b.name} {w.name} {a.name}" for b, w, a in path if w not in pace]
        for path in taken.values()
    ]


@pytest_twisted.ensureDeferred
async def test_logins_reconnects_and_takes_on_a_real_site(
    db_target: str, steps: dict[SessionLife, list[Step]]
) -> None:
    site = await Site(db_target).start()
    try:
        first = await site.connect("n1", site_proof=True)
        assert await first.challenge()
        old = site.side.nodes["n1"]
        await eventually(lambda: old.life.state is S.HELD_PROVEN)
        second = await site.connect("n1")  # newest wins
        new = site.side.nodes["n1"]
        await first.lost
        await eventually(lambda: old.life.state is S.CLOSED and new.life.state is S.HELD)
        await second.disconnect()
        site.nodes.remove(second)
        await eventually(lambda: new.life.state is S.CLOSED)
    finally:
        await site.stop()
    login = ["CONNECTED HELLO CONNECTED", "CONNECTED LOGIN WAITING"]
    assert paths(steps)[:2] == [
        login
        + [
            "WAITING LOGIN_ACCEPTED_PROOF_ASKED PROVING",
            "PROVING CHALLENGE CURRENT_PROVEN",
            "CURRENT_PROVEN TAKE_COMMITTED HELD_PROVEN",
            "HELD_PROVEN REPLACED REPLACED",
            "REPLACED CONNECTION_LOST CLOSED",
        ],
        login
        + [
            "WAITING LOGIN_ACCEPTED CURRENT",
            "CURRENT TAKE_COMMITTED HELD",
            "HELD CONNECTION_LOST CLOSED",
        ],
    ]


def described_frames(data: bytes) -> list[str]:
    return described(data, describe)
