"""Which commands go to which node (LIFECYCLE.md invariants 5 and 9).

Reads are paged by gid (``gid > after ORDER BY gid LIMIT n``, on the
``gallery(node_id, gid)`` index) so a node with 100k tasks is never loaded
into memory at once.  Assignment is sticky: once ``gallery.node_id`` is set it
is never changed here.  A task is marked ``dispatched = 1`` in the same
transaction that assigns it, *before* any command is sent: should the send
then fail, the delete path still waits for a node's confirmation, which is
the safe side (invariant 5: only a task never sent anywhere is deleted at
once).

What is sent:

* ``DOWNLOAD`` for a task the eligibility rule
  (:func:`~tasknet.site.storage.eligibility.is_dispatchable`) allows and
  that is not yet ``COMPLETED`` at the site.  A completed task is not resent
  on every login; any other repeat is a no-op at the node (same operationId).
* ``DELETE`` for a ``DELETE_PENDING`` task assigned to the node, unless its
  last attempt failed (删除失败: a user's retry resends it).  A pending
  delete of a task with no known node (a pre-migration row that shows a node
  status but never recorded which node) is sent to no one: it waits until a
  node claims the row by reporting it (then it is that node's delete), or
  for an operator (PROTOCOL.md "Ownership").

Such a legacy row (:func:`~tasknet.site.storage.eligibility.awaits_claim`)
is never assigned here either: some node holds it, and sending it to the
least loaded one would start a second download.

Every function that decides what to send runs inside a write transaction
(:meth:`Database.write`), and the dispatcher sends the commands it returns on
the reactor right after that commit, without yielding.  Writes are
serialised, so a page is decided either wholly before a concurrent
``request_delete`` (its DOWNLOAD reaches the wire before the DELETE does) or
wholly after it (it sees ``DELETE_PENDING`` and sends the DELETE): a
DOWNLOAD never follows the DELETE of its task (LIFECYCLE.md invariant 5,
drill D5).
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from tasknet.protocol.messages import ACTION_DELETE, ACTION_DOWNLOAD
from tasknet.site.storage import node_control
from tasknet.site.storage.eligibility import (
    AWAITS_CLAIM_SQL,
    DISPATCHABLE_SQL,
    awaits_claim,
    is_dispatchable,
)
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.generation import backfill_legacy
from tasknet.status import NodeCode, OperationState

PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class Command:
    """One command for one node; ``operation_id`` is the generation's id for
    ``DOWNLOAD`` and the stable delete id for ``DELETE``; ``size`` the
    archive size learned from ``prepare`` (``gallery.size``; 0 unknown, and
    always 0 for ``DELETE``), which bounds the node's download."""

    node_id: str
    action: str
    gid: int
    operation_id: str
    token: str
    name: str
    url: str
    size: int = 0


#: The columns every command is decided from (a task and its generation);
#: ``storage/reassign.py`` reads its pages with them too.
TASK_COLUMNS = """
SELECT g.gid, g.name, g.token, g.url, g.status, g.progress, g.node_id, g.user_id, g.cost,
       g.created_at, g.updated_at, g.size,
       o.state, o.operation_id, o.delete_operation_id, o.delete_result, o.archive_url,
       o.dispatched, o.legacy
FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid
"""

_COMPLETED = int(NodeCode.COMPLETED)

_NODE_PAGE_SQL = sql(
    TASK_COLUMNS
    + f"""
WHERE g.node_id = ? AND g.gid > ?
  AND (o.state = 'DELETE_PENDING' OR g.status IS NULL OR g.status <> {_COMPLETED})
ORDER BY g.gid LIMIT ?
"""
)

_UNASSIGNED_PAGE_SQL = sql(
    TASK_COLUMNS
    + f"""
WHERE g.node_id IS NULL AND g.gid > ?
  AND {DISPATCHABLE_SQL} AND NOT {AWAITS_CLAIM_SQL}
  AND (g.status IS NULL OR g.status <> {_COMPLETED})
ORDER BY g.gid LIMIT ?
"""
)
_ONE_TASK_SQL = sql(TASK_COLUMNS + " WHERE g.gid = ?")


def _download_ok(row: sqlite3.Row) -> bool:
    return row["status"] != _COMPLETED and is_dispatchable(row)


def _delete_ok(row: sqlite3.Row) -> bool:
    return (
        row["state"] == OperationState.DELETE_PENDING.value
        and row["delete_result"] is None
        and bool(row["delete_operation_id"])
    )


def _url(row: sqlite3.Row) -> str:
    return str(row["url"] or row["archive_url"] or "")


def _size(row: sqlite3.Row) -> int:
    """The archive size from ``prepare``; 0 when unknown (a legacy row, an
    upstream that gave none)."""
    size = row["size"]
    return int(size) if isinstance(size, int) and size > 0 else 0


def _download_generation(cursor: Cursor, row: sqlite3.Row, unmarked: list[int]) -> str:
    """The operationId a DOWNLOAD of ``row`` carries: a pre-migration row
    gets its generation now (born dispatched); a row not yet marked
    dispatched is added to ``unmarked``, for the caller to mark."""
    if row["state"] is None:
        return backfill_legacy(cursor, row["gid"])
    if not row["dispatched"]:
        unmarked.append(row["gid"])
    return str(row["operation_id"])


def _next_after(rows: Sequence[sqlite3.Row], limit: int) -> int | None:
    """Where the next page starts: the last gid of a full page, else None."""
    return int(rows[-1]["gid"]) if len(rows) == limit else None


def _command(node_id: str, row: sqlite3.Row, operation_id: str | None = None) -> Command:
    if row["state"] == OperationState.DELETE_PENDING.value:
        return Command(
            node_id, ACTION_DELETE, row["gid"], row["delete_operation_id"], "", row["name"], ""
        )
    return Command(
        node_id,
        ACTION_DOWNLOAD,
        row["gid"],
        operation_id or row["operation_id"],
        row["token"],
        row["name"],
        _url(row),
        _size(row),
    )


@dataclass(frozen=True)
class Page:
    """One page of commands.  ``last_gid`` is where the next page starts
    (``None``: this was the last page); ``loads`` are the node loads after an
    assignment page (passed on to the next page)."""

    commands: list[Command]
    last_gid: int | None
    loads: dict[str, int] | None = None


def claim_node_page(cursor: Cursor, node_id: str, after_gid: int, limit: int = PAGE_SIZE) -> Page:
    """A write: the next page of commands for the tasks already assigned to
    ``node_id`` (resent on login).  A pre-migration row gets its generation
    and every DOWNLOAD row is marked dispatched in this same transaction, so
    the decision and the marks commit together (see the module doc)."""
    rows = cursor.execute(_NODE_PAGE_SQL, (node_id, after_gid, limit)).fetchall()
    commands = []
    unmarked: list[int] = []
    for row in rows:
        if _delete_ok(row):
            commands.append(_command(node_id, row))
        elif _download_ok(row):
            commands.append(_command(node_id, row, _download_generation(cursor, row, unmarked)))
    _mark_dispatched(cursor, unmarked)
    return Page(commands, _next_after(rows, limit))


#: Nodes whose login pages one transaction of :func:`claim_nodes_pages` reads
#: at most (each an index probe even when it has nothing), so that a storm
#: of logins is a few short transactions the creates interleave with.
NODES_PER_PAGE = 100


def claim_nodes_pages(
    cursor: Cursor, wanted: Sequence[tuple[str, int]], limit: int = PAGE_SIZE
) -> list[Page]:
    """A write: :func:`claim_node_page` for each ``(node_id, after_gid)`` of
    ``wanted`` in turn, in one transaction (a burst of logins), until
    ``limit`` rows were read or :data:`NODES_PER_PAGE` nodes were: one page
    per node reached, in ``wanted``'s order (fewer pages than ``wanted``:
    the rest were not reached).  A node's page that ends before its last
    task (``last_gid`` set) is the last page of the list."""
    pages: list[Page] = []
    budget = limit
    for node_id, after in wanted[:NODES_PER_PAGE]:
        page = claim_node_page(cursor, node_id, after, budget)
        pages.append(page)
        if page.last_gid is not None:
            break
        budget -= len(page.commands)
        if budget <= 0:
            break
    return pages


_PENDING_DELETES_SQL = sql(
    TASK_COLUMNS
    + """
WHERE o.state = 'DELETE_PENDING' AND o.gid > ?
  AND o.delete_result IS NULL AND o.delete_operation_id IS NOT NULL
  AND g.node_id {in_array}
ORDER BY o.gid LIMIT ?
"""
)
_MARK_DISPATCHED_SQL = sql("UPDATE task_operation SET dispatched = 1 WHERE gid {in_array}")
# From schema v9's kept counts (``node_task_count``: a status of NULL is -1).
_COUNT_BY_NODE_SQL = sql(
    "SELECT node_id, SUM(n) FROM node_task_count WHERE node_id {in_array}"
    " AND (? = 0 OR status <> ?) GROUP BY node_id"
)
_ASSIGN_SQL = sql(
    "UPDATE gallery SET node_id = ?, updated_at = {now} WHERE gid = ? AND node_id IS NULL"
)
_FORGET_CANCEL_SQL = sql("DELETE FROM node_cancel WHERE node_id = ? AND operation_id = ?")


def pending_deletes_page(
    cursor: Cursor, node_ids: Sequence[str], after_gid: int, limit: int = PAGE_SIZE
) -> Page:
    """A write (decided under the write lock, like every command): the next
    page of pending deletes for the connected ``node_ids`` (a task with no
    known node waits for a claim: it is in no page)."""
    rows = cursor.execute(_PENDING_DELETES_SQL, (after_gid, list(node_ids), limit)).fetchall()
    commands = [_command(row["node_id"], row) for row in rows if _delete_ok(row)]
    return Page(commands, _next_after(rows, limit))


def _mark_dispatched(cursor: Cursor, gids: Sequence[int]) -> None:
    if gids:
        cursor.execute(_MARK_DISPATCHED_SQL, (list(gids),))


def _count_by_node(cursor: Cursor, node_ids: Sequence[str], *, open_only: bool) -> dict[str, int]:
    """Tasks assigned to each of ``node_ids`` (0 for a node with none);
    ``open_only``: only those not yet completed."""
    counts = dict.fromkeys(node_ids, 0)
    rows = cursor.execute(_COUNT_BY_NODE_SQL, (list(node_ids), int(open_only), _COMPLETED))
    for node_id, count in rows:
        counts[node_id] = int(count)  # PostgreSQL's SUM is a numeric
    return counts


def node_loads(cursor: Cursor, node_ids: Sequence[str]) -> dict[str, int]:
    """Tasks assigned to each node and not yet completed (its load)."""
    return _count_by_node(cursor, node_ids, open_only=True)


def assign(
    cursor: Cursor,
    rows: Sequence[sqlite3.Row],
    node_ids: Sequence[str],
    loads: dict[str, int] | None = None,
) -> tuple[list[Command], dict[str, int]]:
    """Assign ``rows`` (eligible, unassigned; :data:`TASK_COLUMNS`) to the least loaded of
    ``node_ids``, mark them dispatched, and return their commands and the
    loads after it (``loads`` from the previous page, else counted here)."""
    if not rows or not node_ids:
        return [], loads if loads is not None else {}
    if loads is None or set(loads) != set(node_ids):
        loads = node_loads(cursor, node_ids)
    # An operator's drain, pause or limit (node_control), read in this
    # transaction: a node with no room left is given nothing more.
    room = node_control.capacities(cursor, node_ids)
    heap = [(load, node_id) for node_id, load in loads.items() if room.get(node_id) != 0]
    heapq.heapify(heap)
    full = {node_id: load for node_id, load in loads.items() if room.get(node_id) == 0}
    commands = []
    assignments = []
    for row in rows:
        if not heap:
            break  # every node is full: the rest wait, unassigned
        load, node_id = heapq.heappop(heap)
        op = row["operation_id"]
        if row["state"] is None:
            op = backfill_legacy(cursor, row["gid"])
        assignments.append((node_id, row["gid"]))
        commands.append(_command(node_id, row, op))
        left = room.get(node_id)
        if left is not None:
            room[node_id] = left - 1
        if room.get(node_id) == 0:
            full[node_id] = load + 1
        else:
            heapq.heappush(heap, (load + 1, node_id))
    cursor.executemany(_ASSIGN_SQL, assignments)
    _mark_dispatched(cursor, [gid for _, gid in assignments])
    # A generation given back to a node it was once moved off: that node
    # owns it again, so the CANCEL still owed to it (node_cancel) must not go.
    cursor.executemany(
        _FORGET_CANCEL_SQL, [(command.node_id, command.operation_id) for command in commands]
    )
    return commands, {node_id: load for load, node_id in heap} | full


def claim_unassigned_page(
    cursor: Cursor,
    node_ids: Sequence[str],
    after_gid: int,
    limit: int = PAGE_SIZE,
    loads: dict[str, int] | None = None,
) -> Page:
    """Assign the next page of eligible unassigned tasks among the connected
    ``node_ids`` (least loaded first) and return their commands.  Pass the
    previous page's ``loads`` on to the next page (counted once per pass)."""
    rows = cursor.execute(_UNASSIGNED_PAGE_SQL, (after_gid, limit)).fetchall()
    commands, loads = assign(cursor, [r for r in rows if _download_ok(r)], node_ids, loads)
    return Page(commands, _next_after(rows, limit), loads)


def claim_task(
    cursor: Cursor,
    gid: int,
    node_ids: Sequence[str],
    loads: dict[str, int] | None = None,
) -> Command | None:
    """The command for one task that just became ``SUBMITTED`` (or
    ``DELETE_PENDING``): assigned to the least loaded of ``node_ids`` when
    unassigned, else to its sticky node (whether connected or not: the caller
    sends only to a connected one).  ``None`` when nothing is to be sent, as
    for a legacy row waiting for a claim (its download and its delete).
    ``loads`` (of exactly ``node_ids``, the caller's own count) spares the
    count of every node's tasks: the dispatcher passes its least loaded
    node alone, with its load."""
    row = cursor.execute(_ONE_TASK_SQL, (gid,)).fetchone()
    if row is None or awaits_claim(row):
        return None
    if row["node_id"] is not None:
        if _delete_ok(row):
            return _command(row["node_id"], row)
        if not _download_ok(row):
            return None
        unmarked: list[int] = []
        command = _command(row["node_id"], row, _download_generation(cursor, row, unmarked))
        _mark_dispatched(cursor, unmarked)
        return command
    if not _download_ok(row):
        # Also a pending delete without a node (request_delete completes at
        # once what no node can hold): it waits for a claim or an operator.
        return None
    commands, _ = assign(cursor, [row], node_ids, loads)
    return commands[0] if commands else None
