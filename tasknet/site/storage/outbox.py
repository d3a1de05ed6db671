"""The write side of the notification outbox (LIFECYCLE.md invariant 8).

A change a user can see is announced by a ``notification_outbox`` row written
in the same transaction as the change, so a notification exists exactly when
the change was committed.  The outbox executor (``tasknet.site.outbox``)
delivers rows after commit, off the commit path; its read side is
``tasknet.site.storage.outbox``.

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
(delivered at commit: every site wakes its tail); it is PostgreSQL's only
(:func:`~tasknet.site.storage.engine.sql.postgres_only`), a no-op on
SQLite.  The lock is held from the
insert, near a transaction's end, to its commit; a transaction holding it
that waits for a row lock of another one that then asks for it is a
deadlock, which PostgreSQL breaks and the database layer retries.  SQLite
has one writer: its ids are in commit order already, and nothing is sent.

The read side (delivery).  The outbox executor reads committed rows in id
order (ids become visible in id order: SQLite has one writer, and on
PostgreSQL the outbox lock above orders them), fans them out, then marks
them here.  A row is finished when ``ws_delivered_at`` is set and
``webhook_state`` is no longer ``pending``; finished rows older than the
retention are pruned (:func:`prunable` and :func:`prune_finished`), a small
batch per transaction.

Several sites on one PostgreSQL database (SCALE.md 6; the executor's
*shared* mode, for a site with an instance id) change two things:

* WebSocket: every site tails every row for its own clients, so no site
  may mark or delete a row for the others.  Each instance keeps how far its
  tail has read in ``outbox_reader`` (:func:`join_readers` at start,
  :func:`mark_read`, :func:`leave_readers` at a clean stop); a row counts
  as fanned out (``ws_delivered_at``; deleted, without a webhook) once the
  tail of every *open* instance (``site_instance``: neither ended nor
  reaped) has passed it.  A dead instance holds that back until it is
  reaped, never longer.
* Webhook: a row is delivered by one site.  A site claims pending rows
  (:func:`claim_webhook_rows`: ``FOR UPDATE SKIP LOCKED``, so two sites
  claiming at once take different rows; ``{skip_locked}``, nothing on
  SQLite) with a lease
  (``webhook_claimed_by``/``webhook_claimed_until``) that it renews while
  it holds them (:func:`renew_webhook_claims`) and gives back at a clean stop
  (:func:`release_webhook_claims`).  Rows of a site that died are claimed
  again once its lease ran out, or at once when the reaper releases them
  (:func:`release_outbox_of`): at-least-once across a crash, once otherwise.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import orjson

from tasknet.json_types import JsonValue
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.sql import Sql, offset, postgres_only, sql
from tasknet.site.storage.engine.transactions import Cursor, read_committed
from tasknet.site.storage.lease import OUTBOX_PRUNE_JOB, once
from tasknet.site.storage.views import TaskView, gone_view, task_views_and_owners

_INSERT = (
    "INSERT INTO notification_outbox (gid, user_id, payload, created_at) VALUES (?, ?, ?, {now})"
)
_INSERT_SQL = sql(_INSERT)
_INSERT_ONE_SQL = sql(_INSERT + " RETURNING id")

#: The advisory lock (single 64-bit key space) that orders outbox ids on
#: PostgreSQL (see the module doc): "tn-outbx".
OUTBOX_LOCK_KEY = int.from_bytes(b"tn-outbx", "big")

# Before inserting outbox rows: take the outbox lock and announce the rows
# at commit (PostgreSQL; re-taking it in one transaction is cheap).
_ORDERED_SQL = postgres_only(
    f"SELECT pg_advisory_xact_lock({OUTBOX_LOCK_KEY}), pg_notify('{listen.OUTBOX}', '')"
)


# One encoder for every payload: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


class TaskEvent(TypedDict):
    """The payload of a task change's outbox row."""

    type: str
    task: TaskView


def _payload(obj: TaskEvent) -> str:
    """Compact JSON of ``obj``: orjson (a report's views are a tenth of the
    writer's time with json), json where orjson refuses (an int beyond 64 bits,
    a lone surrogate).  The text may spell a float differently (0.00001 for
    1e-05): a JSON reader sees the same value."""
    try:
        return orjson.dumps(obj).decode("utf-8")
    except TypeError:
        return _ENCODER.encode(obj)


def _outbox_row(
    gid: int, found: tuple[TaskView | None, int | None] | None, user_id: int | None
) -> tuple[int, int | None, str]:
    view, owner = found if found is not None else (None, None)
    if view is None:
        view = gone_view(gid)
    if owner is None:
        owner = user_id
    return gid, owner, _payload({"type": "task", "task": view})


def enqueue_task_change(cursor: Cursor, gid: int, *, user_id: int | None = None) -> int:
    """Record ``{"type": "task", "task": <view>}`` for ``gid`` as it stands
    now in this transaction; return the outbox row id.

    Call it after the change, inside the transaction that made it.  When the
    task's rows are already gone (released, resolved "not submitted"), the view
    is :func:`~tasknet.site.storage.views.gone_view` (``status`` null: clients drop the task) and
    ``user_id`` names the owner who should hear of it.
    """
    found = task_views_and_owners(cursor, (gid,)).get(gid)
    cursor.execute(_ORDERED_SQL)
    row = cursor.execute(_INSERT_ONE_SQL, _outbox_row(gid, found, user_id)).fetchone()
    return int(row[0])


def enqueue_task_changes(cursor: Cursor, gids: Sequence[int]) -> int:
    """:func:`enqueue_task_change` for each of ``gids``, in that order, with
    one view query and one insert statement; return the number of rows.

    Every view is read after all the changes: call it once the transaction
    has made every change it announces (a gid listed twice gets two rows
    showing the same, final view).
    """
    if not gids:
        return 0
    found = task_views_and_owners(cursor, gids)
    cursor.execute(_ORDERED_SQL)
    cursor.executemany(_INSERT_SQL, [_outbox_row(gid, found.get(gid), None) for gid in gids])
    return len(gids)


_LAST_PAYLOAD_SQL = sql(
    "SELECT payload FROM notification_outbox WHERE gid = ? ORDER BY id DESC LIMIT 1"
)
#: The fields of a task's view that change without the task changing.
_VOLATILE = ("updatedAt", "createdAt")


def _announced(payload: str) -> dict[str, JsonValue]:
    task: dict[str, JsonValue] = json.loads(payload).get("task") or {}
    return {k: v for k, v in task.items() if k not in _VOLATILE}


def enqueue_visible_task_changes(cursor: Cursor, gids: Sequence[int]) -> int:
    """:func:`enqueue_task_changes` for those of ``gids`` whose view differs
    from the last one announced for them: a change the notifications never
    showed (a dispatch is not announced) undone is no change to announce
    (DRILLS.md D7: no notification repeats the one before)."""
    found = task_views_and_owners(cursor, gids)
    changed = []
    for gid in gids:
        last = cursor.execute(_LAST_PAYLOAD_SQL, (gid,)).fetchone()
        payload = _outbox_row(gid, found.get(gid), None)[2]
        if last is None or _announced(str(last[0])) != _announced(payload):
            changed.append(gid)
    return enqueue_task_changes(cursor, changed)


# -- The read side (delivery) --------------------


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
_FANOUT_SQL = sql(_ROW_SQL + " WHERE id > ? AND ws_delivered_at IS NULL ORDER BY id LIMIT ?")
_ROWS_AFTER_SQL = sql(_ROW_SQL + " WHERE id > ? ORDER BY id LIMIT ?")
_WEBHOOK_ROWS_SQL = sql(
    _ROW_SQL + " WHERE id > ? AND webhook_state = 'pending' ORDER BY id LIMIT ?"
)
_LAST_ID_SQL = sql("SELECT COALESCE(MAX(id), 0) FROM notification_outbox")
_DELETE_RANGE_SQL = sql("DELETE FROM notification_outbox WHERE id > ? AND id <= ?")
_MARK_RANGE_SQL = sql(
    "UPDATE notification_outbox SET ws_delivered_at = {now}"
    " WHERE id > ? AND id <= ? AND ws_delivered_at IS NULL"
)
_WEBHOOK_RESULT_SQL = sql(
    "UPDATE notification_outbox SET webhook_state = ?, webhook_attempts = ?,"
    " webhook_error = ? WHERE id = ? AND webhook_state = 'pending'"
)
_BACKLOG_SQL = sql(
    "SELECT COUNT(*) FROM notification_outbox"
    " WHERE ws_delivered_at IS NULL OR webhook_state = 'pending'"
)
_FIRST_YOUNG_SQL = sql(
    "SELECT COALESCE((SELECT id FROM notification_outbox"
    "  WHERE created_at >= {now_offset} ORDER BY id LIMIT 1),"
    " (SELECT COALESCE(MAX(id), 0) + 1 FROM notification_outbox))"
)
_FIRST_FINISHED_SQL = sql(
    "SELECT MIN(id) FROM notification_outbox"
    " WHERE id < ? AND ws_delivered_at IS NOT NULL AND webhook_state <> 'pending'"
)
_FINISHED_SQL = sql(
    "SELECT id FROM notification_outbox WHERE id > ? AND id < ?"
    " AND ws_delivered_at IS NOT NULL AND webhook_state <> 'pending' ORDER BY id LIMIT ?"
)
_PRUNE_SQL = sql(
    "DELETE FROM notification_outbox WHERE id >= ? AND id <= ?"
    " AND ws_delivered_at IS NOT NULL AND webhook_state <> 'pending'"
)


def _row(r: sqlite3.Row) -> OutboxRow:
    return OutboxRow(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[5]), r[6])


def _rows(cursor: Cursor, statement: Sql, args: tuple[int, int]) -> list[OutboxRow]:
    return [_row(r) for r in cursor.execute(statement, args)]


def fanout_rows(cursor: Cursor, after_id: int, limit: int) -> list[OutboxRow]:
    """Rows after ``after_id`` (id order) not yet pushed to WebSocket clients."""
    return _rows(cursor, _FANOUT_SQL, (after_id, limit))


def rows_after(cursor: Cursor, after_id: int, limit: int) -> list[OutboxRow]:
    """Rows after ``after_id`` (id order), whatever their marks: a site's
    own tail in shared mode (another site's marks say nothing of its clients)."""
    return _rows(cursor, _ROWS_AFTER_SQL, (after_id, limit))


def webhook_rows(cursor: Cursor, after_id: int, limit: int) -> list[OutboxRow]:
    """Rows after ``after_id`` (id order) whose webhook delivery is pending:
    the webhook sender holds a bounded number of rows and reads the next
    ones from here when it has room."""
    return _rows(cursor, _WEBHOOK_ROWS_SQL, (after_id, limit))


def last_id(cursor: Cursor) -> int:
    """The id of the newest outbox row (0 when empty)."""
    row = cursor.execute(_LAST_ID_SQL).fetchone()
    return int(row[0])


# The marks below decide nothing from what another site may change under
# them (a range or ids, and the readers' positions, which only move
# forward: a stale one marks less), so they run at READ COMMITTED on
# PostgreSQL (engine/transactions.py, "Isolation") and never conflict.
@read_committed
def mark_range_fanned_out(
    cursor: Cursor, after_id: int, upto_id: int, *, skip_webhook: bool
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
        cursor.execute(_DELETE_RANGE_SQL, (after_id, upto_id))
        return
    cursor.execute(_MARK_RANGE_SQL, (after_id, upto_id))


@read_committed
def record_webhook_results(cursor: Cursor, results: Sequence[WebhookResult]) -> None:
    """Store webhook attempts (several at once: one transaction per flush).
    Only a pending row changes: a delivery finished once stays finished."""
    cursor.executemany(
        _WEBHOOK_RESULT_SQL,
        [(r.state, r.attempts, r.error, r.id) for r in results],
    )


def backlog(cursor: Cursor) -> int:
    """Rows not yet fully delivered."""
    row = cursor.execute(_BACKLOG_SQL).fetchone()
    return int(row[0])


@dataclass(frozen=True, slots=True)
class Prunable:
    """Finished rows that may be pruned lie in ``first <= id < below``
    (``first`` is None: there are none)."""

    first: int | None
    below: int


def prunable(cursor: Cursor, retention_seconds: float) -> Prunable:
    """Where the finished rows created more than ``retention_seconds`` ago lie.

    ``below`` is the first row created within the retention: ids grow in
    commit order, so every row before it is older (even if the clock jumped:
    rows are taken in id order and the first young one ends the range).  The
    scan reads only the old rows, in id order, and no index is needed.
    """
    below = cursor.execute(_FIRST_YOUNG_SQL, (offset(-retention_seconds),)).fetchone()[0]
    first = cursor.execute(_FIRST_FINISHED_SQL, (below,)).fetchone()[0]
    return Prunable(None if first is None else int(first), int(below))


def prune_finished(cursor: Cursor, after_id: int, below_id: int, limit: int) -> tuple[int, int]:
    """Delete up to ``limit`` finished rows with ``after_id < id < below_id``,
    oldest first.  Returns (rows deleted, the id to continue after); on a
    shared database only one site prunes at a time (another one pruning
    right now: nothing done, ``(0, after_id)``)."""
    if not once(cursor, OUTBOX_PRUNE_JOB):
        return 0, after_id
    ids = cursor.execute(_FINISHED_SQL, (after_id, below_id, limit)).fetchall()
    if not ids:
        return 0, after_id
    first, last = int(ids[0][0]), int(ids[-1][0])
    # The same condition over the range: exactly the rows just selected
    # (nothing changes between the two statements of one transaction).
    cursor.execute(_PRUNE_SQL, (first, last))
    return cursor.rowcount, last


# -- several sites: the WebSocket tails -------------------------------------------------

#: The advisory lock (single 64-bit key space) the readers' marks take in
#: turn on PostgreSQL (:func:`mark_read`): "tn-marks".
MARKS_LOCK_KEY = int.from_bytes(b"tn-marks", "big")

_MARKS_IN_TURN_SQL = postgres_only(f"SELECT pg_advisory_xact_lock({MARKS_LOCK_KEY})")
_OPEN_READERS = sql(
    "SELECT MIN(after_id) FROM outbox_reader WHERE instance_id IN"
    " (SELECT id FROM site_instance WHERE ended_at IS NULL AND reaped_at IS NULL)"
)
_READ_UPTO_SQL = sql(
    "INSERT INTO outbox_reader (instance_id, after_id, updated_at) VALUES (?, ?, {now})"
    " ON CONFLICT (instance_id) DO UPDATE SET after_id = excluded.after_id,"
    " updated_at = {now}"
)
_DELETE_UPTO_SQL = sql("DELETE FROM notification_outbox WHERE id <= ?")
_MARK_UPTO_SQL = sql(
    "UPDATE notification_outbox SET ws_delivered_at = {now}"
    " WHERE ws_delivered_at IS NULL AND id <= ?"
)
_LEAVE_SQL = sql("DELETE FROM outbox_reader WHERE instance_id = ?")


@read_committed
def join_readers(cursor: Cursor, instance_id: int) -> int:
    """Instance ``instance_id`` starts tailing the outbox from its newest
    row (what was committed before has no client of this site to reach:
    they load the current state when they connect); returns that id.
    Under the marks' lock (:func:`mark_read`): no site's mark can then
    delete a row after that id before this one's position is counted."""
    cursor.execute(_MARKS_IN_TURN_SQL)
    last = last_id(cursor)
    cursor.execute(_READ_UPTO_SQL, (instance_id, last))
    return last


@read_committed
def mark_read(cursor: Cursor, instance_id: int, upto_id: int, *, skip_webhook: bool) -> int:
    """Instance ``instance_id``'s tail has pushed every row up to
    ``upto_id`` to its clients.  Rows every open instance's tail has passed
    are fanned out: marked ``ws_delivered_at``, or, with no webhook
    (``skip_webhook``, as :func:`mark_range_fanned_out`), deleted.  Returns
    the id up to which rows are fanned out everywhere.

    At ``READ COMMITTED`` two sites marking at once would each read the
    other's position from before the other's mark, and the rows both have
    passed would stay until the next mark.  So the marks of all sites take
    turns (the advisory lock :data:`MARKS_LOCK_KEY`, first): each statement
    after it sees the marks committed before."""
    cursor.execute(_MARKS_IN_TURN_SQL)
    cursor.execute(_READ_UPTO_SQL, (instance_id, upto_id))
    everywhere = cursor.execute(_OPEN_READERS).fetchone()[0]
    # Our own row is counted only if our instance is open; if it is not
    # (reaped), nothing is ours to mark.
    if everywhere is None:
        return 0
    everywhere = min(int(everywhere), upto_id)
    if skip_webhook:
        cursor.execute(_DELETE_UPTO_SQL, (everywhere,))
    else:
        cursor.execute(_MARK_UPTO_SQL, (everywhere,))
    return everywhere


def leave_readers(cursor: Cursor, instance_id: int) -> None:
    """Instance ``instance_id`` stops tailing (a clean stop): it no longer
    holds back the fan-out marks of the others."""
    cursor.execute(_LEAVE_SQL, (instance_id,))


# -- several sites: webhook claims ------------------------------------------------------

#: Seconds a claim lasts unless renewed; renewed every third of it.
WEBHOOK_LEASE = 30.0

_CLAIMABLE = (
    "webhook_state = 'pending' AND (webhook_claimed_until IS NULL OR webhook_claimed_until < {now})"
)
_ANY_CLAIMABLE_SQL = sql(f"SELECT 1 FROM notification_outbox WHERE {_CLAIMABLE} LIMIT 1")  # noqa: S608
_CLAIM_SQL = sql(
    "UPDATE notification_outbox SET webhook_claimed_by = ?,"  # noqa: S608
    " webhook_claimed_until = {now_offset}"
    " WHERE id IN (SELECT id FROM notification_outbox"
    f" WHERE {_CLAIMABLE} ORDER BY id LIMIT ? {{skip_locked}})"
    " RETURNING id, gid, user_id, payload, ws_delivered_at IS NULL,"
    " webhook_state = 'pending', webhook_attempts"
)
_RENEW_SQL = sql(
    "UPDATE notification_outbox SET webhook_claimed_until = {now_offset}"
    " WHERE webhook_claimed_by = ? AND webhook_state = 'pending' AND id {in_array}"
    " RETURNING id"
)
_RELEASE_CLAIMS_SQL = sql(
    "UPDATE notification_outbox SET webhook_claimed_by = NULL, webhook_claimed_until = NULL"
    " WHERE webhook_claimed_by = ? AND webhook_state = 'pending'"
)


def claimable_webhook_rows(cursor: Cursor) -> bool:
    """Whether any pending row is claimable now (a read before the write
    of :func:`claim_webhook_rows`, so that an idle wake costs no write)."""
    found = cursor.execute(_ANY_CLAIMABLE_SQL).fetchone()
    return found is not None


@read_committed
def claim_webhook_rows(
    cursor: Cursor, instance_id: int, limit: int, lease_seconds: float = WEBHOOK_LEASE
) -> list[OutboxRow]:
    """Claim up to ``limit`` pending rows nobody holds (oldest first) for
    ``instance_id``'s webhook sender, for ``lease_seconds``.  On PostgreSQL
    the rows are locked ``FOR UPDATE SKIP LOCKED``: a site claiming at the
    same moment takes others, and never waits.  ``READ COMMITTED`` is the
    queue's usual isolation: a row whose lock is taken is judged again on
    its newest version (a claim committed meanwhile excludes it)."""
    rows = cursor.execute(_CLAIM_SQL, (instance_id, offset(lease_seconds), limit)).fetchall()
    return sorted((_row(r) for r in rows), key=lambda row: row.id)


def renew_webhook_claims(
    cursor: Cursor,
    instance_id: int,
    ids: Sequence[int],
    lease_seconds: float = WEBHOOK_LEASE,
) -> list[int]:
    """Extend ``instance_id``'s claims on the rows ``ids`` it still holds;
    returns those it no longer has (another site claimed them after the
    lease ran out: it must not deliver them)."""
    if not ids:
        return []
    kept = cursor.execute(_RENEW_SQL, (offset(lease_seconds), instance_id, list(ids))).fetchall()
    return sorted(set(ids) - {int(r[0]) for r in kept})


def release_webhook_claims(cursor: Cursor, instance_id: int) -> int:
    """Give back every pending row ``instance_id`` holds (a clean stop: the
    other sites take them at once, not after the lease)."""
    cursor.execute(_RELEASE_CLAIMS_SQL, (instance_id,))
    return cursor.rowcount


def release_outbox_of(cursor: Cursor, instance_id: int) -> int:
    """Instance ``instance_id`` is gone (the reaper's call): its tail no
    longer holds the marks back, and its webhook claims are free.  Returns
    the number of claims released."""
    leave_readers(cursor, instance_id)
    return release_webhook_claims(cursor, instance_id)
