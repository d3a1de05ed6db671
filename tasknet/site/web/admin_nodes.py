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

from weakref import ref

from twisted.internet.interfaces import IReactorTime

from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.node_disk import NodeDiskFigures
from tasknet.site.storage import node_panel, throughput
from tasknet.site.storage.engine.database import Database


def registry_of(
    nodes: ConnectedNodes, shared: bool, disks: NodeDiskFigures | None = None
) -> node_panel.Registry:
    """This site's connections as the panel counts them (with what
    ``disks`` knows of each one's disk)."""
    registered = []
    for node_id in nodes.ids():
        session = nodes[node_id]
        holding = nodes.holding_of(session)
        figures = disks.figures(node_id, session.serve_url) if disks is not None else None
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
                figures.to_json() if figures is not None else None,
            )
        )
    return node_panel.Registry(nodes.site_name, nodes.instance_id, shared, tuple(registered))


#: Each registry's disk figures (:mod:`tasknet.site.node_disk`), made on
#: the first panel asked of it and dropped with it (by the registry's id: a
#: registry is not hashable).
_DISKS: dict[int, tuple[ref[ConnectedNodes], NodeDiskFigures]] = {}


def disk_figures_of(nodes: ConnectedNodes, clock: IReactorTime) -> NodeDiskFigures:
    """The disk figures the panel of ``nodes`` shows, read on ``clock``."""
    key = id(nodes)
    known = _DISKS.get(key)
    if known is not None and known[0]() is nodes:
        return known[1]
    from twisted.internet import reactor

    disks = NodeDiskFigures(reactor, clock)  # type: ignore[arg-type]
    _DISKS[key] = (ref(nodes, lambda _: _DISKS.pop(key, None)), disks)
    return disks


async def nodes_view(db: Database, nodes: ConnectedNodes, clock: IReactorTime) -> str:
    """The nodes, as ``/api/admin/nodes`` lists them (a JSON array's text),
    their ages on ``clock``."""
    # Each connected node's disk, as its serve endpoint says (cached; a
    # slow node delays the panel by at most node_disk.PANEL_WAIT).
    disks = disk_figures_of(nodes, clock)
    await disks.refresh({node_id: nodes[node_id].serve_url for node_id in nodes.ids()})
    # One site per SQLite file: a row of another instance is an earlier run's.
    registry = registry_of(nodes, shared=db.backend == "postgresql", disks=disks)
    return await db.read(node_panel.node_panel, clock.seconds(), registry)
