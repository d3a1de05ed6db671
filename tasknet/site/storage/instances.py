"""Site instances: one ``site_instance`` row per run of a site process
(SCALE.md 2); the settling of what a gone instance left in flight is
:mod:`tasknet.site.storage.reaping`.

Whether an instance is alive is never read from these rows: the database
judges it by the instance's lease (:mod:`tasknet.site.storage.lease`).  The
rows say who the instances are, which of them ended cleanly
(``ended_at``) or were found gone and settled (``reaped_at``,
``reaped_by``), and which instance wrote each in-flight generation
(``task_operation.instance_id``, set by ``create.reserve`` and
``create.begin_submit``).

The row is also the instance's fencing token: a reaped or ended instance is
not *open*, and the writes that take a submission into an instance's hands
(reserve, SUBMITTING) check, in their own transaction, that it still is
(:func:`require_open`).  So once a reap has committed, the reaped instance
cannot start a submission any more, however late it learns that its lease
is gone; on PostgreSQL (SERIALIZABLE) a reap and such a write racing each
other cannot both commit.

Each function is the body of one transaction (``fn(cursor, *args)``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from tasknet.site.storage.engine.errors import DatabaseBusy, DatabaseFailed
from tasknet.site.storage.engine.sql import offset, sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.status import OperationState

#: An instance that neither ended nor was reaped (a WHERE condition on site_instance).
OPEN_SQL = "ended_at IS NULL AND reaped_at IS NULL"
_IN_FLIGHT = (OperationState.SUBMITTING.value, OperationState.RESERVED.value)

_REGISTER = sql(
    "INSERT INTO site_instance (name, host, pid, lease_pid, lease_timeout, upstream_timeout, "
    "process_space, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?, ?, ?, {now}, {now})"
    " RETURNING id"
)
_LEASE_CONFIRMED = sql(
    "INSERT INTO instance_lease (instance_id, confirmed_at) "
    "VALUES (?, {now}) ON CONFLICT (instance_id) DO UPDATE "
    "SET confirmed_at = excluded.confirmed_at"
)
_CONFIRMED_AT = sql("SELECT confirmed_at FROM instance_lease WHERE instance_id = ?")
_LAST_CONFIRMATION = sql(
    "SELECT i.lease_timeout, l.confirmed_at FROM site_instance i "
    "LEFT JOIN instance_lease l ON l.instance_id = i.id WHERE i.id = ?"
)
_OLDER_THAN = sql("SELECT {now_offset} >= ?")
_OPEN_LOCKED = sql(f"SELECT id FROM site_instance WHERE id = ? AND {OPEN_SQL} {{for_share}}")  # noqa: S608
_HEARTBEAT = sql(f"UPDATE site_instance SET heartbeat_at = {{now}} WHERE id = ? AND {OPEN_SQL}")  # noqa: S608
_END = sql(f"UPDATE site_instance SET ended_at = {{now}} WHERE id = ? AND {OPEN_SQL}")  # noqa: S608
_FENCE = sql("SELECT reaped_by, ended_at FROM site_instance WHERE id = ?")
_INSTANCE = sql("SELECT * FROM site_instance WHERE id = ?")
_INSTANCES = sql("SELECT * FROM site_instance ORDER BY id")
_OPEN_INSTANCES = sql(f"SELECT * FROM site_instance WHERE {OPEN_SQL} ORDER BY id")  # noqa: S608
_SUSPECTS = sql(
    f"SELECT id FROM site_instance WHERE {OPEN_SQL} AND id <> ? "  # noqa: S608
    "UNION SELECT DISTINCT instance_id FROM task_operation "
    "WHERE state IN (?, ?) AND (instance_id IS NULL OR instance_id <> ?)"
)


class LeaseLost(DatabaseFailed):
    """This instance's lease is gone (its lock session ended, or another
    instance found it gone and reaped it): it must not write any more.
    Nothing of the refused transaction was written."""


class LeaseStale(DatabaseBusy):
    """This instance has not confirmed its lease within the lease timeout
    (SCALE.md "Fencing" 1 and 3): it starts no write transaction and sends no
    POST until a check confirms the lease again (then the write may be
    retried) or finds it lost (then :class:`LeaseLost` for good)."""


@dataclass(frozen=True)
class Instance:
    """One ``site_instance`` row."""

    id: int
    name: str
    host: str
    pid: int
    lease_pid: int | None
    started_at: str
    heartbeat_at: str
    ended_at: str | None
    reaped_at: str | None
    reaped_by: int | None
    #: Seconds (v5; None for an instance of an older release).
    lease_timeout: float | None = None
    upstream_timeout: float | None = None
    #: The kernel and pid namespace it ran in (``lease.process_space``).
    process_space: str | None = None

    @property
    def open(self) -> bool:
        """Neither ended nor reaped (which says nothing of being alive)."""
        return self.ended_at is None and self.reaped_at is None


def register(
    cursor: Cursor,
    name: str,
    host: str,
    pid: int,
    lease_pid: int | None = None,
    *,
    lease_timeout: float | None = None,
    upstream_timeout: float | None = None,
    process_space: str | None = None,
) -> int:
    """A new open instance; its id (ids are never reused).  Its lease
    timeout and upstream timeout are recorded for whoever reaps it: how
    long after its last lease confirmation its last POST may still land
    (:mod:`tasknet.site.storage.reaping`)."""
    row = cursor.execute(
        _REGISTER, (name, host, pid, lease_pid, lease_timeout, upstream_timeout, process_space)
    ).fetchone()
    return int(row[0])


def lease_confirmed(cursor: Cursor, instance_id: int) -> None:
    """Record that ``instance_id`` holds its lease now (its registration;
    its lease checks write the same row, :mod:`tasknet.site.storage.lease`)."""
    cursor.execute(_LEASE_CONFIRMED, (instance_id,))


def lease_confirmed_at(cursor: Cursor, instance_id: int) -> str | None:
    """When ``instance_id`` last confirmed its lease (None: never recorded,
    an instance of an older release)."""
    row = cursor.execute(_CONFIRMED_AT, (instance_id,)).fetchone()
    return None if row is None else str(row[0])


def surely_stale(cursor: Cursor, instance_id: int, default_timeout: float) -> bool:
    """Whether gone instance ``instance_id``, were it only paused, must find
    its lease stale by its own clock whenever it resumes: its last
    confirmation is at least its lease timeout (``default_timeout`` for an
    instance that recorded none) old.  Only then may it be reaped (SCALE.md
    "Fencing": nothing it could still start after its reap)."""
    row = cursor.execute(_LAST_CONFIRMATION, (instance_id,)).fetchone()
    if row is None or row[1] is None:
        return True
    timeout = default_timeout if row[0] is None else float(row[0])
    old = cursor.execute(_OLDER_THAN, (offset(-timeout), row[1])).fetchone()
    # "now - timeout" at or past the confirmation: text compare of one format.
    return bool(old[0])


def require_open_locked(cursor: Cursor, instance_id: int) -> None:
    """The write gate of a PostgreSQL transaction (SCALE.md "Fencing" 3):
    this instance's row is still open, read ``FOR SHARE`` so that a reaper's
    ``UPDATE`` of it waits for this transaction to end (and the reaper ends
    this instance's sessions first, so a paused holder cannot make it wait
    for ever).  Raises :class:`LeaseLost` otherwise: nothing of the
    transaction commits."""
    row = cursor.execute(_OPEN_LOCKED, (instance_id,)).fetchone()
    if row is None:
        raise LeaseLost(
            f"site instance {instance_id} was reaped or ended; nothing of this transaction "
            "was written"
        )


def heartbeat(cursor: Cursor, instance_id: int) -> bool:
    """Note that ``instance_id`` is running (``heartbeat_at``, for people);
    ``False`` when its row is no longer open: another instance reaped it
    (its lease was judged gone), so it must stop writing."""
    cursor.execute(_HEARTBEAT, (instance_id,))
    return cursor.rowcount == 1


def end(cursor: Cursor, instance_id: int) -> bool:
    """A clean stop of ``instance_id`` (its last write); ``False`` if it
    was no longer open."""
    cursor.execute(_END, (instance_id,))
    return cursor.rowcount == 1


def require_open(cursor: Cursor, instance_id: int) -> None:
    """The fencing check of the writes that hand a submission to
    ``instance_id``: raise :class:`LeaseLost` if the instance was reaped or
    ended (the whole transaction is refused)."""
    row = cursor.execute(_FENCE, (instance_id,)).fetchone()
    if row is None:
        raise LeaseLost(f"site instance {instance_id} is not registered; nothing was written")
    if row["reaped_by"] is not None or row["ended_at"] is not None:
        how = f"reaped by instance {row['reaped_by']}" if row["reaped_by"] is not None else "ended"
        raise LeaseLost(f"site instance {instance_id} lost its lease ({how}); nothing was written")


def instance(cursor: Cursor, instance_id: int) -> Instance | None:
    row = cursor.execute(_INSTANCE, (instance_id,)).fetchone()
    return None if row is None else _instance(row)


def list_instances(cursor: Cursor, *, open_only: bool = False) -> list[Instance]:
    """Every instance (or the open ones), oldest first."""
    return [_instance(row) for row in cursor.execute(_OPEN_INSTANCES if open_only else _INSTANCES)]


def _instance(row: sqlite3.Row) -> Instance:
    return Instance(
        id=int(row["id"]),
        name=row["name"],
        host=row["host"],
        pid=int(row["pid"]),
        lease_pid=None if row["lease_pid"] is None else int(row["lease_pid"]),
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        ended_at=row["ended_at"],
        reaped_at=row["reaped_at"],
        reaped_by=None if row["reaped_by"] is None else int(row["reaped_by"]),
        lease_timeout=None if row["lease_timeout"] is None else float(row["lease_timeout"]),
        upstream_timeout=(
            None if row["upstream_timeout"] is None else float(row["upstream_timeout"])
        ),
        process_space=row["process_space"],
    )


def suspects(cursor: Cursor, me: int, *, unrecorded: bool = False) -> list[int | None]:
    """The instances whose lease must be judged: every other open one, and
    every other one that owns a generation still ``RESERVED`` or
    ``SUBMITTING`` (an ended or reaped instance may have left some, e.g. an
    outcome its stop did not record).  With ``unrecorded``, ``None`` is one
    of them when a generation in flight has no instance (written before
    v4): the start's recovery settles those."""
    rows = cursor.execute(_SUSPECTS, (me, *_IN_FLIGHT, me)).fetchall()
    ids = sorted({int(r[0]) for r in rows if r[0] is not None})
    found: list[int | None] = list(ids)
    if unrecorded and any(r[0] is None for r in rows):
        found.append(None)
    return found
