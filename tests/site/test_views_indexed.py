"""The views' indexes of schema v6 (issue 23, item 2), on both backends.

* ``gallery.status_key``, the stored display-status key of the status tabs
  and the counts, kept by the database's triggers whoever writes: equal to
  :func:`views.stored_key` (Python's ``display_status``) for every
  (state, node code, failed delete, queued) a row can have, whichever of its
  two rows is written first, after every change and after its operation
  row is gone; written by the site's own create, dispatch, report and
  delete functions; backfilled by the v6 upgrade.
* The tabs, the totals and ``/api/tasks/counts`` from it equal the views
  (every task's ``status`` and ``queued``), page after page.
* The substring search by index (SQLite's FTS5 trigram table, PostgreSQL's
  pg_trgm indexes) answers exactly the old ``LIKE`` scan: ASCII case
  folded only, ``%`` and ``_`` as text, non-ASCII names, digits of a gid,
  after renames and deletes; and the indexes are what the plans use.
* Reads run in parallel on several reader connections.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
from typing import Any

import psycopg
import pytest
import pytest_twisted

from bench import viewseed
from tasknet.site.storage import views
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import (
    UPGRADES,
    UPGRADES_POSTGRES,
    apply_statements,
    load_script,
    postgres_upgrade_scripts,
    prepare_database,
    schema_version,
    split_statements,
)
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, COMMIT, SERIALIZABLE
from tasknet.status import NodeCode, OperationState
from tests.backends import is_postgres
from tests.runtime import site_runtime
from tests.site_protocol.harness import add_task, add_user

_KEYS = sql("SELECT gid, status_key FROM gallery ORDER BY gid")
_COUNT_TASKS = sql("SELECT COUNT(*) FROM gallery")
_LEGACY_ROWS = sql(
    "SELECT COUNT(*) FROM gallery AS g"
    " WHERE NOT EXISTS (SELECT 1 FROM task_operation AS o WHERE o.gid = g.gid)"
)
_INPUTS = sql(
    "SELECT g.gid, o.state, g.status, o.delete_result, g.queued, g.status_key,"
    " g.archive_gone_reason"
    " FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid ORDER BY g.gid"
)


def _expected_keys(connection: Any) -> dict[int, tuple[str, str]]:
    """Per gid: (the stored key, the key Python computes from the row)."""
    out = {}
    for gid, state, code, result, queued, stored, gone in connection.execute(_INPUTS).fetchall():
        want = views.stored_key(state, code, result == "FAILED", bool(queued), gone is not None)
        out[int(gid)] = (stored, want)
    return out


_COUNTED = sql("SELECT user_id, status_key, COUNT(*) FROM gallery GROUP BY user_id, status_key")
_KEPT = sql("SELECT user_id, status_key, n FROM task_count WHERE n <> 0")
_NODE_COUNTED = sql(
    "SELECT node_id, COALESCE(status, -1), queued, COUNT(*) FROM gallery"
    " WHERE node_id IS NOT NULL GROUP BY node_id, COALESCE(status, -1), queued"
)
_NODE_KEPT = sql("SELECT node_id, status, queued, n FROM node_task_count WHERE n <> 0")


def _assert_keys_right(connection: Any) -> None:
    keys = _expected_keys(connection)
    wrong = {gid: pair for gid, pair in keys.items() if pair[0] != pair[1]}
    assert not wrong, f"stored status_key differs from views.stored_key: {wrong}"
    _assert_counts_kept(connection)


def _assert_counts_kept(connection: Any) -> None:
    """Schema v9's task_count says what counting the task rows says."""
    counted = {(int(u), k): int(n) for u, k, n in connection.execute(_COUNTED).fetchall()}
    kept = {(int(u), k): int(n) for u, k, n in connection.execute(_KEPT).fetchall()}
    assert kept == counted
    counted = {tuple(row[:3]): int(row[3]) for row in connection.execute(_NODE_COUNTED)}
    kept = {tuple(row[:3]): int(row[3]) for row in connection.execute(_NODE_KEPT)}
    assert kept == counted


# -- the stored key ----------------------------------------------------------------------

STATES = [None, *(s.value for s in OperationState if s is not OperationState.DELETED)]
CODES = [None, 0, *(int(c) for c in NodeCode)]


def test_the_stored_key_is_display_status_for_every_row_and_change(conn: Any) -> None:
    """Every (state, code, failed, queued): written gallery row first (as a
    legacy row gets its operation) and operation first (as the create path
    writes), then every change of each input, then the operation row gone."""
    alice, _ = add_user(conn, "alice")
    combos = list(itertools.product(STATES, CODES, (False, True), (False, True)))
    gid = 1
    placed: dict[int, tuple[Any, ...]] = {}
    for state, code, failed, queued in combos:
        if failed and state != "DELETE_PENDING":
            continue
        node = None if gid % 4 == 0 else f"n{gid % 3}"  # schema v9's per-node counts too
        add_task(conn, gid, alice, state, status=code, node_id=node)
        placed[gid] = (state, code, failed, queued)
        gid += 1

    def settle(c: Any) -> None:
        for number, (_state, _code, failed, queued) in placed.items():
            if failed:
                c.execute(
                    "UPDATE task_operation SET delete_result = 'FAILED' WHERE gid = ?", (number,)
                )
            if queued:
                c.execute("UPDATE gallery SET queued = 1 WHERE gid = ?", (number,))

    dbmod.run_write(conn, settle)
    _assert_keys_right(conn)
    stored = dict(tuple(r) for r in conn.execute(_KEYS).fetchall())
    for number, (state, code, failed, queued) in placed.items():
        assert stored[number] == views.stored_key(state, code, failed, queued)

    # Archives gone (schema v13) on a third of the rows, then back on some.
    def archives_gone(c: Any) -> None:
        c.execute("UPDATE gallery SET archive_gone_reason = 'EXPIRED' WHERE gid % 3 = 0")
        c.execute("UPDATE gallery SET archive_gone_reason = NULL WHERE gid % 9 = 0")

    dbmod.run_write(conn, archives_gone)
    _assert_keys_right(conn)
    assert "ARCHIVE_GONE" in {r[1] for r in conn.execute(_KEYS).fetchall()}

    # Operation row first, the task row after it (the create path's order).
    def operation_first(c: Any) -> None:
        c.execute(
            "INSERT INTO task_operation (gid, operation_id, state, user_id, cost, metered,"
            " dispatched) VALUES (9001, 'op-9001', 'RESERVED', ?, 1, 0, 0)",
            (alice,),
        )
        c.execute(
            "INSERT INTO gallery (gid, user_id, name, status) VALUES (9001, ?, 'x', NULL)",
            (alice,),
        )

    dbmod.run_write(conn, operation_first)
    assert dict(tuple(r) for r in conn.execute(_KEYS).fetchall())[9001] == "SUBMITTING"

    # Every input changed, one at a time.
    def change(c: Any) -> None:
        for code in (1, 2, 3, 4, None, 1):
            c.execute("UPDATE gallery SET status = ? WHERE gid >= 1", (code,))
            c.execute("UPDATE gallery SET queued = 1 - queued WHERE gid >= 1")
            c.execute("UPDATE gallery SET progress = progress + 0.01 WHERE gid >= 1")
        c.execute("UPDATE task_operation SET delete_result = NULL WHERE delete_result = 'FAILED'")
        c.execute(
            "UPDATE task_operation SET state = 'SUBMITTING' WHERE state = 'RESERVED' AND gid < 9000"
        )
        c.execute("UPDATE task_operation SET state = 'UNKNOWN' WHERE state = 'SUBMITTING'")
        c.execute(
            "UPDATE task_operation SET state = 'DELETE_PENDING', delete_operation_id ="
            " 'd' || CAST(gid AS TEXT) WHERE state = 'SUBMITTED'"
        )
        c.execute("UPDATE task_operation SET delete_result = 'FAILED' WHERE gid % 2 = 0")

    dbmod.run_write(conn, change)
    _assert_keys_right(conn)

    # The operation rows gone (released, resolved): legacy rows, keyed by code.
    def release(c: Any) -> None:
        c.execute("UPDATE task_operation SET delete_result = NULL")
        c.execute("DELETE FROM task_operation WHERE state = 'UNKNOWN'")

    dbmod.run_write(conn, release)
    _assert_keys_right(conn)
    assert conn.execute(_LEGACY_ROWS).fetchone()[0] > len(CODES) * 2

    # Task rows given to another owner, and gone (schema v9's counts).
    bob, _ = add_user(conn, "bob")

    def move_and_remove(c: Any) -> None:
        c.execute("UPDATE gallery SET user_id = ? WHERE gid % 3 = 0", (bob,))
        c.execute("UPDATE gallery SET user_id = ?, status = 4 WHERE gid % 3 = 1", (bob,))
        c.execute("UPDATE gallery SET node_id = 'n9' WHERE gid % 5 = 0")
        c.execute("UPDATE gallery SET node_id = NULL WHERE gid % 7 = 0")
        c.execute("DELETE FROM gallery WHERE gid % 4 = 0")

    dbmod.run_write(conn, move_and_remove)
    _assert_keys_right(conn)
    kept = conn.execute(sql("SELECT COUNT(*) FROM task_count WHERE user_id = ?"), (bob,))
    assert kept.fetchone()[0] > 0


def _seeded(conn: Any, tasks: int = 400) -> viewseed.ViewSizes:
    """Tasks written by the site's own functions (bench.viewseed: reserve,
    submit, dispatch, node reports with queued and moving tasks, deletes
    requested and failed)."""
    sizes = viewseed.ViewSizes(
        tasks=tasks, users=4, heavy_tasks=tasks // 4, nodes=3, history_minutes=1
    )
    made = dbmod.run_write(conn, viewseed._users, sizes)
    user_ids = [user_id for user_id, _, _ in made]
    for start in range(0, tasks, 200):
        dbmod.run_write(
            conn, viewseed._seed_chunk, sizes, user_ids, start, min(tasks, start + 200), start + 1
        )
    return sizes


def _all_views(conn: Any, user_id: int | None) -> list[dict[str, Any]]:
    found, after = [], None
    while True:
        query = views.TaskQuery(user_id=user_id, limit=97, after=after)
        page, following, _ = dbmod.run_read(conn, views.list_tasks, query)
        found += page
        if following is None:
            return found
        after = views.parse_cursor(views.Order.NEWEST, str(following))


def _filter_key_of(view: dict[str, Any]) -> set[str]:
    keys = {view["status"]}
    if view["queued"]:
        keys.add(views.QUEUED)
    elif view["status"] == "SUBMITTED":
        keys.add(views.SUBMITTED_NOT_QUEUED)
    return keys


def _count_of(counts: dict[str, int], key: str) -> int:
    """A filter key's count: the counts keep their shape, so the In progress
    tab's part of SUBMITTED is SUBMITTED less QUEUED (as the UI takes it)."""
    if key == views.SUBMITTED_NOT_QUEUED:
        return counts["SUBMITTED"] - counts[views.QUEUED]
    return counts[key]


def test_the_site_writes_keep_it_and_tabs_and_counts_equal_the_views(conn: Any) -> None:
    _seeded(conn)
    _assert_keys_right(conn)
    owner = int(conn.execute(sql('SELECT id FROM "user" ORDER BY id LIMIT 1')).fetchone()[0])
    for scope in (owner, None):
        every = _all_views(conn, scope)
        assert len({v["gid"] for v in every}) == len(every) > 50
        counts = dbmod.run_read(conn, views.count_by_status, scope, "", True)
        for key in views.FILTER_KEYS:
            wanted = [v["gid"] for v in every if key in _filter_key_of(v)]
            assert _count_of(counts, key) == len(wanted), key
            for order in (views.Order.NEWEST, views.Order.OLDEST, views.Order.STATUS):
                got, after, total = [], None, None
                while True:
                    query = views.TaskQuery(scope, 7, order, statuses=frozenset({key}), after=after)
                    page, following, total = dbmod.run_read(conn, views.list_tasks, query)
                    got += [v["gid"] for v in page]
                    if following is None:
                        break
                    after = views.parse_cursor(order, str(following))
                assert sorted(got) == sorted(wanted), (key, order)
                assert total == len(wanted)
                if order is views.Order.NEWEST:
                    assert got == wanted  # the same order as the unfiltered list
        two = frozenset({"DOWNLOADING", "COMPLETED"})
        _, _, total = dbmod.run_read(
            conn, views.list_tasks, views.TaskQuery(scope, 5, statuses=two)
        )
        assert total == counts["DOWNLOADING"] + counts["COMPLETED"]
    # The seed's mix really has the queued, failed and moving kinds.
    counts = dbmod.run_read(conn, views.count_by_status, None, "", True)
    assert counts["QUEUED"] and counts["DELETE_FAILED"] and counts["DOWNLOADING"]
    assert counts["SUBMITTED"] > counts["QUEUED"]


# -- the upgrade -------------------------------------------------------------------------


def _at(target: str, version: int) -> None:
    """A new database at schema ``version``, as the releases before made it."""
    connection = dbmod.connect(target)
    try:
        if is_postgres(target):
            connection.execute(BEGIN_WRITE[SERIALIZABLE])
            for script in postgres_upgrade_scripts(0):
                if script == UPGRADES_POSTGRES.get(version + 1):
                    break
                connection.run_script(load_script(script))  # type: ignore[union-attr]
        else:
            cursor: Any = connection.cursor()
            cursor.execute(BEGIN_WRITE[SERIALIZABLE])
            apply_statements(cursor, split_statements(load_script("schema_v1.sql")))
            for step in range(2, version + 1):
                apply_statements(cursor, split_statements(load_script(UPGRADES[step])))
        connection.execute(COMMIT)
        assert schema_version(connection) == version
    finally:
        connection.close()


def test_the_v6_upgrade_backfills_the_key_and_the_search(db_target: str) -> None:
    _at(db_target, 5)
    connection = dbmod.connect(db_target)
    try:
        alice, _ = add_user(connection, "alice")
        for number, (state, code) in enumerate(itertools.product(STATES, CODES), 1):
            add_task(connection, 1000 + number, alice, state, status=code)
        dbmod.run_write(
            connection,
            lambda c: c.execute(
                "UPDATE gallery SET queued = 1, name = 'Queued Phoenix' WHERE status = 1"
            ),
        )
    finally:
        connection.close()
    assert prepare_database(db_target) is False
    connection = dbmod.connect(db_target)
    try:
        assert (schema_version(connection) or 0) >= 6
        _assert_keys_right(connection)
        assert "QUEUED" in {r[1] for r in connection.execute(_KEYS).fetchall()}
        found = _search(connection, alice, "PHOENIX")
        assert found and found == _search(connection, alice, "phoenix")
        assert _search(connection, alice, "1003") == [1003]
    finally:
        connection.close()


def test_the_v10_upgrade_makes_the_search_table_exact(db_target: str) -> None:
    """Tasks written at v9 (the trigram table of the names as they are) are
    found by v10's (the names' ASCII letters lowered), renames after it too."""
    _at(db_target, 9)
    connection = dbmod.connect(db_target)
    try:
        alice, _ = add_user(connection, "alice")
        for gid, name in ((501, "Old PHOENIX"), (502, "\u212aelvin"), (503, "plain")):
            add_task(connection, gid, alice)
            dbmod.run_write(connection, lambda c, n=name, g=gid: c.execute(_RENAME, (n, g)))
    finally:
        connection.close()
    assert prepare_database(db_target) is False
    connection = dbmod.connect(db_target)
    try:
        assert schema_version(connection) == max(UPGRADES)
        _check_fts(connection)
        for scope in (alice, None):
            assert _search(connection, scope, "phoenix") == [501]
            assert _search(connection, scope, "OLD PH") == [501]
            assert _search(connection, scope, "kelvin") == []
            assert _search(connection, scope, "\u212aelvin") == [502]
            assert _search(connection, scope, "503") == [503]
        dbmod.run_write(connection, lambda c: c.execute(_RENAME, ("Phoenix Renamed", 503)))
        dbmod.run_write(connection, lambda c: c.execute(_FORGET, (501,)))
        _check_fts(connection)
        assert _search(connection, None, "phoenix") == [503]
        assert _search(connection, alice, "plain") == []
    finally:
        connection.close()


# -- the search --------------------------------------------------------------------------

NAMES = {
    101: "Alpha Phoenix vol.3",
    102: "ÉCOLE Abc",
    103: "école abc",
    104: "100% pure_gold",
    105: "100 percent pure gold",
    106: 'say "hello" world',
    107: "Straße STRASSE",
    108: "日本語のテキスト",
    109: "phoenixphoenix",
    110: "",
    2012345: "twelve thousand",
    112345: "gid only",
    # Letters Unicode folds to ASCII ones (the Kelvin sign to k, the dotted
    # capital I to i) and LIKE does not: no match for "kelvin", "istanbul".
    111: "\u212aelvin scale",
    113: "\u0130stanbul",
}
QUERIES = [
    "phoenix",
    "PHOENIX",
    "Phoe",
    "hoenix vol",
    "école",
    "ÉCOLE",
    "cole abc",
    "COLE",
    "abc",
    "100%",
    "0%",
    "% p",
    "pure_gold",
    "_go",
    "e_g",
    '"hello"',
    'say "',
    "straße",
    "STRASSE",
    "strasse",
    "本語の",
    "テキスト",
    "12345",
    "2345",
    "201",
    "234",
    "10",
    "ab",
    "%",
    "_",
    "é",
    "ph",
    "nothing at all",
    "xx",
    "\\",
    "a\\b",
    "10 ",
    "kelvin",
    "KELVIN",
    "\u212aelvin",
    "elvin",
    "istanbul",
    "\u0130stan",
    "stanbul",
]


def _ascii_lower(text: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


def _reference(names: dict[int, str], text: str) -> set[int]:
    """The old scan's answer: the name containing the text ignoring ASCII
    case only, or the gid in decimal containing it."""
    return {
        gid
        for gid, name in names.items()
        if _ascii_lower(text) in _ascii_lower(name) or text in str(gid)
    }


def _search(connection: Any, user_id: int | None, text: str) -> list[int]:
    query = views.TaskQuery(user_id=user_id, limit=500, text=text)
    page, _, total = dbmod.run_read(connection, views.list_tasks, query)
    gids = [view["gid"] for view in page]
    assert total == len(gids)
    counts = dbmod.run_read(connection, views.count_by_status, user_id, text, False)
    assert sum(counts.values()) == total
    return gids


_RENAME = sql("UPDATE gallery SET name = ? WHERE gid = ?")
_FORGET = sql("DELETE FROM gallery WHERE gid = ?")


def _check_fts(connection: Any) -> None:
    """SQLite: the trigram table is consistent (FTS5's own check; contentless
    since v10, so of its index alone: the searches test what it holds)."""
    if isinstance(connection, sqlite3.Connection):
        dbmod.run_write(
            connection,
            lambda c: c.execute(
                "INSERT INTO gallery_text(gallery_text, rank) VALUES ('integrity-check', 1)"
            ),
        )


@pytest.mark.parametrize("matches_first_up_to", [views.MATCHES_FIRST_UP_TO, 0])
def test_the_indexed_search_answers_exactly_the_like_scan(
    conn: Any, matches_first_up_to: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either page plan (the index's matches first, or the page's order
    matching each row: ``MATCHES_FIRST_UP_TO`` 0) and the counts."""
    monkeypatch.setattr(views, "MATCHES_FIRST_UP_TO", matches_first_up_to)
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    names = dict(NAMES)
    for gid, name in names.items():
        add_task(conn, gid, alice if gid % 2 else bob)
        dbmod.run_write(conn, lambda c, n=name, g=gid: c.execute(_RENAME, (n, g)))
    owners = {gid: alice if gid % 2 else bob for gid in names}

    def check() -> None:
        _check_fts(conn)
        for text in QUERIES:
            want = _reference(names, text)
            assert set(_search(conn, None, text)) == want, text
            mine = {gid for gid in want if owners[gid] == alice}
            assert set(_search(conn, alice, text)) == mine, text

    check()
    # Renames and deletes keep the index right.
    names[101] = "Renamed Dragon"
    names[109] = "PHOENIX again"
    for gid in (101, 109):
        dbmod.run_write(conn, lambda c, g=gid: c.execute(_RENAME, (names[g], g)))
    for gid in (104, 2012345):
        dbmod.run_write(conn, lambda c, g=gid: c.execute(_FORGET, (g,)))
        del names[gid]
    check()
    assert _search(conn, None, "dragon") == [101]
    assert _search(conn, None, "12345") == [112345]
    # A task row gone and written again under its gid: found by its new name.
    names[104] = "reborn 50%_off"
    dbmod.run_write(
        conn,
        lambda c: c.execute(
            "INSERT INTO gallery (gid, user_id, name) VALUES (104, ?, ?)", (bob, names[104])
        ),
    )
    owners[104] = bob
    check()


def test_the_plans_use_the_indexes(conn: Any, db_target: str) -> None:
    alice, _ = add_user(conn, "alice")
    for gid in range(1, 40):
        add_task(conn, gid, alice, status=gid % 5 or None)
    dbmod.run_write(conn, lambda c: c.execute(_RENAME, ("Phoenix rising", 7)))
    statements = []

    class Recording:
        def __init__(self, cursor: Any) -> None:
            self.cursor = cursor
            self.connection = cursor.connection  # its sources: the wall clock of the views

        def execute(self, statement: Any, params: Any = ()) -> Any:
            statements.append((statement, list(params)))
            return self.cursor.execute(statement, params)

    for scope in (alice, None):
        for query in (
            views.TaskQuery(scope, 50, statuses=frozenset({"COMPLETED"})),
            views.TaskQuery(scope, 50, text="phoenix"),
        ):
            statements.clear()
            dbmod.run_read(conn, lambda c, q=query: views.list_tasks(Recording(c), q))  # type: ignore[arg-type]
            count, page = statements[0], statements[1]
            if "COUNT(*) OVER ()" in str(count[0]):
                page = count  # one reading gave both; the next statement reads the rows
            plans = [_plan(db_target, s, p) for s, p in (count, page)]
            if query.statuses:
                # The total is schema v9's kept count, not a count of tasks.
                assert "task_count" in plans[0] and "gallery" not in plans[0], plans[0]
            if query.statuses and is_postgres(db_target):
                # (a tiny table: either index of the key serves the planner)
                plan = plans[1]
                assert "gallery_user_status" in plan or "gallery_status" in plan, plan
            elif query.statuses:
                wanted = "gallery_user_status" if scope else "gallery_status"
                assert wanted in plans[1], plans[1]
                assert "TEMP B-TREE" not in plans[1], plans[1]
            elif not is_postgres(db_target):
                for plan in plans:
                    assert "gallery_text" in plan, plan
                if scope is not None:
                    # A user's few matches: the page and its total from one
                    # reading, each match looked up by (user_id, gid), not
                    # every match of everyone read (B9: 14 -> 4 ms); then
                    # the page's rows.
                    assert "COUNT(*) OVER ()" in str(count[0]), count[0]
                    assert "gallery_user (user_id=? AND gid=?)" in plans[0], plans[0]
            elif scope is None:
                # The count; (a page of a tiny table walks the time index
                # backwards, and a user's few rows are read by their index).
                plan = plans[0]
                assert "gallery_name_trgm" in plan and "gallery_gid_trgm" in plan, plan


def _plan(target: str, statement: Any, params: list[Any]) -> str:
    if is_postgres(target):
        with psycopg.connect(target, autocommit=True) as pg:
            # A tiny table scans best: ask whether the index can serve it.
            pg.execute("SET enable_seqscan = off")
            rows = pg.execute("EXPLAIN " + statement.postgres, params).fetchall()
        return "\n".join(str(r[0]) for r in rows)
    connection = sqlite3.connect(target)
    try:
        rows = connection.execute("EXPLAIN QUERY PLAN " + str(statement), params).fetchall()
    finally:
        connection.close()
    return "\n".join(str(r[3]) for r in rows)


def test_pg_trgm_is_there_or_the_search_still_answers(db_target: str) -> None:
    """PostgreSQL: the trigram indexes exist where pg_trgm can be had (the
    test server's does); SQLite: its trigram table exists."""
    prepare_database(db_target)
    if is_postgres(db_target):
        with psycopg.connect(db_target, autocommit=True) as pg:
            available = pg.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'"
            ).fetchone()
            indexes = {
                r[0]
                for r in pg.execute(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'gallery'"
                ).fetchall()
            }
        if available:
            assert {"gallery_name_trgm", "gallery_gid_trgm"} <= indexes
    else:
        connection = sqlite3.connect(db_target)
        try:
            found = connection.execute(
                "SELECT name FROM sqlite_master WHERE name = 'gallery_text'"
            ).fetchone()
        finally:
            connection.close()
        assert found is not None


# -- readers -------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_reads_run_in_parallel_on_several_readers(db_target: str) -> None:
    """Two reads, each waiting for the other inside its transaction: they
    finish only if they run at once (one reader would time out)."""
    prepare_database(db_target)
    assert dbmod.DEFAULT_READERS > 1
    db = dbmod.open_pool(db_target, **site_runtime())
    barrier = threading.Barrier(2, timeout=10)

    def meet(cursor: Any) -> int:
        cursor.execute(_COUNT_TASKS).fetchone()
        return barrier.wait()

    try:
        first, second = db.read(meet), db.read(meet)
        assert sorted([await first, await second]) == [0, 1]
    finally:
        db.close()


@pytest.mark.parametrize("order", list(views.Order))
def test_a_search_pages_alike_from_one_reading_or_from_a_count(
    conn: Any, order: views.Order, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search's pages, their cursors and total when its matches are read
    once for both (few matches) are those of the count then the page's
    scan (``MATCHES_FIRST_UP_TO`` 0), in every order."""
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    codes = [None, 1, 2, 3, 4]
    for gid in range(1, 41):
        add_task(conn, gid, alice if gid % 3 else bob, status=codes[gid % 5], progress=gid % 7 / 7)
        name = f"Phoenix {gid}" if gid % 4 else f"dragon {gid}"
        dbmod.run_write(
            conn,
            lambda c, n=name, g=gid: c.execute(
                "UPDATE gallery SET name = ?, size = ?, created_at = ? WHERE gid = ?",
                (n, None if g % 6 == 0 else g % 9 * 1000, f"2026-01-01T00:00:{g % 13:02}.000Z", g),
            ),
        )

    def pages(query: views.TaskQuery) -> list[tuple[list[int], Any, int]]:
        walked: list[tuple[list[int], Any, int]] = []
        after = None
        while True:
            page, following, total = dbmod.run_read(
                conn, views.list_tasks, views.TaskQuery(**{**query.__dict__, "after": after})
            )
            walked.append(([t["gid"] for t in page], following, total))
            if following is None:
                return walked
            after = views.parse_cursor(order, str(following))

    for scope, statuses in (
        (alice, frozenset()),
        (alice, frozenset({"DOWNLOADING"})),
        (None, frozenset({"COMPLETED"})),
        (bob, frozenset()),
    ):
        query = views.TaskQuery(scope, 4, order, statuses, text="phoenix")
        monkeypatch.setattr(views, "MATCHES_FIRST_UP_TO", 5_000)
        once = pages(query)
        monkeypatch.setattr(views, "MATCHES_FIRST_UP_TO", 0)
        counted = pages(query)
        assert once == counted, (scope, statuses)
        assert sum(len(gids) for gids, _, _ in once) == once[0][2] > 0
