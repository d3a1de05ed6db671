"""Every statement of storage, rendered for both engines at import, is one
each engine accepts (tasknet/site/storage/engine/sql.py).

The statements are found where they are made: every module of
``tasknet.site.storage`` is imported and :func:`sql.defined` lists each
:class:`~tasknet.site.storage.engine.sql.Sql` made by ``sql``,
``fragment``, ``per_backend`` and ``postgres_only`` on the way.  On a real
SQLite file and a real PostgreSQL database with the site's schema, each
statement is prepared by the engine itself (SQLite: ``EXPLAIN``, which
compiles it against the schema; PostgreSQL: ``PREPARE``, which parses,
analyses and plans it, parameter types inferred); the transaction
statements, which PostgreSQL cannot prepare, are run in a transaction that
is rolled back.  The statements composed at run time (a page of the task
list, a state change) are composed here from their fragments and run.

A source check keeps it so: storage passes ``execute`` no text of its own
making (a literal, an f-string, a concatenation), only its constants.  And
the pieces behave alike: a case-insensitive search folds ASCII letters
only, on both engines, whatever the database's locale.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tasknet.site.storage as storage_package
from tasknet.site.storage import generation, views
from tasknet.site.storage.engine import sql as sql_module
from tasknet.site.storage.engine.database import connect, run_read, run_write
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.sql import Sql, fragment, per_backend, postgres_only, sql
from tasknet.site.storage.engine.targets import is_postgres
from tests.site_protocol.harness import add_task, add_user


def _import_storage() -> list[str]:
    names = [
        module.name
        for module in pkgutil.walk_packages(
            storage_package.__path__, storage_package.__name__ + "."
        )
    ]
    for name in names:
        importlib.import_module(name)
    return names


MODULES = _import_storage()
DEFINED = [d for d in sql_module.defined() if d.module.startswith("tasknet.site.storage")]
STATEMENTS = [d for d in DEFINED if not d.fragment]

# PostgreSQL prepares only these; the rest (transaction control, SET) are run.
_PREPARABLE = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "VALUES")


def test_every_storage_module_makes_its_statements_at_import() -> None:
    modules = {d.module for d in DEFINED}
    assert len(STATEMENTS) > 150, len(STATEMENTS)
    # Each subject module and the engine's statement makers are among them.
    for name in ("create", "delete", "reports", "views", "outbox", "lease", "users"):
        assert f"tasknet.site.storage.{name}" in modules, name
    assert "tasknet.site.storage.engine.transactions" in modules


def _numbered(postgres: str, order: tuple[int, ...] | None) -> str:
    """``postgres`` with ``$n`` for its ``%s`` placeholders (PREPARE's
    spelling) and a doubled ``%`` single again."""
    position = iter(range(1_000_000))

    def one(match: re.Match[str]) -> str:
        if match.group() == "%%":
            return "%"
        index = next(position)
        return f"${(index if order is None else order[index]) + 1}"

    return re.sub(r"%%|%s", one, postgres)


def _check_sqlite(connection: Any, statement: Sql) -> None:
    connection.execute("EXPLAIN " + str(statement), [None] * statement.arity)


def _check_postgres(connection: psycopg.Connection[Any], statement: Sql) -> None:
    text = _numbered(statement.postgres, statement.order)
    head = text.lstrip().split(None, 1)[0].upper()
    if head in _PREPARABLE:
        connection.execute(f"PREPARE rendering_check AS {text}")
        connection.execute("DEALLOCATE rendering_check")
        return
    # Transaction control and settings: run for real, then rolled back.
    kind = statement.kind
    if kind == "begin":
        connection.execute(text)
        connection.execute("ROLLBACK")
        return
    connection.execute("BEGIN")
    try:
        if kind == "rollback_to" or head == "RELEASE":
            connection.execute("SAVEPOINT database_write")
        connection.execute(text)
    finally:
        if connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            connection.execute("ROLLBACK")


@pytest.fixture
def prepared(db_target: str) -> Iterator[str]:
    prepare_database(db_target)
    yield db_target


def test_every_statement_is_accepted_by_its_engine(prepared: str) -> None:
    failures = []
    if is_postgres(prepared):
        with psycopg.connect(prepared, autocommit=True) as pg:
            for d in STATEMENTS:
                try:
                    _check_postgres(pg, d.statement)
                except psycopg.Error as error:
                    failures.append(f"{d.module}: {d.statement.postgres!r}: {error}")
    else:
        lite = connect(prepared)
        try:
            for d in STATEMENTS:
                try:
                    _check_sqlite(lite, d.statement)
                except Exception as error:
                    failures.append(f"{d.module}: {str(d.statement)!r}: {error}")
        finally:
            lite.close()
    assert not failures, "\n".join(failures)


_RENAME = sql("UPDATE gallery SET name = ? WHERE gid = ?")


def _rename(connection: Any, gid: int, name: str) -> None:
    run_write(connection, lambda c: c.execute(_RENAME, (name, gid)))


def test_the_composed_statements_run_on_both_engines(prepared: str) -> None:
    connection = connect(prepared)
    try:
        user, _ = add_user(connection, "alice")
        add_task(connection, 5, user, node_id="n1", status=1, progress=0.5)
        add_task(connection, 6, user)
        _rename(connection, 6, "Café Crème")
        for order in views.Order:
            query = views.TaskQuery(
                user_id=user,
                limit=1,
                order=order,
                statuses=frozenset({"SUBMITTED", "DOWNLOADING"}),
                text="a",
                favorite_of=None,
                node=None,
            )
            page, following, total = run_read(connection, views.list_tasks, query)
            assert total >= 1, order
            if following is not None:
                after = views.parse_cursor(order, str(following))
                run_read(
                    connection,
                    views.list_tasks,
                    views.TaskQuery(user, 10, order, after=after, favorite_of=user, node="n1"),
                )
        run_read(connection, views.count_by_status, user, "c", True)
        # A state change naming every column a state change may set.
        every = tuple(generation._SET_COLUMN)
        statement = generation._change_state_sql(every)
        assert statement.placeholders == 1 + len(every) + 3
        run_write(
            connection,
            lambda c: c.execute(statement, ("SUBMITTED", *[None] * len(every), 99, "op", "X")),
        )
    finally:
        connection.close()


def test_a_case_insensitive_search_folds_ascii_letters_only_on_both_engines(
    prepared: str,
) -> None:
    connection = connect(prepared)
    try:
        user, _ = add_user(connection, "alice")
        add_task(connection, 1, user)
        _rename(connection, 1, "ÉCOLE Abc")

        def found(text: str) -> list[int]:
            query = views.TaskQuery(user_id=user, limit=10, text=text)
            page, _, _ = run_read(connection, views.list_tasks, query)
            return [view["gid"] for view in page]

        assert found("abc") == [1] and found("ABC") == [1] and found("cOLE") == [1]
        assert found("école") == []  # É is not é: no Unicode folding
        assert found("ÉCOLE") == [1]
        assert found("%") == [] and found("_") == []  # wildcards are matched as text
    finally:
        connection.close()


def test_the_ilike_piece_ignores_the_database_locale(pg_url: str) -> None:
    """On PostgreSQL a bare ILIKE folds every letter its collation knows:
    the piece pins the C collation (ASCII only), whatever the column's."""
    matches = fragment("n {ilike} ?").postgres
    with psycopg.connect(pg_url, autocommit=True) as pg:
        unicode_collations = [
            row[0]
            for row in pg.execute(
                "SELECT collname FROM pg_collation"
                " WHERE collname IN ('und-x-icu', 'C.utf8', 'en_US.utf8') ORDER BY collname"
            )
        ]
        if not unicode_collations:
            pytest.skip("no Unicode-aware collation on this server")
        for name in unicode_collations:
            column = f"(SELECT CAST('ÉCOLE Abc' AS text) COLLATE \"{name}\" AS n) AS t"
            bare = pg.execute(f"SELECT n ILIKE %s FROM {column}", ("%école%",)).fetchone()
            piece = pg.execute(f"SELECT {matches} FROM {column}", ("%école%",)).fetchone()
            ascii_only = pg.execute(f"SELECT {matches} FROM {column}", ("%aBC%",)).fetchone()
            assert piece == (False,), name  # É is not é, even where the collation says so
            assert ascii_only == (True,), name
            assert bare in {(True,), (False,)}  # what the collation alone would do


# -- the pieces and the rendering ------------------------------------------------------


def test_placeholders_are_rendered_outside_literals_quoted_names_and_comments() -> None:
    statement = fragment("SELECT '?', \"a?\", x FROM t WHERE a = ? AND b LIKE ? -- why?")
    assert statement.postgres == "SELECT '?', \"a?\", x FROM t WHERE a = %s AND b LIKE %s -- why?"
    assert statement.order is None and statement.arity == 2
    numbered = sql("INSERT INTO s (a, b, c) VALUES (?1, ?2, ?2) ON CONFLICT DO NOTHING")
    assert numbered.postgres.endswith("VALUES (%s, %s, %s) ON CONFLICT DO NOTHING")
    assert numbered.order == (0, 1, 1) and numbered.arity == 2
    assert sql_module.parameters(numbered, ("a", "b")) == ["a", "b", "b"]
    with pytest.raises(ValueError, match="mixes"):
        sql("SELECT ?1, ?")
    assert sql("SELECT '100%' WHERE a = ?").postgres == "SELECT '100%%' WHERE a = %s"
    assert sql("SELECT '100%'").postgres == "SELECT '100%%'"  # always with parameters


def test_the_pieces_have_one_rendering_per_engine() -> None:
    statement = fragment(
        "UPDATE t SET at = {now}, high = {greatest:t.h, excluded.h}"
        " WHERE gid {in_array} AND created_at < {now_offset} AND name {ilike} ?"
    )
    assert str(statement) == (
        "UPDATE t SET at = strftime('%Y-%m-%dT%H:%M:%fZ', tasknet_now(), 'unixepoch'),"
        " high = MAX(t.h, excluded.h) WHERE gid IN (SELECT value FROM json_each(?))"
        " AND created_at < strftime('%Y-%m-%dT%H:%M:%fZ', tasknet_now(), 'unixepoch', ?)"
        " AND name LIKE ?"
    )
    now = (
        "COALESCE(NULLIF(current_setting('tasknet.now', true), '')::timestamptz,"
        " statement_timestamp())"
    )
    assert statement.postgres == (
        f"UPDATE t SET at = to_char({now} AT TIME ZONE 'UTC',"
        ' \'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\'), high = GREATEST(t.h, excluded.h)'
        f" WHERE gid = ANY(%s) AND created_at < to_char(({now}"
        " + CAST(%s AS interval)) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        ' AND name COLLATE "C" ILIKE %s'
    )
    numbered = fragment("SELECT 1 WHERE a {in_array:?} AND b = ?")
    assert numbered.postgres == "SELECT 1 WHERE a = ANY(%s) AND b = %s"
    locked = fragment("SELECT 1 {for_update}")
    assert str(locked) == "SELECT 1 /* FOR UPDATE */" and locked.postgres == "SELECT 1 FOR UPDATE"


def test_a_postgres_only_statement_is_a_neutral_select_on_sqlite() -> None:
    lock = postgres_only("SELECT pg_try_advisory_xact_lock(1, ?)", sqlite_answer="1")
    assert str(lock) == "SELECT 1 FROM (SELECT ?)" and lock.arity == 1
    assert lock.postgres == "SELECT pg_try_advisory_xact_lock(1, %s)"
    bare = postgres_only("SELECT pg_advisory_xact_lock(7)")
    assert str(bare) == "SELECT NULL"
    numbered = postgres_only("SELECT f(?2, ?1, ?2)")
    assert str(numbered) == "SELECT NULL FROM (SELECT ?1, ?2)" and numbered.order == (1, 0, 1)
    with pytest.raises(ValueError, match="different parameters"):
        per_backend(sqlite="SELECT ?", postgres="SELECT 1")


def test_fragments_compose_both_renderings_and_nothing_else() -> None:
    a, b = fragment("a = ?"), fragment(" AND b = ?")
    both = a + b
    assert str(both) == "a = ? AND b = ?" and both.postgres == "a = %s AND b = %s"
    assert both.placeholders == 2
    joined = fragment(" OR ").join([a, fragment("c = ?")])
    assert str(joined) == "a = ? OR c = ?" and joined.postgres == "a = %s OR c = %s"
    with pytest.raises(TypeError):
        a + " AND b = ?"  # type: ignore[operator]
    with pytest.raises(TypeError):
        " AND b = ?" + a
    with pytest.raises(TypeError):
        f"{a}"
    with pytest.raises(TypeError):
        sql("SELECT ?1") + a


def test_plain_text_is_rendered_once_placeholders_only() -> None:
    text = "SELECT name FROM t WHERE a = ? AND b LIKE ?"
    once = sql_module.rendered(text)
    assert once is sql_module.rendered(text)
    assert once.postgres == "SELECT name FROM t WHERE a = %s AND b LIKE %s"  # no ILIKE
    assert sql_module.rendered("SELECT * FROM user").postgres == "SELECT * FROM user"
    with pytest.raises(ValueError, match="BEGIN_READ or BEGIN_WRITE"):
        sql_module.rendered("BEGIN IMMEDIATE")


# -- storage passes only its constants -------------------------------------------------

# The drivers and the LISTEN connection talk to their own connections.
_DRIVERS = {"engine/sqlite.py", "engine/postgres.py", "engine/listen.py"}


def _made_here(node: ast.expr) -> bool:
    """Text made at the call: a literal, an f-string, a concatenation or a
    formatting of strings."""
    if isinstance(node, ast.Constant | ast.JoinedStr):
        return isinstance(node, ast.JoinedStr) or isinstance(node.value, str)
    if isinstance(node, ast.BinOp):
        return _made_here(node.left) or _made_here(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"format", "format_map", "replace", "join"} and _made_here(
            node.func.value
        )
    return False


def test_storage_runs_no_text_of_its_own_making() -> None:
    root = Path(storage_package.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative in _DRIVERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"execute", "executemany"}
                and node.args
                and _made_here(node.args[0])
            ):
                offenders.append(f"{relative}:{node.lineno}")
    assert not offenders, offenders
