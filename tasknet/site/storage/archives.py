"""What an archive link is made of (DELIVERY.md, "Getting an archive
(site)"): for a gid, its owner, name, display status, the current
generation's operationId, the node that holds it and the archive's size and
SHA-256 as that node reported them with the completion.

One read serves ``GET /api/tasks/{gid}/archive`` (:func:`archive_of`) and
one statement serves up to a thousand gids of ``POST
/api/tasks/archive-links`` (:func:`archives_of`): the same columns, the
same row -> :class:`ArchiveTask` code.  Whether the caller may see a task
is decided here as for the task itself (``views.visible_gallery``):
another user's task is ``not_found`` (one gid) or left out (many).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.views import QUEUED
from tasknet.status import TaskStatus

__all__ = ["ArchiveTask", "archive_of", "archives_of"]

# ``status_key`` is the stored display status (schema v6, kept by the
# triggers); QUEUED is a part of SUBMITTED.
_ARCHIVES_SQL = """
SELECT g.gid, g.user_id, g.name, g.status_key, o.operation_id, g.node_id,
       g.archive_size, g.archive_sha256, g.archive_gone_reason, g.archive_gone_at
FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid
WHERE g.gid {match}
"""
_ARCHIVE_ONE_SQL = sql(_ARCHIVES_SQL.format(match="= ?"))
_ARCHIVE_MANY_SQL = sql(_ARCHIVES_SQL.format(match="{in_array:?}"))


@dataclass(frozen=True, slots=True)
class ArchiveTask:
    """One task as its archive link needs it."""

    gid: int
    owner_id: int
    #: The task's name (``gallery.name``; may be empty).
    name: str
    #: The display status (``TaskStatus`` value): only ``COMPLETED`` has an archive.
    status: str
    #: The current generation's operationId (``None``: a legacy row without one).
    operation_id: str | None
    #: The node assigned the task (``None``: none yet).
    node_id: str | None
    #: Bytes and lowercase hex SHA-256 the node reported (``None``: not reported).
    archive_size: int | None
    archive_sha256: str | None
    #: Why and when no node holds the archive any more (``None``: not gone).
    gone_reason: str | None = None
    gone_at: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == TaskStatus.COMPLETED.value


def _task(row: sqlite3.Row) -> ArchiveTask:
    gid, owner, name, key, operation_id, node_id, size, sha256, gone_reason, gone_at = tuple(row)
    status = TaskStatus.SUBMITTED.value if key == QUEUED else str(key)
    return ArchiveTask(
        gid=int(gid),
        owner_id=int(owner),
        name=name or "",
        status=status,
        operation_id=operation_id,
        node_id=node_id,
        archive_size=None if size is None else int(size),
        archive_sha256=sha256,
        gone_reason=gone_reason,
        gone_at=gone_at,
    )


def _visible(task: ArchiveTask, user_id: int | None) -> bool:
    return user_id is None or task.owner_id == user_id


def archive_of(cursor: Cursor, gid: int, user_id: int | None) -> ArchiveTask:
    """``gid`` as its archive link needs it, if ``user_id`` may see it
    (``None``: an admin), else ``not_found`` (as ``GET /api/tasks/{gid}``)."""
    row = cursor.execute(_ARCHIVE_ONE_SQL, (gid,)).fetchone()
    task = None if row is None else _task(row)
    if task is None or not _visible(task, user_id):
        raise TaskError("not_found", f"no task {gid}")
    return task


def archives_of(cursor: Cursor, gids: Iterable[int], user_id: int | None) -> dict[int, ArchiveTask]:
    """The tasks of ``gids`` that ``user_id`` may see (``None``: an admin),
    by gid, in one statement; any other gid is absent."""
    wanted = list(gids)
    if not wanted:
        return {}
    rows = cursor.execute(_ARCHIVE_MANY_SQL, (wanted,)).fetchall()
    tasks = (_task(row) for row in rows)
    return {task.gid: task for task in tasks if _visible(task, user_id)}
