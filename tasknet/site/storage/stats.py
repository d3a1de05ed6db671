"""``GET /api/stats``: one-minute buckets of throughput, and weekly usage.

Read from ``throughput_minute`` (written by
:mod:`tasknet.site.storage.throughput` in each report's transaction) and
``weekly_usage``.  Every minute of the window is present, zeros included,
oldest first; the last bucket is the current, partial minute.  ``usage`` is
always the caller's own (the quota is per user), even for an admin, whose
buckets cover every user.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

from tasknet.site.storage import throughput, views
from tasknet.site.storage.dialect import IN_ARRAY_SQL, array
from tasknet.site.storage.usage import iso_week

BUCKET_SECONDS = 60
MIN_WINDOW = 60
MAX_WINDOW = 24 * 3600
DEFAULT_WINDOW = 3600
USAGE_WEEKS = 8


def _minute_start(minute: int) -> str:
    return datetime.fromtimestamp(minute * BUCKET_SECONDS, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def last_weeks(now: datetime, count: int = USAGE_WEEKS) -> list[str]:
    """The ISO weeks of the ``count`` weeks up to ``now``'s, oldest first."""
    return [iso_week(now - timedelta(weeks=back)) for back in range(count - 1, -1, -1)]


def weekly_usage(cursor: sqlite3.Cursor, user_id: int, weeks: list[str]) -> dict[str, Any]:
    """``{"quota", "weeks": [{"week", "used"}]}`` of ``user_id`` (zeros included)."""
    quota = cursor.execute('SELECT quota FROM "user" WHERE id = ?', (user_id,)).fetchone()
    used = dict.fromkeys(weeks, 0)
    for row in cursor.execute(
        "SELECT week, used FROM weekly_usage WHERE user_id = ?"  # noqa: S608
        f" AND week {IN_ARRAY_SQL}",
        (user_id, array(weeks)),
    ):
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
    seconds); ``scope_user`` None covers every user's tasks (admin)."""
    last = int(now // BUCKET_SECONDS)
    count = max(1, -(-window // BUCKET_SECONDS))
    first = last - count + 1
    sql = (
        "SELECT minute, node_id, SUM(bytes), SUM(completed) FROM throughput_minute"
        " WHERE minute BETWEEN ? AND ?"
    )
    params: list[Any] = [first, last]
    if scope_user is not None:
        sql += " AND user_id = ?"
        params.append(scope_user)
    rows = cursor.execute(sql + " GROUP BY minute, node_id", params).fetchall()
    nodes = sorted({row[1] for row in rows})
    buckets = [
        {
            "start": _minute_start(minute),
            "completed": 0,
            "bytes": 0,
            "byNode": dict.fromkeys(nodes, 0),
        }
        for minute in range(first, last + 1)
    ]
    for minute, node_id, gained, completed in rows:
        bucket = buckets[minute - first]
        bucket["bytes"] += int(gained)
        bucket["completed"] += int(completed)
        bucket["byNode"][node_id] += int(gained)
    moment = datetime.fromtimestamp(now, UTC)
    return {
        "window": window,
        "bucketSeconds": BUCKET_SECONDS,
        "nodes": nodes,
        "buckets": buckets,
        "usage": weekly_usage(cursor, caller_id, last_weeks(moment)),
    }


SEEN_DAYS = 7


def node_activity(
    cursor: sqlite3.Cursor, connected: list[str], now: float
) -> dict[str, dict[str, Any]]:
    """What ``/api/admin/nodes`` shows of each node: the ``connected`` ids and
    every node seen in the last :data:`SEEN_DAYS` days, by id, with
    ``assigned`` (all its tasks), ``activeTasks`` (those not completed),
    ``bytesPerSecond`` (the sum of its tasks' visible speeds) and its
    ``node_seen`` row (``protocol``, ``features``, ``lastSeenAt``,
    ``lastReportAt``; None for a node never recorded)."""
    since = throughput.iso(now - SEEN_DAYS * 86400)
    seen = {
        row["node_id"]: row
        for row in cursor.execute(
            "SELECT * FROM node_seen WHERE last_seen_at >= ?"  # noqa: S608
            f" OR node_id {IN_ARRAY_SQL}",
            (since, array(connected)),
        )
    }
    ids = sorted(set(connected) | set(seen))
    nodes: dict[str, dict[str, Any]] = {
        node_id: {"assigned": 0, "activeTasks": 0, "bytesPerSecond": 0.0, "seen": seen.get(node_id)}
        for node_id in ids
    }
    for node_id, assigned, active in cursor.execute(
        "SELECT node_id, COUNT(*),"  # noqa: S608
        " SUM(CASE WHEN status IS NOT DISTINCT FROM ? THEN 0 ELSE 1 END) FROM gallery"
        f" WHERE node_id {IN_ARRAY_SQL} GROUP BY node_id",
        (throughput.COMPLETED, array(ids)),
    ):
        nodes[node_id]["assigned"] = int(assigned)
        nodes[node_id]["activeTasks"] = int(active)
    for node_id, status, speed, moved_at in cursor.execute(
        "SELECT node_id, status, speed, moved_at FROM gallery"  # noqa: S608
        f" WHERE node_id {IN_ARRAY_SQL} AND status = ?",
        (array(ids), throughput.DOWNLOADING),
    ):
        speed = throughput.visible_speed(status, speed, moved_at, now)
        nodes[node_id]["bytesPerSecond"] += speed or 0.0
    return nodes


def metrics_sample(cursor: sqlite3.Cursor) -> dict[str, dict[str, int]]:
    """What ``/metrics`` samples from the database before each scrape:
    ``{"states": ..., "statuses": ..., "nodeBytes": ...}``."""
    return {
        "states": views.count_by_state(cursor),
        "statuses": views.count_by_status(cursor, None),
        "nodeBytes": throughput.node_byte_totals(cursor),
    }
