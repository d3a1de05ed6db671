"""The node's parts read time, threads and randomness only through what
its root hands them (issue 20): on a simulated process they run on the
world's clock and inline pools, and a seeded entropy source gives the same
ids, nonces and jitter every time."""

from __future__ import annotations

import random
import sqlite3
import threading
import uuid
from pathlib import Path

from zope.interface.verify import verifyObject

from tasknet.node.paths import DataDir
from tasknet.node.store import NodeStore
from tasknet.node.worker import backoff
from tasknet.runtime import IEntropy, IThreadPools, RealThreadPools, SeededEntropy, SystemEntropy
from tasknet.sim import SimThreadPool, World


def test_the_store_runs_on_the_given_reactor_threads_and_clock(tmp_path: Path) -> None:
    world = World(2)
    reactor = world.add_process("node")
    store = NodeStore(DataDir(tmp_path / "node"), reactor=reactor, clock=reactor, threads=reactor)
    reactor.startRunning()  # adbapi starts its pool when the reactor runs
    assert isinstance(store._pool.threadpool, SimThreadPool)
    assert store._pool._reactor is reactor
    here = threading.get_ident()
    world.wait(store.create_schema())
    world.run_for(100.0)  # simulated: no real second passes
    accepted_at = world.now
    world.wait(store.accept_download(7, "op-a", "seven", "http://x/7", 2))
    world.run_for(5.0)
    written_at = world.now
    world.wait(store.set_progress(7, "op-a", 0.5, 1000))

    def read(cursor: sqlite3.Cursor) -> tuple[float, float]:
        assert threading.get_ident() == here  # inline, no real thread
        cursor.execute("SELECT received_at FROM received_command WHERE gid = 7")
        received = cursor.fetchone()[0]
        cursor.execute("SELECT updated_at FROM task WHERE gid = 7")
        return received, cursor.fetchone()[0]

    received, updated = world.wait(store._run(read))
    # The times written are the store's clock at submission, the world's.
    assert received == accepted_at and updated == written_at
    store.close()


def test_seeded_entropy_replays_and_the_system_one_is_the_same_interface() -> None:
    one, two = SeededEntropy(5), SeededEntropy(random.Random(5))
    drawn = [one.token_hex(16), one.uuid4(), one.token_bytes(3), one.random().random()]
    assert drawn == [two.token_hex(16), two.uuid4(), two.token_bytes(3), two.random().random()]
    assert len(drawn[0]) == 32 and drawn[1].version == 4 and len(drawn[2]) == 3
    assert SeededEntropy(6).token_hex(16) != SeededEntropy(5).token_hex(16)
    for source in (SeededEntropy(1), SystemEntropy()):
        assert verifyObject(IEntropy, source)
        assert isinstance(source.uuid4(), uuid.UUID) and source.uuid4().version == 4
    assert SystemEntropy().token_hex(16) != SystemEntropy().token_hex(16)


def test_the_simulated_process_and_the_real_threads_give_thread_pools() -> None:
    world = World(3)
    reactor = world.add_process("node")
    assert verifyObject(IThreadPools, reactor) and verifyObject(IThreadPools, RealThreadPools())
    pool = reactor.thread_pool(0, 2, "compress")
    assert isinstance(pool, SimThreadPool) and (pool.min, pool.max, pool.name) == (0, 2, "compress")
    real = RealThreadPools().thread_pool(0, 2, "compress")
    assert not real.started and real.max == 2  # made, never started here


def test_the_workers_jitter_comes_from_the_generator_it_is_given() -> None:
    delays = [backoff(n, random.Random(9)) for n in range(1, 6)]
    assert delays == [backoff(n, random.Random(9)) for n in range(1, 6)]
    for n, delay in enumerate(delays, start=1):
        full = min(0.1 * 2**n, 30.0)  # backoffPolicy: initialDelay * factor ** attempt
        assert 0.5 * full <= delay <= full
