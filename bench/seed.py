"""Seeding a site database before the site starts, with the site's own storage functions.

A task is created the way the lifecycle creates it (``reserve`` →
``begin_submit`` → ``persist_submitted``: ``SUBMITTED``, metered, with its
outbox rows), optionally assigned to a node with ``dispatch.claim_task`` (as
dispatch assigns it), in transactions of ``CHUNK`` tasks.  Node keys go into
the ``node_key`` table (``users.add_node_key``), so 1,000 nodes need no
1,000 ``--node-key`` options.  The outbox rows the seeding wrote are marked
delivered (``outbox.mark_range_fanned_out``, webhook skipped): otherwise the
site would start by delivering 100,000 old notifications, which is not what any
benchmark measures.  The database is a SQLite file or a PostgreSQL URL
(a fresh database: ``prepare_database`` creates the schema on it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import plan

if TYPE_CHECKING:
    from tasknet.site.storage.engine.database import Connection

# Either backend's cursor (the storage functions are annotated with sqlite3's).
Cursor = Any

CHUNK = 2000
BENCH_USER = "bench"
# Seeding must never run into the weekly quota.
BENCH_QUOTA = 10**12


@dataclass
class Seeded:
    token: str
    user_id: int
    operation_ids: dict[int, str] = field(default_factory=dict)


def _connect(db: Path | str) -> Connection:
    from tasknet.site.storage.engine.database import connect, is_postgres
    from tasknet.site.storage.engine.schema import prepare_database

    if not is_postgres(str(db)):
        # Always a fresh file: a kept --workdir must not carry a previous run's rows.
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    prepare_database(str(db))
    return connect(str(db))


def _create_tasks(
    cursor: Cursor, user_id: int, items: Sequence[tuple[int, str | None]], archive_base: str
) -> dict[int, str]:
    from tasknet.site.storage import create, dispatch, usage

    week = usage.iso_week()
    created = {}
    for gid, node in items:
        operation_id = create.reserve(cursor, gid, user_id, f"bench {gid}", "bench-token", week)
        if not create.begin_submit(cursor, gid, operation_id, 1, f"bench gallery {gid}", week):
            raise RuntimeError(f"seeding gid {gid}: quota check refused")
        url = f"{archive_base}/files/{gid}-1.bin"
        create.persist_submitted(cursor, gid, operation_id, url, 1, week)
        if node is not None and dispatch.claim_task(cursor, gid, [node]) is None:
            raise RuntimeError(f"seeding gid {gid}: could not assign it to {node}")
        created[gid] = operation_id
    return created


def _mark_outbox_delivered(cursor: Cursor) -> None:
    from tasknet.site.storage import outbox

    # Every row so far is the seeding's own: one range covers them all.
    outbox.mark_range_fanned_out(cursor, 0, outbox.last_id(cursor), skip_webhook=True)


def seed_site(
    db: Path | str,
    *,
    node_count: int = 0,
    assigned: Mapping[int, Iterable[int]] | None = None,
    unassigned: Iterable[int] = (),
    archive_base: str = "http://127.0.0.1:9",
    keep_ids: bool = True,
) -> Seeded:
    """Create the database ``db`` with a bench user, ``node_count`` node keys
    (``plan.node_id(i)`` with ``plan.SECRET``) and ``SUBMITTED`` tasks:
    ``assigned[i]`` gids assigned to node ``i``, ``unassigned`` gids to no one.
    ``keep_ids=False``: do not return every task's operationId (B4's
    million)."""
    from tasknet.site.storage import users
    from tasknet.site.storage.engine.database import run_write

    items: list[tuple[int, str | None]] = []
    for index, gids in (assigned or {}).items():
        items.extend((gid, plan.node_id(index)) for gid in gids)
    items.extend((gid, None) for gid in unassigned)

    connection = _connect(db)
    try:
        user, token = run_write(
            connection, lambda c: users.create_user(c, BENCH_USER, admin=True, quota=BENCH_QUOTA)
        )

        def keys(cursor: Cursor) -> None:
            for i in range(node_count):
                users.add_node_key(cursor, plan.node_id(i), plan.SECRET)

        run_write(connection, keys)
        seeded = Seeded(token=token, user_id=user.id)
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            created = run_write(connection, _create_tasks, user.id, chunk, archive_base)
            if keep_ids:
                seeded.operation_ids.update(created)
        run_write(connection, _mark_outbox_delivered)
    finally:
        connection.close()
    return seeded
