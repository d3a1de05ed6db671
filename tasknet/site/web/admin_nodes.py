"""``GET /api/admin/nodes``: the nodes, connected or seen lately (admin only).

The API module (``web/api.py``) checks the caller is an admin and answers
``{"nodes": <what nodes_view gives>}`` (``site.nodes_view()``): connected
nodes first, then the ones seen in the last 7 days (``"connected": false``),
each sorted by id, each
``{"id", "connected", "protocol", "features", "lastRevision", "assigned",
"activeTasks", "connectedAt", "lastSeenAt", "lastReportAt", "bytesPerSecond",
"droppedEntries"}``:

* ``assigned`` counts every task assigned to the node, completed included;
  ``activeTasks`` only those not completed (what a person means by
  "assigned");
* ``lastRevision`` is the revision of the last report from the node
  committed since the site started (``null`` before one, and for a
  disconnected node): an internal counter, not for display;
* ``bytesPerSecond`` is the sum of the ``speed`` of its moving tasks;
* ``lastSeenAt``/``lastReportAt``/``connectedAt`` are ISO 8601 UTC, from the
  ``node_seen`` table (``connectedAt`` null while disconnected);
* ``droppedEntries`` is ``{reason: count}`` of report entries and
  deletions the site dropped from the node (``not_owner``, ``stale``, ...;
  ``node_dropped_entry``, kept across restarts).

``node_seen`` is kept current on login and disconnect by
``session_handler.record_seen``.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.interfaces import IReactorTime

from tasknet.clock import default_reactor
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.storage import reports, stats, throughput
from tasknet.site.storage.db import Database


async def nodes_view(
    db: Database, nodes: ConnectedNodes, clock: IReactorTime | None = None
) -> list[dict[str, Any]]:
    """The nodes, as ``/api/admin/nodes`` lists them."""
    now = default_reactor(clock).seconds()
    sessions = {node_id: nodes[node_id] for node_id in nodes.ids()}
    activity = await db.read(stats.node_activity, list(sessions), now)
    dropped = await db.read(reports.dropped_entries_by_node, list(activity))
    listed = []
    for node_id, known in activity.items():
        session = sessions.get(node_id)
        seen = known["seen"]
        connected = session is not None
        listed.append(
            {
                "id": node_id,
                "connected": connected,
                "protocol": session.protocol_version if session else seen["protocol"],
                "features": list(session.features) if session else json.loads(seen["features"]),
                "lastRevision": nodes.last_revision(node_id) if connected else None,
                "assigned": known["assigned"],
                "activeTasks": known["activeTasks"],
                "connectedAt": throughput.iso(session.connected_at) if session else None,
                "lastSeenAt": (
                    throughput.iso(now) if connected or seen is None else seen["last_seen_at"]
                ),
                "lastReportAt": seen["last_report_at"] if seen is not None else None,
                "bytesPerSecond": round(known["bytesPerSecond"], 1),
                "droppedEntries": dropped.get(node_id, {}),
            }
        )
    listed.sort(key=lambda node: (not node["connected"], node["id"]))
    return listed
