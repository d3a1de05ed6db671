"""The write side of the notification outbox (LIFECYCLE.md invariant 8).

A change a user can see is announced by a ``notification_outbox`` row written
in the same transaction as the change, so a notification exists exactly when
the change was committed.  The outbox executor (``tasknet.site.notify``)
delivers rows after commit, off the commit path; its read side is
``tasknet.site.storage.delivery``.

Payloads are the task views of :mod:`tasknet.site.storage.views`, which
imports nothing of this module.

Several sites on PostgreSQL (SCALE.md 6): the readers tail the outbox by
id (``id > after``), which is right only if ids become visible in id order.
A sequence does not give that (a transaction may take id 11, another id 12
and commit first: a reader past 12 would never see 11).  So every
transaction that inserts outbox rows first takes the transaction-level
advisory lock :data:`OUTBOX_LOCK_KEY`, just before its first insert: ids are
then taken and committed one transaction at a time, and a reader that sees
id N has seen every committed id below N (the lock is released after the
commit is visible).  The same statement sends ``NOTIFY tasknet_outbox``
(delivered at commit: every site wakes its tail).  The lock is held from the
insert, near a transaction's end, to its commit; a transaction holding it
that waits for a row lock of another one that then asks for it is a
deadlock, which PostgreSQL breaks and the database layer retries.  SQLite
has one writer: its ids are in commit order already, and nothing is sent.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from tasknet.site.storage import listen
from tasknet.site.storage.views import gone_view, task_views_and_owners

_INSERT_SQL = "INSERT INTO notification_outbox (gid, user_id, payload) VALUES (?, ?, ?)"

#: The advisory lock (single 64-bit key space) that orders outbox ids on
#: PostgreSQL (see the module doc): "tn-outbx".
OUTBOX_LOCK_KEY = int.from_bytes(b"tn-outbx", "big")


def _ordered(cursor: sqlite3.Cursor) -> None:
    """Before inserting outbox rows (PostgreSQL): take the outbox lock and
    announce the rows at commit.  Re-taking it in one transaction is cheap."""
    if listen.is_postgres_cursor(cursor):
        cursor.execute(
            "SELECT pg_advisory_xact_lock(?), pg_notify(?, '')", (OUTBOX_LOCK_KEY, listen.OUTBOX)
        )


# One encoder for every payload: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _payload(obj: dict[str, Any]) -> str:
    """Compact JSON of ``obj``: orjson (a report's views are a tenth of the
    writer's time with json), json where orjson refuses (an int beyond 64 bits,
    a lone surrogate).  The text may spell a float differently (0.00001 for
    1e-05): a JSON reader sees the same value."""
    try:
        return orjson.dumps(obj).decode("utf-8")
    except TypeError:
        return _ENCODER.encode(obj)


def _outbox_row(
    gid: int, found: tuple[dict[str, Any] | None, int | None] | None, user_id: int | None
) -> tuple[int, int | None, str]:
    view, owner = found if found is not None else (None, None)
    if view is None:
        view = gone_view(gid)
    if owner is None:
        owner = user_id
    return gid, owner, _payload({"type": "task", "task": view})


def enqueue_task_change(cursor: sqlite3.Cursor, gid: int, *, user_id: int | None = None) -> int:
    """Record ``{"type": "task", "task": <view>}`` for ``gid`` as it stands
    now in this transaction; return the outbox row id.

    Call it after the change, inside the transaction that made it.  When the
    task's rows are already gone (released, resolved "not submitted"), the view
    is :func:`~tasknet.site.storage.views.gone_view` (``status`` null: clients drop the task) and
    ``user_id`` names the owner who should hear of it.
    """
    found = task_views_and_owners(cursor, (gid,)).get(gid)
    _ordered(cursor)
    row = cursor.execute(_INSERT_SQL + " RETURNING id", _outbox_row(gid, found, user_id)).fetchone()
    return int(row[0])


def enqueue_task_changes(cursor: sqlite3.Cursor, gids: Sequence[int]) -> int:
    """:func:`enqueue_task_change` for each of ``gids``, in that order, with
    one view query and one insert statement; return the number of rows.

    Every view is read after all the changes: call it once the transaction
    has made every change it announces (a gid listed twice gets two rows
    showing the same, final view).
    """
    if not gids:
        return 0
    found = task_views_and_owners(cursor, gids)
    _ordered(cursor)
    cursor.executemany(_INSERT_SQL, [_outbox_row(gid, found.get(gid), None) for gid in gids])
    return len(gids)
