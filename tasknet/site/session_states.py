"""A node session's life at the site (PROTOCOL.md "Connection flow",
"Mutual authentication", SCALE.md 5), as one machine -- as the node's link
is (``SiteLink.TRANSITIONS`` in :mod:`tasknet.node.link`).

Each connection the node listener accepts has one :class:`SessionLife`:
for every :class:`SessionState` and every :class:`SessionInput`,
:data:`TRANSITIONS` says the next state and the outputs (methods of the
session, named in the table) that run, in order; a pair not in the table is
refused (:class:`IllegalSessionTransition`, changing nothing).  Only
:meth:`SessionLife.handle` moves a session.  The listener
(``node_listener.py``) feeds it the node's messages, the Login's turn and
the challenge deadline (each named in one place) and the connection's loss;
the registry (``connected_nodes.py``) feeds ``REPLACED`` to the session a
newer one displaces; the ownership feeds ``TAKE_COMMITTED`` and
``TAKEN_ELSEWHERE``; the admission's grace and the report ACKs feed the
rest.  The outputs join and leave the registry, so what the registry holds
and what each session says it is cannot disagree.

The common path::

    CONNECTED --Login--> WAITING --its turn, accepted, site-proof--> PROVING
        PROVING --NodeChallenge--> CURRENT_PROVEN (SiteProof sent; attached, take queued)
        CURRENT_PROVEN --take committed--> HELD_PROVEN --connection lost--> CLOSED
    WAITING --its turn, accepted, no site-proof--> CURRENT --take committed--> HELD
    WAITING --its turn, refused--> REFUSED --connection lost--> CLOSED
    attached --a newer connection attached here--> REPLACED
    HELD* --a connection at another site took the node--> MOVED
    CURRENT* --its take failed--> DROPPED

* ``CONNECTED`` -- accepted; ``Identity`` and ``Hello`` sent, no ``Login`` yet;
* ``WAITING`` -- its ``Login`` waits for its turn (the listener's admission);
* ``REFUSED`` -- the site refused it before login (its Login, or a message
  a node never sends): closing;
* ``PROVING`` -- its Login accepted, its Hello announced ``site-proof``: it
  waits for its ``NodeChallenge`` (the deadline armed) and is not attached
  (no command may go to a node the site has not proved itself to);
* ``CURRENT`` / ``CURRENT_PROVEN`` -- its node's current session here: in
  the registry, known to the handler (reports go up, commands go down);
  with an ownership, its take of the node in the database not yet
  committed.  ``_PROVEN``: a SiteProof went on this connection, so a
  NodeChallenge now is a second one; without it (a node that did not
  announce site-proof) one NodeChallenge is still answered;
* ``HELD`` / ``HELD_PROVEN`` -- the same, its take committed: it holds its
  node in the database (:attr:`SessionLife.holding`); each of its reports
  is judged against that holding in the report's own transaction;
* ``REPLACED`` -- a newer connection of its node at this site won (newest
  wins), before or after this one was attached: closed;
* ``MOVED`` -- a connection at another site took its node: detached and
  closed, but its node is still connected (not recorded as gone, not
  given back);
* ``DROPPED`` -- its take failed (the database busy or down): detached and
  closed with ``Goodbye{"site busy, try again"}``;
* ``CLOSED`` -- its connection is gone; leaving an attached state for it
  detaches the session (and gives a held node back).

A session is *attached* exactly while it is in :data:`ATTACHED`, and holds
its node exactly while it is in :data:`HOLDING`.
"""

from __future__ import annotations

import enum
from typing import Any

from zope.interface import Attribute

from tasknet.protocol.session import INodeSession
from tasknet.site.storage.node_sessions import Holding

__all__ = [
    "ATTACHED",
    "HOLDING",
    "TRANSITIONS",
    "IllegalSessionTransition",
    "ITrackedSession",
    "SessionInput",
    "SessionLife",
    "SessionState",
]


class SessionState(enum.Enum):
    CONNECTED = "connected"
    WAITING = "waiting"
    REFUSED = "refused"
    PROVING = "proving"
    CURRENT = "current"
    CURRENT_PROVEN = "current, proven"
    HELD = "held"
    HELD_PROVEN = "held, proven"
    REPLACED = "replaced"
    MOVED = "moved"
    DROPPED = "dropped"
    CLOSED = "closed"


class SessionInput(enum.Enum):
    """What happens to a session: the node's messages as the listener names
    them, its Login's turn as judged, timers, the registry's and the
    ownership's news, the connection's loss."""

    HELLO = "ProtocolHello before login"
    LOGIN = "Login"
    NOT_FROM_A_NODE = "Identity or LoginResult (not something a node sends)"
    LOGIN_SLOWED = "its Login's turn: too many refused Logins from its address"
    LOGIN_UNKNOWN_NODE = "its Login's turn: no key for its node"
    LOGIN_BAD_SIGNATURE = "its Login's turn: a wrong signature"
    LOGIN_ACCEPTED = "its Login's turn: accepted, no site-proof announced"
    LOGIN_ACCEPTED_PROOF_ASKED = "its Login's turn: accepted, its v2 Hello announced site-proof"
    CHALLENGE = "NodeChallenge, its Login still its node's newest here"
    CHALLENGE_AFTER_NEWER_LOGIN = "NodeChallenge, a newer Login of its node accepted since"
    REPORT = "a report (StatusReport, DeleteResult, TaskReport)"
    INVENTORY_PART = "an ArchiveInventory part"
    CHALLENGE_DEADLINE = "no NodeChallenge within login_timeout of its LoginResult"
    REPLACED = "a newer connection of its node attached here (the registry)"
    TAKE_COMMITTED = "its take of the node committed (the ownership; the event is the holding)"
    TAKE_FAILED = "its take of the node failed"
    TAKEN_ELSEWHERE = "a connection at another site took its node (the ownership)"
    REPORT_ACKED = "a report of it applied: its ACK went out"
    GRACE_OVER = "LOGIN_GRACE after its take: its login is settled"
    CONNECTION_LOST = "the connection is gone"


S = SessionState
I = SessionInput  # noqa: E741 (the table's shorthand)

#: The states in which a session is its node's current one here.
ATTACHED = frozenset({S.CURRENT, S.CURRENT_PROVEN, S.HELD, S.HELD_PROVEN})
#: The states in which a session holds its node in the database.
HOLDING = frozenset({S.HELD, S.HELD_PROVEN})

#: One transition: the next state and the names of the session's methods
#: (outputs) run with the input's event, in order.
Transition = tuple[SessionState, tuple[str, ...]]


class IllegalSessionTransition(Exception):
    def __init__(self, state: SessionState, what: SessionInput) -> None:
        super().__init__(f"node session in {state.name} refuses {what.name}")
        self.state = state
        self.input = what


class SessionLife:
    """Where one connection is in its life (see the module doc), and the
    :class:`Holding` of its take once that committed.

    ``outputs`` is what runs the table's outputs: the session (each output
    is one of its methods, called with the input's event).
    """

    __slots__ = ("_outputs", "_state", "holding")

    def __init__(self, outputs: Any) -> None:
        self._outputs = outputs
        self._state = S.CONNECTED
        #: Set when its take commits (kept after: what it gives back).
        self.holding: Holding | None = None

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def attached(self) -> bool:
        """Its node's current session here."""
        return self._state in ATTACHED

    @property
    def held(self) -> bool:
        """It holds its node in the database (its take committed)."""
        return self._state in HOLDING

    def handle(self, what: SessionInput, event: Any = None) -> None:
        """Take ``what``: enter its next state, then run its outputs in order
        (an output may feed another input: it finds the new state).  Raises
        :class:`IllegalSessionTransition` (changing nothing) for a pair
        the table refuses."""
        transition = TRANSITIONS.get((self._state, what))
        if transition is None:
            raise IllegalSessionTransition(self._state, what)
        if what is I.TAKE_COMMITTED:
            self.holding = event
        self._state, outputs = transition
        for output in outputs:
            getattr(self._outputs, output)(event)

    def __repr__(self) -> str:
        return f"<SessionLife {self._state.name}>"


class ITrackedSession(INodeSession):
    """A node session as the registry and the ownership handle it."""

    life = Attribute("SessionLife: where the session is in its life")


# -- the table's rows ------------------------------------------------------------------------

#: Attached without a SiteProof sent -> attached with one.
_PROVEN = {S.CURRENT: S.CURRENT_PROVEN, S.HELD: S.HELD_PROVEN}
#: Its take committed: current -> held.
_HELD = {S.CURRENT: S.HELD, S.CURRENT_PROVEN: S.HELD_PROVEN}
#: Attached: the table takes these, then its node's current session joins
#: the registry, takes its node and is told to the handler.
_ATTACH = ("_believe_urls", "_attach", "_take", "_tell_attached")


def _attached_rows(state: SessionState) -> dict[tuple[SessionState, SessionInput], Transition]:
    """What an attached session (``state``) does with each input."""
    if state in _PROVEN:
        challenge: Transition = (_PROVEN[state], ("_send_proof", "_log_unasked_challenge"))
    else:
        challenge = (state, ("_refuse_second_challenge",))
    rows: dict[tuple[SessionState, SessionInput], Transition] = {
        (state, I.CHALLENGE): challenge,
        (state, I.CHALLENGE_AFTER_NEWER_LOGIN): challenge,
        (state, I.REPORT): (state, ("_hand_up",)),
        (state, I.INVENTORY_PART): (state, ("_take_inventory_part",)),
        (state, I.REPLACED): (S.REPLACED, ("_log_reconnected", "_tell_detached", "_say_replaced")),
        (state, I.REPORT_ACKED): (state, ("_settle_login",)),
    }
    if state in HOLDING:
        rows[state, I.TAKEN_ELSEWHERE] = (
            S.MOVED,
            ("_leave_registry", "_tell_detached", "_say_replaced"),
        )
        rows[state, I.GRACE_OVER] = (state, ("_settle_login",))
        rows[state, I.CONNECTION_LOST] = (
            S.CLOSED,
            ("_log_disconnected", "_leave_registry", "_tell_detached", "_give_back")
            + ("_forget_connection",),
        )
    else:
        rows[state, I.TAKE_COMMITTED] = (_HELD[state], ("_begin_grace",))
        rows[state, I.TAKE_FAILED] = (
            S.DROPPED,
            ("_log_take_failed", "_leave_registry", "_tell_detached", "_say_busy", "_begin_grace"),
        )
        rows[state, I.CONNECTION_LOST] = (
            S.CLOSED,
            ("_log_disconnected", "_leave_registry", "_tell_detached", "_forget_connection"),
        )
    return rows


#: The session's life: ``(state, input) -> (next state, outputs)``; a pair
#: not here is refused.  :meth:`SessionLife.handle` enters the next state
#: first, then runs the outputs.  Not here, because they cannot come: a
#: message PeerProtocol answers before the session sees it (a report before
#: login, a pre-login type or a Hello after it), any message or timer of a
#: connection that is closing (it reads nothing more, and the listener
#: feeds no timer of a closing one), and news of a take or a holding a
#: session never had.
TRANSITIONS: dict[tuple[SessionState, SessionInput], Transition] = {
    # -- CONNECTED: Identity and Hello sent
    (S.CONNECTED, I.HELLO): (S.CONNECTED, ("_keep_hello",)),
    (S.CONNECTED, I.LOGIN): (S.WAITING, ("_queue_login",)),
    (S.CONNECTED, I.NOT_FROM_A_NODE): (S.REFUSED, ("_refuse_not_from_a_node",)),
    (S.CONNECTED, I.CONNECTION_LOST): (S.CLOSED, ("_forget_connection",)),
    # -- WAITING: its Login queued for its turn (a Hello meanwhile still counts)
    (S.WAITING, I.HELLO): (S.WAITING, ("_keep_hello",)),
    (S.WAITING, I.LOGIN): (S.REFUSED, ("_refuse_second_login",)),
    (S.WAITING, I.NOT_FROM_A_NODE): (S.REFUSED, ("_refuse_not_from_a_node",)),
    (S.WAITING, I.LOGIN_SLOWED): (S.REFUSED, ("_refuse_slowed",)),
    (S.WAITING, I.LOGIN_UNKNOWN_NODE): (S.REFUSED, ("_refuse_unknown_node",)),
    (S.WAITING, I.LOGIN_BAD_SIGNATURE): (S.REFUSED, ("_refuse_bad_signature",)),
    (S.WAITING, I.LOGIN_ACCEPTED): (S.CURRENT, ("_log_in", *_ATTACH)),
    (S.WAITING, I.LOGIN_ACCEPTED_PROOF_ASKED): (
        S.PROVING,
        ("_log_in", "_arm_challenge_deadline"),
    ),
    (S.WAITING, I.CONNECTION_LOST): (S.CLOSED, ("_forget_connection",)),
    # -- REFUSED: closing
    (S.REFUSED, I.CONNECTION_LOST): (S.CLOSED, ("_forget_connection",)),
    # -- PROVING: waiting for its NodeChallenge (the deadline armed)
    (S.PROVING, I.CHALLENGE): (
        S.CURRENT_PROVEN,
        ("_send_proof", "_cancel_challenge_deadline", "_log_proof_sent", *_ATTACH),
    ),
    (S.PROVING, I.CHALLENGE_AFTER_NEWER_LOGIN): (
        S.REPLACED,
        ("_send_proof", "_cancel_challenge_deadline", "_log_proof_sent", "_say_replaced"),
    ),
    (S.PROVING, I.REPORT): (S.PROVING, ("_refuse_before_challenge",)),
    (S.PROVING, I.INVENTORY_PART): (S.PROVING, ("_refuse_before_challenge",)),
    (S.PROVING, I.CHALLENGE_DEADLINE): (S.PROVING, ("_refuse_no_challenge",)),
    (S.PROVING, I.CONNECTION_LOST): (
        S.CLOSED,
        ("_cancel_challenge_deadline", "_log_disconnected", "_forget_connection"),
    ),
    # -- attached: CURRENT, CURRENT_PROVEN, HELD, HELD_PROVEN
    **_attached_rows(S.CURRENT),
    **_attached_rows(S.CURRENT_PROVEN),
    **_attached_rows(S.HELD),
    **_attached_rows(S.HELD_PROVEN),
    # -- REPLACED: closing; a take under way still settles (a node not held
    # is given back), its login still settles
    (S.REPLACED, I.TAKE_COMMITTED): (S.REPLACED, ("_give_back", "_begin_grace")),
    (S.REPLACED, I.TAKE_FAILED): (S.REPLACED, ("_log_take_failed", "_begin_grace")),
    (S.REPLACED, I.REPORT_ACKED): (S.REPLACED, ("_settle_login",)),
    (S.REPLACED, I.GRACE_OVER): (S.REPLACED, ("_settle_login",)),
    (S.REPLACED, I.CONNECTION_LOST): (S.CLOSED, ("_log_disconnected", "_forget_connection")),
    # -- MOVED, DROPPED: detached, closing
    (S.MOVED, I.REPORT_ACKED): (S.MOVED, ("_settle_login",)),
    (S.MOVED, I.GRACE_OVER): (S.MOVED, ("_settle_login",)),
    (S.MOVED, I.CONNECTION_LOST): (S.CLOSED, ("_log_disconnected", "_forget_connection")),
    (S.DROPPED, I.REPORT_ACKED): (S.DROPPED, ("_settle_login",)),
    (S.DROPPED, I.GRACE_OVER): (S.DROPPED, ("_settle_login",)),
    (S.DROPPED, I.CONNECTION_LOST): (S.CLOSED, ("_log_disconnected", "_forget_connection")),
    # -- CLOSED: the end; a take under way still settles (given back)
    (S.CLOSED, I.TAKE_COMMITTED): (S.CLOSED, ("_give_back",)),
    (S.CLOSED, I.TAKE_FAILED): (S.CLOSED, ("_log_take_failed",)),
    (S.CLOSED, I.REPORT_ACKED): (S.CLOSED, ()),
}
