"""``GET /api/admin/nodes``: the nodes, connected or seen lately, as the
engine renders them (:func:`node_panel`).

The answer is ``{"nodes": [...]}``: connected nodes first, then the ones
seen in the last :data:`SEEN_DAYS` days (``"connected": false``), each
sorted by id (code points), each ``{"id", "connected", "site", "protocol",
"features", "lastRevision", "assigned", "activeTasks", "runningTasks",
"queuedTasks", "connectedAt", "lastSeenAt", "lastReportAt",
"bytesPerSecond", "droppedEntries", "archiveUrl", "serveUrl", "orphans",
"inventory"}``:

* every node connected to *any* site of the database is listed once, with
  ``site`` the ``--name`` of the site holding it (``node_session``, read in
  the same snapshot as the rest; ``null`` while disconnected).  A row that
  names this site counts only while this site's registry still has that
  very connection (a connection that just went may not have given its row
  back yet), and a connection here whose take has not committed yet counts
  as this site's.  On SQLite (one site per file) only this site's own
  connections count (:func:`connections`);
* ``assigned`` counts every task assigned to the node, completed included;
  ``activeTasks`` only those not completed (what a person means by
  "assigned"), of which ``queuedTasks`` are held but not started (the
  node's ``queued``) and ``runningTasks`` are downloading (not queued),
  waiting for compression or compressing: schema v9's kept counts
  (``node_task_count``);
* ``lastRevision`` is the revision of the last report from the node
  committed since the site started (``null`` before one, for a
  disconnected node, and for a node another site holds): an internal
  counter, not for display;
* ``bytesPerSecond`` is the node's bytes over the last
  :data:`RATE_MINUTES` full minutes (``throughput_minute``: the same bytes
  as ``/api/stats``' ``byNode`` of those buckets, every user's) divided by
  their seconds, to a tenth (halves up) -- not a sum of task speeds; 0
  for a node not connected (issue 36, item 2: a gone node shows no speed);
* ``lastSeenAt``/``lastReportAt`` are ISO 8601 UTC, from the ``node_seen``
  table (``lastSeenAt`` is now for a connected node, and for one never
  recorded); ``connectedAt`` (the holding connection's accept time, null
  while disconnected) and ``protocol``/``features`` of a connected node
  from its connection, of another from its ``node_seen`` row;
* ``archiveUrl`` and ``serveUrl`` are where a node connected to this site
  serves its archives, as its v2 Hello said once it was proven
  (``node_listener.py``); ``""`` when it serves none, for a legacy or
  disconnected node, and for one another site holds (its Hello went there);
* ``disk`` is what a node connected to this site with a ``serveUrl``
  last said of its disk on its serve endpoint's ``/healthz``
  (:mod:`tasknet.site.node_disk`, read at most every 10 s when the panel
  is asked): ``{"archives", "bytes", "free", "budget", "at"}`` (the
  archives it holds, their bytes, the free bytes under its ``--data``,
  its ``--disk-budget`` or null; a figure it did not give is null);
  ``null`` when unknown (no ``serveUrl``, held by another site, not
  answering);
* ``droppedEntries`` is ``{reason: count}`` of report entries and
  deletions the site dropped from the node (``not_owner``, ``stale``, ...;
  ``node_dropped_entry``, kept across restarts);
* ``orphans`` lists the archives the node's last inventory held that the
  site has no live generation for on it and no delete to remove them with
  (``node_archive_orphan``, :mod:`~tasknet.site.storage.inventory`), each
  ``{"gid", "operationId", "size", "sha256", "foundAt"}``, by gid: the
  first :data:`ORPHANS_LISTED` (``inventory.orphans`` counts them all);
* ``control`` is an operator's drain, pause or download limit of the node
  (``node_control``, :mod:`~tasknet.site.storage.node_control`):
  ``{"mode", "downloadLimit", "actor", "note", "changedAt"}``, ``null``
  when active with no bound;
* ``inventory`` is the node's last judged inventory (``node_inventory``):
  ``{"inventoryId", "archives", "bytes", "missing", "orphans",
  "judgedAt"}``, ``null`` before its first.

The engine builds the whole list as one JSON text, which the API answers
as it is: a thousand nodes cross to Python as one value, not a row each,
and the engine's work runs with the GIL released (B9's node panel at 8
concurrent clients: p50 72 ms with a row per node, 37 with the rows parsed
from one text, and less still with nothing parsed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import orjson

from tasknet.site.storage import node_sessions, throughput
from tasknet.site.storage.engine.sql import per_backend
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.stats import BUCKET_SECONDS
from tasknet.status import NodeCode

#: A node disconnected longer than this is no longer listed.
SEEN_DAYS = 7
#: ``bytesPerSecond``: over the last this many full minutes of
#: ``throughput_minute`` (the buckets of ``/api/stats``).
RATE_MINUTES = 1
#: A node's ``orphans``: at most this many listed (the panel stays small
#: after a node restored from another site's backup).
ORPHANS_LISTED = 100


class DiskJson(TypedDict):
    """A node's disk as the panel shows it (``tasknet.site.node_disk``'s
    figures; a figure the node did not give is null)."""

    archives: int | None
    bytes: int | None
    free: int | None
    budget: int | None
    at: str


class ConnectionJson(TypedDict):
    """A connected node as the panel shows its connection (:func:`connections`)."""

    id: str
    site: str
    protocol: int
    features: list[str]
    connectedAt: str
    lastRevision: int | None
    archiveUrl: str
    serveUrl: str
    disk: DiskJson | None


@dataclass(frozen=True)
class Registered:
    """A connection of this site's registry as the panel counts it, read on
    the reactor before the panel's transaction."""

    node_id: str
    #: The epoch of its hold on the node (None: its take has not committed).
    epoch: int | None
    protocol: int
    features: tuple[str, ...]
    connected_at: str
    last_revision: int | None
    #: Where it serves archives (its believed Hello; "" when none).
    archive_url: str = ""
    serve_url: str = ""
    #: What its serve endpoint's /healthz last said of its disk
    #: (``tasknet.site.node_disk``; None: unknown).
    disk: DiskJson | None = None


@dataclass(frozen=True)
class Registry:
    """Who this site is and the connections it has."""

    site_name: str
    instance_id: int | None
    #: Several sites share the database (PostgreSQL): their rows count too.
    shared: bool
    connections: tuple[Registered, ...] = ()


def connections(holders: list[node_sessions.Holder], registry: Registry) -> list[ConnectionJson]:
    """The connected nodes, each once, as the panel shows their connection
    (see the module doc): on a shared database another site's rows as they
    are, and this site's own connections -- those whose row is theirs, and
    those whose take has not committed yet; on SQLite this site's
    connections."""

    def ours(holder: node_sessions.Holder) -> bool:
        return (holder.instance_id, holder.site_name) == (registry.instance_id, registry.site_name)

    revisions = {r.node_id: r.last_revision for r in registry.connections}
    found: dict[str, ConnectionJson] = {
        h.node_id: {
            "id": h.node_id,
            "site": h.site_name,
            "protocol": h.protocol,
            "features": list(h.features),
            "connectedAt": h.connected_at,
            "lastRevision": revisions.get(h.node_id) if h.site_name == registry.site_name else None,
            "archiveUrl": "",
            "serveUrl": "",
            "disk": None,
        }
        for h in holders
        if registry.shared and not ours(h)
    }
    held = {h.node_id: h for h in holders}
    for mine in registry.connections:
        holder = held.get(mine.node_id)
        if (
            not registry.shared
            or mine.epoch is None
            or (holder is not None and ours(holder) and holder.epoch == mine.epoch)
        ):
            found[mine.node_id] = {
                "id": mine.node_id,
                "site": registry.site_name,
                "protocol": mine.protocol,
                "features": list(mine.features),
                "connectedAt": mine.connected_at,
                "lastRevision": mine.last_revision,
                "archiveUrl": mine.archive_url,
                "serveUrl": mine.serve_url,
                "disk": mine.disk,
            }
    return list(found.values())


# The list, rendered by the engine.  ?1 the connections (a JSON array of
# connections()'s objects), ?2 the oldest last_seen_at listed, ?3 now (ISO),
# ?4-?7 the node codes (completed, downloading, waiting for compression,
# compressing), ?8 and ?9 the rate's first and last minute, ?10 its seconds.
# Listed: the connections, then the nodes seen lately that are not among
# them (a set the engine indexes: ten thousand connections are not compared
# with each node); the task counts are schema v9's (a status of NULL is -1),
# looked up per listed node; the order is connected first, then the id's
# code points.  SQLite joins the objects as text (group_concat, in the
# order of its subquery): they are JSON already.
# Both engines alike: each listed node's kept task counts (all, not
# completed, queued, running) and the rate's bytes per node.
_COUNTS_AND_RATE = """\
           COALESCE(SUM(k.n), 0),
           COALESCE(SUM(CASE WHEN k.status = ?4 THEN 0 ELSE k.n END), 0),
           COALESCE(SUM(CASE WHEN k.status = ?5 AND k.queued = 1 THEN k.n ELSE 0 END), 0),
           COALESCE(SUM(CASE WHEN (k.status = ?5 AND k.queued = 0) OR k.status IN (?6, ?7)
                             THEN k.n ELSE 0 END), 0)
    FROM listed AS l LEFT JOIN node_task_count AS k ON k.node_id = l.node_id
    GROUP BY l.node_id
),
rate(node_id, bytes) AS (
    SELECT node_id, SUM(bytes) FROM throughput_minute
    WHERE minute BETWEEN ?8 AND ?9 GROUP BY node_id
),"""
_NODE_PANEL_SQL = per_backend(
    sqlite=f"""
WITH listed(node_id, c) AS (
    SELECT json_extract(value, '$.id'), value FROM json_each(?1)
    UNION ALL
    SELECT node_id, NULL FROM node_seen WHERE last_seen_at >= ?2
        AND node_id NOT IN (SELECT json_extract(value, '$.id') FROM json_each(?1))
),
tasks(node_id, c, assigned, active, queued, running) AS (
    SELECT l.node_id, l.c,
{_COUNTS_AND_RATE}
dropped(node_id, reasons) AS (
    SELECT node_id, json_group_object(reason, count) FROM node_dropped_entry
    WHERE node_id IN (SELECT node_id FROM listed) GROUP BY node_id
),
orphan(node_id, list) AS (
    SELECT node_id, json_group_array(json_object('gid', gid, 'operationId', operation_id,
        'size', size, 'sha256', sha256, 'foundAt', found_at)) FROM (
        SELECT *, row_number() OVER (PARTITION BY node_id ORDER BY gid, operation_id) AS n
        FROM node_archive_orphan WHERE node_id IN (SELECT node_id FROM listed)
        ORDER BY node_id, gid, operation_id)
    WHERE n <= {ORPHANS_LISTED} GROUP BY node_id
)
SELECT '[' || COALESCE(group_concat(node, ','), '') || ']' FROM (
    SELECT json_object(
        'id', t.node_id,
        'connected', json(CASE WHEN t.c IS NULL THEN 'false' ELSE 'true' END),
        'site', json_extract(t.c, '$.site'),
        'protocol', CASE WHEN t.c IS NULL THEN s.protocol
                         ELSE json_extract(t.c, '$.protocol') END,
        'features', json(CASE WHEN t.c IS NULL THEN COALESCE(s.features, '[]')
                              ELSE json_extract(t.c, '$.features') END),
        'lastRevision', json_extract(t.c, '$.lastRevision'),
        'assigned', t.assigned,
        'activeTasks', t.active,
        'runningTasks', t.running,
        'queuedTasks', t.queued,
        'connectedAt', json_extract(t.c, '$.connectedAt'),
        'lastSeenAt', CASE WHEN t.c IS NULL AND s.node_id IS NOT NULL THEN s.last_seen_at
                           ELSE ?3 END,
        'lastReportAt', s.last_report_at,
        'bytesPerSecond', CASE WHEN t.c IS NULL THEN 0.0
                               ELSE ((COALESCE(r.bytes, 0) * 10 + ?10 / 2) / ?10) / 10.0 END,
        'droppedEntries', json(COALESCE(d.reasons, '{{}}')),
        'archiveUrl', COALESCE(json_extract(t.c, '$.archiveUrl'), ''),
        'serveUrl', COALESCE(json_extract(t.c, '$.serveUrl'), ''),
        'disk', json(COALESCE(json_extract(t.c, '$.disk'), 'null')),
        'orphans', json(COALESCE(o.list, '[]')),
        'inventory', json(CASE WHEN v.node_id IS NULL THEN 'null' ELSE json_object(
            'inventoryId', v.inventory_id, 'archives', v.archives, 'bytes', v.bytes,
            'missing', v.missing, 'orphans', v.orphans, 'judgedAt', v.judged_at) END),
        'control', json(CASE WHEN nc.node_id IS NULL THEN 'null' ELSE json_object(
            'mode', nc.mode, 'downloadLimit', nc.download_limit, 'actor', nc.actor,
            'note', nc.note, 'changedAt', nc.changed_at) END)) AS node
    FROM tasks AS t
    LEFT JOIN node_seen AS s ON s.node_id = t.node_id
    LEFT JOIN rate AS r ON r.node_id = t.node_id
    LEFT JOIN dropped AS d ON d.node_id = t.node_id
    LEFT JOIN orphan AS o ON o.node_id = t.node_id
    LEFT JOIN node_inventory AS v ON v.node_id = t.node_id
    LEFT JOIN node_control AS nc ON nc.node_id = t.node_id
    ORDER BY t.c IS NULL, t.node_id
)
""",  # noqa: S608 (constant text)
    postgres=f"""
WITH listed(node_id, c) AS (
    SELECT c ->> 'id', c FROM json_array_elements(CAST(?1 AS JSON)) AS c
    UNION ALL
    SELECT node_id, NULL FROM node_seen WHERE last_seen_at >= ?2
        AND node_id NOT IN (
            SELECT c ->> 'id' FROM json_array_elements(CAST(?1 AS JSON)) AS c)
),
tasks(node_id, c, assigned, active, queued, running) AS (
    SELECT l.node_id, MIN(CAST(l.c AS TEXT)),
{_COUNTS_AND_RATE}
dropped(node_id, reasons) AS (
    SELECT node_id, json_object_agg(reason, count) FROM node_dropped_entry
    WHERE node_id IN (SELECT node_id FROM listed) GROUP BY node_id
),
orphan(node_id, list) AS (
    SELECT node_id, json_agg(json_build_object('gid', gid, 'operationId', operation_id,
        'size', size, 'sha256', sha256, 'foundAt', found_at) ORDER BY gid, operation_id)
    FROM (
        SELECT *, row_number() OVER (PARTITION BY node_id ORDER BY gid, operation_id) AS n
        FROM node_archive_orphan WHERE node_id IN (SELECT node_id FROM listed)) AS numbered
    WHERE n <= {ORPHANS_LISTED} GROUP BY node_id
)
SELECT CAST(json_agg(json_build_object(
        'id', t.node_id,
        'connected', t.c IS NOT NULL,
        'site', CAST(t.c AS JSON) -> 'site',
        'protocol', CASE WHEN t.c IS NULL THEN to_json(s.protocol)
                         ELSE CAST(t.c AS JSON) -> 'protocol' END,
        'features', CASE WHEN t.c IS NULL THEN CAST(COALESCE(s.features, '[]') AS JSON)
                         ELSE CAST(t.c AS JSON) -> 'features' END,
        'lastRevision', CAST(t.c AS JSON) -> 'lastRevision',
        'assigned', t.assigned,
        'activeTasks', t.active,
        'runningTasks', t.running,
        'queuedTasks', t.queued,
        'connectedAt', CAST(t.c AS JSON) -> 'connectedAt',
        'lastSeenAt', CASE WHEN t.c IS NULL AND s.node_id IS NOT NULL THEN s.last_seen_at
                           ELSE ?3 END,
        'lastReportAt', s.last_report_at,
        'bytesPerSecond', CASE WHEN t.c IS NULL THEN 0 ELSE
            CAST((CAST(COALESCE(r.bytes, 0) AS BIGINT) * 10 + ?10 / 2) / ?10 AS DOUBLE PRECISION)
            / 10 END,
        'droppedEntries', COALESCE(d.reasons, CAST('{{}}' AS JSON)),
        'archiveUrl', COALESCE(CAST(t.c AS JSON) ->> 'archiveUrl', ''),
        'serveUrl', COALESCE(CAST(t.c AS JSON) ->> 'serveUrl', ''),
        'disk', CAST(t.c AS JSON) -> 'disk',
        'orphans', COALESCE(o.list, CAST('[]' AS JSON)),
        'inventory', CASE WHEN v.node_id IS NULL THEN NULL ELSE json_build_object(
            'inventoryId', v.inventory_id, 'archives', v.archives, 'bytes', v.bytes,
            'missing', v.missing, 'orphans', v.orphans, 'judgedAt', v.judged_at) END,
        'control', CASE WHEN nc.node_id IS NULL THEN NULL ELSE json_build_object(
            'mode', nc.mode, 'downloadLimit', nc.download_limit, 'actor', nc.actor,
            'note', nc.note, 'changedAt', nc.changed_at) END)
    ORDER BY t.c IS NULL, t.node_id COLLATE "C") AS TEXT)
FROM tasks AS t
LEFT JOIN node_seen AS s ON s.node_id = t.node_id
LEFT JOIN rate AS r ON r.node_id = t.node_id
LEFT JOIN dropped AS d ON d.node_id = t.node_id
LEFT JOIN orphan AS o ON o.node_id = t.node_id
LEFT JOIN node_inventory AS v ON v.node_id = t.node_id
LEFT JOIN node_control AS nc ON nc.node_id = t.node_id
""",  # noqa: S608 (constant text)
)


def node_panel(cursor: Cursor, now: float, registry: Registry) -> str:
    """The ``nodes`` of ``/api/admin/nodes`` at ``now`` (unix seconds) as
    JSON text, read in one snapshot: who holds which node
    (:func:`node_sessions.holders
    <tasknet.site.storage.node_sessions.holders>`), and with ``registry``
    (this site's connections) what the module doc lists."""
    listed = connections(node_sessions.holders(cursor), registry)
    last_full = int(now // BUCKET_SECONDS) - 1
    text = cursor.execute(
        _NODE_PANEL_SQL,
        (
            orjson.dumps(listed).decode(),
            iso(now - SEEN_DAYS * 86400),
            iso(now),
            throughput.COMPLETED,
            throughput.DOWNLOADING,
            int(NodeCode.WAITING_COMPRESSION),
            int(NodeCode.COMPRESSING),
            last_full - RATE_MINUTES + 1,
            last_full,
            RATE_MINUTES * BUCKET_SECONDS,
        ),
    ).fetchone()[0]
    return str(text) if text is not None else "[]"
