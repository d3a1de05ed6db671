"""Group commit in ``Database.write``: writes called while the writer is busy
share one ``BEGIN IMMEDIATE … COMMIT``, each in its own savepoint.

Real SQLite files in tmp_path.  The writer connection's own statement trace
(``sqlite3.Connection.set_trace_callback``, set from inside a write) is the
witness of how many transactions ran; a second, plain connection is the
witness of what was committed when.  To make batches deterministic, a first
write holds the writer thread (it waits on an event) while the test queues
the writes that must share the next transaction.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList

from tasknet.site.storage import create, usage
from tasknet.site.storage.db import Database, TransactionLost, connect, open_pool
from tasknet.site.storage.errors import TaskError
from tasknet.site.storage.schema import prepare_database
from tests.site.helpers import add_user

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
    db = open_pool(path, **options)
    statements: list[str] = []
    try:
        await db.write(lambda cursor: cursor.connection.set_trace_callback(statements.append))
        statements.clear()
        yield db, statements
    finally:
        db.close()


class HeldWriter:
    """A write whose function blocks the writer thread until released."""

    def __init__(self, db: Database) -> None:
        self._started: Deferred[None] = Deferred()
        self._release = threading.Event()
        self.done = db.write(self._block)

    def _block(self, cursor: sqlite3.Cursor) -> str:
        reactor.callFromThread(self._started.callback, None)
        if not self._release.wait(10):
            raise RuntimeError("the test never released the writer")
        return "held"

    async def started(self) -> None:
        await self._started

    def release(self) -> None:
        self._release.set()


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
        with pytest.raises(sqlite3.IntegrityError):
            await db.write(insert("a"))
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
    assert results[1][1].check(sqlite3.IntegrityError)
    assert "UNIQUE" in results[1][1].getErrorMessage()
    assert results[3][1].check(sqlite3.IntegrityError)
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
            assert results[index][1].check(sqlite3.IntegrityError)
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
            assert failure.check(sqlite3.OperationalError)
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
    assert results[1][1].check(sqlite3.OperationalError)
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


def test_bad_options_are_refused(tmp_path):
    path = str(tmp_path / "x.sqlite")
    with pytest.raises(ValueError, match="max_batch"):
        Database(path, max_batch=0)
    with pytest.raises(ValueError, match="busy_timeout_ms"):
        Database(path, busy_timeout_ms=-1)
