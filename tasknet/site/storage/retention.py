"""Pruning the tables that grow with traffic (docs/operations.md "Retention
and limits"): node report receipts and audit rows (reconciliation verdicts,
forced deletes).  The
outbox has its own (:mod:`tasknet.site.storage.outbox`).

Each function is the body of one transaction; the housekeeping job
(:mod:`tasknet.site.housekeeping`) runs them in small batches on the site's
clock, so a prune never holds the writer the reports need for long.

Receipts (``report_receipt``) answer a node's redelivery ``DUPLICATE``.  A
node redelivers only its one in-flight report, and only until it gets the
ACK, so a receipt is needed while its report may still be in flight.  A
receipt may go once it is older than the retention **and** is not its node's
newest: the newest receipt of every node is kept whatever its age (a node
that was away for months and comes back with its last report unACKed is
still answered ``DUPLICATE``); an older one stands for a report the node has
since been ACKed for, since a node sends its next report only after the
ACK of the previous one.

Several sites on one database prune one at a time (SCALE.md 7): each prune
transaction first takes the once-only lock of the job
(:func:`tasknet.site.storage.lease.once`); a site that finds it taken skips
(``None``), and two prunes racing anyway delete each row once.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.lease import PRUNE_JOB, once

# Receipts are paged by their key ``id``, which grows in insert order
# (SQLite's INTEGER PRIMARY KEY, PostgreSQL's identity).
_FIRST_YOUNG = sql(
    "SELECT COALESCE((SELECT id FROM report_receipt WHERE received_at >= ?"
    " ORDER BY id LIMIT 1), (SELECT COALESCE(MAX(id), 0) + 1 FROM report_receipt))"
)
_NEWEST_OLD = sql("SELECT MAX(id) FROM report_receipt WHERE id < ? GROUP BY node_id")
_RECEIPTS = sql("SELECT id FROM report_receipt WHERE id > ? AND id < ? ORDER BY id LIMIT ?")
_PRUNE_RECEIPT = sql("DELETE FROM report_receipt WHERE id = ?")


@dataclass(frozen=True, slots=True)
class PrunableReceipts:
    """Receipts received before the cutoff lie below id ``below``;
    ``keep`` are the newest of each node among them (never pruned here)."""

    below: int
    keep: frozenset[int]


def prunable_receipts(cursor: Cursor, cutoff: str) -> PrunableReceipts:
    """Where the receipts received before ``cutoff`` (a stored-format UTC
    timestamp) lie.  Ids grow in insert order, so every receipt before the
    first young one is old; the scan reads only the old ones."""
    below = cursor.execute(_FIRST_YOUNG, (cutoff,)).fetchone()[0]
    # The newest old receipt of each node.  For a node with younger
    # receipts this keeps one row past the retention (until those age):
    # at most one per node, and it spares a scan of the young receipts.
    keep = cursor.execute(_NEWEST_OLD, (below,)).fetchall()
    return PrunableReceipts(int(below), frozenset(int(r[0]) for r in keep))


def prune_receipts(
    cursor: Cursor, after: int, below: int, keep: frozenset[int], limit: int
) -> tuple[int, int] | None:
    """Delete up to ``limit`` receipts with ``after < id < below`` that
    are not in ``keep``, oldest first.  Returns (deleted, the id to
    continue after; ``below`` when the range is done), or ``None`` when
    another site is pruning right now (nothing done)."""
    if not once(cursor, PRUNE_JOB):
        return None
    ids = [int(r[0]) for r in cursor.execute(_RECEIPTS, (after, below, limit))]
    if not ids:
        return 0, below
    doomed = [(receipt,) for receipt in ids if receipt not in keep]
    cursor.executemany(_PRUNE_RECEIPT, doomed)
    return len(doomed), ids[-1] if len(ids) == limit else below


#: The audit tables and the column saying when each row was written.
AUDIT_TABLES = (("reconciliation_audit", "resolved_at"), ("force_delete_audit", "forced_at"))
# Table and column names are ours (AUDIT_TABLES), never input.
_PRUNE_AUDIT = [
    sql(
        f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table}"  # noqa: S608
        f" WHERE {written_at} < ? ORDER BY id LIMIT ?)"
    )
    for table, written_at in AUDIT_TABLES
]


def prune_audit(cursor: Cursor, cutoff: str, limit: int) -> int | None:
    """Delete up to ``limit`` audit rows (reconciliation verdicts, forced
    deletes) written before ``cutoff``, oldest first, table by table;
    returns how many (``None``: another site is pruning right now)."""
    if not once(cursor, PRUNE_JOB):
        return None
    deleted = 0
    for prune in _PRUNE_AUDIT:
        if deleted >= limit:
            break
        cursor.execute(prune, (cutoff, limit - deleted))
        deleted += int(cursor.rowcount)
    return deleted
