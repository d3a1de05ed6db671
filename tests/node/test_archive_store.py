"""The node's store of the archives it holds, on a real SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from tasknet.node.paths import DataDir
from tasknet.node.store import DELETED, FAILED, ArchiveRow, NodeStore
from tasknet.protocol.messages import TaskEntry
from tasknet.runtime import RealThreadPools

URL = "http://127.0.0.1:9/f"
DIGEST = "0f" * 32
OTHER_DIGEST = "e1" * 32


@asynccontextmanager
async def opened(path: Path, clock: Clock | None = None) -> AsyncIterator[NodeStore]:
    store = NodeStore(
        DataDir(path), reactor=reactor, clock=clock or Clock(), threads=RealThreadPools()
    )
    await store.create_schema()
    try:
        yield store
    finally:
        store.close()


async def completed(store: NodeStore, gid: int, operation_id: str, digest: str = DIGEST) -> Path:
    """A generation downloaded and zipped: its archive file on disk, its row held."""
    await store.accept_download(gid, operation_id, f"task {gid}", URL, 2)
    path = store.data.archive_path(gid, operation_id)
    path.write_bytes(b"zip bytes")
    assert await store.complete(gid, operation_id, path.name, size=9, sha256=digest)
    return path


async def acknowledged(store: NodeStore, report_id: str) -> None:
    report = await store.create_report(report_id, 1)
    assert report is not None and await store.acknowledge(report_id)


@pytest_twisted.ensureDeferred
async def test_completion_holds_the_archive_past_the_ack(tmp_path: Path) -> None:
    clock = Clock()
    clock.advance(1_800_000_000.5)
    async with opened(tmp_path, clock) as store:
        path = await completed(store, 7, "op-a")
        await acknowledged(store, "r1")
        assert await store.get_task(7) is None  # the task row goes with the ACK
        row = await store.archive(7, "op-a")
        assert await store.archive(7, "op-b") is None
        assert await store.archives() == [row]
    assert row == ArchiveRow(
        gid=7,
        operation_id="op-a",
        name="task 7",
        file=path.name,
        size=9,
        sha256=DIGEST,
        completed_at=1_800_000_000.5,
        served_at=None,
        scrubbed_at=None,
    )
    assert DataDir(tmp_path).archive_file(row) == path


@pytest_twisted.ensureDeferred
async def test_an_old_generation_completing_late_holds_nothing(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await store.accept_download(7, "op-a", "n", URL, 2)
        await store.accept_download(7, "op-b", "n", URL, 2)
        assert not await store.complete(7, "op-a", "7-a.zip", size=9, sha256=DIGEST)
        assert await store.archives() == []


@pytest_twisted.ensureDeferred
async def test_mark_served_records_the_time(tmp_path: Path) -> None:
    clock = Clock()
    async with opened(tmp_path, clock) as store:
        await completed(store, 7, "op-a")
        clock.advance(42.0)
        await store.mark_served(7, "op-a")
        await store.mark_served(8, "op-none")  # not held: nothing happens
        row = await store.archive(7, "op-a")
    assert row is not None and row.served_at == 42.0


@pytest_twisted.ensureDeferred
async def test_set_aside_forgets_the_archive_and_moves_its_file(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        path = await completed(store, 7, "op-a")
        kept = await completed(store, 8, "op-b")
        await store.set_aside(7, "op-a", "sha256 differs")
        await store.set_aside(7, "op-a", "again")  # no longer held: nothing happens
        held = await store.archives()
    assert [(a.gid, a.operation_id) for a in held] == [(8, "op-b")]
    assert not path.exists() and kept.exists()
    assert (DataDir(tmp_path).corrupt / path.name).read_bytes() == b"zip bytes"


@pytest_twisted.ensureDeferred
async def test_set_aside_of_a_missing_file_still_forgets_it(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        path = await completed(store, 7, "op-a")
        path.unlink()
        await store.set_aside(7, "op-a", "size differs")
        assert await store.archives() == []


@pytest_twisted.ensureDeferred
async def test_a_delete_forgets_the_archives_of_the_gid(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await completed(store, 7, "op-a")
        await completed(store, 8, "op-b")
        await acknowledged(store, "r1")
        await store.begin_delete(8, "del-8", 2)
        await store.finish_delete(8, "del-8", FAILED, "cannot remove")
        assert len(await store.archives()) == 2  # a failed delete keeps what it held
        await store.begin_delete(7, "del-7", 2)
        await store.finish_delete(7, "del-7", DELETED, "")
        held = await store.archives()
    assert [(a.gid, a.operation_id) for a in held] == [(8, "op-b")]


@pytest_twisted.ensureDeferred
async def test_a_new_generation_replaces_the_archive_of_the_old(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await completed(store, 7, "op-a")
        await acknowledged(store, "r1")
        # The old generation's task row is gone: its archive still makes the
        # DOWNLOAD a new generation, so its files are removed.
        accepted = await store.accept_download(7, "op-b", "n", URL, 2)
        assert (accepted.kind, accepted.old_operation_id) == ("new_generation", "op-a")
        assert await store.archives() == []
        await completed(store, 9, "op-9")
        accepted = await store.accept_download(9, "op-10", "n", URL, 2)  # task row still there
        assert (accepted.kind, accepted.old_operation_id) == ("new_generation", "op-9")
        assert await store.archives() == []


@pytest_twisted.ensureDeferred
async def test_a_completion_reports_its_size_and_digest(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await completed(store, 7, "op-a", DIGEST)
        await completed(store, 8, "op-b", OTHER_DIGEST)
        # A completion from before the archive table: held, but no digest known.
        await completed(store, 9, "op-c")
        with sqlite3.connect(tmp_path / "node.sqlite") as db:
            db.execute("DELETE FROM archive WHERE gid = 9")
        report = await store.create_report("r1", 1)
    assert report is not None
    assert report.gallery_tasks == (
        TaskEntry(7, 4, 1.0, size=9, sha256=DIGEST),
        TaskEntry(8, 4, 1.0, size=9, sha256=OTHER_DIGEST),
        TaskEntry(9, 4, 1.0),
    )


@pytest_twisted.ensureDeferred
async def test_an_older_database_gains_the_archive_table(tmp_path: Path) -> None:
    data = DataDir(tmp_path)
    data.create()
    with sqlite3.connect(data.database) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('revision', '5')")
    async with opened(tmp_path) as store:
        assert await store.archives() == []
        assert await store.last_revision() == 5
        await completed(store, 7, "op-a")
        assert len(await store.archives()) == 1


@pytest.mark.parametrize("name", ["", ".", "..", "../node.sqlite", "sub/x.zip"])
def test_archive_file_refuses_anything_but_a_bare_name(tmp_path: Path, name: str) -> None:
    row = ArchiveRow(1, "op", "n", name, 0, DIGEST, 0.0)
    with pytest.raises(ValueError, match="not an archive file name"):
        DataDir(tmp_path).archive_file(row)
