"""The PostgreSQL backend behind the storage seam (tasknet/site/storage/
engine/: postgres.py, transactions.py, database.py, schema.py,
schema_postgres.sql).  The two schemas are compared by
tests/site/test_schema_backends.py, the statements of both engines by
tests/site/test_sql_rendering.py.

Everything
runs on a real throwaway PostgreSQL server (``pg_server``, tests/conftest.py)
through the same storage API the site uses, and where a behaviour must be
the same on both backends, on a real SQLite file too (``db_target``):
rows, error classes, the transition trigger, the schemas.  Concurrency is
real: two sessions of one server, two threads where the site would be two
processes.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import pytest_twisted
from twisted.internet.defer import DeferredList

from tasknet.cli.migrate import main as migrate_main
from tasknet.drill.pgserver import ThrowawayPostgres
from tasknet.site import transitions
from tasknet.site.storage import create, usage, users
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine import file_lock as lock
from tasknet.site.storage.engine import postgres, timestamps, transactions
from tasknet.site.storage.engine.errors import (
    DatabaseBusy,
    DatabaseFailed,
    DatabaseUnavailable,
    TaskError,
)
from tasknet.site.storage.engine.schema import (
    CURRENT_VERSION,
    POSTGRES_BASE_VERSION,
    UPGRADES,
    UPGRADES_POSTGRES,
    prepare_database,
    schema_version,
)
from tasknet.site.storage.engine.sql import offset, sql
from tasknet.status import OperationState
from tests.backends import backend_of
from tests.runtime import site_runtime
from tests.site.helpers import HeldWriter

_names = itertools.count(1)


@pytest.fixture
def empty_pg_url(pg_server: ThrowawayPostgres) -> Iterator[str]:
    """A fresh empty PostgreSQL database."""
    name = f"backend_{next(_names)}"
    url = pg_server.create_database(name)
    yield url
    pg_server.drop_database(name)


def prepared(target: str) -> str:
    prepare_database(target)
    return target


def user_id(target: str, name: str = "alice", quota: int = 100) -> int:
    connection = dbmod.connect(target)
    try:
        user, _ = dbmod.run_write(connection, lambda c: users.create_user(c, name, quota=quota))
        return user.id
    finally:
        connection.close()


# -- statements (tests/site/test_sql_rendering.py renders and prepares each) -------


def test_the_engine_chooses_each_transactions_begin() -> None:
    read, write = transactions.BEGIN_READ, transactions.BEGIN_WRITE
    assert (str(read), read.postgres) == (
        "BEGIN",
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
    )
    serializable, committed = write[transactions.SERIALIZABLE], write[transactions.READ_COMMITTED]
    assert (str(serializable), serializable.postgres) == (
        "BEGIN IMMEDIATE",
        "BEGIN ISOLATION LEVEL SERIALIZABLE",
    )
    assert (str(committed), committed.postgres) == (
        "BEGIN IMMEDIATE",
        "BEGIN ISOLATION LEVEL READ COMMITTED",
    )
    assert {read.kind, serializable.kind, committed.kind} == {"begin"}
    assert (transactions.COMMIT.kind, transactions.ROLLBACK.kind) == ("commit", "rollback")


_IN_USERS = sql('SELECT COUNT(*) FROM "user" WHERE id {in_array}')


# -- rows and values (both backends) ---------------------------------------------------


def test_rows_index_by_position_and_name_on_both_backends(db_target: str) -> None:
    prepared(db_target)
    uid = user_id(db_target, quota=7)
    connection = dbmod.connect(db_target)
    try:
        row = connection.execute(
            'SELECT id, name AS Who, quota FROM "user" WHERE id = ?', (uid,)
        ).fetchone()
        assert row[0] == uid and row["who"] == "alice" and row["Who"] == "alice"
        assert list(row.keys())[1].lower() == "who" and row["quota"] == 7
        ident, name, quota = row
        assert (ident, name, quota) == (uid, "alice", 7)
        assert dict(zip(row.keys(), row, strict=True))["quota"] == 7
        with pytest.raises(IndexError):
            row["nope"]
        # SQLite answers an integer SUM as an integer; so does PostgreSQL's adapter.
        total = connection.execute('SELECT SUM(quota), COUNT(*) FROM "user"').fetchone()
        assert total[0] == 7 and type(total[0]) is int and total[1] == 1
        # A bool parameter is the integer 1, as SQLite stores it.
        flagged = connection.execute(
            'SELECT COUNT(*) FROM "user" WHERE is_admin = ?', (False,)
        ).fetchone()
        assert flagged[0] == 1
        assert connection.execute('UPDATE "user" SET quota = quota').fetchone() is None
        # A list parameter is an array on both (JSON for json_each on SQLite).
        assert connection.execute(_IN_USERS, ([uid, uid + 1],)).fetchone()[0] == 1
        assert connection.execute(_IN_USERS, ([],)).fetchone()[0] == 0
    finally:
        connection.close()


_NOW = sql("SELECT {now}")
_NOW_OFFSET = sql("SELECT {now_offset}")


def test_stored_timestamps_have_one_format_on_both_backends(db_target: str) -> None:
    prepared(db_target)
    user_id(db_target)
    connection = dbmod.connect(db_target)
    try:
        created = connection.execute('SELECT created_at FROM "user"').fetchone()[0]
        now = connection.execute(_NOW).fetchone()[0]
        earlier = connection.execute(_NOW_OFFSET, (offset(-3600),)).fetchone()[0]
    finally:
        connection.close()
    pattern = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    python = timestamps.iso(timestamps.parse(now).timestamp())  # the Python side's one helper
    assert all(re.fullmatch(pattern, t) for t in (created, now, earlier, python))
    assert python == now
    assert earlier < created <= now


# -- errors (both backends) ------------------------------------------------------------


def test_a_unique_violation_is_classified_as_on_sqlite(db_target: str) -> None:
    prepared(db_target)
    user_id(db_target)
    connection = dbmod.connect(db_target)
    try:
        with pytest.raises(Exception) as raised:
            dbmod.run_write(
                connection,
                lambda c: c.execute(
                    "INSERT INTO \"user\" (name, token_hash) VALUES ('alice', 'other')"
                ),
            )
        assert dbmod.is_integrity_error(raised.value)
        classified = dbmod.classify(raised.value)
        assert isinstance(classified, DatabaseFailed) and classified.__cause__ is raised.value
        # The connection is usable again, nothing was committed.
        assert connection.execute('SELECT COUNT(*) FROM "user"').fetchone()[0] == 1
        # Storage code refuses a duplicate as a business error on both backends.
        with pytest.raises(users.UserError, match="already exists"):
            dbmod.run_write(connection, lambda c: users.create_user(c, "alice"))
    finally:
        connection.close()


def test_the_transition_trigger_refuses_what_transitions_refuses(db_target: str) -> None:
    prepared(db_target)
    uid = user_id(db_target)
    connection = dbmod.connect(db_target)

    def write(sql: str, *params: Any) -> None:
        dbmod.run_write(connection, lambda c: c.execute(sql, params))

    def refused(message: str, sql: str, *params: Any) -> None:
        with pytest.raises(Exception, match=message) as raised:
            write(sql, *params)
        assert dbmod.is_integrity_error(raised.value)

    try:
        insert = (
            "INSERT INTO task_operation (gid, operation_id, state, user_id) VALUES (1, 'a', ?, ?)"
        )
        for bad in ("SUBMITTING", "UNKNOWN", "DELETE_PENDING", "DELETED"):
            refused("illegal task_operation transition", insert, bad, uid)
        write(insert, "RESERVED", uid)
        for bad in ("SUBMITTED", "UNKNOWN", "DELETE_PENDING", "DELETED"):
            refused(
                "illegal task_operation transition",
                "UPDATE task_operation SET state = ? WHERE gid = 1",
                bad,
            )
        write("UPDATE task_operation SET state = 'SUBMITTING' WHERE gid = 1")
        write("UPDATE task_operation SET state = 'SUBMITTED' WHERE gid = 1")
        refused("illegal task_operation transition", "DELETE FROM task_operation WHERE gid = 1")
        refused(
            "operationId may not be rewritten",
            "UPDATE task_operation SET operation_id = 'b' WHERE gid = 1",
        )
        write("UPDATE task_operation SET step = 'x' WHERE gid = 1")  # other columns are free
        row = connection.execute("SELECT state, operation_id FROM task_operation").fetchone()
        assert tuple(row) == ("SUBMITTED", "a")
        rows = {tuple(r) for r in connection.execute("SELECT * FROM task_transition")}
    finally:
        connection.close()

    def name(state: OperationState | None) -> str:
        return "NONE" if state is None else state.value

    assert rows == {(name(a), name(b)) for a, b in transitions.ALLOWED}


def test_a_lock_held_past_the_timeout_is_busy_not_a_hang(empty_pg_url: str) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    _seed_usage(empty_pg_url, uid)
    holder = psycopg.connect(empty_pg_url)  # a transaction until rollback
    connection = postgres.connect(empty_pg_url, lock_timeout_ms=100)
    try:
        holder.execute("UPDATE weekly_usage SET used = used WHERE user_id = %s", (uid,))
        with pytest.raises(psycopg.errors.LockNotAvailable) as raised:
            dbmod.run_write(connection, usage.meter, uid, "w", 1)
        assert isinstance(dbmod.classify(raised.value), DatabaseBusy)
        holder.rollback()
        dbmod.run_write(connection, usage.meter, uid, "w", 1)
        assert _used(empty_pg_url, uid) == 11
    finally:
        holder.close()
        connection.close()


# -- serialization conflicts ------------------------------------------------------------


def _meter_with_interference(
    target: str, uid: int, attempts: list[int], interfere: Callable[[], None]
) -> Callable[[Any], int]:
    """A write of ``weekly_usage`` that, on its first attempt only, lets
    another session commit a change of the same row between its read and
    its write: a real serialization failure."""

    def fn(cursor: Any) -> int:
        attempts.append(1)
        row = cursor.execute(
            "SELECT used FROM weekly_usage WHERE user_id = ? AND week = 'w'", (uid,)
        ).fetchone()
        if len(attempts) == 1:
            interfere()
        cursor.execute(
            "UPDATE weekly_usage SET used = ? WHERE user_id = ? AND week = 'w'",
            (row["used"] + 1, uid),
        )
        return int(row["used"]) + 1

    return fn


def _other_session_adds(target: str, uid: int, amount: int) -> Callable[[], None]:
    def interfere() -> None:
        with psycopg.connect(target, autocommit=True) as other:
            other.execute(
                "UPDATE weekly_usage SET used = used + %s WHERE user_id = %s AND week = 'w'",
                (amount, uid),
            )

    return interfere


def _seed_usage(target: str, uid: int) -> None:
    connection = dbmod.connect(target)
    try:
        dbmod.run_write(connection, usage.meter, uid, "w", 10)
    finally:
        connection.close()


def _used(target: str, uid: int) -> int:
    connection = dbmod.connect(target)
    try:
        return int(
            connection.execute(
                "SELECT used FROM weekly_usage WHERE user_id = ? AND week = 'w'", (uid,)
            ).fetchone()[0]
        )
    finally:
        connection.close()


def test_a_serialization_failure_reruns_the_transaction_and_it_lands(empty_pg_url: str) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    _seed_usage(empty_pg_url, uid)
    attempts: list[int] = []
    fn = _meter_with_interference(
        empty_pg_url, uid, attempts, _other_session_adds(empty_pg_url, uid, 5)
    )
    connection = dbmod.connect(empty_pg_url)
    try:
        assert dbmod.run_write(connection, fn) == 16  # read after the other's commit
    finally:
        connection.close()
    assert len(attempts) == 2
    assert _used(empty_pg_url, uid) == 16  # both changes, none lost


def test_a_swallowed_serialization_failure_is_still_rerun(empty_pg_url: str) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    _seed_usage(empty_pg_url, uid)
    attempts: list[int] = []
    inner = _meter_with_interference(
        empty_pg_url, uid, attempts, _other_session_adds(empty_pg_url, uid, 5)
    )

    def swallowing(cursor: Any) -> str:
        try:
            inner(cursor)
        except psycopg.Error:
            pass  # a bug: carries on in an aborted transaction
        return "done"

    connection = dbmod.connect(empty_pg_url)
    try:
        assert dbmod.run_write(connection, swallowing) == "done"
    finally:
        connection.close()
    assert len(attempts) == 2 and _used(empty_pg_url, uid) == 16


def test_a_commit_of_a_transaction_aborted_by_another_error_fails(empty_pg_url: str) -> None:
    prepared(empty_pg_url)
    user_id(empty_pg_url)
    connection = dbmod.connect(empty_pg_url)

    def swallowing(cursor: Any) -> None:
        try:
            cursor.execute("INSERT INTO \"user\" (name, token_hash) VALUES ('alice', 'x')")
        except psycopg.Error:
            pass
        cursor.execute("SELECT 1")  # never reached: the transaction is aborted

    def swallowing_last(cursor: Any) -> None:
        try:
            cursor.execute("INSERT INTO \"user\" (name, token_hash) VALUES ('alice', 'x')")
        except psycopg.Error:
            pass

    try:
        with pytest.raises(psycopg.Error):
            dbmod.run_write(connection, swallowing)
        with pytest.raises(psycopg.errors.UniqueViolation):
            dbmod.run_write(connection, swallowing_last)  # not a silent rollback
        assert not connection.in_transaction
        assert connection.execute('SELECT COUNT(*) FROM "user"').fetchone()[0] == 1
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_the_writer_reruns_a_conflicting_transaction(empty_pg_url: str) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    _seed_usage(empty_pg_url, uid)
    attempts: list[int] = []
    fn = _meter_with_interference(
        empty_pg_url, uid, attempts, _other_session_adds(empty_pg_url, uid, 5)
    )
    db = dbmod.open_pool(empty_pg_url, **site_runtime())
    try:
        assert (db.backend, db.target) == ("postgresql", empty_pg_url)
        assert await db.write(fn) == 16
        assert (db.writes, db.transactions) == (1, 1)
    finally:
        db.close()
    assert len(attempts) == 2 and _used(empty_pg_url, uid) == 16


@pytest_twisted.ensureDeferred
async def test_a_conflict_in_a_group_commit_reruns_its_writes_one_by_one(empty_pg_url: str) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    _seed_usage(empty_pg_url, uid)
    db = dbmod.open_pool(empty_pg_url, **site_runtime())
    calls: list[str] = []

    def named(name: str) -> Callable[[Any], str]:
        def fn(cursor: Any) -> str:
            calls.append(name)
            cursor.execute("INSERT INTO node_key (node_id, secret) VALUES (?, 's')", (name,))
            return name

        return fn

    attempts: list[int] = []
    conflicting = _meter_with_interference(
        empty_pg_url, uid, attempts, _other_session_adds(empty_pg_url, uid, 5)
    )
    try:
        held = HeldWriter(db)
        await held.started()
        writes = [db.write(named("a")), db.write(conflicting), db.write(named("b"))]
        held.release()
        await held.done
        results = await DeferredList(writes, consumeErrors=True)
        assert results == [(True, "a"), (True, 16), (True, "b")]
        assert calls == ["a", "a", "b"]  # "a" again: each write alone, from scratch
        assert len(attempts) == 2
        # The batch lost the conflict, so each of its three writes ran in a
        # transaction of its own (one conflicting write takes no other down).
        assert (db.writes, db.transactions, db.conflicts) == (4, 4, 1)
    finally:
        db.close()
    connection = dbmod.connect(empty_pg_url)
    try:
        assert connection.execute("SELECT COUNT(*) FROM node_key").fetchone()[0] == 2
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_a_conflict_that_never_ends_fails_busy(empty_pg_url: str, monkeypatch) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    _seed_usage(empty_pg_url, uid)
    monkeypatch.setattr(transactions, "CONFLICT_RETRIES", 2)
    attempts: list[int] = []
    interfere = _other_session_adds(empty_pg_url, uid, 1)

    def always_conflicting(cursor: Any) -> None:
        attempts.append(1)
        cursor.execute("SELECT used FROM weekly_usage WHERE user_id = ?", (uid,)).fetchone()
        interfere()
        cursor.execute("UPDATE weekly_usage SET used = used + 1 WHERE user_id = ?", (uid,))

    db = dbmod.open_pool(empty_pg_url, **site_runtime())
    try:
        with pytest.raises(DatabaseBusy, match="serialization") as raised:
            await db.write(always_conflicting)
        assert isinstance(raised.value.__cause__, psycopg.errors.SerializationFailure)
        assert len(attempts) == 3
    finally:
        db.close()
    assert _used(empty_pg_url, uid) == 13  # the other session's three, none of ours


# -- group commit, reads, broken connections ----------------------------------------


@pytest_twisted.ensureDeferred
async def test_group_commit_on_postgresql(empty_pg_url: str) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    db = dbmod.open_pool(empty_pg_url, **site_runtime())
    try:
        held = HeldWriter(db)
        await held.started()
        reservations = [
            db.write(create.reserve, gid, uid, f"t{gid}", "tok", "2026-W01") for gid in (1, 2, 3)
        ]
        duplicate = db.write(create.reserve, 2, uid, "again", "tok", "2026-W01")
        held.release()
        await held.done
        results = await DeferredList([*reservations, duplicate], consumeErrors=True)
        assert [ok for ok, _ in results] == [True, True, True, False]
        assert results[3][1].check(TaskError) and results[3][1].value.code == "conflict"
        assert (db.writes, db.transactions) == (4, 2)  # the hold, then one for the rest
        views = await db.read(lambda c: [r[0] for r in c.execute("SELECT gid FROM gallery")])
        assert sorted(views) == [1, 2, 3]
        with pytest.raises(DatabaseFailed, match="read-only"):
            await db.read(lambda c: c.execute("DELETE FROM gallery"))
    finally:
        db.close()


@pytest_twisted.ensureDeferred
async def test_a_broken_connection_is_replaced_and_its_transaction_run_again_once(
    empty_pg_url: str,
) -> None:
    # SCALE.md "Fencing" 4: the transaction that met the dead connection is
    # run again whole on a fresh one (it had not committed), exactly once.
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    db = dbmod.open_pool(empty_pg_url, **site_runtime())
    try:
        pid = await db.write(lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0])
        with psycopg.connect(empty_pg_url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        await db.write(usage.meter, uid, "w", 1)
        assert db.reconnects == 1
        await db.write(usage.meter, uid, "w", 2)
        new_pid = await db.write(lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0])
        assert new_pid != pid
    finally:
        db.close()
    assert _used(empty_pg_url, uid) == 3


@pytest_twisted.ensureDeferred
async def test_a_database_that_stays_unreachable_fails_writes_as_unavailable(
    empty_pg_url: str,
) -> None:
    prepared(empty_pg_url)
    uid = user_id(empty_pg_url)
    database = empty_pg_url.rsplit("/", 1)[1].split("?")[0]
    admin_url = empty_pg_url.replace(f"/{database}", "/postgres", 1)
    db = dbmod.open_pool(empty_pg_url, **site_runtime())
    try:
        pid = await db.write(lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0])
        with psycopg.connect(admin_url, autocommit=True) as other:
            other.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            other.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            try:
                with pytest.raises(DatabaseUnavailable):  # busy: retry later
                    await db.write(usage.meter, uid, "w", 1)
            finally:
                other.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await db.write(usage.meter, uid, "w", 2)
    finally:
        db.close()
    assert _used(empty_pg_url, uid) == 2


# -- schema ------------------------------------------------------------------------


def test_sites_starting_together_create_the_schema_once(empty_pg_url: str) -> None:
    results: list[bool] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def start() -> None:
        try:
            barrier.wait(10)
            results.append(prepare_database(empty_pg_url))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sorted(results) == [False, False, True]
    connection = dbmod.connect(empty_pg_url)
    try:
        assert schema_version(connection) == CURRENT_VERSION
        versions = [r[0] for r in connection.execute("SELECT version FROM schema_version")]
        assert sorted(versions) == list(range(2, CURRENT_VERSION + 1))
    finally:
        connection.close()


def test_a_foreign_database_is_refused_and_left_alone(empty_pg_url: str) -> None:
    with psycopg.connect(empty_pg_url, autocommit=True) as other:
        other.execute("CREATE TABLE theirs (x int)")
    with pytest.raises(Exception, match="no tasknet schema"):
        prepare_database(empty_pg_url)
    with psycopg.connect(empty_pg_url, autocommit=True) as other:
        tables = other.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    assert tables == [("theirs",)]


def test_every_version_has_its_postgresql_script() -> None:
    assert set(UPGRADES_POSTGRES) == set(range(POSTGRES_BASE_VERSION + 1, CURRENT_VERSION + 1))
    assert set(UPGRADES) == set(range(2, CURRENT_VERSION + 1))


# -- tools and the seam ----------------------------------------------------------------


def test_the_backend_of_a_target() -> None:
    assert dbmod.is_postgres("postgresql://u@h/db") and dbmod.is_postgres("postgres://h/db")
    assert not dbmod.is_postgres("site.sqlite") and not dbmod.is_postgres("/x/postgresql://")
    assert backend_of("postgres://h/db") == dbmod.backend_of("postgres://h/db") == "postgresql"
    assert dbmod.describe("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert dbmod.describe("postgresql://u@h/db") == "postgresql://u@h/db"


def test_no_instance_lock_is_taken_on_postgresql(empty_pg_url: str) -> None:
    first = lock.acquire(empty_pg_url)
    second = lock.acquire(empty_pg_url)  # several sites share one database
    assert first.held and second.held and first.path is None
    first.release()
    assert not first.held


def test_migrate_creates_the_schema_on_an_empty_postgresql_database(
    empty_pg_url: str, capsys
) -> None:
    assert migrate_main(["--db", empty_pg_url]) == 0
    assert f"at schema v{CURRENT_VERSION}" in capsys.readouterr().out
    assert migrate_main(["--db", empty_pg_url]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert migrate_main(["--db", empty_pg_url.rsplit("/", 1)[0] + "/no_such_database"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_a_multi_host_url_tries_the_last_writable_host_first(empty_pg_url: str) -> None:
    """After a failover the URL's first host may answer nothing (its host
    cut off: no RST): each new session would wait its connect_timeout there
    before trying the new primary.  Once a session opened on a host, the
    next ones of the process try that host first."""
    import socket
    import time
    from urllib.parse import urlsplit

    parts = urlsplit(empty_pg_url)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the handshake completes, nothing ever answers
    try:
        hosts = f"127.0.0.1:{silent.getsockname()[1]},{parts.hostname}:{parts.port}"
        url = (
            f"postgresql://{parts.username}@{hosts}{parts.path}"
            "?target_session_attrs=read-write&connect_timeout=4"
        )
        began = time.monotonic()
        postgres.connect(url).close()
        first = time.monotonic() - began
        began = time.monotonic()
        connection = postgres.connect(url)
        again = time.monotonic() - began
        assert connection.raw.info.port == parts.port
        connection.close()
    finally:
        silent.close()
        postgres._last_writable.clear()
    assert first >= 3.9  # the silent host's connect_timeout
    assert again < 3.0, again  # not waited for again (a loaded machine's connect is slow, not 4 s)
    params = {"host": "a,b,c", "port": "1", "target_session_attrs": "read-write"}
    listed = postgres.listed_hosts(params)
    assert postgres.writable_first(params, listed) == params  # nothing known yet
    postgres._last_writable[("a,b,c", "1")] = ("b", "1")
    try:
        assert postgres.writable_first(params, listed)["host"] == "b,a,c"
    finally:
        postgres._last_writable.clear()
    assert postgres.listed_hosts({"host": "a,b", "target_session_attrs": "any"}) is None
    assert postgres.listed_hosts({"host": "a", "target_session_attrs": "read-write"}) is None
