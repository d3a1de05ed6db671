"""Throughput samples from applied node reports, and when nodes were seen.

Reports carry a progress fraction per task, not bytes (PROTOCOL.md), so a
task's downloaded bytes are ``round(progress × size)`` while it downloads and
its whole ``size`` once it is past the download (the size comes from the
upstream's ``prepare``).  Each applied report is a sample, timed by the
site's clock when it is applied:

* the task's speed is an exponentially weighted moving average of the bytes/s
  between successive samples, weighted by time (``α = 1 − e^(−Δt/τ)``,
  τ = :data:`SMOOTHING_SECONDS`), so irregular report spacing does not skew
  it; it starts with the second sample of a download and is cleared when the
  task leaves ``DOWNLOADING``;
* the bytes gained are added to the minute buckets of ``throughput_minute``
  (by node and owner), to its rollups for ``/api/stats`` (``throughput_total``:
  per owner and minute, and of every owner; ``throughput_node``: per owner
  and node, and of every owner, in quarter-hour, hour and six-hour slots) and to
  ``node_bytes`` (the site's byte counters), in the report's own
  transaction, so a report that rolls back counts nothing and the rollups
  always say what the minute rows say;
* the first ``COMPLETED`` sets ``gallery.completed_at`` and counts one
  completion in its minute.  A completion is counted once per generation:
  the report rules drop an entry that would move a ``COMPLETED`` task
  backwards (``regressed``, ``tasknet/site/storage/reports.py``), so a
  node cannot roll its task back and complete it again to count its
  completion and bytes twice.

:func:`sample_reports` is called by ``tasknet/site/storage/reports.py`` in
the transaction that applies the reports, with their changed entries: it
writes the buckets and counters and answers each task's new sample columns,
which the report's own ``UPDATE`` of the task writes;
:func:`record_node_seen` is called when a node logs in or goes away;
:func:`window_stats` is the buckets of ``GET /api/stats``, read from the
rollups (see there).  Every
function takes the cursor of the caller's transaction and ``now`` (unix
seconds; default: the wall clock of the cursor's connection, the site's).
"""

from __future__ import annotations

import json
import math
import sqlite3
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypedDict

import orjson

from tasknet.site.storage.engine.sources import now_of
from tasknet.site.storage.engine.sql import per_backend, sql
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.engine.transactions import Connection, Cursor
from tasknet.status import NodeCode

SMOOTHING_SECONDS = 10.0
#: A task whose progress has not moved for this long shows ``speed: null``.
STALL_SECONDS = 15.0
#: Minute buckets kept (a little over the largest ``/api/stats`` window);
#: the rollups are pruned with them.
KEEP_MINUTES = 25 * 60
#: ``user_id`` of the rollup rows of every user (the admin's view).
ALL_USERS = 0
#: The slots of ``throughput_node``, in seconds: quarter hours (the
#: buckets of long windows), hours and six hours (ranking the nodes of a
#: window: 24 hours are at most 4 six-hour slots, 5 hours and 3 quarters).
QUARTER = 900
HOUR = 3600
SIX_HOURS = 6 * HOUR
GRAINS = (QUARTER, HOUR, SIX_HOURS)
#: The most nodes ``/api/stats`` names (``nodes``, each bucket's ``byNode``):
#: the top ones by bytes over the window; the rest are summed in ``other``.
TOP_NODES = 10

DOWNLOADING = _DOWNLOADING = int(NodeCode.DOWNLOADING)
COMPLETED = _COMPLETED = int(NodeCode.COMPLETED)


class Entry(Protocol):
    """What is read of a report entry (``tasknet.protocol.messages.TaskEntry``)."""

    @property
    def status(self) -> int: ...

    @property
    def progress(self) -> float: ...


def bytes_done(status: int | None, progress: float, size: int | None) -> int | None:
    """The downloaded bytes of a task, as far as a progress fraction tells."""
    if size is None:
        return None
    if status is None or status == 0:
        return 0
    if status == _DOWNLOADING:
        return min(size, max(0, round(progress * size)))
    return size


def visible_speed(
    status: int | None, speed: float | None, moved_at: float | None, now: float
) -> float | None:
    """The speed a view shows: ``None`` unless the task is downloading and
    its progress moved in the last :data:`STALL_SECONDS`."""
    if status != _DOWNLOADING or speed is None or moved_at is None:
        return None
    if now - moved_at > STALL_SECONDS:
        return None
    return speed


def eta(size: int | None, done: int | None, speed: float | None) -> int | None:
    """Seconds left at ``speed``, rounded up; ``None`` when unknown."""
    if size is None or done is None or not speed or speed <= 0:
        return None
    return math.ceil(max(0, size - done) / speed)


_MINUTE_SQL = sql("""
INSERT INTO throughput_minute (minute, node_id, user_id, bytes, completed) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (minute, node_id, user_id) DO UPDATE SET
    bytes = throughput_minute.bytes + excluded.bytes,
    completed = throughput_minute.completed + excluded.completed
""")
_NODE_BYTES_SQL = sql("""
INSERT INTO node_bytes (node_id, bytes) VALUES (?, ?)
ON CONFLICT (node_id) DO UPDATE SET bytes = node_bytes.bytes + excluded.bytes
""")
_REPORTED_SQL = sql("""
INSERT INTO node_seen (node_id, last_seen_at, last_report_at) VALUES (?1, ?2, ?2)
ON CONFLICT (node_id) DO UPDATE SET last_seen_at = ?2, last_report_at = ?2
""")
_PRUNE_MINUTES_SQL = sql("DELETE FROM throughput_minute WHERE minute < ?")
_TOTAL_SQL = sql("""
INSERT INTO throughput_total (user_id, minute, bytes, completed) VALUES (?, ?, ?, ?)
ON CONFLICT (user_id, minute) DO UPDATE SET
    bytes = throughput_total.bytes + excluded.bytes,
    completed = throughput_total.completed + excluded.completed
""")
_NODE_SLOT_SQL = sql("""
INSERT INTO throughput_node (user_id, grain, slot, node_id, bytes) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (user_id, grain, slot, node_id) DO UPDATE SET
    bytes = throughput_node.bytes + excluded.bytes
""")
_PRUNE_TOTALS_SQL = sql("DELETE FROM throughput_total WHERE minute < ?")
_PRUNE_NODE_SLOTS_SQL = sql("DELETE FROM throughput_node WHERE grain = ? AND slot < ?")
_NODE_SEEN_SQL = sql(
    "INSERT INTO node_seen (node_id, protocol, features, connected_at, last_seen_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5)"
    " ON CONFLICT (node_id) DO UPDATE SET protocol = ?2, features = ?3,"
    " connected_at = ?4, last_seen_at = ?5"
)
_NODE_BYTE_TOTALS_SQL = sql("SELECT node_id, bytes FROM node_bytes")

# The minute last pruned, per connection (a site's writer: about once a
# minute per database; pruning is idempotent).  Never per process: two sites
# of one process (a simulation's), or two runs of one, would prune on each
# other's minutes.  The engine's connections are weakly referenceable.
_pruned_minute: weakref.WeakKeyDictionary[Connection, int] = weakref.WeakKeyDictionary()


#: A task's new ``(speed, sampled_at, moved_at, completed_at)``, the last
#: ``None`` unless this sample completed it (``completed_at`` is set once).
Sample = tuple[float | None, float | None, float | None, str | None]


def _sampled(
    reports: Sequence[tuple[str, Iterable[int], Mapping[int, Entry], Mapping[int, Any]]],
) -> dict[int, tuple[str, Entry, Any]]:
    """The entries that are samples: a task whose status changed, or a
    download whose progress moved.  A snapshot repeats every finished task
    and every queued download that has not moved, and those write nothing
    (BENCH B1: most entries of a snapshot).  A stalled download keeps its
    last sample; views hide its speed once it has not moved for
    :data:`STALL_SECONDS`, and its next movement is averaged over the whole
    time since that sample."""
    sampled: dict[int, tuple[str, Entry, Any]] = {}
    for node_id, applied, entries, before in reports:
        for g in applied:
            new, old = entries[g], before[g]
            if new.status != old["status"] or (
                new.status == _DOWNLOADING and new.progress != float(old["progress"])
            ):
                sampled[g] = (node_id, new, old)
    return sampled


def sample_reports(
    cursor: Cursor,
    reports: Sequence[tuple[str, Iterable[int], Mapping[int, Entry], Mapping[int, Any]]],
    rows: Mapping[int, Any],
    now: float | None = None,
) -> dict[int, Sample]:
    """Sample ``reports``, each ``(node_id, gids, entries, before)``: the
    report's changed gids, its entries by gid, and the task rows as they
    were before the reports (``status`` and ``progress``).  Returns each
    sampled task's new sample columns by gid, for the caller to write with
    its own ``UPDATE`` of the row (the report path: one statement per
    changed task, not two); every other write (node seen, minute buckets,
    node bytes) is done here, one statement per kind for all the reports
    (group commit: the batch's reports share them).  ``rows`` are the
    sampled tasks' rows before the reports (``gid``, ``user_id``, ``size``,
    ``speed``, ``sampled_at``, ``moved_at``).  The same as sampling the
    reports one after the other, provided no gid is in two of them (as in a
    run of :func:`~tasknet.site.storage.reports.apply_reports`): the sums
    per minute, node and user add up the same either way."""
    now = now_of(cursor) if now is None else now
    stamp = iso(now)
    cursor.executemany(_REPORTED_SQL, [(node_id, stamp) for node_id, *_ in reports])
    sampled = _sampled(reports)
    if not sampled:
        return {}
    minute = int(now // 60)
    samples: dict[int, Sample] = {}
    per_user: dict[tuple[str, int], list[int]] = {}
    per_node: dict[str, int] = {}
    for gid, (node_id, new, old) in sampled.items():
        row = rows[gid]
        old_status = old["status"]
        old_bytes = bytes_done(old_status, float(old["progress"]), row["size"]) or 0
        new_bytes = bytes_done(new.status, new.progress, row["size"]) or 0
        gained = max(0, new_bytes - old_bytes)
        completed = new.status == _COMPLETED and old_status != _COMPLETED
        speed, sampled_at, moved_at = _next_sample(
            row, old_status == _DOWNLOADING, new.status == _DOWNLOADING, gained, now
        )
        samples[gid] = (speed, sampled_at, moved_at, stamp if completed else None)
        totals = per_user.setdefault((node_id, row["user_id"]), [0, 0])
        totals[0] += gained
        totals[1] += int(completed)
        per_node[node_id] = per_node.get(node_id, 0) + gained
    minutes = [
        (minute, node_id, user_id, gained, completed)
        for (node_id, user_id), (gained, completed) in per_user.items()
        if gained or completed
    ]
    if minutes:
        cursor.executemany(_MINUTE_SQL, minutes)
        _roll_up(cursor, minute, minutes)
    node_bytes = [(node_id, gained) for node_id, gained in per_node.items() if gained]
    if node_bytes:
        cursor.executemany(_NODE_BYTES_SQL, node_bytes)
    if _pruned_minute.get(cursor.connection) != minute:
        cutoff = minute - KEEP_MINUTES
        cursor.execute(_PRUNE_MINUTES_SQL, (cutoff,))
        cursor.execute(_PRUNE_TOTALS_SQL, (cutoff,))
        for grain in GRAINS:
            # The slots that end at or before the cutoff minute.
            cursor.execute(_PRUNE_NODE_SLOTS_SQL, (grain, cutoff * 60 // grain))
        _pruned_minute[cursor.connection] = minute
    return samples


def _roll_up(
    cursor: Cursor, minute: int, minutes: Sequence[tuple[int, str, int, int, int]]
) -> None:
    """Add the ``throughput_minute`` rows just written (``(minute, node,
    user, bytes, completed)``, all of ``minute``) to the rollups: the
    totals per user and of every user in ``minute``, and the bytes per
    user and node and of every user and node in the quarter, the hour and
    the six hours of ``minute`` (:data:`GRAINS`).  Rows go in key order,
    so that PostgreSQL transactions writing the same rows (several sites)
    lock them in the same order."""
    totals: dict[int, list[int]] = {}
    slots: dict[tuple[int, int, str], int] = {}
    for _, node_id, user_id, gained, completed in minutes:
        for scope in (int(user_id), ALL_USERS):
            total = totals.setdefault(scope, [0, 0])
            total[0] += gained
            total[1] += completed
            if gained:
                for grain in GRAINS:
                    key = (scope, grain, node_id)
                    slots[key] = slots.get(key, 0) + gained
    cursor.executemany(
        _TOTAL_SQL, [(scope, minute, b, c) for scope, (b, c) in sorted(totals.items())]
    )
    if slots:
        cursor.executemany(
            _NODE_SLOT_SQL,
            sorted(
                (scope, grain, minute * 60 // grain, node_id, gained)
                for (scope, grain, node_id), gained in slots.items()
            ),
        )


def _next_sample(
    row: sqlite3.Row, was_downloading: bool, downloading: bool, gained: int, now: float
) -> tuple[float | None, float | None, float | None]:
    """``(speed, sampled_at, moved_at)`` after one sample."""
    if not downloading:
        return None, None, None
    if not was_downloading or row["sampled_at"] is None:
        # The first sample of a download: a start time, no rate yet.
        return None, now, now if gained else None
    elapsed = now - float(row["sampled_at"])
    if elapsed <= 0:
        return row["speed"], row["sampled_at"], now if gained else row["moved_at"]
    rate = gained / elapsed
    previous = row["speed"]
    if previous is None:
        speed = rate
    else:
        weight = 1.0 - math.exp(-elapsed / SMOOTHING_SECONDS)
        speed = previous + weight * (rate - previous)
    return speed, now, now if gained else row["moved_at"]


def record_node_seen(
    cursor: Cursor,
    node_id: str,
    protocol: int | None,
    features: Iterable[str],
    connected: bool,
    now: float | None = None,
) -> None:
    """A node logged in (``connected``) or went away."""
    stamp = iso(now_of(cursor) if now is None else now)
    cursor.execute(
        _NODE_SEEN_SQL,
        (node_id, protocol, json.dumps(list(features)), stamp if connected else None, stamp),
    )


def node_byte_totals(cursor: Cursor) -> dict[str, int]:
    """Bytes downloaded per node since the database was created (metrics)."""
    return {row[0]: int(row[1]) for row in cursor.execute(_NODE_BYTE_TOTALS_SQL)}


# ---------------------------------------------------------------- /api/stats


def bucket_seconds(window: int) -> int:
    """The bucket of a ``window`` (seconds) of ``/api/stats``: one minute up
    to an hour, a quarter of an hour beyond (6 hours: 24 buckets, 24 hours:
    96).  A quarter's top nodes are read from the quarter slots, one index
    lookup per bucket and node; finer buckets over a longer window would
    cost one lookup in ``throughput_minute`` per minute and node (6 hours
    in 5-minute buckets: 3,600, 30 ms on B9's database)."""
    return 60 if window <= 3600 else QUARTER


# Every statement below answers one row: the rows it sums, as one JSON text
# where there are several (a bucket each).  With several reader threads,
# each row fetched is a hand-off of the GIL: a thousand rows per statement
# made 8 concurrent requests slower than one after the other, and a row per
# bucket (96 over 24 hours) still queued them.  The sums are SQL's.
# ``[[bucket, bytes, completed], ...]``:
_TOTALS_READ_SQL = per_backend(
    sqlite="SELECT json_group_array(json_array(b, gained, done)) FROM ("
    " SELECT minute / ?4 AS b, SUM(bytes) AS gained, SUM(completed) AS done"
    " FROM throughput_total WHERE user_id = ?1 AND minute BETWEEN ?2 AND ?3 GROUP BY 1)",
    postgres="SELECT CAST(json_agg(json_build_array(b, gained, done)) AS TEXT) FROM ("
    " SELECT minute / ?4 AS b, SUM(bytes) AS gained, SUM(completed) AS done"
    " FROM throughput_total WHERE user_id = ?1 AND minute BETWEEN ?2 AND ?3 GROUP BY 1) AS t",
)
# The top nodes from a minute on (?7..), and how many nodes have bytes
# there: the minutes are split into whole six-hour slots (?2..), the hours
# before them (?3..?4), the quarters before those (?5..?6) and the minutes
# before those (the raw rows: a window starts on any minute).  ?1 is the
# user, 0 every user.
_RANK_SQL = sql(
    "SELECT node_id, total, COUNT(*) OVER () FROM ("
    " SELECT node_id, SUM(bytes) AS total FROM ("
    " SELECT node_id, bytes FROM throughput_node"
    " WHERE user_id = ?1 AND grain = 21600 AND slot >= ?2"
    " UNION ALL SELECT node_id, bytes FROM throughput_node"
    " WHERE user_id = ?1 AND grain = 3600 AND slot BETWEEN ?3 AND ?4"
    " UNION ALL SELECT node_id, bytes FROM throughput_node"
    " WHERE user_id = ?1 AND grain = 900 AND slot BETWEEN ?5 AND ?6"
    " UNION ALL SELECT node_id, bytes FROM throughput_minute"
    " WHERE minute BETWEEN ?7 AND ?8 AND (?1 = 0 OR user_id = ?1)"
    " ) AS r GROUP BY node_id"
    ") AS t WHERE total > 0 ORDER BY total DESC, node_id LIMIT ?9"
)
# The top nodes' bytes in each quarter (one index lookup per slot and
# node): ``{slot: {node: bytes}}``.
_TOP_QUARTERS_SQL = per_backend(
    sqlite="SELECT json_group_object(slot, json(by_node)) FROM ("
    " SELECT slot, json_group_object(node_id, bytes) AS by_node FROM throughput_node"
    " WHERE user_id = ?1 AND grain = 900 AND slot IN (SELECT value FROM json_each(?2))"
    " AND node_id IN (SELECT value FROM json_each(?3)) GROUP BY slot)",
    postgres="SELECT CAST(json_object_agg(slot, by_node) AS TEXT) FROM ("
    " SELECT slot, json_object_agg(node_id, bytes) AS by_node FROM throughput_node"
    " WHERE user_id = ?1 AND grain = 900 AND slot = ANY(?2) AND node_id = ANY(?3)"
    " GROUP BY slot) AS q",
)
# ... and in each minute, from the raw rows (one lookup per minute and
# node): ``{minute: {node: bytes}}``.
_TOP_MINUTES_SQL = per_backend(
    sqlite="SELECT json_group_object(minute, json(by_node)) FROM ("
    " SELECT minute, json_group_object(node_id, bytes) AS by_node FROM ("
    " SELECT minute, node_id, SUM(bytes) AS bytes FROM throughput_minute"
    " WHERE minute IN (SELECT value FROM json_each(?2))"
    " AND node_id IN (SELECT value FROM json_each(?3)) AND (?1 = 0 OR user_id = ?1)"
    " GROUP BY minute, node_id) AS m GROUP BY minute)",
    postgres="SELECT CAST(json_object_agg(minute, by_node) AS TEXT) FROM ("
    " SELECT minute, json_object_agg(node_id, bytes) AS by_node FROM ("
    " SELECT minute, node_id, SUM(bytes) AS bytes FROM throughput_minute"
    " WHERE minute = ANY(?2) AND node_id = ANY(?3) AND (?1 = 0 OR user_id = ?1)"
    " GROUP BY minute, node_id) AS m GROUP BY minute) AS q",
)
_EMPTY = (1, 0)  # a range of no slot


def rank_nodes(
    cursor: Cursor, user: int, first_minute: int, limit: int = TOP_NODES
) -> tuple[list[tuple[str, int]], int]:
    """The ``limit`` nodes with the most bytes from ``first_minute`` on for
    ``user`` (:data:`ALL_USERS`: everyone's), ``(node, bytes)``, most first
    (then by id), and how many nodes have bytes there.  Read mostly from
    the coarsest slots: whole six-hour slots, then at most 5 hours, 3
    quarters and 14 minutes before them.  There is no end: a window ends
    now, and the rows a site whose clock is ahead stamped later count
    too."""
    six = -(-first_minute // 360)
    hours = (-(-first_minute // 60), six * 6 - 1)
    quarters = (-(-first_minute // 15), hours[0] * 4 - 1)
    minutes = (first_minute, quarters[0] * 15 - 1)
    params = [user, six]
    for low, high in (hours, quarters, minutes):
        params += [low, high] if low <= high else list(_EMPTY)
    top: list[tuple[str, int]] = []
    count = 0
    for node_id, total, nodes in cursor.execute(_RANK_SQL, (*params, limit)):
        top.append((str(node_id), int(total)))
        count = int(nodes)
    return top, count


class StatsBucket(TypedDict):
    """One bucket of :func:`window_stats`."""

    start: str
    completed: int
    bytes: int
    byNode: dict[str, int]
    other: int


class WindowStats(TypedDict):
    """What :func:`window_stats` answers (``/api/stats``'s buckets)."""

    window: int
    bucketSeconds: int
    nodes: list[str]
    nodeLimit: int
    otherNodes: int
    buckets: list[StatsBucket]


def window_stats(cursor: Cursor, scope_user: int | None, window: int, now: float) -> WindowStats:
    """The buckets of ``/api/stats`` for ``window`` seconds up to ``now``
    (unix seconds); ``scope_user`` None covers every user's tasks (admin).

    Buckets of :func:`bucket_seconds`, aligned on multiples of it, every one
    present (zeros included), oldest first, the last holding ``now``:
    ``completed`` and ``bytes`` from ``throughput_total``, ``byNode`` for
    the :data:`TOP_NODES` nodes with the most bytes from the window's start
    (``nodes``, most first: :func:`rank_nodes`), and ``other``: the bytes
    of every other node (``otherNodes`` of them), so that ``bytes`` is
    ``other`` plus the sum of ``byNode``.  The top nodes' buckets are read
    from the quarter slots (quarter-hour buckets) or from
    ``throughput_minute`` (one-minute buckets)."""
    seconds = bucket_seconds(window)
    per = seconds // 60
    last = int(now // seconds)
    count = max(1, -(-window // seconds))
    first = last - count + 1
    first_minute, end_minute = first * per, (last + 1) * per - 1
    user = ALL_USERS if scope_user is None else int(scope_user)
    ranked, nodes = rank_nodes(cursor, user, first_minute)
    top = [node_id for node_id, _ in ranked]
    buckets: list[StatsBucket] = [
        {
            "start": iso(b * seconds),
            "completed": 0,
            "bytes": 0,
            "byNode": dict.fromkeys(top, 0),
            "other": 0,
        }
        for b in range(first, last + 1)
    ]
    totals = cursor.execute(_TOTALS_READ_SQL, (user, first_minute, end_minute, per)).fetchone()
    for at, gained, completed in orjson.loads(totals[0] or "[]"):
        bucket = buckets[int(at) - first]
        bucket["bytes"] = int(gained)
        bucket["completed"] = int(completed)
    if top:
        if seconds == QUARTER:
            found = cursor.execute(_TOP_QUARTERS_SQL, (user, list(range(first, last + 1)), top))
        else:
            minutes = list(range(first_minute, end_minute + 1))
            found = cursor.execute(_TOP_MINUTES_SQL, (user, minutes, top))
        for at, by_node in orjson.loads(found.fetchone()[0] or "{}").items():
            index = int(at) // (1 if seconds == QUARTER else per) - first
            for node_id, gained in by_node.items():
                buckets[index]["byNode"][node_id] += int(gained)
    for bucket in buckets:
        bucket["other"] = max(0, bucket["bytes"] - sum(bucket["byNode"].values()))
    return {
        "window": window,
        "bucketSeconds": seconds,
        "nodes": top,
        "nodeLimit": TOP_NODES,
        "otherNodes": nodes - len(top),
        "buckets": buckets,
    }
