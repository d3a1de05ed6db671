"""The liveness watch of a site alone on its database reads the connected
nodes (every node's session row) only when they can have changed: its
registry's held nodes changed, the last read disagreed with the registry (a
take or release not yet committed), or ``refresh_sweeps`` sweeps went by.
Without a registry (shared mode) it reads them at every sweep, as before.

Real database of the site schema (both backends); the registry is a
stand-in with the one method the watch reads (``holdings()``), and the
publisher a recording stand-in for the WebSocket hub.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted

from tasknet.site.outbox import LivenessWatch
from tasknet.site.storage import node_sessions
from tasknet.site.storage.engine.database import Database, open_pool
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.node_sessions import Holding
from tests.runtime import site_runtime
from tests.site.test_outbox_idle_marks import RecordingPublisher


def Publisher(listening: bool = False) -> RecordingPublisher:  # noqa: N802 -- reads as the class
    publisher = RecordingPublisher()
    publisher.connected = listening
    return publisher


class Registry(dict[str, Any]):
    """This site's connected nodes by id (``ConnectedNodes``, a mapping)."""


async def take(db: Database, node_id: str) -> Holding:
    taken = await db.write(node_sessions.take, node_id, None, "site", 2, (), iso(0.0))
    return taken.holding


@pytest.fixture
def db(db_target: str):
    prepare_database(db_target)
    pool = open_pool(db_target, **site_runtime())
    yield pool
    pool.close()


@pytest.mark.parametrize("listening", [False, True], ids=["nobody", "clients"])
@pytest_twisted.ensureDeferred
async def test_unchanged_registry_reads_only_every_refresh(db: Database, listening: bool):
    registry = Registry()
    watch = LivenessWatch(db, Publisher(listening), nodes=registry, refresh_sweeps=4)
    for node_id in ("n1", "n2"):
        await take(db, node_id)
        registry[node_id] = object()
    for _ in range(9):
        await watch.sweep()
    # Read at the first sweep, then at the 5th and 9th (every 4th).
    assert watch.connected_reads == 3
    assert watch._connected == {"n1", "n2"}


@pytest_twisted.ensureDeferred
async def test_a_drop_is_read_until_the_release_is_committed(db: Database):
    registry = Registry()
    watch = LivenessWatch(db, Publisher(), nodes=registry, refresh_sweeps=100)
    holding = await take(db, "n1")
    registry[holding.node_id] = object()
    await watch.sweep()
    await watch.sweep()
    assert watch.connected_reads == 1 and watch._connected == {"n1"}
    # Dropped here; its release is not committed yet: the read still finds
    # it, disagrees with the registry, and the next sweep reads again.
    del registry[holding.node_id]
    await watch.sweep()
    assert watch.connected_reads == 2 and watch._connected == {"n1"}
    await watch.sweep()
    assert watch.connected_reads == 3
    assert await db.write(node_sessions.release, holding)
    await watch.sweep()
    assert watch.connected_reads == 4 and watch._connected == set()
    await watch.sweep()  # agrees with the registry: no read
    assert watch.connected_reads == 4


@pytest_twisted.ensureDeferred
async def test_a_login_is_read_when_it_is_held(db: Database):
    registry = Registry()
    watch = LivenessWatch(db, Publisher(), nodes=registry, refresh_sweeps=100)
    await watch.sweep()
    await watch.sweep()
    assert watch.connected_reads == 1 and watch._connected == set()
    holding = await take(db, "n1")  # committed; the registry not yet told
    await watch.sweep()
    assert watch.connected_reads == 1  # nothing here says so: not read yet
    registry[holding.node_id] = object()
    await watch.sweep()
    assert watch.connected_reads == 2 and watch._connected == {"n1"}
    await watch.sweep()
    assert watch.connected_reads == 2


@pytest_twisted.ensureDeferred
async def test_an_attached_node_is_read_until_its_take_is_committed(db: Database):
    registry = Registry()
    watch = LivenessWatch(db, Publisher(), nodes=registry, refresh_sweeps=100)
    await watch.sweep()
    registry["n1"] = object()  # logged in here; its take not committed yet
    await watch.sweep()
    await watch.sweep()
    assert watch.connected_reads == 3 and watch._connected == set()
    await take(db, "n1")
    await watch.sweep()
    assert watch.connected_reads == 4 and watch._connected == {"n1"}
    await watch.sweep()
    assert watch.connected_reads == 4


@pytest_twisted.ensureDeferred
async def test_a_row_the_registry_does_not_hold_is_read_at_every_sweep(db: Database):
    # A row left by a previous run (or another writer): the read disagrees
    # with the registry, so the watch does not trust the registry alone.
    await take(db, "stale")
    watch = LivenessWatch(db, Publisher(), nodes=Registry(), refresh_sweeps=100)
    for _ in range(3):
        await watch.sweep()
    assert watch.connected_reads == 3


@pytest_twisted.ensureDeferred
async def test_without_a_registry_every_sweep_reads(db: Database):
    watch = LivenessWatch(db, Publisher())
    await take(db, "n1")
    for _ in range(3):
        await watch.sweep()
    assert watch.connected_reads == 3 and watch._connected == {"n1"}


def test_refresh_sweeps_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        LivenessWatch(None, Publisher(), refresh_sweeps=0)  # type: ignore[arg-type]


@pytest_twisted.ensureDeferred
async def test_the_executor_sweeps_the_watch_it_is_given_with_its_registry(db: Database):
    # The composition root gives the watch the registry only when alone
    # (tests/site/test_root.py); the executor sweeps the watch it is given.
    from twisted.internet.task import Clock

    from tasknet.site.outbox import OutboxExecutor

    registry = Registry()
    await take(db, "n1")
    registry["n1"] = object()
    executor = OutboxExecutor(
        db,
        Publisher(),
        liveness=LivenessWatch(db, Publisher(), nodes=registry),
        poll_interval=None,
        prune_interval=None,
        clock=Clock(),
    )
    watch = executor.liveness
    assert watch is not None
    for _ in range(3):
        await watch.sweep()
    assert watch.connected_reads == 1 and watch._connected == {"n1"}
