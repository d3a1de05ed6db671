"""Download → compress → archive against the real mock upstream on loopback."""

from __future__ import annotations

import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from tasknet.node.paths import DataDir
from tasknet.node.store import NodeStore, TaskRow
from tasknet.node.worker import Worker
from tasknet.runtime import RealThreadPools, SeededEntropy
from tasknet.upstream import catalog
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.eventually import eventually
from tests.node.harness import file_fault

GID = 4242


@asynccontextmanager
async def node_worker(path: Path, **options: float) -> AsyncIterator[tuple[NodeStore, Worker]]:
    data = DataDir(path)
    store = NodeStore(data, reactor=reactor, clock=reactor, threads=RealThreadPools())
    await store.create_schema()
    worker = Worker(
        store,
        data,
        lambda: None,
        clock=reactor,
        threads=RealThreadPools(),
        rng=SeededEntropy(0).random(),
        **options,  # type: ignore[arg-type]
    )
    worker.start()
    try:
        yield store, worker
    finally:
        await worker.stop()
        store.close()


async def task_row(store: NodeStore, gid: int = GID) -> TaskRow | None:
    return await store.get_task(gid)


def archive_member(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        [name] = zf.namelist()
        assert name == f"{GID}-1.bin"
        return zf.read(name)


async def run_to_completion(store: NodeStore, worker: Worker, up: RunningUpstream) -> TaskRow:
    await store.accept_download(GID, "op-1", "n", up.file_url(GID), 2)
    worker.run(GID, "op-1")
    while True:
        row = await task_row(store)
        assert row is not None
        if row.status == 4:
            return row
        await deferLater(reactor, 0.02, lambda: None)


@pytest_twisted.ensureDeferred
async def test_download_compress_complete_matches_upstream_bytes(tmp_path: Path) -> None:
    up = await start_upstream()
    try:
        async with node_worker(tmp_path) as (store, worker):
            row = await run_to_completion(store, worker, up)
    finally:
        await up.stop()
    assert row.archive is not None and row.progress == 1.0
    assert archive_member(tmp_path / "archives" / row.archive) == catalog.archive_bytes(GID)
    assert list((tmp_path / "partial").iterdir()) == []  # the .part file went into the zip
    assert up.stats()["fileGets"] == {f"{GID}-1.bin": 1}


@pytest_twisted.ensureDeferred
async def test_reset_mid_body_resumes_with_range(tmp_path: Path) -> None:
    up = await start_upstream()
    up.set_faults(file_fault("reset_mid_body", after_bytes=20_000, times=3))
    try:
        async with node_worker(tmp_path) as (store, worker):
            row = await run_to_completion(store, worker, up)
    finally:
        await up.stop()
    stats = up.stats()
    assert stats["fileGets"][f"{GID}-1.bin"] == 4
    assert stats["rangedGets"][f"{GID}-1.bin"] == 3  # every retry asked for the rest only
    assert row.archive is not None
    assert archive_member(tmp_path / "archives" / row.archive) == catalog.archive_bytes(GID)


@pytest_twisted.ensureDeferred
async def test_a_short_body_is_never_reported_complete(tmp_path: Path) -> None:
    up = await start_upstream()
    size = catalog.gallery(GID).size
    # Every answer breaks off before the end: the download can never finish.
    up.set_faults(file_fault("reset_mid_body", after_bytes=0, times=None))
    try:
        async with node_worker(tmp_path) as (store, worker):
            await store.accept_download(GID, "op-1", "n", up.file_url(GID), 2)
            worker.run(GID, "op-1")
            await eventually(lambda: up.stats()["fileGets"].get(f"{GID}-1.bin", 0) >= 4)

            # A new attempt's first progress tick clears the last one's reason,
            # so the reason is looked for in the back-off between attempts.
            rows = []
            for _ in range(200):
                row = await task_row(store)
                assert row is not None and row.status == 1
                rows.append(row.error)
                if row.error is not None and "body broken" in row.error:
                    break
                await deferLater(reactor, 0.02, lambda: None)
            else:
                raise AssertionError(f"no failed attempt reported: {rows[-3:]}")
            part = DataDir(tmp_path).part_path(GID, "op-1")
            assert not part.exists() or part.stat().st_size < size
            up.clear_faults()
            row = await run_to_completion(store, worker, up)
    finally:
        await up.stop()
    assert row.status == 4


@pytest_twisted.ensureDeferred
async def test_slow_body_completes_and_stop_keeps_the_part_file(tmp_path: Path) -> None:
    up = await start_upstream()
    size = catalog.gallery(GID).size
    up.set_faults(file_fault("slow_body", bytes_per_s=size / 10))
    part = DataDir(tmp_path).part_path(GID, "op-1")
    try:
        async with node_worker(tmp_path) as (store, worker):
            await store.accept_download(GID, "op-1", "n", up.file_url(GID), 2)
            worker.run(GID, "op-1")
            await eventually(lambda: part.exists() and part.stat().st_size > size // 20)
        # The worker stopped mid-download: the bytes stay for the next start.
        kept = part.stat().st_size
        assert 0 < kept < size
        async with node_worker(tmp_path) as (store, worker):
            await worker.resume_all()
            row = await run_to_completion(store, worker, up)
    finally:
        await up.stop()
    assert up.stats()["rangedGets"] == {f"{GID}-1.bin": 1}
    assert row.archive is not None
    assert archive_member(tmp_path / "archives" / row.archive) == catalog.archive_bytes(GID)


@pytest_twisted.ensureDeferred
async def test_a_storage_error_is_recorded_and_retried_not_swallowed(tmp_path: Path) -> None:
    up = await start_upstream()
    part = DataDir(tmp_path).part_path(GID, "op-1")
    part.parent.mkdir(parents=True)
    part.mkdir()  # the download cannot write its .part file, even as root
    try:
        async with node_worker(tmp_path) as (store, worker):
            await store.accept_download(GID, "op-1", "n", up.file_url(GID), 2)
            worker.run(GID, "op-1")
            row = None

            async def failed() -> bool:
                nonlocal row
                row = await task_row(store)
                return bool(row and row.error)

            while not await failed():
                await deferLater(reactor, 0.02, lambda: None)
            assert row is not None and row.status == 1
            assert row.error is not None and "cannot write" in row.error
            assert "Is a directory" in row.error
            part.rmdir()  # the operator fixes the disk: the task finishes by itself
            row = await run_to_completion(store, worker, up)
    finally:
        await up.stop()
    assert row.status == 4 and row.error is None
