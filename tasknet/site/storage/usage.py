"""Weekly usage and quota: the ISO week of a moment or of a stored
timestamp, a user's usage this week, the cost of submissions in flight, and
metering a cost into ``weekly_usage``.

"This week" is the week of the site's wall clock: a transaction's is its
cursor's (:func:`this_week`), the lifecycle's its reactor's.  Only a tool or
a test calls :func:`iso_week` without a moment (the system's clock)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypedDict

from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sources import now_of
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.timestamps import parse
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.status import OperationState


def iso_week(moment: datetime | None = None) -> str:
    """The ISO week of ``moment``, e.g. ``2026-W49``; without one, of the
    system's clock (a tool's or a test's "now": the site always gives its
    own moment)."""
    moment = moment or datetime.now(UTC)
    year, week, _ = moment.isocalendar()
    return f"{year}-W{week:02d}"


def this_week(cursor: Cursor) -> str:
    """The ISO week of the wall clock of ``cursor``'s connection."""
    return iso_week(datetime.fromtimestamp(now_of(cursor), UTC))


def week_of_timestamp(cursor: Cursor, timestamp: str | None) -> str:
    """The ISO week of one of our stored UTC timestamps (:func:`this_week`
    if unparsable)."""
    if timestamp:
        try:
            return iso_week(parse(timestamp))
        except ValueError:
            pass
    return this_week(cursor)


_USAGE = sql(
    'SELECT u.quota, COALESCE(w.used, 0) AS used FROM "user" AS u '
    "LEFT JOIN weekly_usage AS w ON w.user_id = u.id AND w.week = ? WHERE u.id = ?"
)
_IN_FLIGHT = sql(
    "SELECT COALESCE(SUM(cost), 0) FROM task_operation"
    " WHERE user_id = ? AND state IN (?, ?) AND metered = 0"
)
_METER = sql(
    "INSERT INTO weekly_usage (user_id, week, used) VALUES (?, ?, ?) "
    "ON CONFLICT (user_id, week) DO UPDATE SET used = weekly_usage.used + excluded.used"
)


class Usage(TypedDict):
    """A user's use of its quota in one week (``GET /api/usage``)."""

    week: str
    used: int
    quota: int


def usage(cursor: Cursor, user_id: int, week: str | None = None) -> Usage:
    """``{"week", "used", "quota"}`` of ``user_id`` for ``week`` (default: this week)."""
    week = week or this_week(cursor)
    row = cursor.execute(_USAGE, (week, user_id)).fetchone()
    if row is None:
        raise TaskError("not_found", f"no user {user_id}")
    return {"week": week, "used": int(row["used"]), "quota": int(row["quota"])}


def in_flight_cost(cursor: Cursor, user_id: int) -> int:
    """Costs of this user's operations that passed a quota check and are not
    metered: the submissions being POSTed right now (two concurrent creates
    cannot both squeeze under the quota) and every unmetered ``UNKNOWN``,
    whatever its week (the upstream may have charged it; until an operator
    resolves it, it counts as spent)."""
    row = cursor.execute(
        _IN_FLIGHT, (user_id, OperationState.SUBMITTING.value, OperationState.UNKNOWN.value)
    ).fetchone()
    return int(row[0])


def meter(cursor: Cursor, user_id: int, week: str, cost: int) -> None:
    """Add ``cost`` to ``user_id``'s usage of ``week``."""
    cursor.execute(_METER, (user_id, week, cost))
