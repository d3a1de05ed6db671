"""The read side of the notification outbox (its write side is
:mod:`tasknet.site.storage.outbox`).

The outbox executor reads committed rows in id order (one writer: ids grow in
commit order), fans them out, then marks them here.  A row is finished when
``ws_delivered_at`` is set and ``webhook_state`` is no longer ``pending``;
finished rows older than the retention are pruned (:func:`prunable` and
:func:`prune_finished`), a small batch per transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from tasknet.site.storage.dialect import NOW_OFFSET_SQL, NOW_SQL, offset

WEBHOOK_PENDING = "pending"
WEBHOOK_DELIVERED = "delivered"
WEBHOOK_SKIPPED = "skipped"
WEBHOOK_FAILED = "failed"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    gid: int
    user_id: int | None
    payload: str
    ws_pending: bool
    webhook_pending: bool
    webhook_attempts: int


@dataclass(frozen=True, slots=True)
class WebhookResult:
    """One delivery attempt's outcome for row ``id``: ``state`` is
    ``delivered``, ``failed`` (gave up) or ``pending`` (will retry)."""

    id: int
    state: str
    attempts: int
    error: str | None


_ROW_SQL = (
    "SELECT id, gid, user_id, payload, ws_delivered_at IS NULL, webhook_state = 'pending',"
    " webhook_attempts FROM notification_outbox"
)


def _rows(cursor: sqlite3.Cursor, sql: str, args: tuple[int, int]) -> list[OutboxRow]:
    return [
        OutboxRow(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[5]), r[6])
        for r in cursor.execute(sql, args)
    ]


def fanout_rows(cursor: sqlite3.Cursor, after_id: int, limit: int) -> list[OutboxRow]:
    """Rows after ``after_id`` (id order) not yet pushed to WebSocket clients."""
    return _rows(
        cursor,
        _ROW_SQL + " WHERE id > ? AND ws_delivered_at IS NULL ORDER BY id LIMIT ?",
        (after_id, limit),
    )


def webhook_rows(cursor: sqlite3.Cursor, after_id: int, limit: int) -> list[OutboxRow]:
    """Rows after ``after_id`` (id order) whose webhook delivery is pending:
    the webhook sender holds a bounded number of rows and reads the next
    ones from here when it has room."""
    return _rows(
        cursor,
        _ROW_SQL + " WHERE id > ? AND webhook_state = 'pending' ORDER BY id LIMIT ?",
        (after_id, limit),
    )


def last_id(cursor: sqlite3.Cursor) -> int:
    """The id of the newest outbox row (0 when empty)."""
    row = cursor.execute("SELECT COALESCE(MAX(id), 0) FROM notification_outbox").fetchone()
    return int(row[0])


def mark_range_fanned_out(
    cursor: sqlite3.Cursor, after_id: int, upto_id: int, *, skip_webhook: bool
) -> None:
    """The rows ``after_id < id <= upto_id`` were pushed to the connected
    WebSocket clients.  A range, not an id list: the executor hands rows over
    in id order.

    With no ``--webhook`` configured (``skip_webhook``) nothing else will
    ever read them, so they are deleted: a site without a webhook keeps only
    the rows it has not fanned out yet (a refused create leaves nothing
    behind).  With a webhook they are marked ``ws_delivered_at`` and stay
    until their webhook delivery is finished and the retention has passed."""
    if skip_webhook:
        # Rows a previous run with a webhook left pending go too: this run
        # has nowhere to send them (they used to be marked "skipped").
        cursor.execute(
            "DELETE FROM notification_outbox WHERE id > ? AND id <= ?", (after_id, upto_id)
        )
        return
    cursor.execute(
        f"UPDATE notification_outbox SET ws_delivered_at = {NOW_SQL}"  # noqa: S608
        " WHERE id > ? AND id <= ? AND ws_delivered_at IS NULL",
        (after_id, upto_id),
    )


def record_webhook_results(cursor: sqlite3.Cursor, results: Sequence[WebhookResult]) -> None:
    """Store webhook attempts (several at once: one transaction per flush)."""
    cursor.executemany(
        "UPDATE notification_outbox SET webhook_state = ?, webhook_attempts = ?,"
        " webhook_error = ? WHERE id = ?",
        [(r.state, r.attempts, r.error, r.id) for r in results],
    )


def backlog(cursor: sqlite3.Cursor) -> int:
    """Rows not yet fully delivered."""
    row = cursor.execute(
        "SELECT COUNT(*) FROM notification_outbox"
        " WHERE ws_delivered_at IS NULL OR webhook_state = 'pending'"
    ).fetchone()
    return int(row[0])


@dataclass(frozen=True, slots=True)
class Prunable:
    """Finished rows that may be pruned lie in ``first <= id < below``
    (``first`` is None: there are none)."""

    first: int | None
    below: int


def prunable(cursor: sqlite3.Cursor, retention_seconds: float) -> Prunable:
    """Where the finished rows created more than ``retention_seconds`` ago lie.

    ``below`` is the first row created within the retention: ids grow in
    commit order, so every row before it is older (even if the clock jumped:
    rows are taken in id order and the first young one ends the range).  The
    scan reads only the old rows, in id order, and no index is needed.
    """
    below = cursor.execute(
        "SELECT COALESCE((SELECT id FROM notification_outbox"  # noqa: S608
        f"  WHERE created_at >= {NOW_OFFSET_SQL} ORDER BY id LIMIT 1),"
        " (SELECT COALESCE(MAX(id), 0) + 1 FROM notification_outbox))",
        (offset(-retention_seconds),),
    ).fetchone()[0]
    first = cursor.execute(
        "SELECT MIN(id) FROM notification_outbox"
        " WHERE id < ? AND ws_delivered_at IS NOT NULL AND webhook_state <> 'pending'",
        (below,),
    ).fetchone()[0]
    return Prunable(None if first is None else int(first), int(below))


def prune_finished(
    cursor: sqlite3.Cursor, after_id: int, below_id: int, limit: int
) -> tuple[int, int]:
    """Delete up to ``limit`` finished rows with ``after_id < id < below_id``,
    oldest first.  Returns (rows deleted, the id to continue after)."""
    ids = cursor.execute(
        "SELECT id FROM notification_outbox WHERE id > ? AND id < ?"
        " AND ws_delivered_at IS NOT NULL AND webhook_state <> 'pending' ORDER BY id LIMIT ?",
        (after_id, below_id, limit),
    ).fetchall()
    if not ids:
        return 0, after_id
    first, last = int(ids[0][0]), int(ids[-1][0])
    # The same condition over the range: exactly the rows just selected
    # (nothing changes between the two statements of one transaction).
    cursor.execute(
        "DELETE FROM notification_outbox WHERE id >= ? AND id <= ?"
        " AND ws_delivered_at IS NOT NULL AND webhook_state <> 'pending'",
        (first, last),
    )
    return cursor.rowcount, last
