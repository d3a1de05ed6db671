"""Judging a node's archive inventory (DELIVERY.md "Custody", PROTOCOL.md
"Archives (v2)", types 16 and 17).

A node that announced ``archive-inventory`` lists, once per connection,
every archive it holds whole; the node listener assembles the parts and
:func:`judge_inventory` compares the whole list with what the site believes
the node holds, in one transaction:

==========================================  ======================================
the site has …                              outcome
==========================================  ======================================
a ``COMPLETED`` generation assigned to the  ``ARCHIVE_GONE`` ``MISSING``
node, not gone, not listed                  (:func:`~tasknet.site.storage.custody.
                                            mark_archives_gone`)
… listed with another size or SHA-256       ``ARCHIVE_GONE`` ``CORRUPT``: the
than the site recorded                      archive held is not the one the
                                            site promised (a verified download
                                            would fail); a legacy completion
                                            (none recorded) is held when listed
a listed generation that is the gid's       held: nothing to do
current one, assigned to the node
a listed gid whose task is a ``DELETED``    the node is sent ``DELETE`` with the
tombstone                                   tombstone's delete operation id,
                                            after the commit
a listed generation the site owes the node  nothing: its ``CANCEL`` is on its way
a ``CANCEL`` for (``node_cancel``)          (storage/custody.py)
any other listed generation: an unknown     an orphan: a ``node_archive_orphan``
gid, another generation of a live gid, or   row, listed in ``/api/admin/nodes``
the current generation of a gid assigned    (``orphans``) until an inventory of
to another node (a node given another       that node no longer lists it
node's data directory)
==========================================  ======================================

The current generation assigned to another node is listed, never deleted:
no delete of that gid was ever asked for, and the copy may be the only one
left (its own node wiped): which copy to keep is an operator's call
(docs/operations.md, "Inventories").

At most :data:`GONE_PER_TRANSACTION` generations are marked gone in that
transaction; the rest come back in the verdict (``pending``) for
:func:`mark_gone`, a transaction per as many (``session_handler.py``): each
is checked again by the same rules, and one left unmarked (a failure) is
found again by the node's next inventory.

A completion applied after ``completed_before`` (the time the inventory's
connection was accepted) is not judged missing: the node may have
completed it after it read its archives for the inventory; the next
inventory judges it.

Locks (PostgreSQL, ``READ COMMITTED``, like the reports of
:mod:`~tasknet.site.storage.reports`): the node's report lock first (one
node's reports and inventories apply one at a time), then the
``task_operation`` rows of every gid it may write from (those to mark gone
and those it may delete or list), in gid order.  Reads of what the node
holds are one statement each whatever the inventory's size: the listed
archives cross as one JSON parameter, or one array of gids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from tasknet.protocol.messages import HeldArchive
from tasknet.site.storage.custody import mark_archives_gone
from tasknet.site.storage.engine.sources import now_of
from tasknet.site.storage.engine.sql import per_backend, postgres_only, sql
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.engine.transactions import Cursor, read_committed
from tasknet.site.storage.node_sessions import Holding, still_held
from tasknet.site.storage.reports import REPORT_NODE_CLASS
from tasknet.status import NodeCode, OperationState

__all__ = [
    "GONE_PER_TRANSACTION",
    "InventoryDelete",
    "InventoryVerdict",
    "Orphan",
    "judge_inventory",
    "judge_inventory_now",
    "mark_gone",
    "node_orphans",
]

#: Generations marked gone in one transaction at most.  On PostgreSQL each
#: one moves its user's kept count (``task_count``, one row per user and
#: status): one transaction updating the same row n times costs n^2 (every
#: update walks the row's versions), so 25,000 of one user took more than
#: 17 minutes holding the site's writer; in 500s, seconds.
GONE_PER_TRANSACTION = 500

_DELETED = OperationState.DELETED.value
_SUBMITTED = OperationState.SUBMITTED.value


@dataclass(frozen=True, slots=True)
class InventoryDelete:
    """A ``DELETE`` to send the node after the commit: ``gid``'s tombstone."""

    gid: int
    delete_operation_id: str
    name: str


@dataclass(frozen=True, slots=True)
class Orphan:
    """An archive listed that the site has no live generation for on that
    node, and no delete to remove it with."""

    gid: int
    operation_id: str
    size: int
    sha256: str


@dataclass(frozen=True)
class InventoryVerdict:
    """What judging one whole inventory did (all of it committed together)."""

    #: The node's connection no longer held it (several sites): nothing written.
    not_held: bool = False
    #: Archives and bytes listed (each generation once).
    archives: int = 0
    bytes: int = 0
    #: Gids whose generation became ``ARCHIVE_GONE`` (``MISSING``, ``CORRUPT``).
    missing: tuple[int, ...] = ()
    corrupt: tuple[int, ...] = ()
    #: ``DELETE`` commands owed to the node (send after the commit).
    deletes: tuple[InventoryDelete, ...] = ()
    #: The node's orphans now (``node_archive_orphan``).
    orphans: tuple[Orphan, ...] = ()
    #: Listed generations the site owes the node a ``CANCEL`` for (left alone).
    cancelling: int = 0
    #: ``(gid, operationId, reason)`` found gone beyond the first
    #: :data:`GONE_PER_TRANSACTION`: for :func:`mark_gone`, in transactions
    #: of their own.
    pending: tuple[tuple[int, str, str], ...] = ()


_LOCK_NODE_SQL = postgres_only(f"SELECT pg_advisory_xact_lock({REPORT_NODE_CLASS}, hashtext(?))")
_LOCK_OPERATIONS_SQL = postgres_only(
    "SELECT COUNT(*) FROM (SELECT gid FROM task_operation"
    " WHERE gid {in_array} ORDER BY gid {for_update}) AS locked",
    sqlite_answer="0",
)
# Every live generation assigned to the node (a legacy row without one too:
# state NULL), with what the site recorded of its archive.
_ASSIGNED_SQL = sql(
    "SELECT g.gid, o.operation_id, o.state, g.status, g.archive_size, g.archive_sha256,"
    " g.completed_at, g.archive_gone_reason"
    " FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid"
    " WHERE g.node_id = ?"
)
_OPERATIONS_SQL = sql(
    "SELECT o.gid, o.operation_id, o.state, o.delete_operation_id, g.name"
    " FROM task_operation AS o LEFT JOIN gallery AS g ON g.gid = o.gid WHERE o.gid {in_array}"
)
_OWED_CANCELS_SQL = sql("SELECT operation_id FROM node_cancel WHERE node_id = ?")
_ORPHANS_SQL = sql(
    "SELECT gid, operation_id, size, sha256, found_at FROM node_archive_orphan"
    " WHERE node_id = ? ORDER BY gid, operation_id"
)
_FORGET_ORPHANS_SQL = sql(
    "DELETE FROM node_archive_orphan WHERE node_id = ? AND operation_id {in_array}"
)
# Each orphan once per (node, operationId); found_at stays that of the first inventory.
_ADD_ORPHANS_SQL = per_backend(
    # WHERE true: SQLite's upsert after a SELECT needs a WHERE (its parser).
    sqlite="INSERT INTO node_archive_orphan (node_id, gid, operation_id, size, sha256, found_at)"
    " SELECT ?1, json_extract(value, '$[0]'), json_extract(value, '$[1]'),"
    " json_extract(value, '$[2]'), json_extract(value, '$[3]'), ?3 FROM json_each(?2)"
    " WHERE true ON CONFLICT (node_id, operation_id) DO UPDATE SET gid = excluded.gid,"
    " size = excluded.size, sha256 = excluded.sha256",
    postgres="INSERT INTO node_archive_orphan (node_id, gid, operation_id, size, sha256, found_at)"
    " SELECT ?1, CAST(e ->> 0 AS BIGINT), e ->> 1, CAST(e ->> 2 AS BIGINT), e ->> 3, ?3"
    " FROM json_array_elements(CAST(?2 AS JSON)) AS e"
    " ON CONFLICT (node_id, operation_id) DO UPDATE SET gid = excluded.gid,"
    " size = excluded.size, sha256 = excluded.sha256",
)
_RECORD_INVENTORY_SQL = sql(
    "INSERT INTO node_inventory (node_id, inventory_id, archives, bytes, missing, orphans,"
    " judged_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (node_id) DO UPDATE SET inventory_id = excluded.inventory_id,"
    " archives = excluded.archives, bytes = excluded.bytes, missing = excluded.missing,"
    " orphans = excluded.orphans, judged_at = excluded.judged_at"
)


def _distinct(archives: Iterable[HeldArchive]) -> dict[str, HeldArchive]:
    """Each listed generation once, by operationId (the first listing wins)."""
    listed: dict[str, HeldArchive] = {}
    for archive in archives:
        listed.setdefault(archive.operation_id, archive)
    return listed


@read_committed
def judge_inventory(
    cursor: Cursor,
    *,
    node_id: str,
    inventory_id: str,
    archives: Sequence[HeldArchive],
    now: str,
    completed_before: str | None = None,
    holding: Holding | None = None,
) -> InventoryVerdict:
    """Judge ``node_id``'s whole inventory ``inventory_id`` (every part's
    ``archives``) at ``now`` (our timestamp text), as the module doc says:
    marks gone, records orphans and the node's ``node_inventory`` row, and
    returns the ``DELETE`` commands to send once committed.
    ``completed_before``: completions applied at or after it are not judged
    missing (see the module doc); ``holding``: the connection's hold on the
    node (several sites): judged only while it still holds it."""
    cursor.execute(_LOCK_NODE_SQL, (node_id,))
    if holding is not None and holding not in still_held(cursor, [holding]):
        return InventoryVerdict(not_held=True)
    listed = _distinct(archives)
    completed = int(NodeCode.COMPLETED)

    held: set[str] = set()
    legacy_gids: set[int] = set()  # assigned rows without a generation
    gone: list[tuple[int, str, str]] = []  # (gid, operationId, reason)
    for row in cursor.execute(_ASSIGNED_SQL, (node_id,)).fetchall():
        gid, operation_id, state = int(row[0]), row[1], row[2]
        if state is None:
            legacy_gids.add(gid)
            continue
        if state == _DELETED:
            continue
        archive = listed.get(operation_id)
        if archive is not None and archive.gid == gid:
            held.add(operation_id)
        if state != _SUBMITTED or row[3] != completed or row[7] is not None:
            continue  # only a completed, live, not yet gone generation can go
        if archive is None or archive.gid != gid:
            if completed_before is None or row[6] is None or row[6] < completed_before:
                gone.append((gid, operation_id, "MISSING"))
        elif row[5] is not None and (row[5] != archive.sha256 or row[4] != archive.size):
            gone.append((gid, operation_id, "CORRUPT"))

    unmatched = [a for op, a in listed.items() if op not in held and a.gid not in legacy_gids]
    to_lock = sorted({g for g, _, _ in gone} | {a.gid for a in unmatched})
    if to_lock:
        cursor.execute(_LOCK_OPERATIONS_SQL, (to_lock,)).fetchone()

    gone.sort()
    missing, corrupt = _mark(cursor, node_id, gone[:GONE_PER_TRANSACTION], now)

    deletes: dict[int, InventoryDelete] = {}
    orphans: list[Orphan] = []
    cancelling = 0
    if unmatched:
        operations = {
            int(r[0]): r
            for r in cursor.execute(
                _OPERATIONS_SQL, (sorted({a.gid for a in unmatched}),)
            ).fetchall()
        }
        owed = {r[0] for r in cursor.execute(_OWED_CANCELS_SQL, (node_id,)).fetchall()}
        for archive in unmatched:
            operation = operations.get(archive.gid)
            if operation is not None and operation[2] == _DELETED and operation[3]:
                deletes.setdefault(
                    archive.gid, InventoryDelete(archive.gid, operation[3], operation[4] or "")
                )
            elif archive.operation_id in owed:
                cancelling += 1
            else:
                orphans.append(
                    Orphan(archive.gid, archive.operation_id, archive.size, archive.sha256)
                )
    orphans.sort(key=lambda o: (o.gid, o.operation_id))
    _replace_orphans(cursor, node_id, orphans, now)
    total = sum(a.size for a in listed.values())
    cursor.execute(
        _RECORD_INVENTORY_SQL,
        (node_id, inventory_id, len(listed), total, len(gone), len(orphans), now),
    )
    return InventoryVerdict(
        archives=len(listed),
        bytes=total,
        missing=tuple(missing),
        corrupt=tuple(corrupt),
        deletes=tuple(deletes[g] for g in sorted(deletes)),
        orphans=tuple(orphans),
        cancelling=cancelling,
        pending=tuple(gone[GONE_PER_TRANSACTION:]),
    )


def _mark(
    cursor: Cursor, node_id: str, gone: Sequence[tuple[int, str, str]], now: str
) -> tuple[list[int], list[int]]:
    """Mark ``gone`` (``(gid, operationId, reason)``): the gids changed,
    ``MISSING`` and ``CORRUPT``."""
    missing, corrupt = (
        mark_archives_gone(
            cursor,
            generations=[(g, op) for g, op, why in gone if why == reason],
            reason=reason,
            node_id=node_id,
            now=now,
        )
        for reason in ("MISSING", "CORRUPT")
    )
    return missing, corrupt


@read_committed
def mark_gone(
    cursor: Cursor, *, node_id: str, generations: Sequence[tuple[int, str, str]]
) -> tuple[list[int], list[int]]:
    """The next :data:`GONE_PER_TRANSACTION` of a verdict's ``pending``,
    at the connection's wall clock, under the node's report lock; each
    checked again by :func:`~tasknet.site.storage.custody.mark_archives_gone`'s
    rules.  The gids changed, ``MISSING`` and ``CORRUPT``."""
    cursor.execute(_LOCK_NODE_SQL, (node_id,))
    return _mark(cursor, node_id, generations, iso(now_of(cursor)))


def _replace_orphans(cursor: Cursor, node_id: str, orphans: Sequence[Orphan], now: str) -> None:
    """The node's ``node_archive_orphan`` rows become ``orphans``: those no
    longer listed go, new ones come (an orphan kept keeps its ``found_at``)."""
    now_listed = {o.operation_id for o in orphans}
    before = {r[1] for r in cursor.execute(_ORPHANS_SQL, (node_id,)).fetchall()}
    gone = sorted(before - now_listed)
    if gone:
        cursor.execute(_FORGET_ORPHANS_SQL, (node_id, gone))
    if orphans:
        rows = [[o.gid, o.operation_id, o.size, o.sha256] for o in orphans]
        cursor.execute(_ADD_ORPHANS_SQL, (node_id, orjson.dumps(rows).decode(), now))


def node_orphans(cursor: Cursor, node_id: str) -> list[dict[str, object]]:
    """``node_id``'s orphans as ``/api/admin/nodes`` lists them."""
    return [
        {
            "gid": int(r[0]),
            "operationId": r[1],
            "size": int(r[2]),
            "sha256": r[3],
            "foundAt": r[4],
        }
        for r in cursor.execute(_ORPHANS_SQL, (node_id,)).fetchall()
    ]


@read_committed
def judge_inventory_now(
    cursor: Cursor,
    *,
    node_id: str,
    inventory_id: str,
    archives: Sequence[HeldArchive],
    completed_before: str | None = None,
    holding: Holding | None = None,
) -> InventoryVerdict:
    """:func:`judge_inventory` at the connection's wall clock (what
    ``{now}`` stamps), for the site's handler."""
    return judge_inventory(
        cursor,
        node_id=node_id,
        inventory_id=inventory_id,
        archives=archives,
        now=iso(now_of(cursor)),
        completed_before=completed_before,
        holding=holding,
    )
