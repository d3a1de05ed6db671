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

A node's archive inventory (PROTOCOL.md "Archives (v2)") comes up whole,
assembled by its session (``node_listener.py``): it is judged in one
transaction (:func:`~tasknet.site.storage.inventory.judge_inventory`,
against the session's hold on its node when there is an ownership), and
once that committed the ``DELETE`` of each orphan with a tombstone goes to
the node, its completing part is ACKed and the outbox is woken (tasks
marked ``ARCHIVE_GONE``).  What it found gone beyond the first
:data:`~tasknet.site.storage.inventory.GONE_PER_TRANSACTION` is marked in
transactions of that many each, after (a wiped node's thousands would hold
the writer for minutes in one on PostgreSQL).  A judgement that failed (the
database down) is logged: the node sends a new inventory on its next
connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.protocol.messages import ArchiveInventory, DeleteResult, StatusReport, TaskReport
from tasknet.protocol.session import INodeSession, ISiteHandler
from tasknet.site import metrics
from tasknet.site.connected_nodes import NodeOwnership
from tasknet.site.dispatcher import Dispatcher
from tasknet.site.report_pipeline import ReportPipeline
from tasknet.site.session_states import ITrackedSession, SessionState
from tasknet.site.storage import inventory, node_sessions
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.node_sessions import Holding

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
        *,
        wake_outbox: Callable[[], object] | None = None,
    ) -> None:
        self.reports = reports
        self.dispatcher = dispatcher
        self.db = db  # where logins and disconnects are recorded (node_seen)
        self.ownership = ownership
        #: Reports not applied because their session no longer held its node.
        self.refused_reports = 0
        #: Called after an inventory's judgement changed tasks (the outbox's wake).
        self.wake_outbox = wake_outbox
        #: Inventories judged (committed) since the start, and the last verdict (tests).
        self.inventories_judged = 0
        self.last_verdict: inventory.InventoryVerdict | None = None

    def node_attached(self, session: INodeSession) -> None:
        record_seen(self.db, session, connected=True)
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
        elif isinstance(message, ArchiveInventory):
            self.judge_inventory(session, message)
        else:
            log.warn(
                "node {node}: unexpected {type}; ignored",
                node=session.node_id,
                type=type(message).__name__,
            )

    def judge_inventory(self, session: INodeSession, whole: ArchiveInventory) -> Deferred[None]:
        """Judge ``session``'s whole inventory (its parts assembled by the
        session), then send what it owes the node (see the module doc).
        Fires once done (never fails: a failure is logged)."""
        return Deferred.fromCoroutine(self._judge_inventory(session, whole))

    async def _judge_inventory(self, session: INodeSession, whole: ArchiveInventory) -> None:
        try:
            held: Holding | None = None
            if self.ownership is not None:
                held = await self.ownership.holding(ITrackedSession(session))
                if held is None:
                    self._not_held_inventory(session, whole)
                    return
            verdict = await self.db.write(
                inventory.judge_inventory_now,
                node_id=session.node_id,
                inventory_id=whole.inventory_id,
                archives=whole.archives,
                completed_before=iso(session.connected_at),
                holding=held,
            )
        except Exception:
            log.failure(
                "judging inventory {inventory_id} of node {node} failed; the node sends"
                " another on its next connection",
                inventory_id=whole.inventory_id,
                node=session.node_id,
            )
            return
        if verdict.not_held:
            self._not_held_inventory(session, whole)
            return
        for delete in verdict.deletes:
            session.send_delete(delete.delete_operation_id, delete.gid, delete.name)
        session.send_inventory_ack(whole.inventory_id, whole.part)
        if (verdict.missing or verdict.corrupt) and self.wake_outbox is not None:
            self.wake_outbox()
        if verdict.pending:
            verdict = await self._mark_pending(session, verdict)
        self.inventories_judged += 1
        self.last_verdict = verdict
        metrics.count_inventory(
            len(verdict.missing), len(verdict.orphans) + len(verdict.deletes), len(verdict.corrupt)
        )
        log.info(
            "node {node}: inventory {inventory_id} judged: {archives} archives ({bytes} bytes),"
            " {missing} missing, {corrupt} not as recorded, {deletes} deleted (tombstones),"
            " {orphans} orphans",
            node=session.node_id,
            inventory_id=whole.inventory_id,
            archives=verdict.archives,
            bytes=verdict.bytes,
            missing=len(verdict.missing),
            corrupt=len(verdict.corrupt),
            deletes=len(verdict.deletes),
            orphans=len(verdict.orphans),
        )

    async def _mark_pending(
        self, session: INodeSession, verdict: inventory.InventoryVerdict
    ) -> inventory.InventoryVerdict:
        """Mark the rest of what the inventory found gone, a transaction per
        :data:`~tasknet.site.storage.inventory.GONE_PER_TRANSACTION` (a
        failure is logged: the node's next inventory finds them again)."""
        missing, corrupt = list(verdict.missing), list(verdict.corrupt)
        pending = verdict.pending
        step = inventory.GONE_PER_TRANSACTION
        try:
            for start in range(0, len(pending), step):
                more_missing, more_corrupt = await self.db.write(
                    inventory.mark_gone,
                    node_id=session.node_id,
                    generations=pending[start : start + step],
                )
                missing += more_missing
                corrupt += more_corrupt
                if self.wake_outbox is not None:
                    self.wake_outbox()
        except Exception:
            log.failure(
                "node {node}: marking the archives its inventory misses failed",
                node=session.node_id,
            )
        return replace(verdict, missing=tuple(missing), corrupt=tuple(corrupt), pending=())

    def _not_held_inventory(self, session: INodeSession, whole: ArchiveInventory) -> None:
        log.info(
            "node {node}: inventory {inventory_id} on a connection that no longer holds the"
            " node; not judged, closing it",
            node=session.node_id,
            inventory_id=whole.inventory_id,
        )
        session.close("replaced by a newer connection")

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
            record_seen(self.db, session, connected=False)
        metrics.CONNECTED_NODES.labels(protocol=str(session.protocol_version)).dec()
        self.dispatcher.node_detached(session)


def record_seen(db: Database, session: INodeSession, connected: bool) -> Deferred[None]:
    """Record in ``node_seen`` that ``session``'s node logged in or went away
    (best effort: a failure is logged; the node panel is only less current),
    in the transaction of the others recorded meanwhile (a burst of logins,
    or disconnects, is one write: ``Database.write_joined``)."""
    d = db.write_joined(
        node_sessions.record_seen_all,
        (session.node_id, session.protocol_version, tuple(session.features), connected),
    )

    def failed(failure: Failure) -> None:
        log.failure("recording node {node} as seen failed", failure, node=session.node_id)

    return d.addCallbacks(lambda _: None, failed)
