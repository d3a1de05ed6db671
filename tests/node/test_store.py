"""The node database on a real SQLite file: commands, revisions, in-flight report."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from tasknet.node.paths import DataDir
from tasknet.node.store import (
    FAILED,
    LEGACY_DELETE_ID,
    NOT_FOUND,
    NodeStore,
    PendingReport,
    report_detail,
)
from tasknet.protocol.messages import TaskEntry
from tasknet.runtime import RealThreadPools

DIGEST = "ab" * 32  # any 64 hex characters: the store does not read the file


async def open_store(path: Path) -> NodeStore:
    store = NodeStore(DataDir(path), reactor=reactor, clock=reactor, threads=RealThreadPools())
    await store.create_schema()
    return store


@pytest_twisted.ensureDeferred
async def test_download_is_persisted_and_deduplicated(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        first = await store.accept_download(7, "op-a", "seven", "http://x/7", 2)
        again = await store.accept_download(7, "op-a", "seven", "http://x/7", 2)
        newer = await store.accept_download(7, "op-b", "seven", "http://x/7", 2)
        stale = await store.accept_download(7, "op-a", "seven", "http://x/7", 2)
        task = await store.get_task(7)
    finally:
        store.close()
    assert (first.kind, again.kind, newer.kind) == ("new", "duplicate", "new_generation")
    assert newer.old_operation_id == "op-a"
    # A late repeat of an older generation's command must not resurrect it.
    assert stale.kind == "duplicate"
    assert task is not None and task.operation_id == "op-b" and task.status == 1
    rows = (
        sqlite3.connect(tmp_path / "node.sqlite")
        .execute("SELECT gid, operation_id, action, protocol FROM received_command ORDER BY id")
        .fetchall()
    )
    assert rows == [(7, "op-a", "DOWNLOAD", 2)] * 2 + [
        (7, "op-b", "DOWNLOAD", 2),
        (7, "op-a", "DOWNLOAD", 2),
    ]


@pytest_twisted.ensureDeferred
async def test_writes_of_an_old_generation_are_ignored(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        await store.accept_download(7, "op-a", "n", "http://x/7", 2)
        await store.accept_download(7, "op-b", "n", "http://x/7", 2)
        assert not await store.complete(7, "op-a", "7-old.zip", size=10, sha256=DIGEST)
        assert not await store.set_status(7, "op-a", 3, 1.0)
        task = await store.get_task(7)
    finally:
        store.close()
    assert task is not None and (task.status, task.archive) == (1, None)


@pytest_twisted.ensureDeferred
async def test_revision_is_strictly_increasing_and_starts_at_unix_ms(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        assert await store.create_report("r0", int(time.time() * 1000)) is None  # nothing held
        await store.accept_download(1, "op", "n", "http://x/1", 2)
        before = int(time.time() * 1000)
        first = await store.create_report("r1", before)
        assert first is not None and first.revision == before
        # Still in flight: asking again gives the same report, not a new one.
        assert await store.create_report("r2", before + 5) == first
        assert await store.acknowledge("r1")
        # A clock that went backwards still moves the revision forward.
        second = await store.create_report("r3", before - 10_000)
        assert second is not None and second.revision == before + 1
    finally:
        store.close()


@pytest_twisted.ensureDeferred
async def test_in_flight_report_survives_reopen_unchanged(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    await store.accept_download(1, "op-1", "n", "http://x/1", 2)
    await store.complete(1, "op-1", "1.zip", size=10, sha256=DIGEST)
    await store.accept_download(2, "op-2", "n", "http://x/2", 2)
    await store.set_progress(2, "op-2", 0.1 + 0.2, 1000)  # a float that must round-trip
    await store.begin_delete(3, "del-3", 2)
    await store.finish_delete(3, "del-3", NOT_FOUND, "nothing here")
    sent = await store.create_report("rep", 1_800_000_000_000)
    store.close()
    store = await open_store(tmp_path)
    try:
        again = await store.in_flight_report()
    finally:
        store.close()
    assert again == sent
    assert sent is not None
    assert sent.gallery_tasks == (
        TaskEntry(1, 4, 1.0, size=10, sha256=DIGEST),
        TaskEntry(2, 1, 0.1 + 0.2),
    )
    assert sent.operation_ids == {1: "op-1", 2: "op-2", 3: "del-3"}
    assert sent.deleted == ((3, "del-3", NOT_FOUND, "nothing here"),)


@pytest_twisted.ensureDeferred
async def test_ack_removes_only_what_the_report_carried(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        await store.accept_download(1, "op-1", "n", "http://x/1", 2)
        await store.complete(1, "op-1", "1.zip", size=10, sha256=DIGEST)
        await store.begin_delete(3, "del-3", 2)
        await store.finish_delete(3, "del-3", NOT_FOUND, "")
        report = await store.create_report("rep", 1)
        assert report is not None
        # Completed after the snapshot: not carried, so not forgotten.
        await store.accept_download(2, "op-2", "n", "http://x/2", 2)
        await store.complete(2, "op-2", "2.zip", size=10, sha256=DIGEST)
        assert not await store.acknowledge("some-other-report")
        assert await store.acknowledge("rep")
        assert not await store.acknowledge("rep")  # a second ACK changes nothing
        tasks = await store.tasks()
        deletions = await store.deletions()
        in_flight = await store.in_flight_report()
    finally:
        store.close()
    assert [(t.gid, t.status) for t in tasks] == [(2, 4)]
    assert deletions == [] and in_flight is None


@pytest_twisted.ensureDeferred
async def test_failed_delete_keeps_the_task_and_a_repeat_runs_again(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        await store.accept_download(1, "op-1", "n", "http://x/1", 2)
        assert (await store.begin_delete(1, "del", 2)).kind == "run"
        await store.finish_delete(1, "del", FAILED, "cannot remove")
        assert await store.get_task(1) is not None
        # The site retries a failed delete with the same id: it runs again.
        assert (await store.begin_delete(1, "del", 2)).kind == "run"
        await store.finish_delete(1, "del", "DELETED", "")
        assert await store.get_task(1) is None
        assert (await store.begin_delete(1, "del", 2)).kind == "repeat"
        with pytest.raises(ValueError):
            await store.finish_delete(1, "del", "GONE", "")
    finally:
        store.close()


@pytest_twisted.ensureDeferred
async def test_a_legacy_delete_never_enters_a_v2_report_until_the_site_names_it(
    tmp_path: Path,
) -> None:
    """A delete taken on a legacy link has no delete id; a v2 report with an
    empty id would be refused (PROTOCOL.md "Bounds") and resent forever.  It
    waits for the site's v2 DELETE, whose id replaces it."""
    store = await open_store(tmp_path)
    try:
        await store.begin_delete(9, LEGACY_DELETE_ID, 1)
        await store.finish_delete(9, LEGACY_DELETE_ID, NOT_FOUND, "")
        assert await store.create_report("r-1", 1_000) is None
        await store.begin_delete(9, "del-9", 2)
        await store.finish_delete(9, "del-9", NOT_FOUND, "")
        report = await store.create_report("r-2", 2_000)
    finally:
        store.close()
    assert report is not None
    assert report.deleted == ((9, "del-9", NOT_FOUND, ""),)


@pytest_twisted.ensureDeferred
async def test_entries_say_queued_and_detail_and_survive_reopen(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    await store.accept_download(1, "op-1", "n", "http://x/1", 2, size=1000)
    await store.accept_download(2, "op-2", "n", "http://x/2", 2)
    await store.set_error(2, "op-2", "retrying in 8 s: connection refused")
    await store.accept_download(3, "op-3", "n", "http://x/3", 2)
    await store.set_progress(3, "op-3", 0.5, 10)
    # 3 had bytes: not "queued" even while it waits for a slot again.
    sent = await store.create_report("rep", 1, frozenset({1, 3}))
    store.close()
    store = await open_store(tmp_path)
    try:
        again = await store.in_flight_report()
        [one, *_] = await store.tasks()
    finally:
        store.close()
    assert sent is not None and again == sent
    assert sent.gallery_tasks == (
        TaskEntry(1, 1, 0.0, True, ""),
        TaskEntry(2, 1, 0.0, False, "retrying in 8 s: connection refused"),
        TaskEntry(3, 1, 0.5, False, ""),
    )
    assert one.expected_size == 1000


def test_a_report_persisted_by_an_older_node_still_loads() -> None:
    body = '{"galleryTasks":[[7,1,0.25]],"operationIds":{"7":"op"},"deleted":[]}'
    report = PendingReport.from_row("r", 5, body)
    assert report.gallery_tasks == (TaskEntry(7, 1, 0.25),)
    assert PendingReport.from_row("r", 5, report.to_json()) == report


def test_a_detail_is_cut_to_256_characters_and_holds_no_nul() -> None:
    assert report_detail(None) == "" and report_detail("") == ""
    assert report_detail("a\x00b") == "ab"
    long = report_detail("x" * 1000)
    assert len(long) == 256 and long.endswith("…")


@pytest_twisted.ensureDeferred
async def test_a_database_of_an_older_node_gets_the_new_column(tmp_path: Path) -> None:
    data = DataDir(tmp_path)
    data.create()
    with sqlite3.connect(data.database) as db:  # the task table of the previous release
        db.execute(
            "CREATE TABLE task (gid INTEGER PRIMARY KEY, operation_id TEXT NOT NULL,"
            " name TEXT NOT NULL, url TEXT NOT NULL, protocol INTEGER NOT NULL,"
            " status INTEGER NOT NULL, progress REAL NOT NULL DEFAULT 0, size INTEGER,"
            " archive TEXT, error TEXT, updated_at REAL NOT NULL)"
        )
        db.execute(
            "INSERT INTO task VALUES (9, 'op', 'n', 'http://x/9', 2, 1, 0, NULL, NULL, NULL, 0)"
        )
    db.close()
    store = await open_store(tmp_path)
    try:
        [task] = await store.tasks()
    finally:
        store.close()
    assert (task.gid, task.expected_size) == (9, 0)
