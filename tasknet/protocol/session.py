"""The interfaces both wire versions sit behind (docs/architecture.md, "Seams").

Site side: an :class:`INodeSession` per logged-in node connection, reported
to an :class:`ISiteHandler`.  Node side: an :class:`ISiteLink` reported to an
:class:`INodeHandler`.  Lifecycle code asks ``protocol_version`` only to pick
a message type; everything else is the same for legacy and v2 connections.

These are the only types of the four roles: classes declare them with
``@implementer`` and code is annotated with them (mypy checks both through
the ``mypy-zope`` plugin).  Attributes are typed in their descriptions.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface

from tasknet.protocol.messages import Message

__all__ = ["INodeHandler", "INodeSession", "ISiteHandler", "ISiteLink"]


class INodeSession(Interface):
    """A logged-in node connection, as the site sees it."""

    node_id = Attribute("str: the node's id, as it logged in")
    protocol_version = Attribute("int: 2 when v2 is in force, 1 for a legacy connection")
    features = Attribute("tuple[str, ...]: features of the node's Hello (empty if legacy)")
    connected_at = Attribute("float: Unix seconds at which the connection was accepted")
    archive_url = Attribute(
        "str: the base URL users reach the node's archive endpoint at (its v2 Hello's"
        " archiveUrl), set once the node is logged in and, with site-proof, proven;"
        " '' when none, not an http(s) URL, or on a legacy session"
    )
    serve_url = Attribute(
        "str: the base URL the site reaches the node's archive endpoint at (its v2"
        " Hello's serveUrl), believed as archive_url is; '' when the node does not serve"
    )

    def send_download(
        operation_id: str, gid: int, token: str, name: str, url: str, size: int = 0
    ) -> None:
        """v2: TaskCommand DOWNLOAD (``size``: the bytes the site expects, 0 if
        unknown); legacy: DownloadPost (no operationId nor size on the wire)."""

    def send_delete(delete_operation_id: str, gid: int, name: str) -> None:
        """v2: TaskCommand DELETE; legacy: DeleteGallery."""

    def send_ack(report_id: str, result: str) -> None:
        """v2 only: TaskReportAck (dropped with an error log on a legacy session)."""

    def send_cancel(operation_id: str, gid: int) -> None:
        """v2 only: TaskCommand CANCEL for that generation (custody: a task moved
        off this node); dropped with an error log on a legacy session."""

    def send_inventory_ack(inventory_id: str, part: int) -> None:
        """v2 only: ArchiveInventoryAck for one part of the node's inventory."""

    def close(reason: str) -> None:
        """Send Goodbye{reason} and close the connection."""


class ISiteHandler(Interface):
    """What the site does with node sessions (dispatch, reports)."""

    def node_attached(session: INodeSession) -> None:
        """A node logged in (after LoginResult{accepted} was sent, and for a
        node that asked for it, after the SiteProof was sent)."""

    def message_received(session: INodeSession, message: Message) -> None:
        """A post-login message other than Heartbeat/Hello/Goodbye/Error."""

    def node_detached(session: INodeSession) -> None:
        """The session is gone (closed, lost or replaced); called once per session."""


class ISiteLink(Interface):
    """The node's logged-in connection to the site."""

    protocol_version = Attribute("int: 2 only if the site's Hello came before LoginResult")

    def send(message: Message) -> None:
        """Send a message; a v2 type (10 and above) on a legacy link raises ValueError."""

    def close(reason: str) -> None:
        """Send Goodbye{reason} and close the connection."""


class INodeHandler(Interface):
    """What the node does with its link to the site."""

    def link_up(link: ISiteLink) -> None:
        """LoginResult{accepted} arrived and, on a v2 link, a valid SiteProof;
        on a legacy link, only if the node trusts a legacy site."""

    def message_received(link: ISiteLink, message: Message) -> None:
        """A post-login message other than Heartbeat/Hello/Goodbye/Error."""

    def link_down(link: ISiteLink) -> None:
        """The logged-in connection is gone; called once per link_up."""
