"""The write side of the notification outbox (LIFECYCLE.md invariant 8).

A change a user can see is announced by a ``notification_outbox`` row written
in the same transaction as the change, so a notification exists exactly when
the change was committed.  The outbox executor (``tasknet.site.notify``)
delivers rows after commit, off the commit path; its read side is
``tasknet.site.storage.delivery``.
"""

from __future__ import annotations

import json
import sqlite3

from tasknet.site.storage import tasks


def enqueue_task_change(cursor: sqlite3.Cursor, gid: int, *, user_id: int | None = None) -> int:
    """Record ``{"type": "task", "task": <view>}`` for ``gid`` as it stands
    now in this transaction; return the outbox row id.

    Call it after the change, inside the transaction that made it.  When the
    task's rows are already gone (released, resolved "not submitted"), the view
    is :func:`tasks.gone_view` (``status`` null: clients drop the task) and
    ``user_id`` names the owner who should hear of it.
    """
    view = tasks.task_view(cursor, gid)
    if view is None:
        view = tasks.gone_view(gid)
    owner = tasks.task_owner(cursor, gid)
    if owner is None:
        owner = user_id
    payload = json.dumps({"type": "task", "task": view}, ensure_ascii=False, separators=(",", ":"))
    cursor.execute(
        "INSERT INTO notification_outbox (gid, user_id, payload) VALUES (?, ?, ?)",
        (gid, owner, payload),
    )
    return int(cursor.lastrowid or 0)
