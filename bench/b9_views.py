"""B9 views at scale: p50/p99 of the task views over a million tasks, 1 and 8 clients.

The database (``bench.viewseed``): 1,000,000 tasks over 1,000 users, one of
whom (``heavy``) holds 100,000, on 1,000 nodes, with 24 hours of
throughput history, seeded with the site's own storage functions (kept in
the bench cache between runs; on PostgreSQL the same rows, copied).  The
site is ``twistd -n tasknet-site`` on it; the clients are
``bench.viewload`` in their own process.

Every view a person opens, for the heavy user (their 100,000) and for an
admin (all 1,000,000): the first page of ``/api/tasks``, a later page (the
21st, by the cursor the 20th gave), each status tab (``?status=`` every
filter key), a substring search of a gid (``?q=`` five digits) and of a
name (``?q=`` a word), ``/api/tasks/counts``, ``/api/stats`` over 24 h,
and (admin) the node panel ``/api/admin/nodes``; each by one client, then
by 8 concurrent clients.

Baseline, same run: the same queries' plain SQL through the raw driver
(``bench.rawsql``: each view's storage function run once, every statement
it sent written down, then those statements sent again on a raw
connection of their own, rows fetched as tuples, nothing built), one
thread, then 8 threads with a connection each.  The ratio is the raw
driver's p99 over the site's (below 1: the site is slower).

Target: every p99 under 50 ms on SQLite, 100 ms on PostgreSQL.  For each
query that misses, the plan of its slowest statements (``EXPLAIN QUERY
PLAN`` / ``EXPLAIN (ANALYZE, BUFFERS)``) goes into the notes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench import rawsql, viewseed
from bench.b1_reports import row_id
from bench.harness import Context, Row, percentile
from bench.pg_baseline import cpu_delta
from bench.procs import REPO_ROOT, BenchError
from bench.services import start_site

TARGET_SQLITE_MS = 50.0
TARGET_PG_MS = 100.0
CONCURRENT = 8
#: The later page is the one after this many pages.
PAGES_DEEP = 20
PAGE = 50
#: Five digits: a gid substring (gids are 2,000,000..2,999,999).
GID_TERM = "12345"
STATS_WINDOW = 24 * 3600
#: Statements of a missed query whose plan is shown (the slowest first).
EXPLAIN_TOP = 2


def _sampling(quick: bool) -> dict[str, dict[str, float]]:
    """Per mode: at most ``max`` samples, stop after ``seconds`` once each
    client has ``min / clients`` of them."""
    if quick:
        return {
            "one": {"max": 2, "min": 1, "seconds": 0.05},
            "many": {"max": 8, "min": 8, "seconds": 0.05},
        }
    return {
        "one": {"max": 30, "min": 5, "seconds": 3.0},
        "many": {"max": 120, "min": 16, "seconds": 4.0},
    }


@dataclass
class ViewQuery:
    name: str
    path: str
    token: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    statements: list[rawsql.Statement] = field(default_factory=list)


def _walk_pages(target: str, user_id: int | None) -> str:
    """The ``next`` of page ``PAGES_DEEP`` (newest first) of ``user_id``'s
    tasks, or of the last page that has one (a small quick run); "" if none."""
    from tasknet.site.storage import views
    from tasknet.site.storage.engine.database import connect, run_read

    connection = connect(target)
    deepest = ""
    try:
        after = None
        for _ in range(PAGES_DEEP):
            query = views.TaskQuery(user_id=user_id, limit=PAGE, after=after)
            _, following, _ = run_read(connection, views.list_tasks, query)
            if following is None:
                break
            deepest = str(following)
            after = views.parse_cursor(views.Order.NEWEST, deepest)
    finally:
        connection.close()
    return deepest


def _page(
    scope_name: str, scope: int | None, token: str, name: str, path: str, **query: Any
) -> ViewQuery:
    from tasknet.site.storage import views

    task_query = views.TaskQuery(user_id=scope, limit=PAGE, **query)
    return ViewQuery(f"{scope_name}: {name}", path, token, views.list_tasks, (task_query,))


#: A quick run's status tabs (the others are the same statement).
QUICK_TABS = ("SUBMITTED", "QUEUED")


def build_queries(
    target: str, seed: viewseed.ViewSeed, now: float, quick: bool = False
) -> list[ViewQuery]:
    """Every view, for the heavy user and for an admin, and the node panel."""
    from tasknet.site.storage import stats, views

    out: list[ViewQuery] = []
    for scope_name, scope, caller, token in (
        ("heavy", seed.heavy_id, seed.heavy_id, seed.heavy_token),
        ("admin", None, seed.admin_id, seed.admin_token),
    ):
        who = (scope_name, scope, token)
        out.append(_page(*who, "first page", "/api/tasks"))
        deep = _walk_pages(target, scope)
        if deep:
            after = views.parse_cursor(views.Order.NEWEST, deep)
            path = f"/api/tasks?after={quote(deep)}"
            out.append(_page(*who, f"page {PAGES_DEEP + 1}", path, after=after))
        for key in QUICK_TABS if quick else views.FILTER_KEYS:
            out.append(
                _page(*who, f"tab {key}", f"/api/tasks?status={key}", statuses=frozenset({key}))
            )
        out.append(
            _page(*who, f"search gid {GID_TERM!r}", f"/api/tasks?q={GID_TERM}", text=GID_TERM)
        )
        term = viewseed.NAME_TERM
        out.append(_page(*who, f"search name {term!r}", f"/api/tasks?q={term}", text=term))
        out.append(
            ViewQuery(
                f"{scope_name}: counts",
                "/api/tasks/counts",
                token,
                views.count_by_status,
                (scope, "", True),
            )
        )
        out.append(
            ViewQuery(
                f"{scope_name}: stats 24 h",
                f"/api/stats?window={STATS_WINDOW}",
                token,
                stats.stats,
                (caller, scope, STATS_WINDOW, now),
            )
        )
    from tasknet.site.storage import node_panel

    out.append(
        ViewQuery(
            "admin: node panel",
            "/api/admin/nodes",
            seed.admin_token,
            node_panel.node_panel,
            (now, node_panel.Registry("site", None, shared=False)),
        )
    )
    return out


def run_site_clients(
    directory: Path,
    site_url: str,
    queries: list[ViewQuery],
    clients: int,
    sampling: dict[str, float],
) -> dict[str, Any]:
    host, port = site_url.removeprefix("http://").rsplit(":", 1)
    plan = {
        "host": host,
        "port": int(port),
        "clients": clients,
        "max_samples": sampling["max"],
        "min_samples": sampling["min"],
        "seconds": sampling["seconds"],
        "queries": [{"name": q.name, "path": q.path, "token": q.token} for q in queries],
    }
    plan_file = directory / f"viewload-{clients}.json"
    plan_file.write_text(json.dumps(plan))
    log = directory / f"viewload-{clients}.log"
    with open(log, "wb") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "bench.viewload", str(plan_file)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=3600,
        )
    if done.returncode != 0:
        raise BenchError(f"view load failed ({done.returncode}); see {log}")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def _raw_query(
    replayers: list[rawsql.Replayer], query: ViewQuery, sampling: dict[str, float]
) -> dict[str, Any]:
    clients = len(replayers)
    ms: list[float] = []
    per_statement: list[list[float]] = []
    errors: list[str] = []
    lock = threading.Lock()
    least_each = max(1, -(-int(sampling["min"]) // clients))
    barrier = threading.Barrier(clients)

    def client(replayer: rawsql.Replayer) -> None:
        barrier.wait()
        began = time.perf_counter()
        mine = 0
        while True:
            with lock:
                if len(ms) >= sampling["max"]:
                    return
            if mine >= least_each and time.perf_counter() - began > sampling["seconds"]:
                return
            timings: list[float] = []
            t0 = time.perf_counter()
            try:
                replayer.run(query.statements, timings)
            except Exception as error:
                with lock:
                    errors.append(f"{type(error).__name__}: {error}")
                return
            elapsed = (time.perf_counter() - t0) * 1000
            mine += 1
            with lock:
                ms.append(elapsed)
                per_statement.append(timings)

    threads = [threading.Thread(target=client, args=(r,)) for r in replayers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"ms": ms, "per_statement": per_statement, "errors": errors[:3]}


def run_raw(
    target: str, queries: list[ViewQuery], clients: int, sampling: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """The recorded statements of each query, ``clients`` threads at once,
    each with a connection of its own."""
    replayers = [rawsql.Replayer(target, any_thread=True) for _ in range(clients)]
    try:
        return {query.name: _raw_query(replayers, query, sampling) for query in queries}
    finally:
        for replayer in replayers:
            replayer.close()


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def run(ctx: Context) -> Row:
    sizes = viewseed.ViewSizes.of(ctx.quick)
    directory = ctx.scratch(row_id(ctx, "b9").lower())
    pg = ctx.pg if ctx.on_postgres else None
    target_ms = TARGET_PG_MS if pg else TARGET_SQLITE_MS
    sampling = _sampling(ctx.quick)

    seed = viewseed.prepare(directory, sizes, ctx.cache)
    target = seed.path
    copy_seconds = None
    if pg is not None:
        target = pg.database("views")
        copy_seconds = viewseed.copy_to_postgres(seed.path, target)["seconds"]

    now = time.time()
    queries = build_queries(target, seed, now, ctx.quick)
    for query in queries:
        query.statements, _ = rawsql.record(target, query.fn, *query.args)

    site_results: dict[int, dict[str, Any]] = {}
    site_cpu: dict[int, float] = {}
    server_cpu: dict[int, float] = {}
    site = start_site(
        directory, target, upstream_url="http://127.0.0.1:9", timeout=600, name="site"
    )
    try:
        startup_s = time.time() - site.started_at
        for clients, mode in ((1, "one"), (CONCURRENT, "many")):
            cpu0 = site.proc.cpu_seconds()
            pg0 = pg.cpu_seconds() if pg is not None else {}
            t0 = time.monotonic()
            site_results[clients] = run_site_clients(
                directory, site.http_url, queries, clients, sampling[mode]
            )
            elapsed = time.monotonic() - t0
            site_cpu[clients] = (site.proc.cpu_seconds() - cpu0) / elapsed
            if pg is not None:
                server_cpu[clients] = cpu_delta(pg0, pg.cpu_seconds()) / elapsed
        rss = site.proc.memory()
        if not site.proc.alive:
            raise site.proc.died("answering the views")
    finally:
        site.proc.stop()

    raw_results = {
        clients: run_raw(target, queries, clients, sampling[mode])
        for clients, mode in ((1, "one"), (CONCURRENT, "many"))
    }

    errors = {
        f"{name} ({side}, {clients})": r["errors"]
        for side, sides in (("site", site_results), ("raw", raw_results))
        for clients, results in sides.items()
        for name, r in results.items()
        if r["errors"]
    }

    table: list[dict[str, Any]] = []
    for query in queries:
        entry: dict[str, Any] = {"name": query.name, "path": query.path}
        for clients in (1, CONCURRENT):
            ours = site_results[clients][query.name]["ms"]
            raw = raw_results[clients][query.name]["ms"]
            entry[str(clients)] = {
                "n": len(ours),
                "p50": _p(ours, 50),
                "p99": _p(ours, 99),
                "raw_n": len(raw),
                "raw_p50": _p(raw, 50),
                "raw_p99": _p(raw, 99),
            }
        entry["bytes"] = site_results[1][query.name]["bytes"]
        entry["statements"] = sum(1 for s in query.statements if rawsql.is_query(s))
        table.append(entry)

    def worst_p99(entry: dict[str, Any]) -> float:
        return max(entry[str(c)]["p99"] or 0.0 for c in (1, CONCURRENT))

    misses = [e for e in table if worst_p99(e) >= target_ms]
    worst = max(table, key=worst_p99)
    worst_clients = max((1, CONCURRENT), key=lambda c: worst[str(c)]["p99"] or 0.0)
    cell = worst[str(worst_clients)]
    row = Row(
        bench=row_id(ctx, "B9"),
        title="views" + (" (PostgreSQL)" if pg else ""),
        unit="ms worst p99",
        figure=cell["p99"],
        baseline=cell["raw_p99"],
        lower_is_better=True,
        baseline_label=(
            "the same queries' plain SQL through the raw "
            f"{'psycopg' if pg else 'sqlite3'} driver (recorded from each view's storage "
            "function, replayed on own connections, rows fetched, nothing built); "
            "ratio = raw p99 / site p99"
        ),
        p50_ms=cell["p50"],
        p99_ms=cell["p99"],
        target=f"every p99 < {target_ms:.0f} ms",
    )
    row.ratio_note = f"({worst['name']}, {worst_clients} client{'s' * (worst_clients > 1)})"
    row.met = not misses and not errors
    if errors:
        row.notes.append(f"requests that failed: {dict(list(errors.items())[:5])}")
    source = "from the cache" if seed.from_cache else f"seeded in {seed.seed_seconds:.0f}s"
    row.notes.append(
        f"{sizes.tasks} tasks, {sizes.users} users (heavy: {sizes.heavy_tasks}), {sizes.nodes} "
        f"nodes, {sizes.history_minutes} min of history; database {source}"
        + (f", copied into PostgreSQL in {copy_seconds:.0f}s" if copy_seconds is not None else "")
        + f"; site up in {startup_s:.1f}s; site CPU {100 * site_cpu[1]:.0f}% (1 client) / "
        f"{100 * site_cpu[CONCURRENT]:.0f}% ({CONCURRENT} clients) of one core"
        + (
            f", PostgreSQL server {100 * server_cpu[1]:.0f}% / {100 * server_cpu[CONCURRENT]:.0f}%"
            if server_cpu
            else ""
        )
        + f"; site peak RSS {rss.get('VmHWM', 0) / 2**20:.0f} MiB"
    )
    row.notes.append(
        f"{len(misses)} of {len(table)} queries miss p99 < {target_ms:.0f} ms. Per query, "
        f"p50/p99 ms site | raw, 1 client ; {CONCURRENT} clients (samples):"
    )
    for e in table:
        one, many = e["1"], e[str(CONCURRENT)]
        mark = "MISS " if e in misses else "     "
        row.notes.append(
            f"  {mark}{e['name']}: {_fmt(one['p50'])}/{_fmt(one['p99'])} | "
            f"{_fmt(one['raw_p50'])}/{_fmt(one['raw_p99'])} (n={one['n']}) ; "
            f"{_fmt(many['p50'])}/{_fmt(many['p99'])} | {_fmt(many['raw_p50'])}/"
            f"{_fmt(many['raw_p99'])} (n={many['n']}); {e['bytes']} bytes, "
            f"{e['statements']} statement(s)"
        )
    plans: dict[str, list[dict[str, Any]]] = {}
    by_name = {q.name: q for q in queries}
    # A quick run's misses say nothing (tiny sizes, a busy machine): one
    # plan proves the path.
    for e in misses[:1] if ctx.quick else misses:
        query = by_name[e["name"]]
        runs = raw_results[1][query.name]["per_statement"]
        if not runs:
            continue
        # The slowest statements of the query (median over the raw runs).
        n = len(runs[0])
        medians = [sorted(r[i] for r in runs if len(r) == n)[len(runs) // 2] for i in range(n)]
        order = sorted(range(n), key=lambda i: -medians[i])
        shown = []
        for i in order:
            statement = query.statements[i]
            if not rawsql.is_query(statement):
                continue
            try:
                plan = rawsql.explain(target, statement)
            except Exception as error:  # a plan is an aid; its failure is not the row's
                plan = [f"(EXPLAIN failed: {type(error).__name__}: {error})"]
            shown.append(
                {
                    "sql": rawsql.one_line(statement.sql, 2000),
                    "params": repr(statement.params)[:300],
                    "raw_ms": medians[i] * 1000,
                    "plan": plan,
                }
            )
            if len(shown) >= EXPLAIN_TOP:
                break
        plans[query.name] = shown
        for s in shown:
            row.notes.append(
                f"  plan, {query.name} ({s['raw_ms']:.1f} ms raw): {rawsql.one_line(s['sql'])}"
            )
            row.notes.extend(f"      {line}" for line in s["plan"][:25])
    row.details = {
        "backend": ctx.backend,
        "sizes": asdict(sizes),
        "seed": viewseed.describe(seed),
        "copy_seconds": copy_seconds,
        "startup_s": startup_s,
        "site_cpu_fraction": site_cpu,
        "postgres_cpu_fraction": server_cpu,
        "site_peak_rss_bytes": rss.get("VmHWM"),
        "sampling": sampling,
        "queries": table,
        "misses": [e["name"] for e in misses],
        "plans": plans,
    }
    return row
