"""A node that is gone (DELIVERY.md "Custody: the site knows what each node
holds", "A node that is gone"): its unfinished tasks move to another node,
and a retired node gives up everything it held.

*Unfinished* is a ``SUBMITTED`` generation (or a legacy row the dispatcher
would send) whose task the node has not completed (status not 4) and whose
archive is not gone.  Moving one keeps its generation: the same operationId,
so no second POST and no second charge upstream; only the download is done
again, by the new node.  In the transaction that moves it:

* its ownership moves: ``gallery.node_id`` (the column every report's owner
  check reads, ``storage/reports.py``) names the new node, or nobody (the
  task waits for a node; the dispatcher's unassigned pass sends it, at this
  site or any other); from its commit the old node's reports about it are
  dropped ``not_owner``;
* what the old node had reported is forgotten: status, progress, queued,
  detail, and the generation's ``last_revision`` (the new node's revisions
  are its own);
* ``dispatched`` says whether a node was given it (1) or not yet (0: a
  delete of it then completes at once; the old node's files go by the
  CANCEL below);
* a ``node_cancel`` row owes the old node a ``CANCEL`` of that generation,
  sent when it next logs in (``dispatcher.py``), settled by its
  ``CANCELLED`` release (``storage/custody.py``).  A legacy node cannot be
  cancelled: its row waits for a v2 login (its files stay until then);
* the change goes to the outbox like every task change, unless the task
  reads as it was last announced (a dispatch is not announced: a task
  moved before its node reported anything, to nobody, is unchanged).

Each function is the body of one transaction (``fn(cursor, ...)``), run at
the engine's default isolation (serializable: a report that changed one of
these tasks meanwhile makes it run again).  As every other writer of a
reportable task, it writes ``task_operation`` before ``gallery``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tasknet.site.storage import custody, dispatch, outbox, users
from tasknet.site.storage.eligibility import DISPATCHABLE_SQL
from tasknet.site.storage.engine.sources import now_of
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.generation import backfill_legacy
from tasknet.status import NodeCode

_COMPLETED = int(NodeCode.COMPLETED)

#: What :func:`reassign_node` moves of a node (over ``gallery AS g LEFT JOIN
#: task_operation AS o``): unfinished, sendable, not gone.
_UNFINISHED_SQL = (
    f"g.node_id = ? AND {DISPATCHABLE_SQL}"
    f" AND (g.status IS NULL OR g.status <> {_COMPLETED}) AND g.archive_gone_reason IS NULL"
)

# A node_session row whose holder may still be alive (node_sessions._LIVE_SQL).
_LIVE_SQL = (
    "s.connected_at IS NOT NULL AND (s.instance_id IS NULL OR s.instance_id IN"
    " (SELECT id FROM site_instance WHERE ended_at IS NULL AND reaped_at IS NULL))"
)

# Nodes with an open task by the kept counts (schema v9), then the exact
# rule for each of those few (an index range of gallery_node).
_STRANDED_SQL = sql(
    "SELECT c.node_id, s.epoch FROM (SELECT DISTINCT node_id FROM node_task_count"  # noqa: S608
    f" WHERE status <> {_COMPLETED} AND n > 0) AS c"
    " LEFT JOIN node_session AS s ON s.node_id = c.node_id"
    f" WHERE s.node_id IS NULL OR NOT ({_LIVE_SQL}) ORDER BY c.node_id"
)
_HAS_UNFINISHED_SQL = sql(
    "SELECT 1 FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid"  # noqa: S608
    f" WHERE {_UNFINISHED_SQL} LIMIT 1"
)
_SESSION_SQL = sql(
    f"SELECT s.epoch, CASE WHEN {_LIVE_SQL} THEN 1 ELSE 0 END AS live"  # noqa: S608
    " FROM node_session AS s WHERE s.node_id = ?"
)
_LEGACY_ROWS_SQL = sql(
    "SELECT g.gid FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid"  # noqa: S608
    f" WHERE {_UNFINISHED_SQL} AND o.gid IS NULL ORDER BY g.gid"
)
_PAGE_SQL = sql(dispatch.TASK_COLUMNS + f" WHERE {_UNFINISHED_SQL} ORDER BY g.gid")
_FORGET_OPERATION_SQL = sql(
    "UPDATE task_operation SET last_revision = NULL, dispatched = 0, updated_at = {now}"
    " WHERE gid = ?"
)
_RELEASE_TASK_SQL = sql(
    "UPDATE gallery SET node_id = NULL, status = NULL, progress = 0, queued = 0, detail = NULL,"
    " updated_at = {now} WHERE gid = ? AND node_id = ?"
)
_OWE_CANCEL_SQL = sql(
    "INSERT INTO node_cancel (node_id, gid, operation_id, queued_at) VALUES (?, ?, ?, {now})"
    " ON CONFLICT (node_id, operation_id) DO NOTHING"
)
_CANCELS_SQL = sql(
    "SELECT operation_id, gid FROM node_cancel WHERE node_id = ? ORDER BY queued_at, operation_id"
)
_FORGET_CANCELS_SQL = sql("DELETE FROM node_cancel WHERE node_id = ?")

#: Completed tasks of a retired node marked gone in one transaction at most:
#: each moves its user's kept count (``task_count``), and PostgreSQL walks
#: a row's versions on every update of it in one transaction (n^2), as
#: :data:`~tasknet.site.storage.inventory.GONE_PER_TRANSACTION` says.
RETIRED_GONE_PER_TRANSACTION = 500

_NEXT_COMPLETED_SQL = sql(
    "SELECT g.gid, o.operation_id FROM gallery AS g JOIN task_operation AS o ON o.gid = g.gid"  # noqa: S608
    f" WHERE g.node_id = ? AND g.status = {_COMPLETED} AND o.state = 'SUBMITTED'"
    " AND g.archive_gone_reason IS NULL ORDER BY g.gid LIMIT ?"
)
_AUDIT_SQL = sql(
    "INSERT INTO node_custody_audit (node_id, action, actor, note, tasks, archives, at)"
    " VALUES (?, ?, ?, ?, ?, ?, {now})"
)
_AUDITS_SQL = sql(
    "SELECT id, node_id, action, actor, note, tasks, archives, at FROM node_custody_audit"
    " WHERE node_id = ? ORDER BY id"
)
# A node the site has heard of: a key, a login, a task, an operator's action
# (a retired node stays known: retiring it again changes nothing).
_KNOWN_SQL = sql(
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM node_key WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM node_session WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM node_seen WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM gallery WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM node_custody_audit WHERE node_id = ?1)"
)

REASSIGN = "REASSIGN"
RETIRE = "RETIRE"


class UnknownNode(Exception):
    """The site has never heard of that node (no key, login or task)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"no node {node_id!r} is known to this site")
        self.node_id = node_id


#: ``epoch`` of :func:`reassign_node` when the caller does not check it (an operator).
ANY_EPOCH = -1


@dataclass(frozen=True)
class Reassigned:
    """What :func:`reassign_node` did: the ``DOWNLOAD`` commands for the
    nodes the tasks went to (sent after the commit), the gids left waiting
    for a node, the ``CANCEL``s owed to the old node (``(operationId, gid)``),
    and the new loads of the nodes given tasks.  ``skipped``: nothing moved
    because the node came back (or was never gone)."""

    node_id: str
    commands: list[dispatch.Command]
    waiting: list[int]
    cancels: list[tuple[str, int]]
    loads: dict[str, int]
    skipped: bool = False

    @property
    def tasks(self) -> int:
        return len(self.commands) + len(self.waiting)


@dataclass(frozen=True)
class Retired:
    """What :func:`retire_node` did: its unfinished tasks moved
    (``reassigned``), ``archives`` completed tasks marked ``ARCHIVE_GONE``
    (``NODE_RETIRED``), and whether it had a key (now removed)."""

    reassigned: Reassigned
    archives: int
    key_removed: bool


def stranded_nodes(cursor: Cursor) -> dict[str, int | None]:
    """A read: the nodes that hold an unfinished task and that no site
    holds now, each with the epoch of its last login (``None``: it never
    logged in since ``node_session`` exists).  The reassignment timer
    watches these (``dispatcher.py``)."""
    found: dict[str, int | None] = {}
    for row in cursor.execute(_STRANDED_SQL).fetchall():
        node_id = row["node_id"]
        if cursor.execute(_HAS_UNFINISHED_SQL, (node_id,)).fetchone() is not None:
            found[node_id] = None if row["epoch"] is None else int(row["epoch"])
    return found


def is_known_node(cursor: Cursor, node_id: str) -> bool:
    """A read: whether the site has heard of ``node_id`` (a key, a login,
    a task)."""
    return cursor.execute(_KNOWN_SQL, (node_id,)).fetchone() is not None


def _move(
    cursor: Cursor,
    node_id: str,
    node_ids: Sequence[str],
    loads: dict[str, int] | None,
) -> Reassigned:
    for legacy in cursor.execute(_LEGACY_ROWS_SQL, (node_id,)).fetchall():
        # A pre-migration row gets its generation first: its operationId is
        # what the new node downloads and the old node is told to cancel.
        backfill_legacy(cursor, legacy["gid"])
    rows = cursor.execute(_PAGE_SQL, (node_id,)).fetchall()
    if not rows:
        return Reassigned(node_id, [], [], [], {})
    gids = [int(row["gid"]) for row in rows]
    cancels = [(str(row["operation_id"]), int(row["gid"])) for row in rows]
    cursor.executemany(_FORGET_OPERATION_SQL, [(gid,) for gid in gids])
    cursor.executemany(_RELEASE_TASK_SQL, [(gid, node_id) for gid in gids])
    cursor.executemany(_OWE_CANCEL_SQL, [(node_id, gid, op) for op, gid in cancels])
    targets = [other for other in node_ids if other != node_id]
    commands, new_loads = dispatch.assign(cursor, rows, targets, loads)
    given = {command.gid for command in commands}
    outbox.enqueue_visible_task_changes(cursor, gids)
    return Reassigned(
        node_id, commands, [gid for gid in gids if gid not in given], cancels, new_loads
    )


def _audit(
    cursor: Cursor,
    node_id: str,
    action: str,
    actor: str,
    note: str,
    tasks: int,
    archives: int,
) -> None:
    cursor.execute(_AUDIT_SQL, (node_id, action, actor, note, tasks, archives))


def reassign_node(
    cursor: Cursor,
    node_id: str,
    node_ids: Sequence[str],
    *,
    epoch: int | None = ANY_EPOCH,
    loads: dict[str, int] | None = None,
    actor: str | None = None,
    note: str = "",
) -> Reassigned:
    """Move every unfinished task of ``node_id`` to the least loaded of
    ``node_ids`` (the caller's connected nodes; ``node_id`` itself is never
    chosen; none: the tasks wait for a node), owing the old node a
    ``CANCEL`` of each (see the module doc).

    The timer passes the ``epoch`` of the node's last login it saw while
    the node was gone (``None``: it never logged in): nothing moves
    (``skipped``) when any site holds the node now or it logged in since.
    An operator passes :data:`ANY_EPOCH` and ``actor`` (and a ``note``):
    the move happens whatever the node's state and is audited
    (``node_custody_audit``, ``REASSIGN``, with the number of tasks).
    """
    if epoch != ANY_EPOCH:
        session = cursor.execute(_SESSION_SQL, (node_id,)).fetchone()
        now_epoch = None if session is None else int(session["epoch"])
        if now_epoch != epoch or (session is not None and session["live"]):
            return Reassigned(node_id, [], [], [], {}, skipped=True)
    moved = _move(cursor, node_id, node_ids, loads)
    if actor is not None:
        _audit(cursor, node_id, REASSIGN, actor, note, moved.tasks, 0)
    return moved


def operator_reassign(
    cursor: Cursor,
    node_id: str,
    node_ids: Sequence[str],
    *,
    actor: str,
    note: str,
    loads: dict[str, int] | None = None,
) -> Reassigned:
    """An operator's ``node reassign ID``: :func:`reassign_node` now, whatever
    the timer, audited.  :class:`UnknownNode` (nothing written) for a node
    the site never heard of."""
    if not is_known_node(cursor, node_id):
        raise UnknownNode(node_id)
    return reassign_node(cursor, node_id, node_ids, loads=loads, actor=actor, note=note)


def retire_node(
    cursor: Cursor,
    node_id: str,
    node_ids: Sequence[str],
    *,
    actor: str,
    note: str,
    loads: dict[str, int] | None = None,
) -> Retired:
    """An operator's ``node retire ID``: its unfinished tasks move now
    (:func:`reassign_node`), every task it completed shows ``ARCHIVE_GONE``
    (``NODE_RETIRED``, :func:`~tasknet.site.storage.custody.mark_archive_gone`),
    its key is removed (its next Login, at any site, fails once that site
    re-reads the keys; the caller closes its live session here), the
    ``CANCEL``s owed to it are forgotten (it will not log in again), and
    the whole is audited (``RETIRE``, tasks and archives).
    :class:`UnknownNode` (nothing written) for a node the site never heard of.
    """
    if not is_known_node(cursor, node_id):
        raise UnknownNode(node_id)
    moved = _move(cursor, node_id, node_ids, loads)
    held = int(cursor.execute(_COUNT_COMPLETED_SQL, (node_id,)).fetchone()[0])
    archives = mark_retired_archives_gone(cursor, node_id)
    cursor.execute(_FORGET_CANCELS_SQL, (node_id,))
    key_removed = users.remove_node_key(cursor, node_id)
    _audit(cursor, node_id, RETIRE, actor, note, moved.tasks, held)
    return Retired(
        Reassigned(node_id, moved.commands, moved.waiting, [], moved.loads),
        archives,
        key_removed,
    )


def mark_retired_archives_gone(cursor: Cursor, node_id: str) -> int:
    """The next :data:`RETIRED_GONE_PER_TRANSACTION` completed tasks of a
    retired node marked ``ARCHIVE_GONE`` (``NODE_RETIRED``); how many.  The
    caller runs it, a transaction each, until it answers 0: one transaction
    marking a big node's every archive would hold the writer for minutes on
    PostgreSQL (see :data:`RETIRED_GONE_PER_TRANSACTION`).  Running it again
    after a crash finishes the retirement (the node's key is already gone)."""
    rows = cursor.execute(_NEXT_COMPLETED_SQL, (node_id, RETIRED_GONE_PER_TRANSACTION)).fetchall()
    generations = [(int(r["gid"]), str(r["operation_id"])) for r in rows]
    changed = custody.mark_archives_gone(
        cursor,
        generations=generations,
        reason="NODE_RETIRED",
        node_id=node_id,
        now=iso(now_of(cursor)),
    )
    return len(changed)


_COUNT_UNFINISHED_SQL = sql(
    "SELECT COUNT(*) FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid"  # noqa: S608
    f" WHERE {_UNFINISHED_SQL}"
)
_COUNT_COMPLETED_SQL = sql(
    "SELECT COUNT(*) FROM gallery AS g JOIN task_operation AS o ON o.gid = g.gid"  # noqa: S608
    f" WHERE g.node_id = ? AND g.status = {_COMPLETED} AND o.state = 'SUBMITTED'"
    " AND g.archive_gone_reason IS NULL"
)
_CONNECTED_SQL = sql(
    f"SELECT s.site_name FROM node_session AS s WHERE s.node_id = ? AND {_LIVE_SQL}"  # noqa: S608
)


@dataclass(frozen=True)
class NodeSummary:
    """What an operator is asked to confirm: the node's unfinished tasks
    (what a reassignment moves), its completed ones whose archives it holds
    (what a retirement marks gone), and the site holding it now (``None``:
    not connected)."""

    node_id: str
    unfinished: int
    completed: int
    connected_to: str | None


def node_summary(cursor: Cursor, node_id: str) -> NodeSummary:
    """A read: :class:`NodeSummary` of ``node_id``; :class:`UnknownNode` for
    a node the site never heard of."""
    if not is_known_node(cursor, node_id):
        raise UnknownNode(node_id)
    held = cursor.execute(_CONNECTED_SQL, (node_id,)).fetchone()
    return NodeSummary(
        node_id,
        int(cursor.execute(_COUNT_UNFINISHED_SQL, (node_id,)).fetchone()[0]),
        int(cursor.execute(_COUNT_COMPLETED_SQL, (node_id,)).fetchone()[0]),
        None if held is None else str(held[0]),
    )


def cancels_owed(cursor: Cursor, node_id: str) -> list[tuple[str, int]]:
    """A read: the ``CANCEL``s owed to ``node_id`` (``(operationId, gid)``,
    oldest first), sent when it logs in."""
    return [
        (str(row["operation_id"]), int(row["gid"]))
        for row in cursor.execute(_CANCELS_SQL, (node_id,)).fetchall()
    ]


def cancels_owed_all(cursor: Cursor, node_ids: Sequence[str]) -> dict[str, list[tuple[str, int]]]:
    """A read: :func:`cancels_owed` for each of ``node_ids`` (a burst of logins)."""
    return {node_id: cancels_owed(cursor, node_id) for node_id in node_ids}


def login_pages(
    cursor: Cursor,
    cancel_for: Sequence[str],
    wanted: Sequence[tuple[str, int]],
    limit: int = dispatch.PAGE_SIZE,
) -> tuple[dict[str, list[tuple[str, int]]], list[dispatch.Page]]:
    """A write: the first transaction of a burst of logins: the ``CANCEL``s
    owed to ``cancel_for`` (their v2 sessions) and the first pages of
    :func:`~tasknet.site.storage.dispatch.claim_nodes_pages`, decided
    together (the dispatcher sends the ``CANCEL``s, then the pages' commands,
    right after its commit)."""
    return cancels_owed_all(cursor, cancel_for), dispatch.claim_nodes_pages(cursor, wanted, limit)


@dataclass(frozen=True)
class AuditEntry:
    id: int
    node_id: str
    action: str
    actor: str
    note: str
    tasks: int
    archives: int
    at: str


def custody_audit(cursor: Cursor, node_id: str) -> list[AuditEntry]:
    """A read: the operators' reassignments and retirements of ``node_id``."""
    return [
        AuditEntry(
            int(r["id"]),
            r["node_id"],
            r["action"],
            r["actor"],
            r["note"],
            int(r["tasks"]),
            int(r["archives"]),
            r["at"],
        )
        for r in cursor.execute(_AUDITS_SQL, (node_id,)).fetchall()
    ]
