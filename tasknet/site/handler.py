"""The site's :class:`ISiteHandler`: node sessions in, dispatch and reports out.

Reports of every kind go to the :class:`ReportPipeline` (apply, commit, ACK);
logins go to the :class:`Dispatcher` (resend, assign).  Which wire a session
speaks never matters here: the session picks the message type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from zope.interface import implementer

from tasknet.protocol.messages import DeleteResult, StatusReport, TaskReport
from tasknet.protocol.session import ISiteHandler
from tasknet.site import metrics
from tasknet.site.dispatch import ConnectedNodes, Dispatcher
from tasknet.site.notify import OutboxExecutor, WebhookSender
from tasknet.site.reports import DEFAULT_MAX_BATCH, ReportPipeline
from tasknet.site.storage.db import Database
from tasknet.site.storage.dispatch import PAGE_SIZE
from tasknet.site.web.events import Authenticate, EventHub, events_resource
from tasknet.site.web.nodes import nodes_view, record_seen

log = Logger()


@implementer(ISiteHandler)
class SiteHandler:
    """Ties node sessions to the report pipeline and the dispatcher."""

    def __init__(
        self,
        nodes: ConnectedNodes,
        reports: ReportPipeline,
        dispatcher: Dispatcher,
        db: Database | None = None,
    ):
        self.nodes = nodes
        self.reports = reports
        self.dispatcher = dispatcher
        self.db = db  # where logins and disconnects are recorded (node_seen)

    def node_attached(self, session: Any) -> None:
        self.nodes.attach(session)
        if self.db is not None:
            record_seen(self.db, session, connected=True)
        metrics.CONNECTED_NODES.labels(protocol=str(session.protocol_version)).inc()
        self.dispatcher.node_attached(session)

    def message_received(self, session: Any, message: object) -> None:
        if isinstance(message, TaskReport | StatusReport | DeleteResult):
            self.reports.submit(session, message)
        else:
            log.warn(
                "node {node}: unexpected {type}; ignored",
                node=session.node_id,
                type=type(message).__name__,
            )

    def node_detached(self, session: Any) -> None:
        if self.nodes.detach(session) and self.db is not None:
            record_seen(self.db, session, connected=False)
        metrics.CONNECTED_NODES.labels(protocol=str(session.protocol_version)).dec()


@dataclass
class ProtocolSide:
    """Everything of the site's protocol side, built by :func:`build_protocol_side`.

    ``service.py`` puts ``handler`` into the ``NodeListenerFactory``,
    ``events_resource`` at ``/api/events``, ``nodes_view`` behind
    ``/api/admin/nodes``, wires ``outbox.wake`` and ``dispatcher.task_changed``
    into the lifecycle, calls :meth:`start` before listening and
    ``dispatcher.enable()`` once recovery succeeded, and :meth:`stop` on
    shutdown (after the node listener stopped, before the connections close).
    """

    db: Database
    nodes: ConnectedNodes
    reports: ReportPipeline
    dispatcher: Dispatcher
    handler: SiteHandler
    hub: EventHub
    outbox: OutboxExecutor
    events_resource: Any

    def nodes_view(self) -> Deferred[list[dict[str, Any]]]:
        return Deferred.fromCoroutine(nodes_view(self.db, self.nodes))

    def start(self) -> Deferred[None]:
        """Deliver what the previous run left in the outbox (and start polling)."""
        return self.outbox.start()

    async def stop(self, close_nodes: Callable[[], object] | None = None) -> None:
        """Shut the protocol side down (call it after the node listener
        stopped accepting): stop dispatching, finish the reports in flight
        while their connections are still open (their ACKs go out, so no
        node redelivers what is already committed), then ``close_nodes()``
        (may return a Deferred), finish what arrived meanwhile, stop
        delivery and close the WebSocket clients."""
        await self.dispatcher.stop()
        await self.reports.idle()
        if close_nodes is not None:
            await maybeDeferred(close_nodes)
            await self.reports.idle()
        await self.outbox.stop()
        self.hub.close_all()


def build_protocol_side(
    db: Database,
    authenticate: Authenticate,
    *,
    webhook_url: str | None = None,
    webhook_timeout: float = 10.0,
    webhook_concurrency: int = 4,
    webhook_max_attempts: int = 5,
    webhook_backoff: float = 1.0,
    max_batch: int = DEFAULT_MAX_BATCH,
    dispatch_page_size: int = PAGE_SIZE,
    dispatch_assign_delay: float = 0.5,
    dispatch_poll_interval: float | None = 5.0,
    outbox_poll_interval: float | None = 5.0,
) -> ProtocolSide:
    """Build the protocol side over ``db``.  ``authenticate(token)`` fires
    with the user of an API token (or ``None``), for ``/api/events``."""
    nodes = ConnectedNodes()
    hub = EventHub()
    webhook = None
    if webhook_url:
        webhook = WebhookSender(
            webhook_url,
            db,
            concurrency=webhook_concurrency,
            timeout=webhook_timeout,
            max_attempts=webhook_max_attempts,
            backoff=webhook_backoff,
        )
    outbox = OutboxExecutor(db, hub, webhook, poll_interval=outbox_poll_interval)
    reports = ReportPipeline(
        db,
        on_committed=outbox.wake,
        on_applied=nodes.report_applied,
        max_batch=max_batch,
    )
    dispatcher = Dispatcher(
        db,
        nodes,
        page_size=dispatch_page_size,
        assign_delay=dispatch_assign_delay,
        poll_interval=dispatch_poll_interval,
    )
    handler = SiteHandler(nodes, reports, dispatcher, db)
    return ProtocolSide(
        db, nodes, reports, dispatcher, handler, hub, outbox, events_resource(hub, authenticate)
    )
