"""Node housekeeping: ``received_command`` rows are pruned only for gids whose
delete the site took (a DELETED/NOT_FOUND result ACKed), up to that DELETE,
after the retention; the guard against downloading a generation twice holds
for everything else.

Real SQLite files through :class:`NodeStore`; a command row's age is set by
hand (``settled_at`` moved into the past) where the retention is tested.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor

from tasknet.node.paths import DataDir
from tasknet.node.store import DELETED, FAILED, NOT_FOUND, NodeStore
from tasknet.runtime import RealThreadPools

URL = "http://127.0.0.1:9/f"

DIGEST = "ab" * 32  # any 64 hex characters: the store does not read the file


@asynccontextmanager
async def opened(path: Path) -> AsyncIterator[NodeStore]:
    store = NodeStore(DataDir(path), reactor=reactor, clock=reactor, threads=RealThreadPools())
    try:
        await store.create_schema()
        yield store
    finally:
        store.close()


def commands(path: Path) -> list[tuple[int, str | None, str]]:
    connection = sqlite3.connect(path / "node.sqlite")
    try:
        return connection.execute(
            "SELECT gid, operation_id, action FROM received_command ORDER BY id"
        ).fetchall()
    finally:
        connection.close()


async def delete_and_ack(store: NodeStore, gid: int, delete_id: str, result: str) -> None:
    """A DELETE run to ``result``, reported, and the report ACKed."""
    await store.begin_delete(gid, delete_id, 2)
    await store.finish_delete(gid, delete_id, result, "")
    report = await store.create_report(f"r-{delete_id}", int(time.time() * 1000))
    assert report is not None
    assert await store.acknowledge(report.report_id)


def backdate_settled(path: Path, days: float) -> None:
    connection = sqlite3.connect(path / "node.sqlite")
    try:
        with connection:
            connection.execute(
                "UPDATE settled_deletion SET settled_at = settled_at - ?", (days * 86400,)
            )
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_an_acked_delete_prunes_its_gid_up_to_the_delete_after_the_retention(
    tmp_path: Path,
) -> None:
    async with opened(tmp_path) as store:
        await store.accept_download(7, "op-a", "n", URL, 2)
        await store.accept_download(7, "op-a", "n", URL, 2)  # re-sent at a login
        await store.accept_download(8, "op-8", "n", URL, 2)  # another gid: untouched
        await delete_and_ack(store, 7, "del-1", DELETED)
        # Kept for the retention (drills and operators read it).
        assert await store.prune_commands() == 0
        assert len(commands(tmp_path)) == 4
        backdate_settled(tmp_path, 8)
        assert await store.prune_commands() == 3
        assert commands(tmp_path) == [(8, "op-8", "DOWNLOAD")]
        # Settled once: nothing left to prune.
        assert await store.prune_commands(retention_days=0) == 0
        # A new generation comes with a new operationId: accepted, and guarded again.
        assert (await store.accept_download(7, "op-b", "n", URL, 2)).kind == "new"
        assert (await store.accept_download(7, "op-b", "n", URL, 2)).kind == "duplicate"


@pytest_twisted.ensureDeferred
async def test_commands_after_the_settled_delete_stay(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await store.accept_download(7, "op-a", "n", URL, 2)
        await store.begin_delete(7, "del-1", 2)
        await store.finish_delete(7, "del-1", DELETED, "")
        report = await store.create_report("r1", int(time.time() * 1000))
        assert report is not None
        # A DOWNLOAD that arrives after the DELETE, before its ACK (a stale one
        # the site should not have sent): its row is evidence and a guard.
        assert (await store.accept_download(7, "op-a", "n", URL, 2)).kind == "duplicate"
        await store.accept_download(7, "op-c", "n", URL, 2)
        assert await store.acknowledge("r1")
        assert await store.prune_commands(retention_days=0) == 2
        assert commands(tmp_path) == [(7, "op-a", "DOWNLOAD"), (7, "op-c", "DOWNLOAD")]
        assert (await store.accept_download(7, "op-a", "n", URL, 2)).kind == "duplicate"
        assert (await store.accept_download(7, "op-c", "n", URL, 2)).kind == "duplicate"


@pytest_twisted.ensureDeferred
async def test_a_not_found_delete_settles_a_failed_one_does_not(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await store.begin_delete(5, "del-5", 2)  # never downloaded here
        await store.finish_delete(5, "del-5", NOT_FOUND, "no task")
        await store.accept_download(6, "op-6", "n", URL, 2)
        await delete_and_ack(store, 6, "del-6", FAILED)
        assert await store.prune_commands(retention_days=0) == 1
        # The failed delete left the task held: its DOWNLOAD still guards it.
        assert commands(tmp_path) == [(6, "op-6", "DOWNLOAD"), (6, "del-6", "DELETE")]
        assert (await store.accept_download(6, "op-6", "n", URL, 2)).kind == "duplicate"


@pytest_twisted.ensureDeferred
async def test_a_completed_generation_stays_guarded(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await store.accept_download(9, "op-9", "n", URL, 2)
        assert await store.complete(9, "op-9", "9.zip", size=10, sha256=DIGEST)
        report = await store.create_report("r1", int(time.time() * 1000))
        assert report is not None and await store.acknowledge("r1")
        assert await store.get_task(9) is None  # forgotten after the ACK
        assert await store.prune_commands(retention_days=0) == 0
        assert (await store.accept_download(9, "op-9", "n", URL, 2)).kind == "duplicate"


@pytest_twisted.ensureDeferred
async def test_the_ack_itself_prunes_what_is_due(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await store.accept_download(7, "op-a", "n", URL, 2)
        await delete_and_ack(store, 7, "del-1", DELETED)
        backdate_settled(tmp_path, 8)
        await store.accept_download(8, "op-8", "n", URL, 2)
        await store.complete(8, "op-8", "8.zip", size=10, sha256=DIGEST)
        report = await store.create_report("r2", int(time.time() * 1000))
        assert report is not None and await store.acknowledge("r2")
        assert commands(tmp_path) == [(8, "op-8", "DOWNLOAD")]


@pytest_twisted.ensureDeferred
async def test_a_legacy_delete_settles_once_its_result_is_sent(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await store.accept_download(7, None, "n", URL, 1, legacy_operation_id="legacy-1")
        await store.begin_delete(7, "", 1)
        await store.finish_delete(7, "", DELETED, "")
        await store.drop_deletion(7, "")
        assert await store.deletions() == []
        assert await store.prune_commands(retention_days=0) == 2
        assert commands(tmp_path) == []
