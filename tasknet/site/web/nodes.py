"""``GET /api/admin/nodes``: the connected nodes (admin only).

The API module (``web/api.py``) checks the caller is an admin and answers
``{"nodes": <what nodes_view gives>}`` (``site.nodes_view()``): a list of
``{"id", "protocol", "features", "lastRevision", "assigned", "connectedAt"}``
sorted by id.  ``assigned`` counts every task assigned to
the node (completed ones included); ``lastRevision`` is the revision of the
last report from the node committed since the site started (``null`` before
one); ``connectedAt`` is ISO 8601 UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tasknet.site.dispatch import ConnectedNodes
from tasknet.site.storage import dispatch as storage
from tasknet.site.storage.db import Database


def _iso(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


async def nodes_view(db: Database, nodes: ConnectedNodes) -> list[dict[str, Any]]:
    """The connected nodes, as ``/api/admin/nodes`` lists them."""
    sessions = [nodes.sessions[node_id] for node_id in nodes.ids()]
    counts = await db.read(storage.assigned_counts, [s.node_id for s in sessions])
    return [
        {
            "id": s.node_id,
            "protocol": s.protocol_version,
            "features": list(s.features),
            "lastRevision": nodes.last_revision.get(s.node_id),
            "assigned": counts.get(s.node_id, 0),
            "connectedAt": _iso(s.connected_at),
        }
        for s in sessions
    ]
