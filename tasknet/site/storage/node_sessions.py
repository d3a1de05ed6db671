"""Which site holds each node's connection (SCALE.md 5: one site at a time,
the newest connection wins across sites).

``node_session`` has one row per node that ever logged in.  A login, at any
site, takes the row in one write transaction (:func:`take`): the epoch goes
up by one and the row names the new holder (its instance, ``--name``, the
connection's protocol, features and accept time).  The transaction also
sends ``NOTIFY tasknet_node_taken`` (``"<node> <epoch>"``, delivered at its
commit, PostgreSQL only) so that the site holding the older connection
closes it at once; that site also finds out by its periodic check
(:func:`still_held`), should the notification be lost.  A connection is
known to its site by its :class:`Holding` (the node, the epoch of its login
and the site's instance), and it holds the node exactly while the row still
says so: a report that arrives on a connection that no longer holds its
node is not applied (the node listener closes it; the node sends it again
on its newer connection).

``connected_at`` is NULL while no site holds the node: its connection went
(:func:`release`, only by the holding connection: a late release of an
older one changes nothing), or its site was found gone and reaped
(:func:`release_nodes_of`, called by the reaper).  The epoch is never reset,
so a stale connection can never match a later login, whichever site it was.

``instance_id`` is NULL for a site without an instance record (tools and
single-site tests that build the node side alone); such holdings compare
with ``IS NOT DISTINCT FROM``.  A row naming an instance that is no longer
open (``site_instance``: ended, or reaped as gone) holds nothing, even
before the reaper's :func:`release_nodes_of` has run.

Each function is the body of one transaction (``fn(cursor, *args)``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tasknet.site.storage import throughput
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor


@dataclass(frozen=True, slots=True)
class Holding:
    """One connection's hold on its node: it holds it while the node's row
    has this epoch (and this instance)."""

    node_id: str
    epoch: int
    instance_id: int | None


@dataclass(frozen=True, slots=True)
class Taken:
    """What a login's :func:`take` found and did: the new holding, and who
    held the node before (``None``: nobody, or a connection already gone)."""

    holding: Holding
    previous_site: str | None
    previous_instance: int | None


@dataclass(frozen=True, slots=True)
class Holder:
    """A connected node as the database knows it, whichever site holds it."""

    node_id: str
    epoch: int
    instance_id: int | None
    site_name: str
    protocol: int
    features: tuple[str, ...]
    connected_at: str


def taken_payload(node_id: str, epoch: int) -> str:
    """The ``tasknet_node_taken`` payload (node ids have no spaces)."""
    return f"{node_id} {epoch}"


def parse_taken_payload(payload: str) -> tuple[str, int] | None:
    """``(node_id, epoch)`` of a ``tasknet_node_taken`` payload, ``None`` if malformed."""
    node_id, _, epoch = payload.partition(" ")
    if not node_id or not epoch.isdigit():
        return None
    return node_id, int(epoch)


_HOLDER_BEFORE_SQL = sql(
    "SELECT epoch, instance_id, site_name, connected_at FROM node_session WHERE node_id = ?"
)
_TAKE_SQL = sql(
    "INSERT INTO node_session (node_id, epoch, instance_id, site_name, protocol, features,"
    " connected_at, changed_at) VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, {now})"
    " ON CONFLICT (node_id) DO UPDATE SET epoch = node_session.epoch + 1,"
    " instance_id = excluded.instance_id, site_name = excluded.site_name,"
    " protocol = excluded.protocol, features = excluded.features,"
    " connected_at = excluded.connected_at, changed_at = excluded.changed_at"
)


def take(
    cursor: Cursor,
    node_id: str,
    instance_id: int | None,
    site_name: str,
    protocol: int,
    features: Iterable[str],
    connected_at: str,
) -> Taken:
    """A node logged in here: its row now names this connection (newest
    wins, whoever held it); tell the previous holder (``NOTIFY``, at commit)."""
    before = cursor.execute(_HOLDER_BEFORE_SQL, (node_id,)).fetchone()
    cursor.execute(
        _TAKE_SQL,
        (node_id, instance_id, site_name, protocol, json.dumps(list(features)), connected_at),
    )
    epoch = 1 if before is None else int(before["epoch"]) + 1
    listen.notify(cursor, listen.NODE_TAKEN, taken_payload(node_id, epoch))
    held = before is not None and before["connected_at"] is not None
    return Taken(
        Holding(node_id, epoch, instance_id),
        before["site_name"] if held else None,
        before["instance_id"] if held else None,
    )


_HELD_SQL = "epoch = ? AND instance_id IS NOT DISTINCT FROM ? AND connected_at IS NOT NULL"

# A row whose holder may still be alive (see the module doc).
_LIVE_SQL = (
    "connected_at IS NOT NULL AND (instance_id IS NULL OR instance_id IN"
    " (SELECT id FROM site_instance WHERE ended_at IS NULL AND reaped_at IS NULL))"
)
_RELEASE_SQL = sql(
    "UPDATE node_session SET connected_at = NULL,"  # noqa: S608
    f" changed_at = {{now}} WHERE node_id = ? AND {_HELD_SQL}"
)
_STILL_HELD_SQL = sql(
    "SELECT node_id, epoch, instance_id FROM node_session"  # noqa: S608
    f" WHERE node_id {{in_array}} AND {_LIVE_SQL}"
)
_RELEASE_NODES_OF_SQL = sql(
    "UPDATE node_session SET connected_at = NULL,"
    " changed_at = {now} WHERE instance_id = ? AND connected_at IS NOT NULL"
    " RETURNING node_id"
)
_HOLDERS_SQL = sql(
    "SELECT node_id, epoch, instance_id, site_name, protocol, features, connected_at"  # noqa: S608
    f" FROM node_session WHERE {_LIVE_SQL} ORDER BY node_id"
)


def release(cursor: Cursor, holding: Holding) -> bool:
    """The connection of ``holding`` went: the node is held by nobody,
    unless a newer login took it meanwhile (then nothing changes).  True if
    it was still the holder."""
    cursor.execute(_RELEASE_SQL, (holding.node_id, holding.epoch, holding.instance_id))
    return cursor.rowcount == 1


def still_held(cursor: Cursor, holdings: Iterable[Holding]) -> set[Holding]:
    """Those of ``holdings`` whose connection still holds its node (one
    read for all of them; a node may appear in several)."""
    wanted = set(holdings)
    if not wanted:
        return set()
    rows = cursor.execute(_STILL_HELD_SQL, (sorted({h.node_id for h in wanted}),))
    found = {Holding(row["node_id"], int(row["epoch"]), row["instance_id"]) for row in rows}
    return wanted & found


def release_nodes_of(cursor: Cursor, instance_id: int) -> list[str]:
    """Instance ``instance_id`` is gone (the reaper's call) or stopping:
    every node it held is held by nobody.  The node ids released."""
    rows = cursor.execute(_RELEASE_NODES_OF_SQL, (instance_id,)).fetchall()
    return sorted(row[0] for row in rows)


@functools.lru_cache(maxsize=64)
def _features(text: str) -> tuple[str, ...]:
    """A ``features`` column's tuple (a few distinct texts across every node:
    parsed once each, not once per node and listing)."""
    return tuple(json.loads(text))


def holders(cursor: Cursor) -> list[Holder]:
    """Every connected node of the database, once, by id."""
    return [
        Holder(
            row["node_id"],
            int(row["epoch"]),
            row["instance_id"],
            row["site_name"],
            int(row["protocol"]),
            _features(row["features"]),
            row["connected_at"],
        )
        for row in cursor.execute(_HOLDERS_SQL)
    ]


#: The arguments of one :func:`take` after its cursor: node id, instance,
#: site name, protocol, features, accept time.
TakeRequest = tuple[str, int | None, str, int, tuple[str, ...], str]


def take_all(cursor: Cursor, requests: Sequence[TakeRequest]) -> list[Taken]:
    """:func:`take` for each of ``requests`` in turn, in one transaction (a
    burst of logins): the same rows and notifications as one take per
    transaction in that order (a node twice: its later login wins)."""
    return [take(cursor, *request) for request in requests]


#: The arguments of one :func:`~tasknet.site.storage.throughput.record_node_seen`
#: after its cursor: node id, protocol, features, connected.
SeenRecord = tuple[str, int | None, tuple[str, ...], bool]


def record_seen_all(cursor: Cursor, records: Sequence[SeenRecord]) -> list[None]:
    """``node_seen`` for each of ``records`` in turn (logins and disconnects
    of a burst), in one transaction."""
    for record in records:
        throughput.record_node_seen(cursor, *record)
    return [None] * len(records)
