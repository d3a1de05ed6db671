"""``GET /api/admin/nodes``: the nodes, connected or seen lately (admin only).

The API module (``web/api.py``) checks the caller is an admin and answers
``{"nodes": <what nodes_view gives>}``; what each node shows, and which
connections count, is :mod:`tasknet.site.storage.node_panel`'s, rendered
by the database engine from this site's registry of connections
(:func:`registry_of`, read here on the reactor) and the rows of one
snapshot.

``node_seen`` is kept current on login and disconnect by
``session_handler.record_seen``.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.storage import node_panel, throughput
from tasknet.site.storage.engine.database import Database


def registry_of(nodes: ConnectedNodes, shared: bool) -> node_panel.Registry:
    """This site's connections as the panel counts them."""
    registered = []
    for node_id in nodes.ids():
        session = nodes[node_id]
        holding = nodes.holding_of(session)
        registered.append(
            node_panel.Registered(
                node_id,
                holding.epoch if holding is not None else None,
                session.protocol_version,
                tuple(session.features),
                throughput.iso(session.connected_at),
                nodes.last_revision(node_id),
                session.archive_url,
                session.serve_url,
            )
        )
    return node_panel.Registry(nodes.site_name, nodes.instance_id, shared, tuple(registered))


async def nodes_view(db: Database, nodes: ConnectedNodes, clock: IReactorTime) -> str:
    """The nodes, as ``/api/admin/nodes`` lists them (a JSON array's text),
    their ages on ``clock``."""
    # One site per SQLite file: a row of another instance is an earlier run's.
    registry = registry_of(nodes, shared=db.backend == "postgresql")
    return await db.read(node_panel.node_panel, clock.seconds(), registry)
