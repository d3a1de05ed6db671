"""adbapi on a real SQLite file, its transactions run inline on the world."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from twisted.internet.defer import gatherResults

from tasknet.sim import SimConnectionPool, World


@pytest.fixture
def database(tmp_path: Path) -> str:
    # tests/conftest.py puts tmp_path on /dev/shm where there is one.
    return str(tmp_path / "sim.sqlite")


def _pool(world: World, name: str, path: str) -> SimConnectionPool:
    reactor = world.add_process(name)
    pool = SimConnectionPool(reactor, "sqlite3", path, check_same_thread=False, cp_min=1, cp_max=1)
    reactor.startRunning()  # adbapi starts its pool when the reactor runs
    return pool


def test_transactions_run_inline_in_order_at_simulated_durations(database: str) -> None:
    world = World(1, thread_time=(0.001, 0.003))
    pool = _pool(world, "site", database)
    here = threading.get_ident()
    threads_before = threading.active_count()

    def add(cursor: sqlite3.Cursor, n: int) -> tuple[int, int]:
        assert threading.get_ident() == here  # no real thread
        cursor.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY)")
        cursor.execute("INSERT INTO t VALUES (?)", (n,))
        cursor.execute("SELECT count(*) FROM t")
        return n, cursor.fetchone()[0]

    results = world.wait(gatherResults([pool.runInteraction(add, n) for n in range(10)]))
    # One thread: one transaction after the other, in the order asked.
    assert results == [(n, n + 1) for n in range(10)]
    assert 0.010 <= world.elapsed() <= 0.030
    assert threading.active_count() == threads_before
    world.assert_clean()
    pool.close()


def test_a_failing_transaction_rolls_back(database: str) -> None:
    world = World(2)
    pool = _pool(world, "site", database)
    world.wait(pool.runOperation("CREATE TABLE t (n INTEGER UNIQUE)"))
    world.wait(pool.runOperation("INSERT INTO t VALUES (1)"))

    def twice(cursor: sqlite3.Cursor) -> None:
        cursor.execute("INSERT INTO t VALUES (2)")
        cursor.execute("INSERT INTO t VALUES (1)")  # IntegrityError: all of it rolls back

    with pytest.raises(sqlite3.IntegrityError):
        world.wait(pool.runInteraction(twice))
    assert world.wait(pool.runQuery("SELECT n FROM t")) == [(1,)]
    pool.close()


def test_a_crash_keeps_what_was_committed_and_nothing_else(database: str) -> None:
    world = World(3, thread_time=(0.5, 0.5))
    pool = _pool(world, "site", database)
    world.wait(pool.runOperation("CREATE TABLE t (n INTEGER)"))
    world.wait(pool.runOperation("INSERT INTO t VALUES (1)"))
    in_flight = pool.runOperation("INSERT INTO t VALUES (2)")
    world.run_for(0.25)  # the second transaction is still "running"
    world.crash("site")
    world.run_until()
    assert not in_flight.called  # a dead process hears nothing more
    # The restart: a new process built again on the same file.
    again = _pool(world, "site", database)
    assert world.wait(again.runQuery("SELECT n FROM t")) == [(1,)]
    again.close()
    assert pool.connections == {}  # the kernel closed the dead process's connection


def test_a_pool_with_real_threads_is_caught_not_run(database: str) -> None:
    """What a role's own ``adbapi.ConnectionPool`` does on the simulated
    reactor today (the seam it lacks): its real thread runs the interaction
    and hands the result to the world from outside: the world refuses it and
    says so."""
    from twisted.enterprise import adbapi

    world = World(4)
    reactor = world.add_process("site")
    reactor.startRunning()
    pool = adbapi.ConnectionPool(
        "sqlite3", database, check_same_thread=False, cp_min=1, cp_max=1, cp_reactor=reactor
    )
    d = pool.runQuery("SELECT 1")
    pool.close()  # joins the real thread: it has handed its result over by then
    world.run_until(within=1)
    assert not d.called
    assert world.foreign and "callFromThread" in world.foreign[0]
