"""Group commit in ``Database.write``: writes called while the writer is busy
share one ``BEGIN IMMEDIATE … COMMIT``, each in its own savepoint.

Real SQLite files in tmp_path.  The writer connection's own statement trace
(``sqlite3.Connection.set_trace_callback``, set from inside a write) is the
witness of how many transactions ran; a second, plain connection is the
witness of what was committed when.  To make batches deterministic, a first
write holds the writer thread (it waits on an event) while the test queues
the writes that must share the next transaction.

SQLite only: the witness is SQLite's own statement trace (with the bound
values expanded) and the faults are SQLite's (``BEGIN EXCLUSIVE`` from
another connection, a transaction SQLite ended itself).  The same group
commit on PostgreSQL, with its retries of serialization failures, is tested
through the site (every ``db_target`` test) and by the backend's own tests.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.task import Clock

from tasknet.site.storage import create, usage
from tasknet.site.storage.engine.database import Database, Retry, connect, open_pool
from tasknet.site.storage.engine.errors import (
    DatabaseBusy,
    DatabaseFailed,
    TaskError,
    TransactionLost,
)
from tasknet.site.storage.engine.schema import prepare_database
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import HeldWriter, add_user

SCRATCH_SCHEMA = """
CREATE TABLE item (name TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0 CHECK (n >= 0));
CREATE TABLE parent (id INTEGER PRIMARY KEY);
CREATE TABLE child (
    id INTEGER PRIMARY KEY,
    parent_id INTEGER NOT NULL REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED
);
"""


def scratch_database(tmp_path: Path) -> str:
    path = str(tmp_path / "scratch.sqlite")
    connection = connect(path)
    try:
        connection.executescript(SCRATCH_SCHEMA)
    finally:
        connection.close()
    return path


@asynccontextmanager
async def opened(path: str, **options: Any) -> AsyncIterator[tuple[Database, list[str]]]:
    """The database and the live list of statements its writer runs."""
    db = open_pool(path, **site_runtime(), **options)
    statements: list[str] = []
    try:
        await db.write(lambda cursor: cursor.connection.set_trace_callback(statements.append))
        statements.clear()
        yield db, statements
    finally:
        db.close()


def insert(name: str, n: int = 0) -> Callable[[sqlite3.Cursor], str]:
    def fn(cursor: sqlite3.Cursor) -> str:
        cursor.execute("INSERT INTO item (name, n) VALUES (?, ?)", (name, n))
        return name

    return fn


def committed_items(path: str) -> list[str]:
    connection = connect(path)
    try:
        return [r[0] for r in connection.execute("SELECT name FROM item ORDER BY name")]
    finally:
        connection.close()


def count(statements: list[str], statement: str) -> int:
    return sum(1 for s in statements if s.strip().upper() == statement)


async def settle(ds: list[Deferred[Any]]) -> list[tuple[bool, Any]]:
    return await DeferredList(ds, consumeErrors=True)


@pytest_twisted.ensureDeferred
async def test_a_lone_write_is_a_plain_transaction(tmp_path):
    path = scratch_database(tmp_path)
    async with opened(path) as (db, statements):
        assert await db.write(insert("a")) == "a"
        assert statements == [
            "BEGIN IMMEDIATE",
            "INSERT INTO item (name, n) VALUES ('a', 0)",
            "COMMIT",
        ]
        with pytest.raises(DatabaseFailed, match="UNIQUE") as failed:
            await db.write(insert("a"))
        assert isinstance(failed.value.__cause__, sqlite3.IntegrityError)
        assert statements[-1] == "ROLLBACK"
        assert (db.writes, db.transactions) == (2, 2)  # the trace setter, "a"
    assert committed_items(path) == ["a"]


@pytest_twisted.ensureDeferred
async def test_writes_queued_behind_a_transaction_share_one_commit(tmp_path):
    path = scratch_database(tmp_path)
    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes = [db.write(insert(f"item-{i:02}")) for i in range(20)]
        held.release()
        assert await held.done == "held"
        results = await settle(writes)
        assert results == [(True, f"item-{i:02}") for i in range(20)]
        # The held write's transaction, then one for all twenty.
        assert count(statements, "COMMIT") == 2
        assert count(statements, "BEGIN IMMEDIATE") == 2
        assert count(statements, "SAVEPOINT DATABASE_WRITE") == 20
        assert db.transactions == 3  # with the trace setter's
    assert committed_items(path) == [f"item-{i:02}" for i in range(20)]


@pytest_twisted.ensureDeferred
async def test_batches_are_bounded(tmp_path):
    path = scratch_database(tmp_path)
    async with opened(path, max_batch=4) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes = [db.write(insert(f"item-{i:02}")) for i in range(10)]
        held.release()
        await held.done
        assert all(ok for ok, _ in await settle(writes))
        # 1 held + ceil(10 / 4) batches; no transaction carries more than 4.
        assert count(statements, "COMMIT") == 4
        per_transaction = "|".join(statements).split("COMMIT")
        assert max(p.count("|SAVEPOINT database_write") for p in per_transaction) == 4
    assert len(committed_items(path)) == 10


@pytest_twisted.ensureDeferred
async def test_a_failing_write_rolls_back_alone(tmp_path):
    path = scratch_database(tmp_path)

    def insert_then_fail(cursor: sqlite3.Cursor) -> None:
        cursor.execute("INSERT INTO item (name) VALUES ('half-done')")
        raise ValueError("changed my mind")

    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes: list[Deferred[Any]] = [
            db.write(insert("a")),
            db.write(insert("a")),  # the unique-index loser
            db.write(insert("b")),
            db.write(insert("negative", -1)),  # CHECK fails
            db.write(insert_then_fail),
            db.write(insert("c")),
        ]
        held.release()
        await held.done
        results = await settle(writes)
        assert count(statements, "COMMIT") == 2
    assert [ok for ok, _ in results] == [True, False, True, False, False, True]
    assert results[1][1].check(DatabaseFailed)
    assert "UNIQUE" in results[1][1].getErrorMessage()
    assert results[3][1].check(DatabaseFailed)
    assert "CHECK" in results[3][1].getErrorMessage()
    assert results[4][1].check(ValueError)
    assert committed_items(path) == ["a", "b", "c"]


@pytest_twisted.ensureDeferred
async def test_no_write_is_answered_before_its_commit(tmp_path):
    path = scratch_database(tmp_path)
    witness = connect(path)
    seen: dict[str, bool] = {}

    def check_committed(name: str) -> None:
        row = witness.execute("SELECT 1 FROM item WHERE name = ?", (name,)).fetchone()
        seen[name] = row is not None

    try:
        async with opened(path) as (db, _):
            held = HeldWriter(db)
            await held.started()
            writes = [db.write(insert(f"item-{i}")).addCallback(check_committed) for i in range(8)]
            held.release()
            await held.done
            await settle(writes)
            check_committed("lone")  # the witness really can miss a row
            assert seen.pop("lone") is False
            await db.write(insert("lone")).addCallback(check_committed)
    finally:
        witness.close()
    assert seen == {f"item-{i}": True for i in range(8)} | {"lone": True}


@pytest_twisted.ensureDeferred
async def test_a_failed_commit_fails_every_write_of_its_batch(tmp_path):
    path = scratch_database(tmp_path)

    def orphan(cursor: sqlite3.Cursor) -> None:
        # A deferred foreign key: the statement passes, the COMMIT refuses.
        cursor.execute("INSERT INTO child (parent_id) VALUES (99)")

    def add_parent(cursor: sqlite3.Cursor) -> None:
        cursor.execute("INSERT INTO parent (id) VALUES (1)")

    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes: list[Deferred[Any]] = [
            db.write(add_parent),
            db.write(insert("a")),
            db.write(insert("a")),  # fails on its own, keeps its own error
            db.write(orphan),
            db.write(insert("b")),
        ]
        held.release()
        assert await held.done == "held"  # its own transaction, committed
        results = await settle(writes)
        assert statements[-1] == "ROLLBACK"
        assert not [ok for ok, _ in results if ok]
        for index in (0, 1, 3, 4):
            assert results[index][1].check(DatabaseFailed)
            assert "FOREIGN KEY" in results[index][1].getErrorMessage()
        assert "UNIQUE" in results[2][1].getErrorMessage()
        # Nothing of the batch is committed, and the writer still works.
        assert committed_items(path) == []
        assert await db.write(insert("after")) == "after"
    assert committed_items(path) == ["after"]
    connection = connect(path)
    try:
        assert connection.execute("SELECT COUNT(*) FROM parent").fetchone()[0] == 0
        assert connection.execute("SELECT COUNT(*) FROM child").fetchone()[0] == 0
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_a_locked_database_fails_every_write_of_the_batch_unrun(tmp_path):
    path = scratch_database(tmp_path)
    ran: list[str] = []

    def recorded(name: str) -> Callable[[sqlite3.Cursor], str]:
        def fn(cursor: sqlite3.Cursor) -> str:
            ran.append(name)
            return insert(name)(cursor)

        return fn

    async with opened(path, busy_timeout_ms=150) as (db, statements):
        locker = sqlite3.connect(path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            writes = [db.write(recorded(f"item-{i}")) for i in range(6)]
            results = await settle(writes)
            locker.execute("ROLLBACK")
        finally:
            locker.close()
        assert ran == []
        for ok, failure in results:
            assert not ok
            assert failure.check(DatabaseBusy)  # classified: retry the transaction
            assert "locked" in failure.getErrorMessage()
        # Six writes, at most two attempts at the lock (a lone first one,
        # then the rest together), each waiting busy_timeout once.
        assert 1 <= count(statements, "BEGIN IMMEDIATE") <= 2
        assert await db.write(recorded("after")) == "after"
    assert committed_items(path) == ["after"]


@pytest_twisted.ensureDeferred
async def test_a_transaction_ended_early_fails_only_what_it_carried(tmp_path):
    """SQLite rolls a whole transaction back on some errors (a full disk, an
    I/O error); a write ending it is the same situation: the writes before
    it lost their changes and must not be answered as committed; the writes
    after it still run, in a transaction of their own."""
    path = scratch_database(tmp_path)

    def end_transaction(cursor: sqlite3.Cursor) -> None:
        cursor.execute("ROLLBACK")
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes: list[Deferred[Any]] = [
            db.write(insert("a")),
            db.write(end_transaction),
            db.write(insert("b")),
            db.write(insert("c")),
        ]
        held.release()
        await held.done
        results = await settle(writes)
    assert [ok for ok, _ in results] == [False, False, True, True]
    assert results[0][1].check(TransactionLost)
    assert "disk I/O error (simulated)" in results[0][1].getErrorMessage()
    assert results[1][1].check(DatabaseFailed)
    assert committed_items(path) == ["b", "c"]


@pytest_twisted.ensureDeferred
async def test_concurrent_reservations_share_commits_and_the_loser_fails_alone(tmp_path):
    """The site's own create step: sixteen reservations and a second one for
    an already reserved gid, queued together."""
    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    user_id, _ = add_user(path, "alice")
    week = usage.iso_week()
    gids = list(range(1001, 1017))
    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes = [db.write(create.reserve, gid, user_id, "", "tok", week) for gid in gids]
        writes.append(db.write(create.reserve, gids[3], user_id, "", "tok", week))
        held.release()
        await held.done
        results = await settle(writes)
        assert count(statements, "COMMIT") == 2
    assert all(ok for ok, _ in results[:-1])
    ok, failure = results[-1]
    assert not ok and failure.check(TaskError) and failure.value.code == "conflict"
    connection = connect(path)
    try:
        reserved = connection.execute(
            "SELECT gid, operation_id FROM task_operation WHERE state = 'RESERVED' ORDER BY gid"
        ).fetchall()
    finally:
        connection.close()
    assert [r["gid"] for r in reserved] == gids
    assert [r["operation_id"] for r in reserved] == [value for _, value in results[:-1]]


# -- coalesced writes: items of one batch function ---------------------------


class InsertAll:
    """A batch function: inserts every name it is given (one result each),
    recording the items of each call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, cursor: sqlite3.Cursor, names: list[str]) -> list[str]:
        self.calls.append(list(names))
        for name in names:
            if name == "end-it":
                cursor.execute("ROLLBACK")
                raise sqlite3.OperationalError("disk I/O error (simulated)")
            n = -1 if name.startswith("bad") else 0
            cursor.execute("INSERT INTO item (name, n) VALUES (?, ?)", (name, n))
        return [name.upper() for name in names]


@pytest_twisted.ensureDeferred
async def test_a_lone_item_is_a_plain_transaction(tmp_path):
    path = scratch_database(tmp_path)
    insert_all = InsertAll()
    async with opened(path) as (db, statements):
        committed = await db.write_joined(insert_all, "a")
        assert statements == [
            "BEGIN IMMEDIATE",
            "INSERT INTO item (name, n) VALUES ('a', 0)",
            "COMMIT",
        ]
    assert (committed.value, committed.transaction) == ("A", 2)  # after the trace setter's
    assert committed.seconds >= 0
    assert insert_all.calls == [["a"]]


@pytest_twisted.ensureDeferred
async def test_queued_items_of_one_function_are_one_call_under_one_savepoint(tmp_path):
    path = scratch_database(tmp_path)
    insert_all, other = InsertAll(), InsertAll()
    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes: list[Deferred[Any]] = [db.write_joined(insert_all, "item-0")]
        writes.append(db.write(insert("plain-1")))
        writes += [db.write_joined(insert_all, f"item-{i}") for i in range(1, 5)]
        writes.append(db.write_joined(other, "other"))
        writes.append(db.write(insert("plain-2")))
        held.release()
        await held.done
        results = await settle(writes)
        assert all(ok for ok, _ in results)
        # Each function called once, with its items in queue order.
        assert insert_all.calls == [[f"item-{i}" for i in range(5)]]
        assert other.calls == [["other"]]
        # The held write's transaction, then one for everything; a savepoint
        # per unit: insert_all's items, plain-1, other's, plain-2.
        assert count(statements, "COMMIT") == 2
        assert count(statements, "SAVEPOINT DATABASE_WRITE") == 4
        inserted = [s for s in statements if s.startswith("INSERT")]
        assert [s.split("'")[1] for s in inserted] == [
            *(f"item-{i}" for i in range(5)),
            "plain-1",
            "other",
            "plain-2",
        ]
    answers = [value for _, value in results]
    assert [a.value for a in answers[:1] + answers[2:7]] == [f"ITEM-{i}" for i in range(5)] + [
        "OTHER"
    ]
    assert answers[1] == "plain-1" and answers[7] == "plain-2"
    assert {a.transaction for a in answers[:1] + answers[2:7]} == {3}
    assert committed_items(path) == sorted(
        [f"item-{i}" for i in range(5)] + ["other", "plain-1", "plain-2"]
    )


@pytest_twisted.ensureDeferred
async def test_items_join_the_waiting_write_which_counts_once_in_a_batch(tmp_path):
    """A burst of items is one write of the queue, however many there are
    (``max_batch`` bounds the writes of a transaction, not the items of
    one): at most one write of the function waits, and a plain write queued
    after an item runs after it, with the burst, not behind it."""
    path = scratch_database(tmp_path)
    insert_all = InsertAll()
    async with opened(path, max_batch=2) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        items = [db.write_joined(insert_all, f"item-{i:02}") for i in range(10)]
        plain = db.write(insert("plain"))
        late = db.write(insert("late"))  # the batch is full: next transaction
        items += [db.write_joined(insert_all, f"item-{i:02}") for i in range(10, 12)]
        held.release()
        await held.done
        results = await settle([*items, plain, late])
        assert all(ok for ok, _ in results)
        assert insert_all.calls == [[f"item-{i:02}" for i in range(12)]]
        inserted = [s.split("'")[1] for s in statements if s.startswith("INSERT")]
        assert inserted == [*(f"item-{i:02}" for i in range(12)), "plain", "late"]
        assert count(statements, "COMMIT") == 3  # the held write's, then two
    assert len({value.transaction for _, value in results[:12]}) == 1


@pytest_twisted.ensureDeferred
async def test_a_failing_item_fails_alone_the_others_run_one_by_one(tmp_path):
    path = scratch_database(tmp_path)
    insert_all = InsertAll()
    names = ["a", "bad-1", "b", "a", "c"]  # a CHECK failure and a UNIQUE loser
    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes = [db.write_joined(insert_all, name) for name in names]
        writes.append(db.write(insert("plain")))
        held.release()
        await held.done
        results = await settle(writes)
        assert count(statements, "COMMIT") == 2  # still one transaction
        # The batch call (rolled back to its savepoint), then one call per item.
        assert insert_all.calls == [names] + [[n] for n in names]
    assert [ok for ok, _ in results] == [True, False, True, False, True, True]
    assert results[1][1].check(DatabaseFailed) and "CHECK" in results[1][1].getErrorMessage()
    assert results[3][1].check(DatabaseFailed) and "UNIQUE" in results[3][1].getErrorMessage()
    assert [results[i][1].value for i in (0, 2, 4)] == ["A", "B", "C"]
    assert committed_items(path) == ["a", "b", "c", "plain"]


@pytest_twisted.ensureDeferred
async def test_items_of_a_call_that_ended_the_transaction_run_again_one_by_one(tmp_path):
    """The batch call ends the transaction (as SQLite does on a full disk):
    the plain write before it lost its changes; the items cannot be told
    apart yet, so each runs again alone in the next transaction: the guilty
    one fails with its own error, the one before it in that transaction is
    lost with it (retryable), the one after it commits in a third."""
    path = scratch_database(tmp_path)
    insert_all = InsertAll()
    async with opened(path) as (db, statements):
        held = HeldWriter(db)
        await held.started()
        writes: list[Deferred[Any]] = [db.write(insert("before"))]
        writes += [db.write_joined(insert_all, name) for name in ("x", "end-it", "y")]
        held.release()
        await held.done
        results = await settle(writes)
        assert count(statements, "COMMIT") == 2  # the held write's, and y's alone
    assert [ok for ok, _ in results] == [False, False, False, True]
    for lost in (0, 1):
        assert results[lost][1].check(TransactionLost) and results[lost][1].check(DatabaseBusy)
    assert results[2][1].check(DatabaseFailed)
    assert "disk I/O error (simulated)" in results[2][1].getErrorMessage()
    assert insert_all.calls == [["x", "end-it", "y"], ["x"], ["end-it"], ["y"]]
    assert results[3][1].value == "Y"
    assert committed_items(path) == ["y"]


# -- retries of a whole transaction -------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_busy_write_is_retried_on_the_clock_until_it_lands(tmp_path):
    path = scratch_database(tmp_path)
    clock = Clock()
    tried: list[float] = []

    def attempt(cursor: sqlite3.Cursor) -> str:
        return insert("late")(cursor)

    async with opened(path, busy_timeout_ms=20, clock=clock) as (db, statements):
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            retry = Retry("test write", 10.0, lambda n: [0.5, 1.0][min(n, 1)])
            done = db.write_retrying(retry, attempt)
            for delay in (0.5, 1.0, 1.0):
                # The attempt failed on the real lock: the next one waits on the clock.
                await eventually(lambda: len(clock.getDelayedCalls()) == 1)
                [call] = clock.getDelayedCalls()
                tried.append(round(call.getTime() - clock.seconds(), 6))
                assert not done.called
                if delay == 1.0 and len(tried) == 3:
                    locker.execute("ROLLBACK")
                clock.advance(delay)
            assert await done == "late"
        finally:
            if locker.in_transaction:
                locker.execute("ROLLBACK")
            locker.close()
        assert count(statements, "BEGIN IMMEDIATE") == 4
    assert tried == [0.5, 1.0, 1.0]
    assert committed_items(path) == ["late"]


@pytest_twisted.ensureDeferred
async def test_a_write_busy_past_its_window_fails_busy_and_other_errors_are_not_retried(tmp_path):
    path = scratch_database(tmp_path)
    clock = Clock()
    async with opened(path, busy_timeout_ms=20, clock=clock) as (db, statements):
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            done = db.write_retrying(Retry("test write", 1.0, lambda _: 0.4), insert("x"))
            for _ in range(2):  # attempts at 0, 0.4, 0.8; 1.2 would be past the window
                await eventually(lambda: len(clock.getDelayedCalls()) == 1)
                clock.advance(0.4)
            with pytest.raises(DatabaseBusy, match="locked"):
                await done
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert count(statements, "BEGIN IMMEDIATE") <= 3
        statements.clear()
        await db.write(insert("a"))
        with pytest.raises(DatabaseFailed, match="UNIQUE"):
            await db.write_retrying(Retry("again", 10.0, lambda _: 0.4), insert("a"))
        assert clock.getDelayedCalls() == []
        assert count(statements, "BEGIN IMMEDIATE") == 2  # "a", and the one failed attempt


def test_bad_options_are_refused(tmp_path):
    path = str(tmp_path / "x.sqlite")
    with pytest.raises(ValueError, match="max_batch"):
        Database(path, **site_runtime(), max_batch=0)
    with pytest.raises(ValueError, match="busy_timeout_ms"):
        Database(path, **site_runtime(), busy_timeout_ms=-1)
    with pytest.raises(ValueError, match="within"):
        Retry("x", -1.0, lambda _: 1.0)
