"""``GET /api/admin/nodes``: the nodes, connected or seen lately (admin only);
``POST /api/admin/nodes/{id}/reassign`` and ``/retire``: an operator's
custody actions on one node (DELIVERY.md "A node that is gone"), answered
by :func:`reassign_answer` and :func:`retire_answer`;
``POST /api/admin/nodes/{id}/control``: drain, pause, resume and a download
limit (:func:`control_answer`, :mod:`tasknet.site.storage.node_control`).

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

from collections.abc import Awaitable, Callable
from typing import TypedDict
from weakref import ref

from twisted.internet.interfaces import IReactorTime

from tasknet.json_types import JsonObject
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.node_disk import NodeDiskFigures
from tasknet.site.storage import node_control, node_panel, reassign, throughput
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.users import NODE_ID_PATTERN
from tasknet.site.web.errors import ApiError


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
    # Unless other sites may share the database (one site per SQLite file),
    # a row of another instance is an earlier run's.
    registry = registry_of(nodes, shared=db.capabilities.shared_by_sites, disks=disks)
    return await db.read(node_panel.node_panel, clock.seconds(), registry)


def _known_id(node_id: str) -> str:
    """``node_id`` of a path, or ``404 not_found`` when it cannot be a node's."""
    if not NODE_ID_PATTERN.fullmatch(node_id):
        raise ApiError("not_found", f"no node {node_id!r}: not a node id")
    return node_id


class MovedJson(TypedDict):
    """What a reassignment moved, as the API says it."""

    node: str
    tasks: int
    sent: int
    waiting: int


class ReassignedJson(MovedJson):
    cancels: int


class RetiredJson(MovedJson):
    archives: int
    keyRemoved: bool


class NodeControlJson(node_control.ControlJson):
    node: str


def _moved(moved: reassign.Reassigned) -> MovedJson:
    return {
        "node": moved.node_id,
        "tasks": moved.tasks,
        "sent": len(moved.commands),
        "waiting": len(moved.waiting),
    }


async def reassign_answer(
    action: Callable[[str, str, str], Awaitable[reassign.Reassigned]],
    node_id: str,
    actor: str,
    note: str,
) -> ReassignedJson:
    """Reassign the unfinished tasks of ``node_id`` now (``action``: the
    dispatcher's) and say what moved; ``404 not_found`` for a node the site
    never heard of (nothing changed)."""
    try:
        moved = await action(_known_id(node_id), actor, note)
    except reassign.UnknownNode as unknown:
        raise ApiError("not_found", str(unknown)) from None
    return {**_moved(moved), "cancels": len(moved.cancels)}


async def retire_answer(
    action: Callable[[str, str, str], Awaitable[reassign.Retired]],
    node_id: str,
    actor: str,
    note: str,
) -> RetiredJson:
    """Retire ``node_id`` (``action``: the dispatcher's) and say what it
    did; ``404 not_found`` for a node the site never heard of (nothing
    changed)."""
    try:
        retired = await action(_known_id(node_id), actor, note)
    except reassign.UnknownNode as unknown:
        raise ApiError("not_found", str(unknown)) from None
    return {
        **_moved(retired.reassigned),
        "archives": retired.archives,
        "keyRemoved": retired.key_removed,
    }


#: ``POST /api/admin/nodes/{id}/control``'s body fields beside ``note``.
CONTROL_FIELDS = ("mode", "downloadLimit")


def control_request(document: JsonObject) -> tuple[str | None, int | None | str]:
    """``(mode, limit)`` of a control body: ``mode`` one of
    :data:`~tasknet.site.storage.node_control.MODES` or absent (None: keep),
    ``downloadLimit`` a whole number, null (no bound) or absent (``"keep"``);
    ``400 invalid_request`` for anything else (nothing changed)."""
    unknown = sorted(set(document) - {*CONTROL_FIELDS, "note"})
    if unknown:
        raise ApiError("invalid_request", f"unknown field(s): {', '.join(unknown)}")
    mode = document.get("mode")
    if mode is not None and mode not in node_control.MODES:
        raise ApiError(
            "invalid_request", f"'mode' is one of {', '.join(node_control.MODES)}, got {mode!r}"
        )
    if mode is None and "downloadLimit" not in document:
        raise ApiError("invalid_request", "give 'mode', 'downloadLimit' or both")
    if "downloadLimit" not in document:
        return mode, "keep"
    limit = document["downloadLimit"]
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)  # 3.0 is 3 in JSON
    try:
        return mode, node_control.check_limit(limit)
    except node_control.BadControl as bad:
        raise ApiError("invalid_request", f"'downloadLimit': {bad}") from None


async def control_answer(
    action: Callable[
        [str, str | None, int | None | str, str, str], Awaitable[node_control.Control]
    ],
    node_id: str,
    document: JsonObject,
    actor: str,
    note: str,
) -> NodeControlJson:
    """Drain, pause or resume ``node_id`` and set its download limit
    (``action``: the dispatcher's ``control_node``) and say what it is now;
    ``404 not_found`` for a node the site never heard of (nothing changed)."""
    mode, limit = control_request(document)
    try:
        control = await action(_known_id(node_id), mode, limit, actor, note)
    except node_control.UnknownNode as unknown:
        raise ApiError("not_found", str(unknown)) from None
    return {"node": node_id, **control.to_json()}
