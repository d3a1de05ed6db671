"""The simulator's checks of what each node holds (issue 34, DELIVERY.md "Custody").

Two checks, each a plain object fed what the run saw, so that a test can
feed it a trace made by hand:

* :class:`OneHolder`, at every event: the site never sends a ``DOWNLOAD``
  of one generation (operationId) to a second node while the first still
  has it, that is, unless a ``CANCEL`` of it went to the first since, or
  the site moved the first node's tasks away (a ``node_cancel`` row owed
  to it, or its reassignment or retirement audited: ``moved_away``);
* :func:`unheld_completions`, once the nodes have reconnected and settled:
  the site shows ``COMPLETED`` (下载完成) for no generation that no node
  holds (D3's archive clause).  A node *holds* a generation when its
  store's ``archive`` table has it and the file is there
  (:func:`node_holdings`).  Only the tasks of a node whose inventory the
  site has judged on the node's current connection are held to it
  (:class:`InventoryWatch`): a legacy node sends none, so its completed
  tasks keep 下载完成 (the known boundary), and a node gone for good is
  never judged again.

Two more, of the faults themselves: :func:`wiped_not_gone` (what the site
showed completed on a node when it was wiped ends ``ARCHIVE_GONE``,
``MISSING``) and :func:`left_behind` (what a node gone for good left
unfinished another node finishes, in the same generation).

:func:`excuse_restored` keeps D4 from judging a node restored from a
backup that sends no inventory (its orphans only an inventory reports).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tasknet.drill.invariants import FAIL, PASS, Verdict
from tasknet.node.paths import DataDir

__all__ = [
    "InventoryWatch",
    "OneHolder",
    "excuse_restored",
    "left_behind",
    "node_holdings",
    "unheld_completions",
    "wiped_not_gone",
]

#: The frame types these checks read (PROTOCOL.md).
TYPE_PROTOCOL_HELLO = 10
TYPE_ARCHIVE_INVENTORY = 16
TYPE_ARCHIVE_INVENTORY_ACK = 17
FEATURE_ARCHIVE_INVENTORY = "archive-inventory"
#: The legacy status code and the gallery status of a completed download.
COMPLETED_CODE = 4


class OneHolder:
    """One node at a time has a generation's ``DOWNLOAD`` (see the module
    doc).  ``moved_away(node, operation_id)``: whether the site has moved
    that node's task of that generation away (read in the committed
    database when the second ``DOWNLOAD`` is written)."""

    def __init__(self, moved_away: Callable[[str, str], bool]) -> None:
        self._moved_away = moved_away
        #: operation id -> the node last sent its DOWNLOAD and no CANCEL since.
        self._holder: dict[str, str] = {}
        self.failures: list[str] = []

    def download(self, node: str, gid: int, operation_id: str) -> str | None:
        """The site wrote a ``DOWNLOAD`` of ``operation_id`` (gid ``gid``) to
        ``node``; the failure's text, or ``None`` when it may."""
        holder = self._holder.get(operation_id)
        self._holder[operation_id] = node
        if holder is None or holder == node or self._moved_away(holder, operation_id):
            return None
        failure = (
            f"gid {gid}: DOWNLOAD of operation {operation_id} sent to {node} while {holder}"
            f" still has it (no CANCEL of it sent to {holder}, its task not moved away)"
        )
        self.failures.append(failure)
        return failure

    def cancel(self, node: str, operation_id: str) -> None:
        """The site wrote a ``CANCEL`` of ``operation_id`` to ``node``."""
        if self._holder.get(operation_id) == node:
            del self._holder[operation_id]


@dataclass
class _Link:
    node: str
    announced: bool
    #: inventory id -> (parts, the parts ACKed).
    inventories: dict[str, tuple[int, set[int]]] = field(default_factory=dict)

    def judged(self) -> bool:
        return any(len(acked) >= parts for parts, acked in self.inventories.values())

    def waiting(self) -> bool:
        """An inventory was sent on it and not every part is ACKed yet."""
        return bool(self.inventories) and not self.judged()


class InventoryWatch:
    """Which nodes announced ``archive-inventory`` on which connection, and
    whether an inventory of theirs was judged there (every part ACKed).
    Fed the frame records of :class:`~tasknet.sim.cluster.SimCluster`
    (``{"link", "direction", "type", "payload", "node"}``) as they are
    delivered; ``open_links()``: the ids of the connections still open."""

    def __init__(self, open_links: Callable[[], Iterable[int]]) -> None:
        self._open_links = open_links
        self._links: dict[int, _Link] = {}

    def frame(self, record: Mapping[str, Any]) -> None:
        type_, payload = record["type"], record["payload"]
        if type_ not in (TYPE_PROTOCOL_HELLO, TYPE_ARCHIVE_INVENTORY, TYPE_ARCHIVE_INVENTORY_ACK):
            return
        if not isinstance(payload, dict):
            return
        link_id = record["link"]
        if type_ == TYPE_PROTOCOL_HELLO:
            if record["direction"] == "to_server":
                features = payload.get("features") or ()
                announced = FEATURE_ARCHIVE_INVENTORY in features
                self._links[link_id] = _Link(record["node"], announced)
            return
        link = self._links.get(link_id)
        if link is None:
            return
        inventory_id = str(payload.get("inventoryId"))
        if type_ == TYPE_ARCHIVE_INVENTORY and record["direction"] == "to_server":
            parts = payload.get("parts")
            if isinstance(parts, int):
                link.inventories.setdefault(inventory_id, (parts, set()))
        elif type_ == TYPE_ARCHIVE_INVENTORY_ACK and record["direction"] == "to_client":
            known = link.inventories.get(inventory_id)
            part = payload.get("part")
            if known is not None and isinstance(part, int):
                known[1].add(part)

    def _current(self) -> dict[str, list[_Link]]:
        links: dict[str, list[_Link]] = {}
        for link_id in self._open_links():
            link = self._links.get(link_id)
            if link is not None:
                links.setdefault(link.node, []).append(link)
        return links

    def judged(self) -> set[str]:
        """The nodes an inventory of which the site judged on a connection
        still open (after which the site's view of them must be what is on
        their disk)."""
        return {
            node
            for node, links in self._current().items()
            if any(link.announced and link.judged() for link in links)
        }

    def announced(self) -> set[str]:
        """The nodes that announced ``archive-inventory`` on a connection
        still open."""
        return {
            node for node, links in self._current().items() if any(link.announced for link in links)
        }

    def waiting(self) -> list[str]:
        """The nodes with an inventory sent on an open connection and not
        yet ACKed whole (not settled)."""
        return sorted(
            node
            for node, links in self._current().items()
            if any(link.announced and link.waiting() for link in links)
        )


def node_holdings(data_dir: Path) -> set[tuple[int, str]]:
    """The generations ``(gid, operationId)`` a node's data directory
    holds: its store's ``archive`` table has them and the file is there."""
    data = DataDir(data_dir)
    if not data.database.exists():
        return set()
    connection = sqlite3.connect(f"file:{data.database}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT gid, operation_id, file FROM archive").fetchall()
    except sqlite3.OperationalError:
        return set()  # an older store: no archive table
    finally:
        connection.close()
    return {(int(gid), str(op)) for gid, op, file in rows if (data.archives / file).is_file()}


def unheld_completions(
    operations: Mapping[int, Mapping[str, Any]],
    galleries: Mapping[int, Mapping[str, Any]],
    holdings: Mapping[str, set[tuple[int, str]]],
    judged: set[str],
    notes: Mapping[str, str] | None = None,
    *,
    excused: AbstractSet[tuple[int, str]] = frozenset(),
) -> list[str]:
    """D3's archive clause over the site's rows (``task_operation`` and
    ``gallery`` by gid) and each node's holdings: a failure's text for each
    generation the site shows ``COMPLETED`` (not ``ARCHIVE_GONE``) whose
    node is in ``judged`` and which no node holds.  ``notes``: what to add
    about a node (``wiped at 31.2 s``); ``excused``: (gid, operation id) of
    completions the site has had no inventory to judge against since."""
    failures = []
    held = set().union(*holdings.values()) if holdings else set()
    for gid, op in sorted(operations.items()):
        gallery = galleries.get(gid) or {}
        node = gallery.get("node_id")
        if op.get("state") != "SUBMITTED" or gallery.get("status") != COMPLETED_CODE:
            continue
        if gallery.get("archive_gone_reason") is not None or node not in judged:
            continue
        operation_id = op.get("operation_id")
        if (gid, operation_id) in held or (gid, operation_id) in excused:
            continue
        note = (notes or {}).get(str(node))
        failures.append(
            f"gid {gid}: the site shows COMPLETED for generation {operation_id} on {node},"
            f" which no node holds{f' ({note})' if note else ''}: ARCHIVE_GONE (MISSING)"
            " was due once its inventory was judged"
        )
    return failures


def excuse_restored(
    verdicts: list[Verdict], restored: set[str], announced: set[str]
) -> list[Verdict]:
    """``verdicts`` less D4's failures about a node restored from a backup
    that sends no inventory (one that does not announce
    ``archive-inventory``): what such a node still holds of a gid deleted
    since its backup, only an inventory tells the site of (its orphans,
    DELIVERY.md "Custody").  A node that announces it is held to D4."""
    excused = restored - announced
    kept = []
    for verdict in verdicts:
        if verdict.invariant != "D4" or verdict.status != FAIL or not excused:
            kept.append(verdict)
            continue
        items = [
            i for i in verdict.evidence if not (isinstance(i, dict) and i.get("node") in excused)
        ]
        if not items:
            kept.append(
                replace(verdict, status=PASS, detail="only a restored node's orphans", evidence=[])
            )
            continue
        more = f" (+{len(items) - 1} more)" if len(items) > 1 else ""
        kept.append(replace(verdict, detail=items[0]["what"] + more, evidence=items))
    return kept


#: (node, gid, operation id): a generation a node had when a fault struck it.
Generation = tuple[str, int, str]


def wiped_not_gone(
    completed: Iterable[Generation],
    operations: Mapping[int, Mapping[str, Any]],
    galleries: Mapping[int, Mapping[str, Any]],
    holdings: Mapping[str, set[tuple[int, str]]],
    judged: set[str],
) -> list[str]:
    """The generations the site showed ``COMPLETED`` on a node when its
    data directory was wiped (``completed``): once that node's inventory
    was judged (``judged``), each that is still the gid's generation and
    that no node holds again (a backup restored since may have brought it
    back) shows ``ARCHIVE_GONE`` with reason ``MISSING``."""
    held = set().union(*holdings.values()) if holdings else set()
    failures = []
    for node, gid, operation_id in completed:
        op = operations.get(gid) or {}
        if node not in judged or (gid, operation_id) in held:
            continue
        if op.get("state") != "SUBMITTED" or op.get("operation_id") != operation_id:
            continue  # deleted, or created again since
        gallery = galleries.get(gid) or {}
        if gallery.get("archive_gone_reason") != "MISSING":
            failures.append(
                f"gid {gid}: COMPLETED on {node} when it was wiped, now status"
                f" {gallery.get('status')} with archive gone"
                f" {gallery.get('archive_gone_reason')!r}: ARCHIVE_GONE (MISSING) was due"
                " once its inventory was judged"
            )
    return failures


def left_behind(
    unfinished: Iterable[Generation],
    operations: Mapping[int, Mapping[str, Any]],
    galleries: Mapping[int, Mapping[str, Any]],
) -> list[str]:
    """The generations a node gone for good had unfinished when it went
    (``unfinished``): each that is still the gid's generation is finished
    (status 4) by another node, the same operationId (so no second POST:
    D1 counts them at every event)."""
    failures = []
    for node, gid, operation_id in unfinished:
        op = operations.get(gid) or {}
        if op.get("state") != "SUBMITTED" or op.get("operation_id") != operation_id:
            continue  # deleted, or created again since
        gallery = galleries.get(gid) or {}
        if gallery.get("node_id") == node and gallery.get("status") == COMPLETED_CODE:
            # Finished by the gone node itself: its completion was on the wire
            # when it went (a dead node sends nothing), committed after (seed 62).
            continue
        if gallery.get("node_id") == node or gallery.get("status") != COMPLETED_CODE:
            failures.append(
                f"gid {gid}: unfinished on {node} when it went for good, now on"
                f" {gallery.get('node_id')} with status {gallery.get('status')}:"
                f" another node should have finished {operation_id}"
            )
    return failures
