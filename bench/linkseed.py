"""A million-task site database for B11's link issue, seeded fast by SQL.

B9's database (``bench.viewseed``) goes through the site's storage
functions task by task: here that ran at about 240 tasks a second, over an
hour for a million.  B11's link figure only needs a database of that size
and shape, so this seeds a small template the same way (``viewseed``'s
``seed_tasks``: :data:`TEMPLATE_TASKS` tasks, 20 users, 20 nodes, B9's
status mix) and then copies the template's ``task_operation`` and
``gallery`` rows by SQL (``INSERT ... SELECT`` over a recursive CTE of copy
numbers, about :data:`CHUNK` rows per transaction) until there are
``tasks``, spread over :data:`NODES` nodes.  Every trigger of the schema
runs as for any insert (the status key, the per-user and per-node counts,
the name search table, the operation-state guards: a ``DELETE_PENDING``
copy is inserted ``SUBMITTED`` and then moved, as the site does).  Copy
``n`` of template gid ``g`` is gid ``g + n * TEMPLATE_TASKS`` with ``-n``
after its operation ids and its name.  Three completed tasks in four then
get an archive size and a (made-up) digest, as a node's v2 completion
reports them.

The file is kept in the bench cache under a name made of the size and a
digest of this module and of the site's schema files (``bench.cache``).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import cache, plan, viewseed

if TYPE_CHECKING:
    from tasknet.site.storage.engine.transactions import Cursor

#: Tasks seeded through the site's own functions, then copied.
TEMPLATE_TASKS = 5_000
#: Rows (about) per copying transaction.
CHUNK = 100_000
#: Nodes the copies are spread over (B9's 1,000: a node holds about a
#: thousand tasks, so the bench's node is not sent tens of thousands of
#: commands when it logs in).
NODES = 1_000
FORMAT = 2


def template_sizes(tasks: int = TEMPLATE_TASKS) -> viewseed.ViewSizes:
    return viewseed.ViewSizes(
        tasks=tasks, users=20, heavy_tasks=tasks // 10, nodes=20, history_minutes=60
    )


def cache_key(tasks: int) -> str:
    return f"b11-links-v{FORMAT}-{tasks}t-{TEMPLATE_TASKS}x-{cache.digest([Path(__file__)])}"


def _columns(connection: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in connection.execute(f'PRAGMA table_info("{table}")')]


def _copy_sql(
    connection: sqlite3.Connection, table: str, overrides: dict[str, str]
) -> tuple[str, str]:
    """The column list and the select list copying ``table``'s template row
    ``t`` as copy ``k.n`` (``overrides``: column -> expression)."""
    columns = [c for c in _columns(connection, table) if c != "id" or table != "gallery"]
    selected = [overrides.get(c, f't."{c}"') for c in columns]
    return ", ".join(f'"{c}"' for c in columns), ", ".join(selected)


def _copies(
    connection: sqlite3.Connection, template: int, tasks: int, first: int, last: int
) -> None:
    """Copies ``first``..``last`` of the template's rows (no gid past
    ``tasks``), in one transaction."""
    base = viewseed.GID_BASE
    stride = template
    new_gid = f"t.gid + k.n * {stride}"
    copies = (
        f"WITH RECURSIVE k(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM k WHERE n < {last})"  # noqa: S608
    )
    in_template = f"t.gid BETWEEN {base} AND {base + template - 1} AND {new_gid} < {base + tasks}"
    op_columns, op_select = _copy_sql(
        connection,
        "task_operation",
        {
            "gid": new_gid,
            "operation_id": "t.operation_id || '-' || k.n",
            "delete_operation_id": "t.delete_operation_id || '-' || k.n",
            # Inserted as the state a new row may start in; moved below.
            "state": "CASE t.state WHEN 'DELETE_PENDING' THEN 'SUBMITTED' ELSE t.state END",
        },
    )
    gallery_columns, gallery_select = _copy_sql(
        connection,
        "gallery",
        {
            "gid": new_gid,
            "name": "t.name || ' -' || k.n",
            "url": f"'http://127.0.0.1:9/files/' || ({new_gid}) || '.zip'",
            # Template node i's copies go to nodes i + 20n (mod NODES).
            "node_id": (
                f"CASE WHEN t.node_id IS NULL THEN NULL ELSE '{plan.NODE_PREFIX}' || printf('%04d',"
                f" (CAST(substr(t.node_id, {len(plan.NODE_PREFIX) + 1}) AS INTEGER)"
                f" + k.n * {template_sizes().nodes}) % {NODES}) END"
            ),
        },
    )
    with connection:
        connection.execute(
            f"{copies} INSERT INTO task_operation ({op_columns})"  # noqa: S608 (our own SQL)
            f" SELECT {op_select} FROM k, task_operation t WHERE {in_template}"
        )
        connection.execute(
            "UPDATE task_operation SET state = 'DELETE_PENDING'"  # noqa: S608 (numbers of ours)
            " WHERE delete_operation_id IS NOT NULL AND state = 'SUBMITTED'"
            f" AND gid >= {base + first * stride}"
        )
        connection.execute(
            f"{copies} INSERT INTO gallery ({gallery_columns})"  # noqa: S608 (our own SQL)
            f" SELECT {gallery_select} FROM k, gallery t WHERE {in_template}"
        )


def _node_keys(cursor: Cursor, first: int) -> None:
    from tasknet.site.storage import users

    for index in range(first, NODES):
        users.add_node_key(cursor, plan.node_id(index), plan.SECRET)


def seed(path: Path, tasks: int, log: Any = print) -> dict[str, Any]:
    """Seed ``tasks`` tasks into a fresh SQLite ``path`` (module doc)."""
    from tasknet.site.storage.engine.database import connect, run_write

    started = time.monotonic()
    template = min(tasks, TEMPLATE_TASKS)
    meta = viewseed.seed_tasks(path, template_sizes(template), log)
    log(f"   B11 links: a {template:,}-task template in {time.monotonic() - started:.0f}s")
    connection = connect(str(path))
    assert isinstance(connection, sqlite3.Connection)  # a file path: SQLite
    try:
        run_write(connection, _node_keys, template_sizes().nodes)
        per_chunk = max(1, CHUNK // template)
        total_copies = -(-tasks // template)  # the template is copy 0
        for first in range(1, total_copies, per_chunk):
            last = min(total_copies - 1, first + per_chunk - 1)
            _copies(connection, template, tasks, first, last)
            done = min(tasks, (last + 1) * template)
            log(
                f"   B11 links: {done:,} of {tasks:,} tasks"
                f" ({done / (time.monotonic() - started):.0f}/s)"
            )
        with connection:
            connection.execute(
                "UPDATE gallery SET archive_size = size, archive_sha256 ="
                " printf('%016x%016x%016x%016x', random(), random(), random(), random())"
                " WHERE status = 4 AND gid % 4 <> 0"
            )
        connection.execute("PRAGMA optimize")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    meta["seed_seconds"] = time.monotonic() - started
    log(f"   B11 links: {tasks:,} tasks in {meta['seed_seconds']:.0f}s")
    return meta


def prepare(
    directory: Path, tasks: int, cache_dir: Path | None, log: Any = print
) -> viewseed.ViewSeed:
    """``directory/links.sqlite`` with ``tasks`` tasks: from the cache, or seeded (and cached)."""
    target = directory / "links.sqlite"
    meta, from_cache = cache.seeded_copy(
        cache_dir, cache_key(tasks), target, lambda path: seed(path, tasks, log), log
    )
    if from_cache:
        log(f"   B11 links: {tasks:,}-task database from the cache")
    sizes = template_sizes(TEMPLATE_TASKS)
    return viewseed.ViewSeed(
        path=str(target),
        sizes=viewseed.ViewSizes(
            tasks=tasks,
            users=sizes.users,
            heavy_tasks=sizes.heavy_tasks,
            nodes=NODES,
            history_minutes=sizes.history_minutes,
        ),
        admin_token=meta["admin"]["token"],
        admin_id=int(meta["admin"]["id"]),
        heavy_token=meta["heavy"]["token"],
        heavy_id=int(meta["heavy"]["id"]),
        seed_seconds=float(meta["seed_seconds"]),
        from_cache=from_cache,
    )
