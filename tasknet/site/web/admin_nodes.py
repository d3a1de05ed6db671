"""``GET /api/admin/nodes``: the nodes, connected or seen lately (admin only).

The API module (``web/api.py``) checks the caller is an admin and answers
``{"nodes": <what nodes_view gives>}`` (``site.nodes_view()``): connected
nodes first, then the ones seen in the last 7 days (``"connected": false``),
each sorted by id, each
``{"id", "connected", "site", "protocol", "features", "lastRevision",
"assigned", "activeTasks", "runningTasks", "queuedTasks", "connectedAt",
"lastSeenAt", "lastReportAt", "bytesPerSecond", "droppedEntries"}``:

* every node connected to *any* site of the database is listed once, with
  ``site`` the ``--name`` of the site holding it (``node_session``, read in
  the same snapshot as the rest; ``null`` while disconnected).  A row that
  names this site counts only while this site's registry still has that
  very connection (a connection that just went may not have given its row
  back yet), and a connection here whose take has not committed yet counts
  as this site's.  On SQLite (one site per file) only this site's own
  connections count;

* ``assigned`` counts every task assigned to the node, completed included;
  ``activeTasks`` only those not completed (what a person means by
  "assigned"), of which ``queuedTasks`` are held but not started (the
  node's ``queued``) and ``runningTasks`` are downloading (not queued),
  waiting for compression or compressing;
* ``lastRevision`` is the revision of the last report from the node
  committed since the site started (``null`` before one, for a
  disconnected node, and for a node another site holds): an internal
  counter, not for display;
* ``bytesPerSecond`` is the node's bytes over the last full minute
  (``stats.node_activity``): the same bytes as ``/api/stats``' ``byNode``
  of that bucket, divided by 60 -- not a sum of task speeds;
* ``lastSeenAt``/``lastReportAt`` are ISO 8601 UTC, from the ``node_seen``
  table; ``connectedAt`` (the holding connection's accept time, null while
  disconnected) and ``protocol``/``features`` of a connected node from its
  ``node_session`` row;
* ``droppedEntries`` is ``{reason: count}`` of report entries and
  deletions the site dropped from the node (``not_owner``, ``stale``, ...;
  ``node_dropped_entry``, kept across restarts).

``node_seen`` is kept current on login and disconnect by
``session_handler.record_seen``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IReactorTime

from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.storage import stats, throughput
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.node_sessions import Holder


@dataclass(frozen=True)
class _Connection:
    site: str
    protocol: int
    features: list[str]
    connected_at: str


def _ours(nodes: ConnectedNodes, holder: Holder) -> bool:
    return (holder.instance_id, holder.site_name) == (nodes.instance_id, nodes.site_name)


def _connections(
    nodes: ConnectedNodes, holders: dict[str, Holder], shared: bool
) -> dict[str, _Connection]:
    """The connected nodes, each once (see the module doc): on a shared
    database another site's rows as they are, and this site's own sessions
    -- those whose row is theirs, and those whose take has not committed
    yet; on SQLite this site's sessions."""
    found = {
        node_id: _Connection(h.site_name, h.protocol, list(h.features), h.connected_at)
        for node_id, h in holders.items()
        if shared and not _ours(nodes, h)
    }
    for node_id in nodes.ids():
        session = nodes[node_id]
        holding = nodes.holding_of(session)
        holder = holders.get(node_id)
        if (
            not shared
            or holding is None
            or (holder is not None and _ours(nodes, holder) and holder.epoch == holding.epoch)
        ):
            found[node_id] = _Connection(
                nodes.site_name,
                session.protocol_version,
                list(session.features),
                throughput.iso(session.connected_at),
            )
    return found


async def nodes_view(
    db: Database, nodes: ConnectedNodes, clock: IReactorTime
) -> list[dict[str, Any]]:
    """The nodes, as ``/api/admin/nodes`` lists them, their ages on ``clock``."""
    now = clock.seconds()
    listing = await db.read(stats.admin_listing, now, nodes.ids())
    # One site per SQLite file: a row of another instance is an earlier run's.
    connections = _connections(nodes, listing.holders, db.backend == "postgresql")
    listed = []
    for node_id, known in listing.activity.items():
        connection = connections.get(node_id)
        seen = known["seen"]
        connected = connection is not None
        if connection is not None:
            protocol, features = connection.protocol, connection.features
        elif seen is not None:
            protocol, features = seen["protocol"], seen["features"]
        else:  # its connection went before its login was recorded as seen
            protocol, features = None, []
        ours = connection is not None and connection.site == nodes.site_name
        listed.append(
            {
                "id": node_id,
                "connected": connected,
                "site": connection.site if connection is not None else None,
                "protocol": protocol,
                "features": features,
                "lastRevision": nodes.last_revision(node_id) if ours else None,
                "assigned": known["assigned"],
                "activeTasks": known["activeTasks"],
                "runningTasks": known["runningTasks"],
                "queuedTasks": known["queuedTasks"],
                "connectedAt": connection.connected_at if connection is not None else None,
                "lastSeenAt": (
                    throughput.iso(now) if connected or seen is None else seen["last_seen_at"]
                ),
                "lastReportAt": seen["last_report_at"] if seen is not None else None,
                "bytesPerSecond": round(known["bytesPerSecond"], 1),
                "droppedEntries": listing.dropped.get(node_id, {}),
            }
        )
    listed.sort(key=lambda node: (not node["connected"], node["id"]))
    return listed
