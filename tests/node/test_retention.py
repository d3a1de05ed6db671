"""Retention (``--keep-days``, ``--disk-budget``, ``--min-free``) and downloads
that wait for room: a real node store and files, the node's clock
(``task.Clock``), free space from a ``disk_usage`` that counts the data
directory's files; and a real node over TCP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python import usage
from twisted.web.client import HTTPConnectionPool

from tasknet.node.paths import DataDir
from tasknet.node.retention import Retention
from tasknet.node.service import NodeService, Options, makeService
from tasknet.node.store import DISK_BUDGET, EXPIRED, NodeStore
from tasknet.protocol.messages import ReleasedEntry
from tasknet.upstream import catalog
from tests.eventually import eventually
from tests.node.harness import logged_in_node, node_rows, running
from tests.node.site_peer import ScriptedSite
from tests.node.test_archive_store import acknowledged, opened
from tests.node.test_commands import completed

DAY = 86400.0
URL = "http://127.0.0.1:9/f"
DIGEST = "0f" * 32


class Disk:
    """A disk of ``size`` bytes holding only the data directory's files."""

    def __init__(self, root: Path, size: int) -> None:
        self.root = root
        self.size = size
        self.asked: list[str] = []

    def used(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    def __call__(self, path: str) -> Any:
        self.asked.append(path)
        return SimpleNamespace(free=self.size - self.used())


async def archive(store: NodeStore, gid: int, size: int, *, ack: bool = True) -> Path:
    """A held archive of ``size`` bytes for ``(gid, op-<gid>)``, ACKed."""
    await store.accept_download(gid, f"op-{gid}", f"g{gid}", URL, 2)
    path = store.data.archive_path(gid, f"op-{gid}")
    path.write_bytes(b"z" * size)
    assert await store.complete(gid, f"op-{gid}", path.name, size=size, sha256=DIGEST)
    if ack:
        await acknowledged(store, f"r-{gid}")
    return path


@asynccontextmanager
async def retention(store: NodeStore, clock: Clock, **options: Any) -> AsyncIterator[Retention]:
    options.setdefault("min_free", 0)
    kept = Retention(store, store.data, clock=clock, **options)
    try:
        yield kept
    finally:
        await kept.stopService()


def held(store_path: Path) -> list[int]:
    return [g for (g,) in node_rows(store_path, "SELECT gid FROM archive ORDER BY gid")]


def released_rows(store_path: Path) -> list[tuple[int, str]]:
    return node_rows(store_path, "SELECT gid, reason FROM released ORDER BY gid")


@pytest_twisted.ensureDeferred
async def test_keep_days_expires_by_last_use_and_zero_keeps_for_ever(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        never_served = await archive(store, 1, 10)
        await archive(store, 2, 10)
        clock.advance(20 * DAY)
        await store.mark_served(2, "op-2")
        clock.advance(11 * DAY)  # 31 days after completion, 11 after the serve
        async with retention(store, clock, keep_days=0) as forever:
            await forever.run()
            assert held(tmp_path) == [1, 2]
        async with retention(store, clock, keep_days=30) as kept:
            await kept.run()
            assert held(tmp_path) == [2] and not never_served.exists()
            assert released_rows(tmp_path) == [(1, EXPIRED)]
            clock.advance(20 * DAY)
            await kept.run()
            assert held(tmp_path) == []
            assert kept.released == {EXPIRED: 2}


@pytest_twisted.ensureDeferred
async def test_the_budget_removes_the_one_served_longest_ago_first(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        for gid in (1, 2, 3):
            await archive(store, gid, 100)
            clock.advance(1.0)
        await store.mark_served(1, "op-1")  # 1 is now the most recently used
        await archive(store, 4, 100, ack=False)  # completion not ACKed: never removed
        async with retention(store, clock, disk_budget=250) as kept:
            await kept.run()
            assert held(tmp_path) == [1, 4]
            assert released_rows(tmp_path) == [(2, DISK_BUDGET), (3, DISK_BUDGET)]
            figures = kept.figures()
    assert (figures.archives, figures.archive_bytes, figures.budget) == (2, 200, 250)
    assert sorted(p.name[0] for p in DataDir(tmp_path).archives.iterdir()) == ["1", "4"]


@pytest_twisted.ensureDeferred
async def test_min_free_reads_the_disk_of_the_data_directory(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        disk = Disk(DataDir(tmp_path).archives, 10_000)  # the archives' own disk
        for gid in (1, 2, 3):
            await archive(store, gid, 3_000)
            clock.advance(1.0)
        async with retention(store, clock, min_free=6_000, disk_usage=disk) as kept:
            await kept.run()
            assert held(tmp_path) == [3]  # 1,000 free was 5,000 short: two went
            assert kept.figures().free == 7_000
    assert set(disk.asked) == {str(tmp_path)}


@pytest_twisted.ensureDeferred
async def test_an_archive_being_served_is_left_for_the_next_run(tmp_path: Path) -> None:
    clock = Clock()
    serving = {(1, "op-1")}
    async with opened(tmp_path, clock) as store:
        await archive(store, 1, 100)
        await archive(store, 2, 100)
        async with retention(store, clock, disk_budget=100, busy=lambda: serving) as kept:
            await kept.run()
            assert held(tmp_path) == [1]
            clock.advance(40 * DAY)
            kept.keep_days = 30
            await kept.run()
            assert held(tmp_path) == [1]
            serving.clear()
            await kept.run()
            assert held(tmp_path) == []


@pytest_twisted.ensureDeferred
async def test_a_download_waits_for_room_first_come_first_served(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        async with retention(store, clock, disk_budget=300) as kept:
            kept.startService()
            waits: list[int] = []
            first = kept.admit(10, "op-10", 200)
            await first  # fits at once
            second = kept.admit(11, "op-11", 200, on_wait=lambda: waits.append(11))
            third = kept.admit(12, "op-12", 50, on_wait=lambda: waits.append(12))
            await eventually(lambda: waits == [11, 12], what="both queued")
            assert kept.waiting() == {11, 12}
            assert "waiting for disk space: needs 200 bytes" in kept.why_waiting(200)
            kept.done(10)  # the first download ended: its room frees
            clock.advance(0)
            await eventually(lambda: second.called and third.called, what="both admitted")
            # A download that can never fit the budget waits without blocking others.
            never: list[int] = []
            huge = kept.admit(13, "op-13", 301, on_wait=lambda: never.append(13))
            await eventually(lambda: never == [13], what="queued")
            kept.done(11)
            small = kept.admit(14, "op-14", 10)
            clock.advance(10.0)
            await eventually(lambda: small.called, what="the small one passed")
            huge.cancel()
            assert kept.waiting() == frozenset()
            failures: list[Any] = []
            huge.addErrback(failures.append)
            assert failures and failures[0].check(CancelledError)


@pytest_twisted.ensureDeferred
async def test_a_download_is_given_room_by_removing_old_archives(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        await archive(store, 1, 100)
        await archive(store, 2, 100)
        async with retention(store, clock, disk_budget=250) as kept:
            admitted: Deferred[None] = kept.admit(3, "op-3", 100)
            await admitted
            assert held(tmp_path) == [2]
            assert released_rows(tmp_path) == [(1, DISK_BUDGET)]


def test_the_options_and_their_defaults(tmp_path: Path) -> None:
    defaults = Options()
    defaults.parseOptions(["--secret", "x", "--data", str(tmp_path)])
    node = makeService(defaults)
    assert isinstance(node, NodeService)
    assert (node.keep_days, node.disk_budget, node.min_free) == (30, None, 1024**3)
    given = Options()
    given.parseOptions(
        ["--secret", "x", "--keep-days", "0", "--disk-budget", "500GB", "--min-free", "2GiB"]
    )
    assert (given["keep-days"], given["disk-budget"], given["min-free"]) == (
        0,
        500 * 10**9,
        2 * 1024**3,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("--keep-days", "-1"),
        ("--keep-days", "1.5"),
        ("--keep-days", "soon"),
        ("--disk-budget", "lots"),
        ("--disk-budget", "-5GB"),
        ("--min-free", "1 parsec"),
    ],
)
def test_bad_options_are_refused(argv: tuple[str, str]) -> None:
    with pytest.raises(usage.UsageError):
        Options().parseOptions(["--secret", "x", *argv])


def released(site: ScriptedSite) -> list[ReleasedEntry]:
    return [e for r in site.reports() for e in r.released]


def entries(site: ScriptedSite, gid: int) -> list[Any]:
    return [e for r in site.reports() for e in r.gallery_tasks if e.gid == gid]


@pytest_twisted.ensureDeferred
async def test_a_node_on_its_budget_queues_the_next_download_then_makes_room(
    tmp_path: Path,
) -> None:
    data = tmp_path / "node"
    first, second = 401, 402
    # What the site would say: a zip of either file is a little larger than it.
    expected = max(catalog.gallery(first).size, catalog.gallery(second).size) + 4096
    async with running(tmp_path) as (site, up):
        async with logged_in_node(
            site, data, disk_budget=expected + expected // 2, min_free=0, serve="tcp:0"
        ) as node:
            site.download("op-1", first, up.file_url(first), size=expected)
            site.download("op-2", second, up.file_url(second), size=expected)
            await eventually(
                lambda: any(e.queued and "disk space" in e.detail for e in entries(site, second)),
                what="the second download queued for room",
            )
            await eventually(lambda: completed(site, first, "op-1"), what="the first done")
            await eventually(lambda: completed(site, second, "op-2"), what="the second done")
            await eventually(lambda: released(site), what="the first one released")
            assert released(site) == [ReleasedEntry(first, "op-1", DISK_BUDGET)]
            assert held(data) == [second]
            port = node.serve_port.getHost().port
            pool = HTTPConnectionPool(reactor, persistent=False)
            # The figures follow retention's look after each download.
            kept = node.retention
            assert kept is not None
            await eventually(lambda: kept.figures().archives == 1, what="the figures")
            response = await treq.get(f"http://127.0.0.1:{port}/healthz", pool=pool)
            figures = json.loads(await response.content())
    [(size,)] = node_rows(data, "SELECT size FROM archive")
    assert figures["archiveBytes"] == size
    health = figures
    assert health["diskBudget"] == expected + expected // 2
    assert isinstance(health["diskFree"], int)


@pytest_twisted.ensureDeferred
async def test_the_metrics_show_the_archives_the_free_space_and_the_budget(
    tmp_path: Path,
) -> None:
    from tests.node.test_metrics import scrape, value

    data = tmp_path / "node"
    disk = Disk(data / "archives", 10**9)
    async with running(tmp_path) as (site, up):
        options = {"metrics": "tcp:0:interface=127.0.0.1", "disk_usage": disk, "min_free": 0}
        async with logged_in_node(site, data, disk_budget=5 * 10**8, **options) as node:
            site.download("op-1", 77, up.file_url(77))
            await eventually(lambda: completed(site, 77, "op-1"), what="downloaded")
            kept = node.retention
            assert kept is not None
            await eventually(lambda: kept.figures().archives == 1, what="the figures")
            samples = await scrape(node)
    [(size,)] = node_rows(data, "SELECT size FROM archive")
    assert value(samples, "tasknet_node_archives_held") == 1
    assert value(samples, "tasknet_node_archive_bytes") == size
    assert value(samples, "tasknet_node_disk_free_bytes") == 10**9 - size
    assert value(samples, "tasknet_node_disk_budget_bytes") == 5 * 10**8
    assert value(samples, "tasknet_node_archives_released_total", reason="EXPIRED") == 0


@pytest_twisted.ensureDeferred
async def test_the_serve_endpoint_says_which_archives_it_is_sending(tmp_path: Path) -> None:
    from tests.node.test_serve_bounds import SIZE, server_waits
    from tests.node.test_serve_support import content_of, request_bytes, serving

    async with serving(tmp_path, serve_max=2, idle_timeout=60.0) as served:
        archive = await served.hold(9, content_of(8 * SIZE))
        assert served.server.serving() == frozenset()
        client = await served.client(request_bytes(served.link(9).path), pause_at=1)
        await eventually(server_waits(served), what="a transfer under way")
        assert served.server.serving() == {(9, archive.operation_id)}
        served.clock.advance(60)  # the stalled client is dropped
        client.reading(True)
        await client.closed
        await eventually(lambda: served.server.serving() == frozenset(), what="sent no more")


@pytest_twisted.ensureDeferred
async def test_archives_are_never_removed_for_room_that_cannot_be_had(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        await archive(store, 1, 100)
        await archive(store, 2, 100)
        async with retention(store, clock, disk_budget=250) as kept:
            waits: list[int] = []
            kept.admit(3, "op-3", 300, on_wait=lambda: waits.append(3))
            await eventually(lambda: waits == [3], what="queued: more than the whole budget")
            await kept.run()
            assert held(tmp_path) == [1, 2]
        # The disk is full of something else: removing every archive would not do.
        full = SimpleNamespace(free=0)
        async with retention(store, clock, min_free=1000, disk_usage=lambda _: full) as kept:
            await kept.run()
            assert held(tmp_path) == [1, 2] and released_rows(tmp_path) == []
            full.free = 850  # now two archives' worth short of it: both go
            await kept.run()
            assert held(tmp_path) == [] and kept.released == {DISK_BUDGET: 2}
