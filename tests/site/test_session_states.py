"""A node session's life as one table (``session_states.py``): the moves
between states it makes, and the ownership's check as a timer of the
service tree, on ``task.Clock``: no reactor, no database (fakes that record
their calls).  Every input in every state is ``test_session_machine.py``."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from tasknet.site.connected_nodes import ConnectedNodes, NodeOwnership
from tasknet.site.session_states import (
    ATTACHED,
    HOLDING,
    TRANSITIONS,
    IllegalSessionTransition,
    SessionInput,
    SessionLife,
    SessionState,
)
from tasknet.site.storage import node_sessions
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Capabilities
from tasknet.site.storage.node_sessions import Holding
from tests.site.helpers import RecordedOutputs, RecordingSession

S = SessionState
I = SessionInput  # noqa: E741
ATTACHED_STATES = (S.CURRENT, S.CURRENT_PROVEN, S.HELD, S.HELD_PROVEN)

#: Every move between two states the site makes, by what makes it (the
#: table must make exactly these).
LIFE = {
    (S.CONNECTED, S.WAITING): "Login, queued for its turn",
    (S.CONNECTED, S.REFUSED): "Identity or LoginResult from a node",
    (S.WAITING, S.REFUSED): "Login refused, a second Login, not a node's message",
    (S.WAITING, S.PROVING): "Login accepted, site-proof announced",
    (S.WAITING, S.CURRENT): "Login accepted",
    (S.PROVING, S.CURRENT_PROVEN): "NodeChallenge answered",
    (S.PROVING, S.REPLACED): "proved after a newer Login",
    (S.CURRENT, S.CURRENT_PROVEN): "an unannounced NodeChallenge answered",
    (S.HELD, S.HELD_PROVEN): "an unannounced NodeChallenge answered",
    (S.CURRENT, S.HELD): "take committed",
    (S.CURRENT_PROVEN, S.HELD_PROVEN): "take committed",
    **{(state, S.REPLACED): "newer connection attached" for state in ATTACHED_STATES},
    (S.HELD, S.MOVED): "taken at another site",
    (S.HELD_PROVEN, S.MOVED): "taken at another site",
    (S.CURRENT, S.DROPPED): "take failed",
    (S.CURRENT_PROVEN, S.DROPPED): "take failed",
    **{(state, S.CLOSED): "connection gone" for state in S if state is not S.CLOSED},
}

#: Inputs that bring a fresh life to each state.
PATHS: dict[SessionState, list[tuple[SessionInput, Any]]] = {
    S.CONNECTED: [],
    S.WAITING: [(I.LOGIN, None)],
    S.REFUSED: [(I.NOT_FROM_A_NODE, None)],
    S.PROVING: [(I.LOGIN, None), (I.LOGIN_ACCEPTED_PROOF_ASKED, None)],
    S.CURRENT: [(I.LOGIN, None), (I.LOGIN_ACCEPTED, None)],
    S.CURRENT_PROVEN: [(I.LOGIN, None), (I.LOGIN_ACCEPTED_PROOF_ASKED, None), (I.CHALLENGE, None)],
    S.HELD: [(I.LOGIN, None), (I.LOGIN_ACCEPTED, None), (I.TAKE_COMMITTED, Holding("n1", 1, 7))],
    S.HELD_PROVEN: [
        (I.LOGIN, None),
        (I.LOGIN_ACCEPTED, None),
        (I.TAKE_COMMITTED, Holding("n1", 1, 7)),
        (I.CHALLENGE, None),
    ],
    S.REPLACED: [(I.LOGIN, None), (I.LOGIN_ACCEPTED, None), (I.REPLACED, None)],
    S.MOVED: [
        (I.LOGIN, None),
        (I.LOGIN_ACCEPTED, None),
        (I.TAKE_COMMITTED, Holding("n1", 1, 7)),
        (I.TAKEN_ELSEWHERE, None),
    ],
    S.DROPPED: [(I.LOGIN, None), (I.LOGIN_ACCEPTED, None), (I.TAKE_FAILED, None)],
    S.CLOSED: [(I.CONNECTION_LOST, None)],
}


def life_in(state: SessionState) -> SessionLife:
    """A life brought to ``state`` through the table only."""
    life = SessionLife(RecordedOutputs())
    for what, event in PATHS[state]:
        life.handle(what, event)
    assert life.state is state
    return life


def test_the_table_makes_exactly_the_sessions_moves() -> None:
    moves = {(state, nxt) for (state, _), (nxt, _) in TRANSITIONS.items() if nxt is not state}
    assert moves == set(LIFE)
    assert ATTACHED == set(ATTACHED_STATES) and HOLDING == {S.HELD, S.HELD_PROVEN}


@pytest.mark.parametrize(("old", "new"), sorted(LIFE, key=lambda p: (p[0].value, p[1].value)))
def test_every_move_is_an_input_of_the_old_state(old: SessionState, new: SessionState) -> None:
    [what, *_] = [i for (s, i), (n, _) in TRANSITIONS.items() if s is old and n is new]
    life = life_in(old)
    life.handle(what, Holding("n1", 2, 7) if what is I.TAKE_COMMITTED else None)
    assert life.state is new
    assert life.attached == (new in ATTACHED)


@pytest.mark.parametrize(
    ("state", "what"),
    sorted(
        (pair for pair in itertools.product(S, I) if pair not in TRANSITIONS),
        key=lambda p: (p[0].value, p[1].value),
    ),
)
def test_every_other_input_raises_and_changes_nothing(
    state: SessionState, what: SessionInput
) -> None:
    life = life_in(state)
    outputs = life._outputs
    ran = list(outputs.ran)
    with pytest.raises(IllegalSessionTransition) as raised:
        life.handle(what)
    assert (raised.value.state, raised.value.input) == (state, what)
    assert life.state is state and outputs.ran == ran


def test_a_refused_input_names_the_state_and_the_input() -> None:
    life = life_in(S.CLOSED)
    with pytest.raises(IllegalSessionTransition, match="CLOSED refuses LOGIN_ACCEPTED"):
        life.handle(I.LOGIN_ACCEPTED)  # a gone connection is never attached again


def test_a_committed_take_is_the_move_to_held_with_its_holding() -> None:
    life = life_in(S.CURRENT)
    life.handle(I.TAKE_COMMITTED, Holding("n1", 4, 7))
    assert life.state is S.HELD and life.held and life.holding == Holding("n1", 4, 7)
    with pytest.raises(IllegalSessionTransition):
        life_in(S.PROVING).handle(I.TAKE_COMMITTED, Holding("n1", 5, 7))  # not attached yet


# -- the ownership's timer -----------------------------------------------------------------


class FakeDatabase:
    """A database several sites share (PostgreSQL) that records the reads
    of the check; ``held`` is what ``still_held`` answers."""

    capabilities = Capabilities(shared_by_sites=True)

    def __init__(self) -> None:
        self.reads: list[Any] = []
        self.held: set[Holding] = set()

    def read(self, fn: Any, *args: Any) -> Deferred[Any]:
        assert fn is node_sessions.still_held
        self.reads.append(args)
        return succeed(set(self.held))


class FakeWakeups:
    def __init__(self) -> None:
        self.subscribed: list[str] = []
        self.cancelled = 0

    def subscribe(self, channel: str, callback: listen.Callback) -> listen.Subscription:
        self.subscribed.append(channel)
        wakeups = self

        class Subscription:
            def cancel(self) -> Deferred[None]:
                wakeups.cancelled += 1
                return succeed(None)

        return Subscription()

    def notify(self, channel: str, payload: str = "") -> None:
        pass


def test_the_ownership_check_is_a_timer_child_on_the_sites_clock() -> None:
    clock = Clock()
    db, wakeups = FakeDatabase(), FakeWakeups()
    nodes = ConnectedNodes("site-a", 7)
    ownership = NodeOwnership(
        db,  # type: ignore[arg-type]
        nodes,
        wakeups=wakeups,
        check_interval=5.0,
        clock=clock,
    )
    assert [type(child).__name__ for child in ownership] == ["TimerService"]
    assert clock.getDelayedCalls() == [] and not ownership.running
    session = RecordingSession("n1")
    holding = Holding("n1", 3, 7)
    nodes.attach(session)
    session.life.handle(SessionInput.TAKE_COMMITTED, holding)
    db.held = {holding}

    ownership.startService()
    assert wakeups.subscribed == [listen.NODE_TAKEN]
    assert ownership.checks == 1 and db.reads == [([holding],)]  # a first check at start
    clock.advance(4.9)
    assert ownership.checks == 1
    clock.advance(0.1)
    assert ownership.checks == 2 and len(db.reads) == 2
    assert session.closed == [] and session.life.state is S.HELD

    db.held = set()  # another login took n1; its notification was lost
    clock.advance(5.0)
    assert ownership.checks == 3 and ownership.taken_elsewhere == 1
    # Fed TAKEN_ELSEWHERE: its life detaches and closes it.
    assert session.life.state is S.MOVED
    assert session.outputs.ran[-3:] == ["_leave_registry", "_tell_detached", "_say_replaced"]

    stopped = ownership.stopService()
    assert stopped.called and wakeups.cancelled == 1 and not ownership.running
    assert clock.getDelayedCalls() == []
    clock.advance(60.0)
    assert ownership.checks == 3


def test_no_timer_on_sqlite_or_without_an_interval() -> None:
    class SqliteDatabase(FakeDatabase):
        capabilities = Capabilities(shared_by_sites=False)

    clock = Clock()
    for db, interval in ((SqliteDatabase(), 5.0), (FakeDatabase(), None)):
        ownership = NodeOwnership(
            db,  # type: ignore[arg-type]
            ConnectedNodes(),
            check_interval=interval,
            clock=clock,
        )
        assert list(ownership) == []
        ownership.startService()
        assert clock.getDelayedCalls() == []
        ownership.stopService()
