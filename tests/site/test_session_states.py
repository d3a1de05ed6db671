"""A node session's life as one table (``session_states.py``), and the
ownership's check as a timer of the service tree, on ``task.Clock``: no
reactor, no database (fakes that record their calls)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from tasknet.site.connected_nodes import ConnectedNodes, NodeOwnership
from tasknet.site.session_states import (
    ALLOWED,
    ATTACHED,
    IllegalSessionTransition,
    SessionLife,
    SessionState,
    check,
)
from tasknet.site.storage import node_sessions
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Capabilities
from tasknet.site.storage.node_sessions import Holding
from tests.site.helpers import RecordingSession

S = SessionState

#: Every move the site makes, by what makes it (the table must be exactly these).
LIFE = {
    (S.CONNECTED, S.LOGGED_IN): "Login accepted, site-proof announced",
    (S.CONNECTED, S.CURRENT): "Login accepted",
    (S.LOGGED_IN, S.CURRENT): "SiteProof sent",
    (S.LOGGED_IN, S.REPLACED): "proved after a newer Login",
    (S.CURRENT, S.HELD): "take committed",
    (S.CURRENT, S.REPLACED): "newer connection attached",
    (S.HELD, S.REPLACED): "newer connection attached",
    (S.HELD, S.MOVED): "taken at another site",
    (S.CURRENT, S.DROPPED): "take failed",
    **{(state, S.CLOSED): "connection gone" for state in S if state is not S.CLOSED},
}


def life_in(state: SessionState) -> SessionLife:
    """A life brought to ``state`` through allowed moves only."""
    paths = {
        S.CONNECTED: [],
        S.LOGGED_IN: [S.LOGGED_IN],
        S.CURRENT: [S.CURRENT],
        S.HELD: [S.CURRENT, S.HELD],
        S.REPLACED: [S.CURRENT, S.REPLACED],
        S.MOVED: [S.CURRENT, S.HELD, S.MOVED],
        S.DROPPED: [S.CURRENT, S.DROPPED],
        S.CLOSED: [S.CLOSED],
    }
    life = SessionLife()
    for step in paths[state]:
        life.to(step)
    assert life.state is state
    return life


def test_the_table_is_the_sessions_life() -> None:
    assert ALLOWED == set(LIFE)
    assert ATTACHED == {S.CURRENT, S.HELD}


@pytest.mark.parametrize(("old", "new"), sorted(LIFE, key=lambda p: (p[0].value, p[1].value)))
def test_every_allowed_transition_moves_the_life(old: SessionState, new: SessionState) -> None:
    life = life_in(old)
    assert life.to(new) is old
    assert life.state is new
    assert life.attached == (new in ATTACHED)


@pytest.mark.parametrize(
    ("old", "new"),
    sorted(
        (pair for pair in itertools.product(S, S) if pair not in ALLOWED),
        key=lambda p: (p[0].value, p[1].value),
    ),
)
def test_every_other_transition_raises_and_changes_nothing(
    old: SessionState, new: SessionState
) -> None:
    life = life_in(old)
    with pytest.raises(IllegalSessionTransition) as raised:
        life.to(new)
    assert (raised.value.old, raised.value.new) == (old, new)
    assert life.state is old
    with pytest.raises(IllegalSessionTransition):
        check(old, new)


def test_a_forbidden_transition_names_both_states() -> None:
    life = life_in(S.CLOSED)
    with pytest.raises(IllegalSessionTransition, match="CLOSED -> CURRENT"):
        life.to(S.CURRENT)  # a gone connection is never attached again


def test_hold_is_the_move_to_held_with_its_holding() -> None:
    life = life_in(S.CURRENT)
    life.hold(Holding("n1", 4, 7))
    assert life.state is S.HELD and life.holding == Holding("n1", 4, 7)
    with pytest.raises(IllegalSessionTransition):
        life_in(S.LOGGED_IN).hold(Holding("n1", 5, 7))  # not attached yet


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
    assert nodes.hold(session, holding)
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
    assert session.closed == ["taken elsewhere"]  # the listener detaches and closes it

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
