"""Reaping: settling what a gone site instance left in flight (SCALE.md 2,
DRILLS.md D9), with the evidence in ``instance_reap``.

An instance is judged gone by its lease (:mod:`tasknet.site.storage.lease`);
its rows are :mod:`tasknet.site.storage.instances`.  Reaping touches what
the instance held: its generations in flight (:func:`create.recover
<tasknet.site.storage.create.recover>`), its nodes and its outbox tail and
webhook claims.  Each function is the body of one transaction
(``fn(cursor, *args)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tasknet.site.storage import create, node_sessions, outbox
from tasknet.site.storage.create import Recovered
from tasknet.site.storage.engine.sql import Sql, SqlValue, sql
from tasknet.site.storage.engine.timestamps import iso, parse
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.instances import OPEN_SQL, instance, lease_confirmed_at

_MARK_REAPED = sql(
    f"UPDATE site_instance SET reaped_at = {{now}}, reaped_by = ? WHERE id = ? AND {OPEN_SQL}"  # noqa: S608
)
_NOW = sql("SELECT {now}")
_RECORD = sql(
    "INSERT INTO instance_reap (instance_id, reaped_by, gid, operation_id, from_state, "
    "outcome, lease_confirmed_at, reaped_at) VALUES (?, ?, ?, ?, ?, ?, ?, {now})"
)
_RECORDS = (
    "SELECT instance_id, reaped_by, reaped_at, gid, operation_id, from_state, outcome "
    "FROM instance_reap"
)
_ALL_RECORDS = sql(f"{_RECORDS} ORDER BY id")
_RECORDS_OF = sql(f"{_RECORDS} WHERE instance_id = ? ORDER BY id")


@dataclass(frozen=True)
class Reaped:
    """What one reap settled: the gone instance (``None``: generations that
    no instance recorded, written before v4), whether its row was marked
    reaped now, and its generations (as :func:`create.recover` answers)."""

    instance_id: int | None
    marked: bool
    recovered: Recovered
    #: Who the gone instance was ("NAME on HOST, pid PID"; None: no instance).
    who: str | None = None
    #: The nodes it held, now held by nobody, and its webhook claims given back.
    nodes: list[str] = field(default_factory=list)
    claims: int = 0

    @property
    def settled(self) -> int:
        return len(self.recovered.unknown) + len(self.recovered.released)


def reap(
    cursor: Cursor,
    gone: int | None,
    reaper: int,
    *,
    verdict_wait: tuple[float, float] | None = None,
) -> Reaped:
    """Settle what instance ``gone`` left, once its lease was judged gone
    (the caller holds that proof: the lock of ``gone``, or the SQLite
    flock), by instance ``reaper``: its row marked reaped, each of its
    ``SUBMITTING`` generations ``UNKNOWN`` and each ``RESERVED`` one
    released (:func:`create.recover`), one ``instance_reap`` row per
    generation settled (the evidence of D9), the nodes it held released
    (:func:`node_sessions.release_nodes_of`) and its outbox tail and webhook
    claims given up (:func:`outbox.release_outbox_of`).  ``gone=None``:
    the generations no instance recorded.  Repeating it settles nothing
    twice.

    ``verdict_wait``: the (lease timeout, upstream timeout) to assume for
    an instance that recorded none (an older release); given when the gone
    instance may have been paused rather than dead (PostgreSQL), each
    ``UNKNOWN`` made here may be resolved "not submitted" only after its
    lease timeout plus its upstream timeout from now, the last moment it can
    have confirmed its lease (its lock was free when it was judged gone):
    a paused site's late POST must have landed before anyone says it never
    came (SCALE.md "Fencing" 2)."""
    marked = False
    if gone is not None:
        cursor.execute(_MARK_REAPED, (reaper, gone))
        marked = cursor.rowcount == 1
    confirmed_at, not_before = _verdict_wait(cursor, gone, verdict_wait)
    recovered = create.recover(
        cursor, gone, error=_reaped_error(gone, reaper), verdict_not_before=not_before
    )
    _record(cursor, gone, reaper, recovered, lease_confirmed_at=confirmed_at)
    if gone is None:
        return Reaped(gone, marked, recovered)
    nodes = node_sessions.release_nodes_of(cursor, gone)
    claims = outbox.release_outbox_of(cursor, gone)
    row = instance(cursor, gone)
    who = None if row is None else f"{row.name} on {row.host}, pid {row.pid}"
    return Reaped(gone, marked, recovered, who, nodes, claims)


def _verdict_wait(
    cursor: Cursor, gone: int | None, defaults: tuple[float, float] | None
) -> tuple[str | None, str | None]:
    """(when ``gone`` last confirmed its lease, when "not submitted" may be
    said for what it left): its confirmation plus its lease timeout plus its
    upstream timeout, the last moment a POST it might still have sent can
    land.  (None, None) when there is nothing to wait for."""
    if gone is None or defaults is None:
        return None, None
    row = instance(cursor, gone)
    lease_timeout = row.lease_timeout if row and row.lease_timeout is not None else defaults[0]
    upstream = row.upstream_timeout if row and row.upstream_timeout is not None else defaults[1]
    confirmed_at = lease_confirmed_at(cursor, gone)
    if confirmed_at is None:  # an instance of an older release: from now
        confirmed_at = str(cursor.execute(_NOW).fetchone()[0])
    moment = parse(confirmed_at).timestamp()
    return confirmed_at, iso(moment + lease_timeout + upstream)


def _reaped_error(gone: int | None, reaper: int) -> str:
    whose = "a site" if gone is None else f"site instance {gone}"
    return (
        f"{whose} stopped while this submission was in flight (settled by site instance "
        f"{reaper}); the POST may or may not have reached the upstream"
    )


def _record(
    cursor: Cursor,
    gone: int | None,
    reaper: int,
    recovered: Recovered,
    *,
    lease_confirmed_at: str | None,
) -> None:
    rows: Sequence[tuple[SqlValue, ...]] = [
        (gone, reaper, op.gid, op.operation_id, op.from_state, op.outcome, lease_confirmed_at)
        for op in recovered.operations
    ]
    if rows:
        cursor.executemany(_RECORD, rows)


@dataclass(frozen=True)
class ReapRecord:
    """One ``instance_reap`` row: generation ``operation_id`` of ``gid``,
    left ``from_state`` by instance ``instance_id``, settled (``outcome``
    ``UNKNOWN`` or ``released``) by instance ``reaped_by`` at ``reaped_at``."""

    instance_id: int | None
    reaped_by: int
    reaped_at: str
    gid: int
    operation_id: str
    from_state: str
    outcome: str


def reap_records(cursor: Cursor, instance_id: int | None = None) -> list[ReapRecord]:
    """The D9 evidence: every generation settled for a gone instance (or
    only ``instance_id``'s), in the order it was settled."""
    records: Sql = _ALL_RECORDS
    params: tuple[SqlValue, ...] = ()
    if instance_id is not None:
        records, params = _RECORDS_OF, (instance_id,)
    return [
        ReapRecord(
            None if r["instance_id"] is None else int(r["instance_id"]),
            int(r["reaped_by"]),
            r["reaped_at"],
            int(r["gid"]),
            r["operation_id"],
            r["from_state"],
            r["outcome"],
        )
        for r in cursor.execute(records, params)
    ]
