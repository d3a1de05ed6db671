"""The site's :class:`ISiteHandler`: node sessions in, dispatch and reports out.

Reports of every kind go to the :class:`ReportPipeline` (apply, commit, ACK);
logins and disconnects go to the :class:`Dispatcher` (resend, assign) and
into ``node_seen`` (:func:`record_seen`).  Which session is a node's current
one is the listener's business (``connected_nodes.py``): this handler hears
of a session only while it is current.  Which wire a session speaks never
matters here: the session picks the message type.

Several sites (SCALE.md 5): a report is applied only by the site holding
its node.  With an ownership, each report goes to the pipeline with the
holding of its session's take
(:meth:`NodeOwnership.holding <tasknet.site.connected_nodes.NodeOwnership.holding>`:
immediately once the take has committed, when it commits while it is under way), in
arrival order, and the report's own transaction judges it against the
node's row, on both backends (``storage/reports.py``): a report on a
session that no longer holds its node is not applied, and the session is
closed (``Goodbye{"replaced by a newer connection"}``: the node sends the
report again on its newer connection).  A report waiting for its take is
already in flight in the pipeline: a stopping site waits for it before it
closes node connections, so its ACK still goes out.  A session closed
because another site took its node (``MOVED``) is not recorded as gone in
``node_seen`` (its node is still connected).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.protocol.messages import DeleteResult, StatusReport, TaskReport
from tasknet.protocol.session import INodeSession, ISiteHandler
from tasknet.site import metrics
from tasknet.site.connected_nodes import JoinedWrites, NodeOwnership
from tasknet.site.dispatcher import Dispatcher
from tasknet.site.report_pipeline import ReportPipeline
from tasknet.site.session_states import ITrackedSession, SessionState
from tasknet.site.storage import node_sessions
from tasknet.site.storage.engine.database import Database

__all__ = ["SiteHandler", "record_seen"]

log = Logger()


@implementer(ISiteHandler)
class SiteHandler:
    """Ties node sessions to the report pipeline and the dispatcher."""

    def __init__(
        self,
        reports: ReportPipeline,
        dispatcher: Dispatcher,
        db: Database,
        ownership: NodeOwnership | None = None,
    ) -> None:
        self.reports = reports
        self.dispatcher = dispatcher
        self.db = db  # where logins and disconnects are recorded (node_seen)
        # A burst of logins (or disconnects) is recorded in one transaction.
        self._seen: JoinedWrites[node_sessions.SeenRecord, None] = JoinedWrites(
            db, node_sessions.record_seen_all
        )
        self.ownership = ownership
        #: Reports not applied because their session no longer held its node.
        self.refused_reports = 0

    def node_attached(self, session: INodeSession) -> None:
        record_seen(self._seen, session, connected=True)
        metrics.CONNECTED_NODES.labels(protocol=str(session.protocol_version)).inc()
        self.dispatcher.node_attached(session)

    def message_received(self, session: INodeSession, message: object) -> None:
        if isinstance(message, TaskReport | StatusReport | DeleteResult):
            if self.ownership is None:
                self.reports.submit(session, message)
                return
            self.reports.submit(
                session,
                message,
                self.ownership.holding(ITrackedSession(session)),
                refused=lambda: self._refused(session, message),
            )
        else:
            log.warn(
                "node {node}: unexpected {type}; ignored",
                node=session.node_id,
                type=type(message).__name__,
            )

    def _refused(
        self, session: INodeSession, message: TaskReport | StatusReport | DeleteResult
    ) -> None:
        self.refused_reports += 1
        log.info(
            "node {node}: {type} on a connection that no longer holds the node; not applied,"
            " closing it",
            node=session.node_id,
            type=type(message).__name__,
        )
        session.close("replaced by a newer connection")

    def node_detached(self, session: INodeSession) -> None:
        if ITrackedSession(session).life.state is not SessionState.MOVED:
            # Moved to another site: still connected, nothing to record.
            record_seen(self._seen, session, connected=False)
        metrics.CONNECTED_NODES.labels(protocol=str(session.protocol_version)).dec()
        self.dispatcher.node_detached(session)


def record_seen(
    writes: JoinedWrites[node_sessions.SeenRecord, None], session: INodeSession, connected: bool
) -> Deferred[None]:
    """Record in ``node_seen`` that ``session``'s node logged in or went away
    (best effort: a failure is logged; the node panel is only less current),
    in the transaction of the others recorded meanwhile."""
    d = writes.add((session.node_id, session.protocol_version, tuple(session.features), connected))

    def failed(failure: Failure) -> None:
        log.failure("recording node {node} as seen failed", failure, node=session.node_id)

    return d.addErrback(failed)
