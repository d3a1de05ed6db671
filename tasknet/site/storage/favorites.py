"""A user's favorite tasks: mark, unmark, list (views in gid order)."""

from __future__ import annotations

from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.views import TaskView, gallery_row, views_in_order, visible_gallery

_ADD_SQL = sql(
    "INSERT INTO favorite (user_id, gid, created_at) VALUES (?, ?, {now}) ON CONFLICT DO NOTHING"
)
_IS_FAVORITE = sql("SELECT 1 FROM favorite WHERE user_id = ? AND gid = ?")
_REMOVE = sql("DELETE FROM favorite WHERE user_id = ? AND gid = ?")
_FAVORITES = sql(
    "SELECT f.gid FROM favorite AS f JOIN gallery AS g ON g.gid = f.gid "
    "WHERE f.user_id = ? ORDER BY f.gid"
)


def add_favorite(cursor: Cursor, user_id: int, gid: int, admin: bool = False) -> None:
    """Mark ``gid`` a favorite of ``user_id`` (idempotent).  Only a task the
    user may see (an admin sees all); otherwise ``not_found``."""
    visible_gallery(cursor, gid, None if admin else user_id)
    cursor.execute(_ADD_SQL, (user_id, gid))


def remove_favorite(cursor: Cursor, user_id: int, gid: int, admin: bool = False) -> None:
    """Unmark (idempotent); ``not_found`` for a task the user may not see."""
    if gallery_row(cursor, gid) is not None:
        visible_gallery(cursor, gid, None if admin else user_id)
    else:
        existing = cursor.execute(_IS_FAVORITE, (user_id, gid)).fetchone()
        if existing is None:
            raise TaskError("not_found", f"no task {gid}")
    cursor.execute(_REMOVE, (user_id, gid))


def list_favorites(cursor: Cursor, user_id: int) -> list[TaskView]:
    """The views of ``user_id``'s favorite tasks, in gid order."""
    rows = cursor.execute(_FAVORITES, (user_id,)).fetchall()
    return views_in_order(cursor, (row[0] for row in rows))
