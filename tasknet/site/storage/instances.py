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

from tasknet.site.storage.dialect import NOW_SQL
from tasknet.site.storage.errors import DatabaseFailed
from tasknet.status import OperationState

#: An instance that neither ended nor was reaped (a WHERE condition on site_instance).
OPEN_SQL = "ended_at IS NULL AND reaped_at IS NULL"
_IN_FLIGHT = (OperationState.SUBMITTING.value, OperationState.RESERVED.value)


class LeaseLost(DatabaseFailed):
    """This instance's lease is gone (its lock session ended, or another
    instance found it gone and reaped it): it must not write any more.
    Nothing of the refused transaction was written."""


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

    @property
    def open(self) -> bool:
        """Neither ended nor reaped (which says nothing of being alive)."""
        return self.ended_at is None and self.reaped_at is None


def register(
    cursor: sqlite3.Cursor, name: str, host: str, pid: int, lease_pid: int | None = None
) -> int:
    """A new open instance; its id (ids are never reused)."""
    row = cursor.execute(
        "INSERT INTO site_instance (name, host, pid, lease_pid) VALUES (?, ?, ?, ?) RETURNING id",
        (name, host, pid, lease_pid),
    ).fetchone()
    return int(row[0])


def heartbeat(cursor: sqlite3.Cursor, instance_id: int) -> bool:
    """Note that ``instance_id`` is running (``heartbeat_at``, for people);
    ``False`` when its row is no longer open: another instance reaped it
    (its lease was judged gone), so it must stop writing."""
    cursor.execute(
        f"UPDATE site_instance SET heartbeat_at = {NOW_SQL} WHERE id = ? AND {OPEN_SQL}",  # noqa: S608
        (instance_id,),
    )
    return cursor.rowcount == 1


def end(cursor: sqlite3.Cursor, instance_id: int) -> bool:
    """A clean stop of ``instance_id`` (its last write); ``False`` if it
    was no longer open."""
    cursor.execute(
        f"UPDATE site_instance SET ended_at = {NOW_SQL} WHERE id = ? AND {OPEN_SQL}",  # noqa: S608
        (instance_id,),
    )
    return cursor.rowcount == 1


def require_open(cursor: sqlite3.Cursor, instance_id: int) -> None:
    """The fencing check of the writes that hand a submission to
    ``instance_id``: raise :class:`LeaseLost` if the instance was reaped or
    ended (the whole transaction is refused)."""
    row = cursor.execute(
        "SELECT reaped_by, ended_at FROM site_instance WHERE id = ?", (instance_id,)
    ).fetchone()
    if row is None:
        raise LeaseLost(f"site instance {instance_id} is not registered; nothing was written")
    if row["reaped_by"] is not None or row["ended_at"] is not None:
        how = f"reaped by instance {row['reaped_by']}" if row["reaped_by"] is not None else "ended"
        raise LeaseLost(f"site instance {instance_id} lost its lease ({how}); nothing was written")


def instance(cursor: sqlite3.Cursor, instance_id: int) -> Instance | None:
    row = cursor.execute("SELECT * FROM site_instance WHERE id = ?", (instance_id,)).fetchone()
    return None if row is None else _instance(row)


def list_instances(cursor: sqlite3.Cursor, *, open_only: bool = False) -> list[Instance]:
    """Every instance (or the open ones), oldest first."""
    where = f" WHERE {OPEN_SQL}" if open_only else ""
    return [
        _instance(row)
        for row in cursor.execute(f"SELECT * FROM site_instance{where} ORDER BY id")  # noqa: S608
    ]


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
    )


def suspects(cursor: sqlite3.Cursor, me: int, *, unrecorded: bool = False) -> list[int | None]:
    """The instances whose lease must be judged: every other open one, and
    every other one that owns a generation still ``RESERVED`` or
    ``SUBMITTING`` (an ended or reaped instance may have left some, e.g. an
    outcome its stop did not record).  With ``unrecorded``, ``None`` is one
    of them when a generation in flight has no instance (written before
    v4): the start's recovery settles those."""
    rows = cursor.execute(
        f"SELECT id FROM site_instance WHERE {OPEN_SQL} AND id <> ? "  # noqa: S608
        "UNION SELECT DISTINCT instance_id FROM task_operation "
        "WHERE state IN (?, ?) AND (instance_id IS NULL OR instance_id <> ?)",
        (me, *_IN_FLIGHT, me),
    ).fetchall()
    ids = sorted({int(r[0]) for r in rows if r[0] is not None})
    found: list[int | None] = list(ids)
    if unrecorded and any(r[0] is None for r in rows):
        found.append(None)
    return found
