"""The node's archive inventory (types 16 and 17) to a scripted site over real
TCP, read from a real node store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from tasknet.node.inventory import inventory_parts
from tasknet.node.paths import DataDir
from tasknet.node.store import NodeStore
from tasknet.protocol.messages import (
    FEATURE_ARCHIVE_INVENTORY,
    ArchiveInventory,
    HeldArchive,
    ProtocolHello,
)
from tasknet.runtime import RealThreadPools
from tests.eventually import eventually
from tests.node.harness import SECRET, logged_in_node, running, start_node
from tests.node.site_peer import ScriptedSite
from tests.node.test_commands import completed

DIGEST = "ab" * 32


async def held_archives(data: Path, count: int) -> list[HeldArchive]:
    """``count`` archives held by the node store at ``data``: rows and
    one-byte files (the start-up check finds each whole)."""
    store = NodeStore(DataDir(data), reactor=reactor, clock=reactor, threads=RealThreadPools())
    try:
        await store.create_schema()
    finally:
        store.close()
    archives = DataDir(data).archives
    rows = []
    for gid in range(1, count + 1):
        name = f"{gid}-{gid:012x}.zip"
        (archives / name).write_bytes(b"z")
        rows.append((gid, f"op-{gid}", f"g{gid}", name, 1, DIGEST, reactor.seconds()))
    with sqlite3.connect(DataDir(data).database) as db:
        db.executemany(
            "INSERT INTO archive (gid, operation_id, name, file, size, sha256, completed_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    return [HeldArchive(gid, f"op-{gid}", 1, DIGEST) for gid in range(1, count + 1)]


def inventories(site: ScriptedSite) -> list[ArchiveInventory]:
    return site.of_type(ArchiveInventory)


@pytest_twisted.ensureDeferred
async def test_25000_archives_go_in_three_parts_on_each_v2_connection(tmp_path: Path) -> None:
    data = tmp_path / "node"
    expected = await held_archives(data, 25_000)
    async with running(tmp_path) as (site, _up):
        async with logged_in_node(site, data) as node:
            await eventually(lambda: len(inventories(site)) == 3, what="three parts")
            [hello] = site.of_type(ProtocolHello)
            assert FEATURE_ARCHIVE_INVENTORY in hello.features
            await site.drop_connections()
            await site.logged_in(2)
            await eventually(lambda: len(inventories(site)) == 6, what="the next connection's")
            assert node.inventory is not None and node.inventory.sent == 2
    first, second = inventories(site)[:3], inventories(site)[3:]
    assert [(p.part, p.parts, len(p.archives)) for p in first] == [
        (1, 3, 10_000),
        (2, 3, 10_000),
        (3, 3, 5_000),
    ]
    assert [a for p in first for a in p.archives] == expected
    assert len({p.inventory_id for p in first}) == 1
    assert {p.inventory_id for p in second} != {first[0].inventory_id}  # a fresh one


@pytest_twisted.ensureDeferred
async def test_an_empty_node_sends_one_empty_part_then_lists_what_it_completes(
    tmp_path: Path,
) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            await eventually(lambda: inventories(site), what="the inventory")
            site.download("op-1", 11, up.file_url(11))
            await eventually(lambda: completed(site, 11, "op-1"), what="completed")
            await site.drop_connections()
            await site.logged_in(2)
            await eventually(lambda: len(inventories(site)) == 2, what="the second inventory")
    empty, listed = inventories(site)
    assert (empty.part, empty.parts, empty.archives) == (1, 1, ())
    [held] = listed.archives
    assert (held.gid, held.operation_id, held.size) == (11, "op-1", len(catalog_zip(data)))
    assert len(held.sha256) == 64


def catalog_zip(data: Path) -> bytes:
    [archive] = (data / "archives").iterdir()
    return archive.read_bytes()


@pytest_twisted.ensureDeferred
async def test_a_legacy_link_carries_no_inventory(tmp_path: Path) -> None:
    data = tmp_path / "node"
    await held_archives(data, 3)
    legacy = ScriptedSite(SECRET, legacy=True)
    await legacy.listen()
    try:
        node = await start_node(legacy, data, trust_legacy_site=True)
        try:
            await legacy.logged_in()
            legacy.legacy_download(5, "http://127.0.0.1:9/never")
            await eventually(lambda: len(legacy.received) >= 2, what="the legacy login")
        finally:
            await node.stopService()
    finally:
        await legacy.stop()
    assert inventories(legacy) == []
    assert node.inventory is not None and node.inventory.sent == 0


def test_parts_are_cut_at_the_bound() -> None:
    archives = [HeldArchive(g, f"op-{g}", 1, DIGEST) for g in range(1, 6)]
    parts = inventory_parts("inv", archives, part_max=2)
    assert [(p.part, p.parts, len(p.archives)) for p in parts] == [(1, 3, 2), (2, 3, 2), (3, 3, 1)]
    with pytest.raises(ValueError, match="part_max"):
        inventory_parts("inv", archives, part_max=10_001)
