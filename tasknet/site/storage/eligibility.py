"""Which tasks may be sent to a node (LIFECYCLE.md invariant 9): the rule
for one row (:func:`is_dispatchable`), the same rule as SQL
(:data:`DISPATCHABLE_SQL`), the verdict resolver for a legacy row
(:func:`legacy_truly_submitted`), and which legacy rows wait for a node to
claim them (:func:`awaits_claim`, PROTOCOL.md "Ownership").  Pure functions
of a row; no queries.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from tasknet.status import OperationState

# The same rule as is_dispatchable(), as a SQL condition over
# ``gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid``, for
# streamed queries.
# A confirmed submission without an archive URL (resolved "submitted" when
# the upstream's audit named no file) has nothing a node could download: it
# waits, shown 已提交, rather than being sent as a command no node can act on.
# (For a legacy row, a URL is also what legacy_truly_submitted accepts.)
DISPATCHABLE_SQL = "(g.url <> '' AND (o.state = 'SUBMITTED' OR o.gid IS NULL))"


# A legacy row (no generation, or a backfilled one) that shows a node status
# but no recorded node: some node holds (part of) it.  It belongs to the
# first node that reports it (storage/reports.py claims it there) and is
# never assigned by the dispatcher, which would start a second download.
AWAITS_CLAIM_SQL = (
    "(g.node_id IS NULL AND g.status IS NOT NULL AND (o.gid IS NULL OR o.legacy = 1))"
)


def awaits_claim(row: Mapping[str, Any] | sqlite3.Row) -> bool:
    """:data:`AWAITS_CLAIM_SQL` for one row with the keys ``node_id``,
    ``status`` (of ``gallery``), ``state`` and ``legacy`` (of
    ``task_operation``; None without one)."""
    return (
        row["node_id"] is None
        and row["status"] is not None
        and (row["state"] is None or bool(row["legacy"]))
    )


def legacy_truly_submitted(row: Mapping[str, Any] | sqlite3.Row) -> bool:
    """The verdict resolver for a legacy task row (no ``task_operation``).

    The old site wrote ``url`` only from the upstream's answer to the archive
    POST, and a node status only arrives for a task a node received; either
    proves the POST happened.  A row with neither (cost alone proves
    nothing) may be the trace of a failed POST: never dispatched."""
    return bool(row["url"]) or row["status"] is not None


def is_dispatchable(row: Mapping[str, Any] | sqlite3.Row) -> bool:
    """Invariant 9, for one row with the keys ``state`` (``task_operation.state``
    or None when there is no operation row), ``url`` and ``status`` (of
    ``gallery``).  Only ``SUBMITTED``, or a legacy row the resolver judges
    truly submitted.  Any other state (``UNKNOWN``, ``RESERVED``,
    ``SUBMITTING``, ``DELETE_PENDING``, ``DELETED``) is never sent, not even
    as a legacy command without an operationId."""
    if not row["url"]:
        return False  # nothing to download (see DISPATCHABLE_SQL)
    state = row["state"]
    if state is not None:
        return bool(state == OperationState.SUBMITTED.value)
    return legacy_truly_submitted(row)
