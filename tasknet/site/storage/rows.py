"""Reading one task's rows: the gid range, the ``gallery`` and
``task_operation`` row of a gid, and the owner check that makes another
user's task look missing (the SQL timestamp is ``dialect.NOW_SQL``).

Read-only helpers shared by every task module; nothing here writes.
"""

from __future__ import annotations

import sqlite3

from tasknet.site.storage.errors import TaskError

#: The gids a task may have (INTERFACES.md).
GID_MIN = 1
GID_MAX = 2**31 - 1  # the wire bound (PROTOCOL.md "Bounds"): every task must be dispatchable


def operation_row(cursor: sqlite3.Cursor, gid: int) -> sqlite3.Row | None:
    """The ``task_operation`` row of ``gid`` (current generation or tombstone)."""
    row: sqlite3.Row | None = cursor.execute(
        "SELECT * FROM task_operation WHERE gid = ?", (gid,)
    ).fetchone()
    return row


def gallery_row(cursor: sqlite3.Cursor, gid: int) -> sqlite3.Row | None:
    """The task (``gallery``) row of ``gid``."""
    row: sqlite3.Row | None = cursor.execute(
        "SELECT * FROM gallery WHERE gid = ?", (gid,)
    ).fetchone()
    return row


def visible_gallery(cursor: sqlite3.Cursor, gid: int, user_id: int | None) -> sqlite3.Row:
    """The task row of ``gid`` if ``user_id`` may see it (None: an admin),
    else ``not_found``: another user's task answers exactly like a missing
    one, so existence is not leaked."""
    row = gallery_row(cursor, gid)
    if row is None or (user_id is not None and row["user_id"] != user_id):
        raise TaskError("not_found", f"no task {gid}")
    return row
