"""The site's one registry of logged-in node sessions (newest wins).

The node listener (``node_listener.py``) attaches a session when its login
succeeds and detaches it when its connection goes; a newer session for the
same node replaces the older one, which :meth:`ConnectedNodes.attach` hands
back for the listener to close.  The dispatcher asks it whom to send to, the
report pipeline tells it which revision each node's reports reached, and the
admin view (``web/admin_nodes.py``) lists what it holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from tasknet.protocol.session import INodeSession
from tasknet.site.storage.reports import ReportOutcome

__all__ = ["ConnectedNodes"]


class ConnectedNodes(Mapping[str, INodeSession]):
    """Node id → the node's current (newest) logged-in session.

    A read-only mapping to its readers; only :meth:`attach` and
    :meth:`detach` change it.  It also remembers the last report revision
    applied for each node since the site started.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, INodeSession] = {}
        self._last_revision: dict[str, int] = {}

    # -- Mapping

    def __getitem__(self, node_id: str) -> INodeSession:
        return self._sessions[node_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __repr__(self) -> str:
        return f"<ConnectedNodes {sorted(self._sessions)}>"

    # -- the listener

    def attach(self, session: INodeSession) -> INodeSession | None:
        """Make ``session`` its node's current one; give back the session it
        replaced (newest wins), if any, for the caller to close."""
        old = self._sessions.get(session.node_id)
        self._sessions[session.node_id] = session
        return old if old is not session else None

    def detach(self, session: INodeSession) -> bool:
        """Forget ``session`` if it is still its node's current one (a
        replaced session is already gone); true if it was."""
        if self._sessions.get(session.node_id) is session:
            del self._sessions[session.node_id]
            return True
        return False

    # -- readers

    def is_current(self, session: INodeSession) -> bool:
        return self._sessions.get(session.node_id) is session

    def ids(self) -> list[str]:
        """The connected node ids, sorted."""
        return sorted(self._sessions)

    # -- reports

    def report_applied(self, session: INodeSession, outcome: ReportOutcome) -> None:
        """After a committed report: remember the node's latest revision (it
        goes down only when the report started a new revision epoch)."""
        revision = outcome.revision
        if revision is None:
            return
        if outcome.new_epoch or revision > self._last_revision.get(session.node_id, -1):
            self._last_revision[session.node_id] = revision

    def last_revision(self, node_id: str) -> int | None:
        """The revision of the node's last report applied since the site started."""
        return self._last_revision.get(node_id)
