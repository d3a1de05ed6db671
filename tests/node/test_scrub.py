"""The scrub on real archive files: whole ones stay, damaged ones are set aside,
reads are paced on the node's clock (a ``task.Clock`` here)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import Clock
from twisted.python import usage

from tasknet.node.compress import build_archive
from tasknet.node.paths import DataDir
from tasknet.node.scrub import Scrubber
from tasknet.node.service import NodeService, Options, makeService
from tasknet.node.store import NodeStore
from tasknet.runtime import RealThreadPools
from tests.eventually import eventually
from tests.node.harness import logged_in_node, node_rows, running

URL = "http://127.0.0.1:9/f"
EVERY = 1000.0  # an archive is due every EVERY / 2 seconds of the clock
MiB = 1024 * 1024


@asynccontextmanager
async def opened(path: Path, clock: Clock) -> AsyncIterator[NodeStore]:
    store = NodeStore(DataDir(path), reactor=reactor, clock=clock, threads=RealThreadPools())
    await store.create_schema()
    try:
        yield store
    finally:
        store.close()


def scrubber(store: NodeStore, clock: Clock, *, rate: int = 10**9, chunk: int = MiB) -> Scrubber:
    return Scrubber(
        store,
        store.data,
        every=EVERY,
        rate=rate,
        chunk=chunk,
        clock=clock,
        reactor=reactor,
        threads=RealThreadPools(),
    )


async def zipped(store: NodeStore, gid: int, content: bytes) -> Path:
    """A completed generation whose archive was built the node's way."""
    operation_id = f"op-{gid}"
    await store.accept_download(gid, operation_id, f"task {gid}", URL, 2)
    part = store.data.part_path(gid, operation_id)
    part.write_bytes(content)
    final = store.data.archive_path(gid, operation_id)
    built = build_archive(
        part, store.data.archive_tmp_path(gid, operation_id), final, "f.bin", threading.Event()
    )
    assert await store.complete(gid, operation_id, final.name, size=built.size, sha256=built.sha256)
    return final


async def raw_archive(store: NodeStore, gid: int, content: bytes) -> Path:
    """A held archive of exactly ``content`` (the scrub reads bytes, not zips)."""
    operation_id = f"op-{gid}"
    await store.accept_download(gid, operation_id, f"task {gid}", URL, 2)
    final = store.data.archive_path(gid, operation_id)
    final.write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    assert await store.complete(gid, operation_id, final.name, size=len(content), sha256=digest)
    return final


def flip_a_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest_twisted.ensureDeferred
async def test_whole_archives_stay_damaged_ones_are_set_aside(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        intact = await zipped(store, 1, os.urandom(3 * MiB))
        flipped = await zipped(store, 2, b"some text " * 1000)
        truncated = await zipped(store, 3, os.urandom(MiB))
        missing = await zipped(store, 4, b"gone")
        flip_a_byte(flipped, flipped.stat().st_size // 2)
        with open(truncated, "r+b") as f:
            f.truncate(truncated.stat().st_size - 1)
        missing.unlink()
        scrub = scrubber(store, clock)
        clock.advance(EVERY / 2)
        try:
            next_due, _waits = await run_pass(scrub, clock)
        finally:
            await scrub.stopService()
        held = await store.archives()
    # Read at 1 GB/s of clock time: found whole at once, or nearly.
    assert [(a.gid, a.scrubbed_at) for a in held] == [(1, pytest.approx(EVERY / 2, abs=0.01))]
    assert intact.exists()
    corrupt = DataDir(tmp_path).corrupt
    assert sorted(p.name for p in corrupt.iterdir()) == sorted([flipped.name, truncated.name])
    assert not flipped.exists() and not truncated.exists()
    assert (scrub.scrubbed, scrub.set_aside) == (1, 3)
    # The one left was found whole now: due again half of EVERY from now.
    assert next_due == pytest.approx(EVERY, abs=0.01)


@pytest_twisted.ensureDeferred
async def test_an_archive_not_yet_due_is_not_read(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        path = await raw_archive(store, 1, b"abc")
        flip_a_byte(path, 0)
        scrub = scrubber(store, clock)
        clock.advance(EVERY / 2 - 1)
        try:
            assert await scrub.run_pass() == EVERY / 2
        finally:
            await scrub.stopService()
        assert len(await store.archives()) == 1
    assert scrub.bytes_read == 0


@pytest_twisted.ensureDeferred
async def test_the_archive_scrubbed_longest_ago_goes_first(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        await raw_archive(store, 1, b"one")
        clock.advance(10)
        await raw_archive(store, 2, b"two")
        clock.advance(10)
        assert await store.mark_scrubbed(1, "op-1", hashlib.sha256(b"one").hexdigest())
        assert not await store.mark_scrubbed(1, "op-1", "00" * 32)  # not that digest
        order = [a.gid for a in await store.archives_to_scrub(10)]
    assert order == [2, 1]


async def run_until(
    clock: Clock, done: Callable[[], object], *, longest: float = 1.0
) -> list[float]:
    """Advance ``clock`` to each call due within ``longest`` seconds (the
    scrub's pacing waits, not its pauses between passes) until ``done()``;
    the waits, in clock seconds."""
    waits: list[float] = []

    def soon() -> list[IDelayedCall]:
        now = clock.seconds()
        return [c for c in clock.getDelayedCalls() if c.getTime() - now <= longest]

    while True:
        await eventually(lambda: done() or soon(), what="the scrub done or waiting")
        if done():
            return waits
        call = min(soon(), key=lambda c: c.getTime())
        waits.append(call.getTime() - clock.seconds())
        clock.advance(waits[-1])


async def run_pass(scrub: Scrubber, clock: Clock) -> tuple[float, list[float]]:
    """One pass, the clock advanced through its pacing; (next due, waits)."""
    running = Deferred.fromCoroutine(scrub.run_pass())
    waits = await run_until(clock, lambda: running.called)
    return await running, waits


@pytest_twisted.ensureDeferred
async def test_reads_are_paced_to_the_rate_on_the_clock(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        await raw_archive(store, 1, os.urandom(3 * MiB))
        await raw_archive(store, 2, os.urandom(MiB))
        clock.advance(EVERY / 2)
        scrub = scrubber(store, clock, rate=MiB)  # a chunk per second
        started = clock.seconds()
        try:
            _next_due, waits = await run_pass(scrub, clock)
        finally:
            await scrub.stopService()
        held = await store.archives()
    # 4 MiB at 1 MiB/s: never faster, and no time lost between the two archives.
    assert clock.seconds() - started == 4.0
    assert waits == [1.0, 1.0, 1.0, 1.0]
    assert [a.scrubbed_at for a in held] == [started + 3.0, started + 4.0]


def paused(clock: Clock) -> bool:
    """The scrub waits for its next pass (a pause, not a pacing wait)."""
    return any(c.getTime() - clock.seconds() > 1 for c in clock.getDelayedCalls())


@pytest_twisted.ensureDeferred
async def test_the_service_rereads_each_archive_within_every(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        path = await raw_archive(store, 1, b"x" * 1000)
        scrub = scrubber(store, clock)
        scrub.startService()
        try:
            await eventually(lambda: clock.getDelayedCalls(), what="the first pause")
            clock.advance(EVERY / 2)
            await run_until(clock, lambda: scrub.scrubbed == 1)
            [row] = await store.archives()
            assert EVERY / 2 <= (row.scrubbed_at or 0) < EVERY / 2 + 1
            flip_a_byte(path, 10)
            await eventually(lambda: paused(clock), what="the next pause")
            clock.advance(EVERY / 2)
            await run_until(clock, lambda: scrub.set_aside == 1)
        finally:
            await scrub.stopService()
        assert await store.archives() == []
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_at_start_a_missing_or_resized_file_is_set_aside_at_once(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        await raw_archive(store, 1, b"whole")
        missing = await raw_archive(store, 2, b"missing")
        grown = await raw_archive(store, 3, b"grown")
        damaged = await raw_archive(store, 4, b"same size, other bytes")
        missing.unlink()
        with open(grown, "ab") as f:
            f.write(b"!")
        flip_a_byte(damaged, 0)  # the size is right: only a read finds it
        scrub = scrubber(store, clock)
        scrub.startService()  # nothing is due yet: no archive is read
        try:
            await eventually(lambda: scrub.set_aside == 2, what="the files checked")
            await eventually(lambda: paused(clock), what="the first pause")
        finally:
            await scrub.stopService()
        held = await store.archives()
    assert [a.gid for a in held] == [1, 4]
    assert scrub.bytes_read == 0
    assert [p.name for p in DataDir(tmp_path).corrupt.iterdir()] == [grown.name]


@pytest_twisted.ensureDeferred
async def test_stopping_mid_archive_changes_nothing(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        await raw_archive(store, 1, os.urandom(3 * MiB))
        clock.advance(EVERY / 2)
        scrub = scrubber(store, clock, rate=MiB)
        scrub.startService()
        await eventually(lambda: clock.getDelayedCalls(), what="a paced read")
        await scrub.stopService()
        [row] = await store.archives()
    assert row.scrubbed_at is None and clock.getDelayedCalls() == []


@pytest.mark.parametrize(("every", "rate"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_bad_settings_are_refused(tmp_path: Path, every: float, rate: int) -> None:
    store = NodeStore(DataDir(tmp_path), reactor=reactor, clock=Clock(), threads=RealThreadPools())
    try:
        with pytest.raises(ValueError, match="scrub"):
            Scrubber(
                store,
                store.data,
                every=every,
                rate=rate,
                clock=Clock(),
                reactor=reactor,
                threads=RealThreadPools(),
            )
    finally:
        store.close()


def test_the_options_default_to_delivery_md_and_parse_units(tmp_path: Path) -> None:
    defaults = Options()
    defaults.parseOptions(["--secret", "x", "--data", str(tmp_path)])
    node = makeService(defaults)
    assert isinstance(node, NodeService)
    assert (node.scrub_every, node.scrub_rate) == (7 * 86400.0, 50_000_000)
    given = Options()
    given.parseOptions(
        ["--secret", "x", "--data", str(tmp_path), "--scrub-every", "12h"]
        + ["--scrub-rate", "200MiB/s"]
    )
    assert (given["scrub-every"], given["scrub-rate"]) == (43200.0, 200 * MiB)


@pytest.mark.parametrize(
    "argv",
    [
        ("--scrub-every", "0"),
        ("--scrub-every", "soon"),
        ("--scrub-every", "-1d"),
        ("--scrub-rate", "0"),
        ("--scrub-rate", "fast"),
    ],
)
def test_bad_options_are_refused(argv: tuple[str, str]) -> None:
    with pytest.raises(usage.UsageError):
        Options().parseOptions(["--secret", "x", *argv])


@pytest_twisted.ensureDeferred
async def test_a_running_node_sets_aside_a_damaged_archive(tmp_path: Path) -> None:
    data = tmp_path / "node"
    gid = 777
    async with running(tmp_path) as (site, up):
        # The real clock: a pass every 0.1 s.
        async with logged_in_node(site, data, scrub_every=0.2) as node:
            site.download("op-1", gid, up.file_url(gid))
            await eventually(
                lambda: (
                    node_rows(data, "SELECT scrubbed_at FROM archive WHERE gid = ?", gid)
                    not in ([], [(None,)])
                ),
                what="the archive found whole",
            )
            [archive] = (data / "archives").iterdir()
            flip_a_byte(archive, archive.stat().st_size - 30)
            await eventually(lambda: not node_rows(data, "SELECT * FROM archive"), what="set aside")
            assert node.scrubber is not None and node.scrubber.set_aside == 1
    assert [p.name for p in (data / "corrupt").iterdir()] == [archive.name]
    assert list((data / "archives").iterdir()) == []
