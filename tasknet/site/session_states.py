"""A node session's life at the site (PROTOCOL.md "Connection flow",
"Mutual authentication", SCALE.md 5), as one table -- as the task states
are in :mod:`tasknet.site.transitions`.

Each connection the node listener accepts has one :class:`SessionLife`;
every change of its state goes through :meth:`SessionLife.to`, which
raises :class:`IllegalSessionTransition` for a pair not in :data:`ALLOWED`.
The listener (``node_listener.py``) moves a connection up to its login and
closes it; the registry (``connected_nodes.py``) attaches it, holds it and
detaches it, so what the registry holds and what each session says it is
cannot disagree:

* ``CONNECTED`` -- accepted; ``Identity`` and ``Hello`` sent, no ``Login`` yet;
* ``LOGGED_IN`` -- its ``Login`` accepted, its Hello announced ``site-proof``:
  it waits for its ``NodeChallenge`` and is not attached (no command may go
  to a node the site has not proved itself to);
* ``CURRENT`` -- its node's current session here: in the registry, known to
  the handler (reports go up, commands go down); with an ownership, its
  take of the node in the database not yet committed;
* ``HELD`` -- current, and its take committed: it holds its node in the
  database (:attr:`SessionLife.holding`); each of its reports is judged
  against that holding in the report's own transaction;
* ``REPLACED`` -- a newer connection of its node at this site won (newest
  wins), before or after this one was attached; it is closed;
* ``MOVED`` -- a connection at another site took its node: detached and
  closed, but its node is still connected (not recorded as gone, not
  given back);
* ``DROPPED`` -- its take failed (the database busy or down): detached and
  closed with ``Goodbye{"site busy, try again"}``;
* ``CLOSED`` -- its connection is gone.  Leaving ``CURRENT`` or ``HELD`` for
  it detaches the session (and gives a held node back); from any other
  state it changes nothing else.

A session is *attached* exactly while it is ``CURRENT`` or ``HELD``.
"""

from __future__ import annotations

import enum

from zope.interface import Attribute

from tasknet.protocol.session import INodeSession
from tasknet.site.storage.node_sessions import Holding

__all__ = [
    "ALLOWED",
    "ATTACHED",
    "IllegalSessionTransition",
    "ITrackedSession",
    "SessionLife",
    "SessionState",
    "check",
]


class SessionState(enum.Enum):
    CONNECTED = "connected"
    LOGGED_IN = "logged in"
    CURRENT = "current"
    HELD = "held"
    REPLACED = "replaced"
    MOVED = "moved"
    DROPPED = "dropped"
    CLOSED = "closed"


S = SessionState

#: The states in which a session is its node's current one here.
ATTACHED = frozenset({S.CURRENT, S.HELD})


class IllegalSessionTransition(Exception):
    def __init__(self, old: SessionState, new: SessionState) -> None:
        super().__init__(f"illegal node session transition {old.name} -> {new.name}")
        self.old = old
        self.new = new


class SessionLife:
    """Where one connection is in its life (see the module doc), and, once
    ``HELD``, the :class:`Holding` of its take."""

    __slots__ = ("_state", "holding")

    def __init__(self) -> None:
        self._state = S.CONNECTED
        #: Set when the session becomes ``HELD``; kept after it leaves
        #: (what its detach gives back).
        self.holding: Holding | None = None

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def attached(self) -> bool:
        """Its node's current session here (``CURRENT`` or ``HELD``)."""
        return self._state in ATTACHED

    def to(self, new: SessionState) -> SessionState:
        """Move to ``new``; the state it left.  Raises
        :class:`IllegalSessionTransition` (changing nothing) unless the
        move is in :data:`ALLOWED`."""
        old = self._state
        check(old, new)
        self._state = new
        return old

    def hold(self, holding: Holding) -> None:
        """``CURRENT -> HELD``: its take committed with ``holding``."""
        self.to(S.HELD)
        self.holding = holding

    def __repr__(self) -> str:
        return f"<SessionLife {self._state.name}>"


class ITrackedSession(INodeSession):
    """A node session as the registry and the ownership handle it."""

    life = Attribute("SessionLife: where the session is in its life")

    def taken_elsewhere() -> None:
        """A connection at another site took this ``HELD`` session's node
        (the ownership's notification or check): detach it (``MOVED``) and
        close it."""


def check(old: SessionState, new: SessionState) -> None:
    """Raise :class:`IllegalSessionTransition` unless ``old -> new`` is in the table."""
    if (old, new) not in ALLOWED:
        raise IllegalSessionTransition(old, new)


ALLOWED: frozenset[tuple[SessionState, SessionState]] = frozenset(
    {
        (S.CONNECTED, S.LOGGED_IN),  # Login accepted; its Hello announced site-proof
        (S.CONNECTED, S.CURRENT),  # Login accepted: attached at once
        (S.LOGGED_IN, S.CURRENT),  # NodeChallenge answered with a SiteProof: attached
        (S.LOGGED_IN, S.REPLACED),  # proved after a newer Login of its node: not attached
        (S.CURRENT, S.HELD),  # its take of the node committed
        (S.CURRENT, S.REPLACED),  # a newer connection of its node attached here
        (S.HELD, S.REPLACED),  # the same, once held
        (S.HELD, S.MOVED),  # a newer connection at another site took its node
        (S.CURRENT, S.DROPPED),  # its take failed: site busy
        (S.CONNECTED, S.CLOSED),  # the connection went (refused, timed out, gone) ...
        (S.LOGGED_IN, S.CLOSED),
        (S.CURRENT, S.CLOSED),  # ... while attached: detached
        (S.HELD, S.CLOSED),  # ... while held: detached, its node given back
        (S.REPLACED, S.CLOSED),
        (S.MOVED, S.CLOSED),
        (S.DROPPED, S.CLOSED),
    }
)
