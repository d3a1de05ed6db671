"""``/api/stats`` from the rollups (schema v8, issue 23): ``throughput_total``
and ``throughput_node`` say what ``throughput_minute`` says, on both
backends.  The answer built from them (:func:`throughput.window_stats`) is
compared with the same answer computed from the raw minute rows, for
windows of 15 minutes to 24 hours ending on and off every boundary, for
each user and for everyone; and across retention pruning, a node that is
gone, users' isolation and the v8 migration's backfill.  The history is
written by the site's own ``throughput.sample_reports`` (as the report path
and the B9 seed write it), with the site's clock given explicitly."""

from __future__ import annotations

import random
import sqlite3
import time
from collections import defaultdict
from typing import Any

from tasknet.protocol.messages import TaskEntry, TaskReport
from tasknet.site.storage import node_sessions, reports, throughput
from tasknet.site.storage.engine.database import run_read, run_write
from tasknet.site.storage.engine.schema import (
    V8_POSTGRES_SCRIPT,
    V8_SCRIPT,
    apply_statements,
    load_script,
    split_statements,
)
from tasknet.site.storage.engine.timestamps import iso
from tests.backends import is_postgres
from tests.site_protocol.harness import add_task, add_user

SIZE = 100 * 2**20
# A minute a little before an hour's start, so that histories cross minute,
# quarter-hour and hour boundaries.
T0 = (1_796_000_000 // 3600) * 3600.0 - 7 * 60


def _sample(
    conn: sqlite3.Connection,
    now: float,
    downloads: list[tuple[str, int, int, int]],
) -> None:
    """One batch of reports at ``now``: ``(node, user, bytes, completed)``
    per synthetic download (rows are not touched, as in bench/viewseed.py)."""
    batch: dict[str, tuple[list[int], dict[int, TaskEntry], dict[int, Any]]] = {}
    rows: dict[int, Any] = {}
    for key, (node, user, gained, completed) in enumerate(downloads, 1):
        # A completion gains the last ``gained`` bytes of the download.
        old = 1.0 - gained / SIZE if completed else 0.25
        status = 4 if completed else 1
        progress = 1.0 if completed else old + gained / SIZE
        gids, entries, before = batch.setdefault(node, ([], {}, {}))
        gids.append(key)
        entries[key] = TaskEntry(key, status, progress)
        before[key] = {"status": 1, "progress": old}
        rows[key] = {
            "gid": key,
            "user_id": user,
            "size": SIZE,
            "speed": None,
            "sampled_at": None,
            "moved_at": None,
        }
    items = [(node, gids, entries, before) for node, (gids, entries, before) in batch.items()]
    run_write(conn, throughput.sample_reports, items, rows, now)


def _history(
    conn: sqlite3.Connection, users: list[int], minutes: int, nodes: int, seed: int = 1
) -> float:
    """``minutes`` minutes of random downloads up to the returned ``now``:
    some minutes idle, some with completions only, more nodes than
    :data:`throughput.TOP_NODES`; two batches in some minutes."""
    rng = random.Random(seed)
    now = T0
    for minute in range(minutes):
        now = T0 + minute * 60
        if rng.random() < 0.1:
            continue  # an idle minute
        for part in range(rng.choice((1, 1, 2))):
            downloads = []
            for _ in range(rng.randrange(1, 8)):
                node = f"n{rng.randrange(nodes):02d}"
                gained = 0 if rng.random() < 0.1 else rng.randrange(1, 5_000_000)
                downloads.append((node, rng.choice(users), gained, int(rng.random() < 0.2)))
            _sample(conn, now + 5 + 20 * part, downloads)
    return now + 40


# -- the answer, computed from the raw minute rows -----------------------------------


def _raw_answer(
    conn: sqlite3.Connection, scope: int | None, window: int, now: float
) -> dict[str, Any]:
    """What ``window_stats`` must answer, from ``throughput_minute`` alone."""
    seconds = throughput.bucket_seconds(window)
    per = seconds // 60
    last = int(now // seconds)
    count = -(-window // seconds)
    first = last - count + 1
    rows = [
        (int(m), str(n), int(u), int(b), int(c))
        for m, n, u, b, c in conn.execute(
            "SELECT minute, node_id, user_id, bytes, completed FROM throughput_minute"
        )
        if scope is None or int(u) == scope
    ]
    in_window = [r for r in rows if first <= r[0] // per <= last]
    per_node: dict[str, int] = defaultdict(int)
    for minute, node, _, gained, _ in rows:
        if minute >= first * per:  # from the window's start on (rows "after now" too)
            per_node[node] += gained
    ranked = sorted(((n, b) for n, b in per_node.items() if b), key=lambda x: (-x[1], x[0]))
    top = [n for n, _ in ranked[: throughput.TOP_NODES]]
    buckets = [
        {"start": iso(b * seconds), "completed": 0, "bytes": 0, "byNode": dict.fromkeys(top, 0)}
        for b in range(first, last + 1)
    ]
    for minute, node, _, gained, completed in in_window:
        bucket = buckets[minute // per - first]
        bucket["bytes"] += gained
        bucket["completed"] += completed
        if node in bucket["byNode"]:
            bucket["byNode"][node] += gained
    for bucket in buckets:
        bucket["other"] = bucket["bytes"] - sum(bucket["byNode"].values())
    return {
        "window": window,
        "bucketSeconds": seconds,
        "nodes": top,
        "nodeLimit": throughput.TOP_NODES,
        "otherNodes": len(ranked) - len(top),
        "buckets": buckets,
    }


def _rollups_match_the_raw_rows(conn: sqlite3.Connection) -> None:
    """Every rollup row is the sum of its minute rows (nothing pruned)."""
    raw = [
        tuple(int(v) if i != 1 else str(v) for i, v in enumerate(r))
        for r in conn.execute(
            "SELECT minute, node_id, user_id, bytes, completed FROM throughput_minute"
        )
    ]
    totals: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    slots: dict[tuple[int, int, int, str], int] = defaultdict(int)
    for minute, node, user, gained, completed in raw:
        for scope in (user, throughput.ALL_USERS):
            totals[(scope, minute)][0] += gained
            totals[(scope, minute)][1] += completed
            if gained:
                for grain in throughput.GRAINS:
                    slots[(scope, grain, minute * 60 // grain, node)] += gained
    got_totals = {
        (int(u), int(m)): [int(b), int(c)]
        for u, m, b, c in conn.execute(
            "SELECT user_id, minute, bytes, completed FROM throughput_total"
        )
    }
    assert got_totals == dict(totals)
    got_slots = {
        (int(u), int(g), int(s), str(n)): int(b)
        for u, g, s, n, b in conn.execute(
            "SELECT user_id, grain, slot, node_id, bytes FROM throughput_node"
        )
    }
    assert got_slots == dict(slots)


WINDOWS = (60, 900, 3000, 3600, 3601, 5000, 21600, 30000, 86400)


def test_rollups_are_the_sums_of_the_minute_rows(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    _history(conn, [alice, bob], 150, 14)
    _rollups_match_the_raw_rows(conn)


def test_the_answer_is_what_the_raw_rows_say(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    carol, _ = add_user(conn, "carol")
    end = _history(conn, [alice, bob, carol], 200, 16)
    # "now" on and off every boundary: the last sample's minute, a quarter's
    # and an hour's first second, the middle of a minute, later idle time.
    hour = (int(end) // 3600) * 3600.0
    for now in (end, hour, hour + 1, hour - 1, hour - 900, end + 59.5, end + 1800):
        for window in WINDOWS:
            for scope in (None, alice, bob, carol):
                got = run_read(conn, throughput.window_stats, scope, window, now)
                assert got == _raw_answer(conn, scope, window, now), (now, window, scope)
    # The 24 h window: 96 quarter-hour buckets; more nodes than the top.
    day = run_read(conn, throughput.window_stats, None, 86400, end)
    assert day["bucketSeconds"] == 900 and len(day["buckets"]) == 96
    assert len(day["nodes"]) == throughput.TOP_NODES and day["otherNodes"] == 6
    assert sum(b["other"] for b in day["buckets"]) > 0
    hourly = run_read(conn, throughput.window_stats, None, 3600, end)
    assert hourly["bucketSeconds"] == 60 and len(hourly["buckets"]) == 60


def test_every_bucket_adds_up_and_the_nodes_are_the_top_of_the_window(
    conn: sqlite3.Connection,
) -> None:
    alice, _ = add_user(conn, "alice")
    # Twelve nodes in one minute: n00 the most, n11 the least.
    _sample(conn, T0, [(f"n{i:02d}", alice, (12 - i) * 1_000_000, 0) for i in range(12)])
    _sample(conn, T0 + 60, [("n11", alice, 1_000, 1)])
    answer = run_read(conn, throughput.window_stats, alice, 3600, T0 + 90)
    assert answer["nodes"] == [f"n{i:02d}" for i in range(10)]
    assert answer["otherNodes"] == 2 and answer["nodeLimit"] == 10
    buckets = answer["buckets"]
    assert buckets[-2]["byNode"]["n00"] == 12_000_000
    assert buckets[-2]["other"] == 2_000_000 + 1_000_000  # n10 and n11
    assert buckets[-1]["other"] == 1_000 and buckets[-1]["completed"] == 1
    for bucket in buckets:
        assert bucket["bytes"] == bucket["other"] + sum(bucket["byNode"].values())
        assert list(bucket["byNode"]) == answer["nodes"]


def test_a_user_sees_only_their_own_throughput(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    mallory, _ = add_user(conn, "mallory")
    _sample(conn, T0, [("shared", alice, 100, 0), ("shared", bob, 7_000, 1)])
    _sample(conn, T0 + 61, [("bobs", bob, 9_000, 0)])
    for window in (3600, 86400):
        own = run_read(conn, throughput.window_stats, alice, window, T0 + 120)
        assert own["nodes"] == ["shared"] and own["otherNodes"] == 0
        assert sum(b["bytes"] for b in own["buckets"]) == 100
        assert sum(b["completed"] for b in own["buckets"]) == 0
        assert sum(b["other"] for b in own["buckets"]) == 0
        bobs = run_read(conn, throughput.window_stats, bob, window, T0 + 120)
        assert bobs["nodes"] == ["bobs", "shared"]
        assert sum(b["bytes"] for b in bobs["buckets"]) == 16_000
        everyone = run_read(conn, throughput.window_stats, None, window, T0 + 120)
        assert sum(b["bytes"] for b in everyone["buckets"]) == 16_100
        assert sum(b["completed"] for b in everyone["buckets"]) == 1
        nobody = run_read(conn, throughput.window_stats, mallory, window, T0 + 120)
        assert nobody["nodes"] == [] and nobody["otherNodes"] == 0
        assert all(b["bytes"] == b["completed"] == b["other"] == 0 for b in nobody["buckets"])


def test_pruning_keeps_the_rollups_of_the_kept_minutes(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    _sample(conn, T0, [("n1", alice, 1_000, 1)])
    _sample(conn, T0 + 3600, [("n1", alice, 2_000, 0)])
    # Past the retention of T0's minute, quarter and hour (T0 is 7 minutes
    # before an hour), not of the next hour's.
    later = T0 + (throughput.KEEP_MINUTES + 8) * 60
    _sample(conn, later, [("n2", alice, 4_000, 0)])
    cutoff = int(later // 60) - throughput.KEEP_MINUTES
    minutes = [int(r[0]) for r in conn.execute("SELECT minute FROM throughput_total")]
    assert min(minutes) >= cutoff and int(T0 // 60) not in minutes
    for grain, slot in conn.execute("SELECT grain, slot FROM throughput_node"):
        assert (int(slot) + 1) * int(grain) > cutoff * 60, (grain, slot)  # ends after the cutoff
    slots = {(int(g), int(s)) for g, s in conn.execute("SELECT grain, slot FROM throughput_node")}
    assert (900, int(T0 // 900)) not in slots and (3600, int(T0 // 3600)) not in slots
    assert (3600, int(T0 // 3600) + 1) in slots  # the next hour's 2,000 bytes are kept
    # Every window (at most 24 h) still says what the kept raw rows say.
    for window in WINDOWS:
        for scope in (None, alice):
            got = run_read(conn, throughput.window_stats, scope, window, later + 10)
            assert got == _raw_answer(conn, scope, window, later + 10), (window, scope)
    day = run_read(conn, throughput.window_stats, None, 86400, later + 10)
    assert day["nodes"] == ["n2"] and sum(b["bytes"] for b in day["buckets"]) == 4_000


def test_a_gone_node_keeps_its_bytes_in_the_window(conn: sqlite3.Connection) -> None:
    """Through the real report path: the bytes a node downloaded stay in the
    charts after it has gone (its session released, its tasks moved on)."""
    alice, _ = add_user(conn, "alice")
    for gid in (1, 2):
        add_task(conn, gid, alice, node_id="n1")
        run_write(
            conn,
            lambda c, g=gid: c.execute("UPDATE gallery SET size = ? WHERE gid = ?", (1_000_000, g)),
        )
    taken = run_write(conn, node_sessions.take, "n1", None, "site-a", 2, [], "2026-01-01T00:00:00Z")
    ids = {1: "op-1", 2: "op-2"}
    for rev, entries in enumerate(
        [
            (TaskEntry(1, 1, 0.0), TaskEntry(2, 1, 0.0)),
            (TaskEntry(1, 1, 0.5), TaskEntry(2, 4, 1.0)),
        ],
        1,
    ):
        run_write(
            conn, reports.apply_task_report, "n1", TaskReport(f"r{rev}", rev, entries, ids, ())
        )
    run_write(conn, node_sessions.release, taken.holding)
    run_write(conn, lambda c: c.execute("DELETE FROM node_seen WHERE node_id = 'n1'"))
    now = time.time()  # the report path samples on the wall clock
    for window in (3600, 86400):
        for scope in (None, alice):
            answer = run_read(conn, throughput.window_stats, scope, window, now)
            assert answer["nodes"] == ["n1"]
            assert sum(b["bytes"] for b in answer["buckets"]) == 1_500_000
            assert sum(b["completed"] for b in answer["buckets"]) == 1
            assert answer == _raw_answer(conn, scope, window, now)
    _rollups_match_the_raw_rows(conn)


def test_the_v8_migration_rolls_up_the_history_so_far(
    conn: sqlite3.Connection, db_target: str
) -> None:
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    end = _history(conn, [alice, bob], 90, 12)
    expected = {
        (scope, window): run_read(conn, throughput.window_stats, scope, window, end)
        for scope in (None, alice, bob)
        for window in (3600, 86400)
    }
    # A database from before v8: no rollups; then the upgrade.
    run_write(
        conn,
        lambda c: [c.execute(f"DROP TABLE {t}") for t in ("throughput_total", "throughput_node")],
    )
    run_write(conn, lambda c: c.execute("DELETE FROM schema_version WHERE version = 8"))
    script = load_script(V8_POSTGRES_SCRIPT if is_postgres(db_target) else V8_SCRIPT)
    run_write(conn, lambda c: apply_statements(c, split_statements(script)))
    _rollups_match_the_raw_rows(conn)
    for (scope, window), answer in expected.items():
        assert run_read(conn, throughput.window_stats, scope, window, end) == answer
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] >= 8
