"""``GET /api/stats``: buckets of throughput, and weekly usage; what
``/api/admin/nodes`` shows of each node (:func:`admin_listing`).

The buckets are :func:`tasknet.site.storage.throughput.window_stats`'s
(from the rollups each report's transaction writes); ``usage`` is always
the caller's own (the quota is per user), even for an admin, whose buckets
cover every user.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from tasknet.site.storage import node_sessions, reports, throughput, views
from tasknet.site.storage.engine.sql import per_backend, sql
from tasknet.site.storage.engine.timestamps import iso, unix
from tasknet.site.storage.usage import iso_week, this_week
from tasknet.status import NodeCode, OperationState

BUCKET_SECONDS = 60
MIN_WINDOW = 60
MAX_WINDOW = 24 * 3600
DEFAULT_WINDOW = 3600
USAGE_WEEKS = 8


_QUOTA_SQL = sql('SELECT quota FROM "user" WHERE id = ?')
_WEEKS_SQL = sql("SELECT week, used FROM weekly_usage WHERE user_id = ? AND week {in_array}")
# What /api/admin/nodes shows of each node, as one JSON array built by the
# engine: per node its ``id``, ``tasks`` (schema v9's kept counts,
# ``node_task_count``, a status of NULL being -1: all, not completed, queued,
# running), the ``bytes`` of its throughput over the rate's minutes and its
# ``node_seen`` row (null: never recorded).  One text crosses to Python, not
# a row per node, so the engine's work runs with the GIL released and a
# thousand nodes cost one parse (B9's node panel: 6.5 ms to 3.5, and 8
# concurrent no longer queue behind each other's rows).  ?1 the oldest
# last_seen_at listed, ?2 the ids listed whenever seen, ?3-?6 the node
# codes, ?7 and ?8 the rate's first and last minute.
_NODE_ACTIVITY_SQL = per_backend(
    sqlite="""
SELECT json_group_array(json_object(
    'id', l.node_id,
    'tasks', (
        SELECT json_array(
            COALESCE(SUM(n), 0),
            COALESCE(SUM(CASE WHEN status = ?3 THEN 0 ELSE n END), 0),
            COALESCE(SUM(CASE WHEN status = ?4 AND queued = 1 THEN n ELSE 0 END), 0),
            COALESCE(SUM(CASE WHEN (status = ?4 AND queued = 0) OR status IN (?5, ?6)
                              THEN n ELSE 0 END), 0))
        FROM node_task_count WHERE node_id = l.node_id),
    'bytes', COALESCE(r.bytes, 0),
    'seen', json(l.seen)))
FROM (
    SELECT s.node_id, json_object(
        'protocol', s.protocol, 'features', json(s.features), 'connected_at', s.connected_at,
        'last_seen_at', s.last_seen_at, 'last_report_at', s.last_report_at) AS seen
    FROM node_seen AS s WHERE s.last_seen_at >= ?1 OR s.node_id IN (SELECT value FROM json_each(?2))
    UNION ALL
    SELECT value, NULL FROM json_each(?2) WHERE value NOT IN (SELECT node_id FROM node_seen)
) AS l
LEFT JOIN (
    SELECT node_id, SUM(bytes) AS bytes FROM throughput_minute
    WHERE minute BETWEEN ?7 AND ?8 GROUP BY node_id
) AS r ON r.node_id = l.node_id
""",
    postgres="""
SELECT CAST(json_agg(json_build_object(
    'id', l.node_id,
    'tasks', (
        SELECT json_build_array(
            COALESCE(SUM(n), 0),
            COALESCE(SUM(CASE WHEN status = ?3 THEN 0 ELSE n END), 0),
            COALESCE(SUM(CASE WHEN status = ?4 AND queued = 1 THEN n ELSE 0 END), 0),
            COALESCE(SUM(CASE WHEN (status = ?4 AND queued = 0) OR status IN (?5, ?6)
                              THEN n ELSE 0 END), 0))
        FROM node_task_count WHERE node_id = l.node_id),
    'bytes', COALESCE(r.bytes, 0),
    'seen', l.seen)) AS TEXT)
FROM (
    SELECT s.node_id, json_build_object(
        'protocol', s.protocol, 'features', CAST(s.features AS JSON),
        'connected_at', s.connected_at, 'last_seen_at', s.last_seen_at,
        'last_report_at', s.last_report_at) AS seen
    FROM node_seen AS s WHERE s.last_seen_at >= ?1 OR s.node_id = ANY(?2)
    UNION ALL
    SELECT listed.node_id, NULL FROM unnest(CAST(?2 AS TEXT[])) AS listed(node_id)
    WHERE listed.node_id NOT IN (SELECT node_id FROM node_seen)
) AS l
LEFT JOIN (
    SELECT node_id, SUM(bytes) AS bytes FROM throughput_minute
    WHERE minute BETWEEN ?7 AND ?8 GROUP BY node_id
) AS r ON r.node_id = l.node_id
""",
)


def last_weeks(now: datetime, count: int = USAGE_WEEKS) -> list[str]:
    """The ISO weeks of the ``count`` weeks up to ``now``'s, oldest first."""
    return [iso_week(now - timedelta(weeks=back)) for back in range(count - 1, -1, -1)]


def weekly_usage(cursor: sqlite3.Cursor, user_id: int, weeks: list[str]) -> dict[str, Any]:
    """``{"quota", "weeks": [{"week", "used"}]}`` of ``user_id`` (zeros included)."""
    quota = cursor.execute(_QUOTA_SQL, (user_id,)).fetchone()
    used = dict.fromkeys(weeks, 0)
    for row in cursor.execute(_WEEKS_SQL, (user_id, list(weeks))):
        used[row[0]] = int(row[1])
    return {
        "quota": int(quota[0]) if quota is not None else 0,
        "weeks": [{"week": week, "used": used[week]} for week in weeks],
    }


def stats(
    cursor: sqlite3.Cursor,
    caller_id: int,
    scope_user: int | None,
    window: int,
    now: float,
) -> dict[str, Any]:
    """The ``/api/stats`` answer for ``window`` seconds up to ``now`` (unix
    seconds), in one read: the buckets (``scope_user`` None covers every
    user's tasks: admin) and the caller's own weekly usage and quota."""
    answer = throughput.window_stats(cursor, scope_user, window, now)
    answer["usage"] = weekly_usage(cursor, caller_id, last_weeks(datetime.fromtimestamp(now, UTC)))
    return answer


SEEN_DAYS = 7


def node_activity(
    cursor: sqlite3.Cursor, connected: list[str], now: float
) -> dict[str, dict[str, Any]]:
    """What ``/api/admin/nodes`` shows of each node: the ``connected`` ids and
    every node seen in the last :data:`SEEN_DAYS` days, by id, with
    ``assigned`` (all its tasks), ``activeTasks`` (those not completed), of
    which ``queuedTasks`` (held, not started: ``queued``) and
    ``runningTasks`` (downloading and not queued, waiting for compression or
    compressing), ``bytesPerSecond`` (its bytes over the last
    :data:`RATE_MINUTES` full minutes before ``now``, from the buckets of
    ``/api/stats``' ``byNode``, every user's, divided by their seconds: the
    same bytes the charts show, not a sum of task speeds) and its
    ``node_seen`` row (``protocol``, ``features`` (a list),
    ``connected_at``, ``last_seen_at``, ``last_report_at``; None for a node
    never recorded)."""
    last_full = int(now // BUCKET_SECONDS) - 1
    seconds = RATE_MINUTES * BUCKET_SECONDS
    found = cursor.execute(
        _NODE_ACTIVITY_SQL,
        (
            iso(now - SEEN_DAYS * 86400),
            list(connected),
            throughput.COMPLETED,
            throughput.DOWNLOADING,
            int(NodeCode.WAITING_COMPRESSION),
            int(NodeCode.COMPRESSING),
            last_full - RATE_MINUTES + 1,
            last_full,
        ),
    ).fetchone()[0]
    nodes: dict[str, dict[str, Any]] = {}
    for node in orjson.loads(found) if found is not None else ():
        assigned, active, queued, running = node["tasks"]
        nodes[node["id"]] = {
            "assigned": int(assigned),
            "activeTasks": int(active),
            "queuedTasks": int(queued),
            "runningTasks": int(running),
            "bytesPerSecond": int(node["bytes"]) / seconds,
            "seen": node["seen"],
        }
    return nodes


#: ``bytesPerSecond`` of ``/api/admin/nodes``: over the last this many full
#: minutes of ``throughput_minute`` (the buckets of ``/api/stats``).
RATE_MINUTES = 1


def metrics_sample(cursor: sqlite3.Cursor) -> dict[str, dict[str, Any]]:
    """What ``/metrics`` samples from the database before each scrape:
    ``{"states": ..., "statuses": ..., "nodeBytes": ..., "quota": ...,
    "nodes": ..., "instances": ...}`` (``tasknet.site.metrics.set_sampled``)."""
    return {
        "states": views.count_by_state(cursor),
        "statuses": views.count_by_status(cursor, None),
        "nodeBytes": throughput.node_byte_totals(cursor),
        "quota": quota_use(cursor),
        "nodes": unfinished_by_node(cursor),
        "instances": instance_counts(cursor),
    }


#: Submissions that count against the quota although not metered (as
#: ``usage.in_flight_cost`` counts them for one user).
_QUOTA_USE_SQL = sql("""
SELECT u.name, u.quota, COALESCE(w.used, 0) + COALESCE(f.cost, 0) FROM "user" AS u
LEFT JOIN weekly_usage AS w ON w.user_id = u.id AND w.week = ?
LEFT JOIN (
    SELECT user_id, SUM(cost) AS cost FROM task_operation
    WHERE state IN (?, ?) AND metered = 0 GROUP BY user_id
) AS f ON f.user_id = u.id
WHERE COALESCE(w.used, 0) + COALESCE(f.cost, 0) > 0
""")


def quota_use(cursor: sqlite3.Cursor, week: str | None = None) -> dict[str, tuple[int, int]]:
    """``{user name: (used, quota)}`` of every user with any use in ``week``
    (default: this week), used as the quota check counts it: metered in
    that week, plus the submissions in flight and every unmetered
    ``UNKNOWN``."""
    in_flight = (OperationState.SUBMITTING.value, OperationState.UNKNOWN.value)
    return {
        str(name): (int(used), int(quota))
        for name, quota, used in cursor.execute(
            _QUOTA_USE_SQL, (week or this_week(cursor), *in_flight)
        )
    }


_UNFINISHED_SQL = sql(
    "SELECT g.node_id, COUNT(*), COALESCE(s.last_report_at, s.last_seen_at) FROM gallery AS g"
    " LEFT JOIN node_seen AS s ON s.node_id = g.node_id"
    " WHERE g.node_id IS NOT NULL AND g.status IS DISTINCT FROM ?"
    " GROUP BY g.node_id, s.last_report_at, s.last_seen_at"
)


def unfinished_by_node(cursor: sqlite3.Cursor) -> dict[str, tuple[int, float | None]]:
    """``{node: (tasks not completed, unix time of its last applied report)}``
    of each node holding tasks that are not completed; before its first
    report, the time it was last seen (None: never recorded)."""
    found: dict[str, tuple[int, float | None]] = {}
    for node_id, count, reported in cursor.execute(_UNFINISHED_SQL, (throughput.COMPLETED,)):
        found[str(node_id)] = (int(count), unix(reported))
    return found


_INSTANCE_COUNTS_SQL = sql(
    "SELECT COALESCE(SUM(CASE WHEN reaped_at IS NOT NULL THEN 1 ELSE 0 END), 0),"
    " COALESCE(SUM(CASE WHEN reaped_at IS NULL AND ended_at IS NOT NULL THEN 1 ELSE 0 END), 0),"
    " COALESCE(SUM(CASE WHEN reaped_at IS NULL AND ended_at IS NULL THEN 1 ELSE 0 END), 0)"
    " FROM site_instance"
)


def instance_counts(cursor: sqlite3.Cursor) -> dict[str, int]:
    """The ``site_instance`` rows by status: ``open`` (neither ended nor
    reaped), ``ended`` (stopped cleanly) and ``reaped`` (found gone)."""
    row = cursor.execute(_INSTANCE_COUNTS_SQL).fetchone()
    return {"reaped": int(row[0]), "ended": int(row[1]), "open": int(row[2])}


@dataclass(frozen=True)
class NodeListing:
    """What ``/api/admin/nodes`` is made of, read in one snapshot."""

    holders: dict[str, node_sessions.Holder]
    activity: dict[str, dict[str, Any]]
    dropped: dict[str, dict[str, int]]


def admin_listing(cursor: sqlite3.Cursor, now: float, also: Iterable[str] = ()) -> NodeListing:
    """The connected nodes of every site (:func:`node_sessions.holders
    <tasknet.site.storage.node_sessions.holders>`), and the activity and drop
    counts of those, of the nodes ``also`` (connected here, not yet
    recorded) and of the nodes seen lately (:func:`node_activity`)."""
    held = {h.node_id: h for h in node_sessions.holders(cursor)}
    activity = node_activity(cursor, sorted(set(held) | set(also)), now)
    dropped = reports.dropped_entries_by_node(cursor, list(activity))
    return NodeListing(held, activity, dropped)
