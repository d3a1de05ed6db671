"""B9's database: a million tasks over 1,000 users (one with 100,000) and 1,000 nodes.

Seeded with the site's own storage functions, in few large transactions
(``CHUNK`` tasks each) on a SQLite file: per task ``create.reserve`` →
``begin_submit`` (with a size) → ``persist_submitted`` and
``dispatch.claim_task`` to its node; then, per node, one
``reports.apply_task_report`` of the chunk's tasks of that node, which moves
them to what the node says (downloading, waiting for compression,
compressing, completed, or held: queued); ``delete.request_delete`` and
``delete.mark_delete_failed`` for the ones being deleted.  The outbox rows
all this wrote are marked delivered (``outbox.mark_range_fanned_out``) and
pruned (``outbox.prune_finished``) in the same transactions, as a site
that had delivered them would.  The mix (of 1,000): 780 completed, 100
queued on their node, 20 submitted and never reported, 50 downloading,
10 waiting for compression, 10 compressing, 20 deleting, 10 whose delete
failed.  Names are three to six words of a fixed vocabulary plus a volume
number; the word :data:`NAME_TERM` is in about 0.5 % of them.

The throughput history of ``/api/stats`` (24 hours of one-minute buckets:
every node downloading for two users every minute) is written by the
site's own ``throughput.sample_reports`` with the sample time of each
minute; it is tied to the clock, so it is rewritten when it is older than
:data:`HISTORY_FRESH_S` (cheap next to the tasks).

Seeding a million tasks takes minutes: the seeded file is kept in the
bench cache (``--cache``) under a name made of the sizes, :data:`FORMAT`
and a digest of the site's schema files, and copied into the work
directory for each run (the site changes it: its instance, sessions).

PostgreSQL (``copy_to_postgres``): the same rows, i.e. the tables of that
SQLite file, loaded into a fresh database (whose schema ``prepare_database``
made) with ``COPY``, identities moved past the copied ids, then
``VACUUM (ANALYZE)`` (as autovacuum would soon do after such a load; done
before anything is measured, so the site and the raw driver see the same
visibility map and statistics).  Seeding
PostgreSQL through the storage functions directly costs ~8 ms per task
(about twenty statements, one round trip each): hours for a million.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import plan

if TYPE_CHECKING:
    from tasknet.site.storage.engine.transactions import Cursor

#: Set to a number of tasks (e.g. 100000) for a B9 run of that size, the
#: million's shape scaled down (users and nodes a thousandth, the heavy
#: user a tenth); ``--quick`` still wins.
TASKS_ENV = "TASKNET_BENCH_B9_TASKS"
#: Tasks per seeding transaction.
CHUNK = 20_000
#: The name-search word (in about 0.5 % of the names).
NAME_TERM = "phoenix"
NAME_TERM_SHARE = 0.005
#: A history younger than this is kept as it is.
HISTORY_FRESH_S = 15 * 60
#: How many users each node downloads for in every minute of the history.
USERS_PER_NODE_MINUTE = 2
GID_BASE = 2_000_000
HEAVY = "heavy"
ADMIN = "bench"
QUOTA = 10**15
#: Bumped whenever what this module writes changes: the cached databases
#: are named by it (and by the schema files), not by this file's bytes.
FORMAT = 1

_WORDS = (
    "alpha amber arcade atlas aurora autumn azure blossom breeze canyon carnival cascade "
    "cedar cipher citadel clover comet coral cosmos crimson crystal dawn delta desert "
    "dragon dream dune echo eclipse ember emerald empire falcon fern festival fjord "
    "flame forest fortune frost galaxy garden glacier harbor harvest haven horizon "
    "island ivory jade jasmine journey jungle karma lagoon lantern legend lotus lunar "
    "magnolia maple marble meadow meteor mirage monsoon mosaic nebula nomad oasis ocean "
    "onyx orbit orchid origin pearl pebble pine planet prairie prism quartz quest "
    "radiant rain raven reef ripple river saffron sage sapphire savanna shadow sierra "
    "silver sky solstice spark spirit spring star storm summit sun thunder tide timber "
    "topaz tundra twilight valley velvet violet voyage willow winter wisp zephyr"
).split()
assert NAME_TERM not in _WORDS

# (share of 1000, what happens to the task): the status mix.
_MIX = (
    (780, "completed"),
    (100, "queued"),
    (20, "submitted"),
    (50, "downloading"),
    (10, "waiting"),
    (10, "compressing"),
    (20, "deleting"),
    (10, "delete_failed"),
)


@dataclass(frozen=True)
class ViewSizes:
    tasks: int
    users: int
    heavy_tasks: int
    nodes: int
    history_minutes: int

    @classmethod
    def of(cls, quick: bool) -> ViewSizes:
        if quick:
            return cls(tasks=2_000, users=10, heavy_tasks=500, nodes=10, history_minutes=30)
        scaled = os.environ.get(TASKS_ENV)
        if scaled:
            # A medium run (e.g. 100,000): the same shape, scaled down.
            tasks = int(scaled)
            if tasks < 1_000:
                raise ValueError(f"{TASKS_ENV} must be at least 1000, got {tasks}")
            return cls(
                tasks=tasks,
                users=max(10, tasks // 1_000),
                heavy_tasks=tasks // 10,
                nodes=max(10, tasks // 1_000),
                history_minutes=1440,
            )
        return cls(
            tasks=1_000_000, users=1_000, heavy_tasks=100_000, nodes=1_000, history_minutes=1440
        )


@dataclass
class ViewSeed:
    """What the benchmark needs to know of a seeded database."""

    path: str
    sizes: ViewSizes
    admin_token: str
    admin_id: int
    heavy_token: str
    heavy_id: int
    seed_seconds: float
    from_cache: bool
    history_seconds: float = 0.0


def _kind(index: int) -> str:
    h = (index * 2654435761) % 1000
    for share, kind in _MIX:
        if h < share:
            return kind
        h -= share
    raise AssertionError("the mix covers 1000")


def gid_of(index: int) -> int:
    return GID_BASE + index


def node_of(index: int, nodes: int) -> int:
    # Not index % nodes: the heavy user's tasks (every 10th) would all sit
    # on a tenth of the nodes.
    return (index + index // 10) % nodes


def user_index(index: int, sizes: ViewSizes) -> int:
    """0: the heavy user (every ``tasks / heavy_tasks``-th task), else 1..users-1."""
    every = max(1, sizes.tasks // sizes.heavy_tasks)
    if index % every == 0:
        return 0
    return 1 + (index // every * (every - 1) + index % every) % (sizes.users - 1)


def _name(rng: random.Random, gid: int) -> str:
    words = rng.sample(_WORDS, rng.randint(3, 6))
    if rng.random() < NAME_TERM_SHARE:
        words[rng.randrange(len(words))] = NAME_TERM
    return " ".join(w.capitalize() for w in words) + f" vol.{gid % 37 + 1}"


def cache_key(sizes: ViewSizes) -> str:
    """Sizes, :data:`FORMAT` and a digest of the site's schema files (a
    change to what this module writes bumps ``FORMAT``)."""
    from bench.cache import digest

    return (
        f"b9-v{FORMAT}-{sizes.tasks}t-{sizes.users}u-{sizes.heavy_tasks}h-{sizes.nodes}n-"
        f"{digest([])}"
    )


# ---------------------------------------------------------------- seeding


def _connect_fresh(path: Path) -> Any:
    from tasknet.site.storage.engine.database import connect
    from tasknet.site.storage.engine.schema import prepare_database

    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    prepare_database(str(path))
    return connect(str(path))


def _users(cursor: Cursor, sizes: ViewSizes) -> list[tuple[int, str, str]]:
    """(id, name, token) of each user, index 0 the heavy one, 1 the admin."""
    from tasknet.site.storage import users

    made = []
    for n in range(sizes.users):
        name = HEAVY if n == 0 else ADMIN if n == 1 else f"user-{n:04d}"
        user, token = users.create_user(cursor, name, admin=n == 1, quota=QUOTA)
        made.append((user.id, name, token))
    for i in range(sizes.nodes):
        users.add_node_key(cursor, plan.node_id(i), plan.SECRET)
    return made


def _seed_chunk(
    cursor: Cursor, sizes: ViewSizes, user_ids: list[int], start: int, stop: int, revision: int
) -> None:
    from tasknet.protocol.messages import TaskEntry, TaskReport
    from tasknet.site.storage import create, delete, dispatch, outbox, reports, usage
    from tasknet.status import NodeCode

    rng = random.Random(start)
    week = usage.iso_week()
    per_node: dict[int, list[TaskEntry]] = {}
    operations: dict[int, dict[int, str]] = {}
    deleting: list[tuple[int, bool]] = []
    for index in range(start, stop):
        gid = gid_of(index)
        user_id = user_ids[user_index(index, sizes)]
        node = node_of(index, sizes.nodes)
        name = _name(rng, gid)
        op = create.reserve(cursor, gid, user_id, name, f"t{gid}", week)
        size = rng.randrange(20, 800) * 2**20
        if not create.begin_submit(cursor, gid, op, 1, name, week, size):
            raise RuntimeError(f"seeding gid {gid}: the quota check refused it")
        create.persist_submitted(cursor, gid, op, f"http://127.0.0.1:9/files/{gid}.zip", 1, week)
        if dispatch.claim_task(cursor, gid, [plan.node_id(node)]) is None:
            raise RuntimeError(f"seeding gid {gid}: not assigned to its node")
        kind = _kind(index)
        entry = {
            "completed": TaskEntry(gid, int(NodeCode.COMPLETED), 1.0),
            "queued": TaskEntry(gid, int(NodeCode.DOWNLOADING), 0.0, queued=True),
            "downloading": TaskEntry(gid, int(NodeCode.DOWNLOADING), rng.random() * 0.9 + 0.05),
            "waiting": TaskEntry(gid, int(NodeCode.WAITING_COMPRESSION), 1.0),
            "compressing": TaskEntry(gid, int(NodeCode.COMPRESSING), rng.random()),
        }.get(kind)
        if entry is not None:
            per_node.setdefault(node, []).append(entry)
            operations.setdefault(node, {})[gid] = op
        elif kind in ("deleting", "delete_failed"):
            deleting.append((gid, kind == "delete_failed"))
    for node, entries in per_node.items():
        report = TaskReport(
            report_id=f"seed-{node}-{revision}",
            revision=revision,
            gallery_tasks=tuple(entries),
            operation_ids=operations[node],
            deleted=(),
        )
        outcome = reports.apply_task_report(cursor, plan.node_id(node), report)
        if len(outcome.applied) != len(entries):
            raise RuntimeError(f"seeding: node {node}'s report not applied: {outcome}")
    for gid, failed in deleting:
        started = delete.request_delete(cursor, gid, None)
        if failed:
            delete.mark_delete_failed(cursor, gid, started.delete_operation_id, "bench: disk full")
    # As a site that delivered them: marked, then pruned.
    last = outbox.last_id(cursor)
    outbox.mark_range_fanned_out(cursor, 0, last, skip_webhook=True)
    outbox.prune_finished(cursor, 0, last + 1, 10**9)


def seed_tasks(path: Path, sizes: ViewSizes, log: Any = print) -> dict[str, Any]:
    """Seed the tasks, users and nodes of ``sizes`` into a fresh SQLite ``path``."""
    from tasknet.site.storage.engine.database import run_write

    started = time.monotonic()
    connection = _connect_fresh(path)
    try:
        made = run_write(connection, _users, sizes)
        user_ids = [user_id for user_id, _, _ in made]
        revision = int(time.time() * 1000)
        for start in range(0, sizes.tasks, CHUNK):
            stop = min(sizes.tasks, start + CHUNK)
            revision += 1
            run_write(connection, _seed_chunk, sizes, user_ids, start, stop, revision)
            if stop % (10 * CHUNK) == 0 or stop == sizes.tasks:
                rate = stop / (time.monotonic() - started)
                log(f"   B9 seeding: {stop} of {sizes.tasks} tasks ({rate:.0f}/s)")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    return {
        "admin": {"id": made[1][0], "token": made[1][2]},
        "heavy": {"id": made[0][0], "token": made[0][2]},
        "seed_seconds": time.monotonic() - started,
    }


def _history_minutes(cursor: Cursor, sizes: ViewSizes, user_ids: list[int], first: int, last: int):
    from tasknet.protocol.messages import TaskEntry
    from tasknet.site.storage import throughput
    from tasknet.status import NodeCode

    downloading = int(NodeCode.DOWNLOADING)
    for minute in range(first, last + 1):
        rng = random.Random(minute)
        batch = []
        rows = {}
        for node in range(sizes.nodes):
            entries, before = {}, {}
            for j in range(USERS_PER_NODE_MINUTE):
                key = node * USERS_PER_NODE_MINUTE + j  # a synthetic id: rows are not touched
                user = 0 if rng.random() < sizes.heavy_tasks / sizes.tasks else None
                if user is None:
                    user = rng.randrange(1, sizes.users)
                old = rng.random() * 0.5
                entries[key] = TaskEntry(key, downloading, old + rng.random() * 0.4)
                before[key] = {"status": downloading, "progress": old}
                rows[key] = {
                    "gid": key,
                    "user_id": user_ids[user],
                    "size": 300 * 2**20,
                    "speed": None,
                    "sampled_at": None,
                    "moved_at": None,
                }
            batch.append((plan.node_id(node), list(entries), entries, before))
        # Only the minute buckets, node bytes and node_seen are written;
        # the returned samples (the tasks' own columns) are not.
        throughput.sample_reports(cursor, batch, rows, now=minute * 60 + 30)


def write_history(path: Path, sizes: ViewSizes, log: Any = print) -> float:
    """Replace the throughput history by ``history_minutes`` minutes up to now."""
    from tasknet.site.storage.engine.database import connect, run_write

    started = time.monotonic()
    connection = connect(str(path))
    try:
        user_ids = [
            int(r[0]) for r in connection.execute('SELECT id FROM "user" ORDER BY id').fetchall()
        ]
        connection.execute("DELETE FROM throughput_minute")
        connection.execute("DELETE FROM throughput_total")  # its rollups (schema v8)
        connection.execute("DELETE FROM throughput_node")
        connection.execute("DELETE FROM node_bytes")
        now_minute = int(time.time() // 60)
        first = now_minute - sizes.history_minutes + 1
        for start in range(first, now_minute + 1, 60):
            stop = min(now_minute, start + 59)
            run_write(connection, _history_minutes, sizes, user_ids, start, stop)
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    seconds = time.monotonic() - started
    log(f"   B9 history: {sizes.history_minutes} minutes x {sizes.nodes} nodes in {seconds:.0f}s")
    return seconds


def _history_age(path: Path) -> float:
    connection = sqlite3.connect(str(path))
    try:
        (newest,) = connection.execute("SELECT MAX(minute) FROM throughput_minute").fetchone()
    finally:
        connection.close()
    return float("inf") if newest is None else time.time() - int(newest) * 60


def prepare(directory: Path, sizes: ViewSizes, cache: Path | None, log: Any = print) -> ViewSeed:
    """The seeded SQLite file for this run, ``directory/views.sqlite``: from
    the cache when it has one of these sizes, else seeded (and cached)."""
    import json

    target = directory / "views.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    key = cache_key(sizes)
    cached = cache / f"{key}.sqlite" if cache is not None else None
    meta_path = cache / f"{key}.json" if cache is not None else None
    from_cache = cached is not None and cached.exists() and meta_path is not None
    if from_cache:
        assert cached is not None and meta_path is not None
        meta = json.loads(meta_path.read_text())
        log(f"   B9: seeded database from the cache ({cached})")
    else:
        fresh = directory / "views-seed.sqlite"
        meta = seed_tasks(fresh, sizes, log)
        history = write_history(fresh, sizes, log)
        meta["history_seconds"] = history
        if cached is not None and meta_path is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".tmp")
            shutil.copyfile(fresh, tmp)
            tmp.replace(cached)
            meta_path.write_text(json.dumps(meta))
            log(f"   B9: cached the seeded database as {cached}")
        fresh.replace(target)
    if from_cache:
        assert cached is not None
        shutil.copyfile(cached, target)
    history_seconds = 0.0
    if _history_age(target) > HISTORY_FRESH_S:
        history_seconds = write_history(target, sizes, log)
        if cached is not None and from_cache:
            shutil.copyfile(target, cached)  # fresh again for the next run
    return ViewSeed(
        path=str(target),
        sizes=sizes,
        admin_token=meta["admin"]["token"],
        admin_id=int(meta["admin"]["id"]),
        heavy_token=meta["heavy"]["token"],
        heavy_id=int(meta["heavy"]["id"]),
        seed_seconds=float(meta["seed_seconds"]),
        from_cache=from_cache,
        history_seconds=history_seconds,
    )


# ---------------------------------------------------------------- PostgreSQL

#: The tables copied (the seed's rows; the site's runtime tables -- its
#: instance, sessions, leases -- start empty, as on SQLite after a restart).
COPIED_TABLES = (
    "user",
    "gallery",
    "task_operation",
    "weekly_usage",
    "favorite",
    "node_key",
    "node_seen",
    "node_revision",
    "node_bytes",
    "node_dropped_entry",
    "throughput_minute",
    "throughput_total",
    "throughput_node",
    "report_receipt",
    "task_count",
    "node_task_count",
)
#: Identity columns to move past the copied ids.
IDENTITIES = (("user", "id"), ("gallery", "id"))


def _rows(connection: sqlite3.Connection, sql: str) -> Iterator[tuple[Any, ...]]:
    cursor = connection.execute(sql)
    while True:
        batch = cursor.fetchmany(10_000)
        if not batch:
            return
        yield from batch


def copy_to_postgres(sqlite_path: str, url: str, log: Any = print) -> dict[str, Any]:
    """The rows of ``sqlite_path`` into the fresh PostgreSQL database ``url``."""
    import psycopg

    from tasknet.site.storage.engine.schema import prepare_database

    started = time.monotonic()
    prepare_database(url)
    source = sqlite3.connect(sqlite_path)
    counts: dict[str, int] = {}
    try:
        with psycopg.connect(url, autocommit=False) as target:
            # The rows are the site's, consistent already: no triggers (the
            # transition checks would see a DELETE_PENDING row appear from
            # nothing) and no foreign-key checks while they are copied.
            target.execute("SET session_replication_role = replica")
            pg_columns: dict[str, list[str]] = {}
            for table in COPIED_TABLES:
                found = target.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                    " AND is_generated = 'NEVER' AND identity_generation IS DISTINCT FROM"
                    " 'ALWAYS' ORDER BY ordinal_position",
                    (table,),
                ).fetchall()
                pg_columns[table] = [r[0] for r in found]
            for table in COPIED_TABLES:
                mine = [r[1] for r in source.execute(f'PRAGMA table_info("{table}")')]
                columns = [c for c in mine if c in pg_columns[table]]
                if not columns:
                    continue
                names = ", ".join(f'"{c}"' for c in columns)
                n = 0
                with target.cursor().copy(f'COPY "{table}" ({names}) FROM STDIN') as copy:
                    for row in _rows(source, f'SELECT {names} FROM "{table}"'):  # noqa: S608
                        copy.write_row(row)
                        n += 1
                counts[table] = n
            for table, column in IDENTITIES:
                serial = f"pg_get_serial_sequence('\"{table}\"', '{column}')"
                highest = f'SELECT COALESCE(MAX("{column}"), 0) + 1 FROM "{table}"'  # noqa: S608
                target.execute(f"SELECT setval({serial}, ({highest}), false)")
            target.commit()
        with psycopg.connect(url, autocommit=True) as target:
            # VACUUM too, not only ANALYZE: until the visibility map is set,
            # an index-only scan visits the heap for every row, and
            # autovacuum would set it at some moment in the middle of the
            # measurements (the site's half or the raw driver's).
            target.execute("VACUUM (ANALYZE)")
    finally:
        source.close()
    seconds = time.monotonic() - started
    log(f"   B9: copied {sum(counts.values())} rows into PostgreSQL in {seconds:.0f}s")
    return {"seconds": seconds, "rows": counts}


def describe(seed: ViewSeed) -> dict[str, Any]:
    return {**asdict(seed), "admin_token": "(redacted)", "heavy_token": "(redacted)"}
