"""``GET /api/stats``: buckets of throughput, and weekly usage; what
``/metrics`` samples from the database (:func:`metrics_sample`).

The buckets are :func:`tasknet.site.storage.throughput.window_stats`'s
(from the rollups each report's transaction writes); ``usage`` is always
the caller's own (the quota is per user), even for an admin, whose buckets
cover every user.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NotRequired, TypedDict, cast

from tasknet.site.storage import throughput, views
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.timestamps import unix
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.usage import iso_week, this_week
from tasknet.status import OperationState

BUCKET_SECONDS = 60
MIN_WINDOW = 60
MAX_WINDOW = 24 * 3600
DEFAULT_WINDOW = 3600
USAGE_WEEKS = 8


_QUOTA_SQL = sql('SELECT quota FROM "user" WHERE id = ?')
_WEEKS_SQL = sql("SELECT week, used FROM weekly_usage WHERE user_id = ? AND week {in_array}")


def last_weeks(now: datetime, count: int = USAGE_WEEKS) -> list[str]:
    """The ISO weeks of the ``count`` weeks up to ``now``'s, oldest first."""
    return [iso_week(now - timedelta(weeks=back)) for back in range(count - 1, -1, -1)]


class WeekUsage(TypedDict):
    week: str
    used: int


class WeeklyUsage(TypedDict):
    """The caller's quota and what it used in each of the last weeks."""

    quota: int
    weeks: list[WeekUsage]


class Stats(throughput.WindowStats):
    """The ``/api/stats`` answer: the buckets and the caller's usage."""

    usage: WeeklyUsage


class MetricsSample(TypedDict):
    """What :func:`metrics_sample` reads for ``/metrics`` (the keys after
    ``nodeBytes`` are optional to :func:`tasknet.site.metrics.set_sampled`)."""

    states: dict[str, int]
    statuses: dict[str, int]
    nodeBytes: dict[str, int]
    quota: NotRequired[dict[str, tuple[int, int]]]
    nodes: NotRequired[dict[str, tuple[int, float | None]]]
    instances: NotRequired[dict[str, int]]


def weekly_usage(cursor: Cursor, user_id: int, weeks: list[str]) -> WeeklyUsage:
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
    cursor: Cursor,
    caller_id: int,
    scope_user: int | None,
    window: int,
    now: float,
) -> Stats:
    """The ``/api/stats`` answer for ``window`` seconds up to ``now`` (unix
    seconds), in one read: the buckets (``scope_user`` None covers every
    user's tasks: admin) and the caller's own weekly usage and quota."""
    # The same dict, given its usage below.
    answer = cast(Stats, throughput.window_stats(cursor, scope_user, window, now))
    answer["usage"] = weekly_usage(cursor, caller_id, last_weeks(datetime.fromtimestamp(now, UTC)))
    return answer


def metrics_sample(cursor: Cursor) -> MetricsSample:
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


def quota_use(cursor: Cursor, week: str | None = None) -> dict[str, tuple[int, int]]:
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


def unfinished_by_node(cursor: Cursor) -> dict[str, tuple[int, float | None]]:
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


def instance_counts(cursor: Cursor) -> dict[str, int]:
    """The ``site_instance`` rows by status: ``open`` (neither ended nor
    reaped), ``ended`` (stopped cleanly) and ``reaped`` (found gone)."""
    row = cursor.execute(_INSTANCE_COUNTS_SQL).fetchone()
    return {"reaped": int(row[0]), "ended": int(row[1]), "open": int(row[2])}
