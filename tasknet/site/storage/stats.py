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

from tasknet.site.storage import node_sessions, reports, throughput, views
from tasknet.site.storage.engine.sql import sql
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
_SEEN_SQL = sql("SELECT * FROM node_seen WHERE last_seen_at >= ? OR node_id {in_array}")
# From schema v9's kept counts (``node_task_count``: a status of NULL is -1).
_NODE_TASKS_SQL = sql(
    "SELECT node_id, SUM(n),"
    " SUM(CASE WHEN status = ?1 THEN 0 ELSE n END),"
    " SUM(CASE WHEN status = ?2 AND queued = 1 THEN n ELSE 0 END),"
    " SUM(CASE WHEN (status = ?2 AND queued = 0) OR status IN (?3, ?4) THEN n ELSE 0 END)"
    " FROM node_task_count WHERE node_id {in_array:?5} GROUP BY node_id"
)
_RATES_SQL = sql(
    "SELECT node_id, SUM(bytes) FROM throughput_minute"
    " WHERE minute BETWEEN ? AND ? AND node_id {in_array} GROUP BY node_id"
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
    compressing), ``bytesPerSecond`` (:func:`node_rates`: the same bytes as
    ``/api/stats``) and its ``node_seen`` row (``protocol``, ``features``,
    ``lastSeenAt``, ``lastReportAt``; None for a node never recorded)."""
    since = iso(now - SEEN_DAYS * 86400)
    seen = {row["node_id"]: row for row in cursor.execute(_SEEN_SQL, (since, list(connected)))}
    ids = sorted(set(connected) | set(seen))
    nodes: dict[str, dict[str, Any]] = {
        node_id: {
            "assigned": 0,
            "activeTasks": 0,
            "runningTasks": 0,
            "queuedTasks": 0,
            "bytesPerSecond": 0.0,
            "seen": seen.get(node_id),
        }
        for node_id in ids
    }
    for node_id, assigned, active, queued, running in cursor.execute(
        _NODE_TASKS_SQL,
        (
            throughput.COMPLETED,
            throughput.DOWNLOADING,
            int(NodeCode.WAITING_COMPRESSION),
            int(NodeCode.COMPRESSING),
            ids,
        ),
    ):
        nodes[node_id]["assigned"] = int(assigned)
        nodes[node_id]["activeTasks"] = int(active)
        nodes[node_id]["queuedTasks"] = int(queued or 0)
        nodes[node_id]["runningTasks"] = int(running or 0)
    for node_id, rate in node_rates(cursor, ids, now).items():
        nodes[node_id]["bytesPerSecond"] = rate
    return nodes


#: ``bytesPerSecond`` of ``/api/admin/nodes``: over the last this many full
#: minutes of ``throughput_minute`` (the buckets of ``/api/stats``).
RATE_MINUTES = 1


def node_rates(cursor: sqlite3.Cursor, ids: list[str], now: float) -> dict[str, float]:
    """Bytes per second of each node of ``ids`` over the last
    :data:`RATE_MINUTES` full minutes before ``now``: the bytes of its
    ``/api/stats`` buckets (``byNode``, every user) divided by their
    seconds -- the same bytes the charts show, not a sum of task speeds.
    A node with no bytes there is absent."""
    last_full = int(now // BUCKET_SECONDS) - 1
    first = last_full - RATE_MINUTES + 1
    seconds = RATE_MINUTES * BUCKET_SECONDS
    return {
        row[0]: int(row[1]) / seconds
        for row in cursor.execute(_RATES_SQL, (first, last_full, list(ids)))
    }


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
