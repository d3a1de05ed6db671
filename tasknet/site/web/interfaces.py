"""What the web layer needs of the rest of the site, and nothing more.

The composition root (:mod:`tasknet.site.root`) builds one
:class:`WebDependencies` from the parts it has already built and hands it to
:func:`tasknet.site.web.api.make_web_resource`.  The web layer therefore never
imports the module that builds it (``root``) nor the running service
(``service``): it sees the lifecycle and the database through their own
types, and everything else (the WebSocket resource, the admin node view,
health, the outbox, the archive links) as the objects or callables below,
each given when the dependencies are made, so none of them is ever missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import IResource

from tasknet.site.lifecycle import Lifecycle
from tasknet.site.ratelimit import CreateRateLimiter
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.node_control import Control
from tasknet.site.storage.reassign import Reassigned, Retired
from tasknet.site.upstream_client import UpstreamReach
from tasknet.site.web.archives import ArchiveDelivery
from tasknet.site.web.auth import Authenticator
from tasknet.site.web.task_queries import MAX_BULK_MATCHING


@dataclass(frozen=True)
class WebDependencies:
    """The collaborators of the site's HTTP API (``web/api.py``)."""

    #: Reads and the small writes the API makes itself (favorites, force-delete).
    db: Database
    #: create / delete / resolve / the UNKNOWN list.
    lifecycle: Lifecycle
    #: ``/api/events``: the WebSocket resource over the site's event hub.
    events: IResource
    #: ``/api/admin/nodes``: fires with the node list, a JSON array's text
    #: (``storage/node_panel.py``).
    admin_nodes: Callable[[], Deferred[str]]
    #: ``/healthz``: ``{"recovery": ..., "dispatch": ..., "database": ...}``
    #: once the database was asked for an answer (``"database": "ok"`` or
    #: ``"failing since …"``, which is a 503).
    health: Callable[[], Deferred[dict[str, str]]]
    #: Called after a commit the API made itself that enqueued notifications.
    wake_outbox: Callable[[], object]
    #: ``--create-rate``: the per-user create limiter, or ``None`` (no limit).
    create_limiter: CreateRateLimiter | None
    #: The site's clock (``/api/stats`` windows end "now" on it).
    clock: IReactorTime
    #: Tokens, browser sessions and the same-origin rule (``web/auth.py``),
    #: the same one ``/api/events`` looks its sockets up with.
    auth: Authenticator
    #: Archive links and the streams through the site (``web/archives.py``).
    archives: ArchiveDelivery
    #: ``POST /api/admin/nodes/{id}/reassign`` and ``/retire``
    #: (``dispatcher.py``): ``(node_id, actor, note)``; fail with
    #: ``storage.reassign.UnknownNode`` for a node never heard of.
    reassign_node: Callable[[str, str, str], Deferred[Reassigned]]
    retire_node: Callable[[str, str, str], Deferred[Retired]]
    #: ``POST /api/admin/nodes/{id}/control`` (``dispatcher.control_node``):
    #: ``(node_id, mode or None, limit or None or "keep", actor, note)``.
    control_node: Callable[[str, str | None, int | None | str, str, str], Deferred[Control]]
    #: ``--max-bulk-matching``: the most tasks ``POST /api/tasks/bulk``
    #: with a ``filter`` acts on at once.
    max_bulk_matching: int = MAX_BULK_MATCHING
    #: The site's ``--name`` (``/api/me``'s ``site``: which site this is).
    site_name: str = ""
    #: Started with ``--demo`` (``GET /api/session``: the sign-in page names
    #: the demo token only then).
    demo: bool = False
    #: Whether the site's own upstream calls reach it (``GET /api/upstream``);
    #: ``None``: this site makes none.
    upstream_reach: UpstreamReach | None = None
