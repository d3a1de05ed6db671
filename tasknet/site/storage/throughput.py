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
  (by node and owner, for ``/api/stats``) and to ``node_bytes`` (the site's
  byte counters), in the report's own transaction, so a report that rolls
  back counts nothing;
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
:func:`record_node_seen` is called when a node logs in or goes away.  Every
function takes the cursor of the caller's transaction and ``now`` (unix
seconds) for tests.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.timestamps import iso
from tasknet.status import NodeCode

SMOOTHING_SECONDS = 10.0
#: A task whose progress has not moved for this long shows ``speed: null``.
STALL_SECONDS = 15.0
#: Minute buckets kept (a little over the largest ``/api/stats`` window).
KEEP_MINUTES = 25 * 60

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
_NODE_SEEN_SQL = sql(
    "INSERT INTO node_seen (node_id, protocol, features, connected_at, last_seen_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5)"
    " ON CONFLICT (node_id) DO UPDATE SET protocol = ?2, features = ?3,"
    " connected_at = ?4, last_seen_at = ?5"
)
_NODE_BYTE_TOTALS_SQL = sql("SELECT node_id, bytes FROM node_bytes")

# Per database file would be exact; per process is enough to prune about
# once a minute (pruning is idempotent).
_last_pruned_minute = -1


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
    cursor: sqlite3.Cursor,
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
    global _last_pruned_minute
    now = time.time() if now is None else now
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
    node_bytes = [(node_id, gained) for node_id, gained in per_node.items() if gained]
    if node_bytes:
        cursor.executemany(_NODE_BYTES_SQL, node_bytes)
    if minute != _last_pruned_minute:
        cursor.execute(_PRUNE_MINUTES_SQL, (minute - KEEP_MINUTES,))
        _last_pruned_minute = minute
    return samples


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
    cursor: sqlite3.Cursor,
    node_id: str,
    protocol: int | None,
    features: Iterable[str],
    connected: bool,
    now: float | None = None,
) -> None:
    """A node logged in (``connected``) or went away."""
    stamp = iso(time.time() if now is None else now)
    cursor.execute(
        _NODE_SEEN_SQL,
        (node_id, protocol, json.dumps(list(features)), stamp if connected else None, stamp),
    )


def node_byte_totals(cursor: sqlite3.Cursor) -> dict[str, int]:
    """Bytes downloaded per node since the database was created (metrics)."""
    return {row[0]: int(row[1]) for row in cursor.execute(_NODE_BYTE_TOTALS_SQL)}
