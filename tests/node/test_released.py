"""Released entries (PROTOCOL.md "Archives (v2)"): what the node stopped holding
on its own is reported until an ACK for a report that carried it; a real
SQLite store, and a real node against a scripted site over TCP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from tasknet.node.store import CANCELLED, CORRUPT, EXPIRED, MISSING, PendingReport
from tasknet.protocol.messages import ReleasedEntry, TaskReport
from tests.eventually import eventually
from tests.node.harness import SECRET, logged_in_node, node_rows, running, start_node
from tests.node.site_peer import ScriptedSite
from tests.node.test_archive_store import acknowledged, completed, opened

GID = 4242


@pytest_twisted.ensureDeferred
async def test_set_aside_releases_in_its_transaction_until_an_ack(tmp_path: Path) -> None:
    clock = Clock()
    clock.advance(1000.0)
    async with opened(tmp_path, clock) as store:
        await completed(store, 7, "op-a")
        await completed(store, 8, "op-b")
        await acknowledged(store, "r1")
        await store.set_aside(7, "op-a", "sha256 differs")
        await store.set_aside(8, "op-b", "its file is missing", reason=MISSING)
        assert node_rows(tmp_path, "SELECT gid, operation_id, reason, at FROM released") == [
            (7, "op-a", CORRUPT, 1000.0),
            (8, "op-b", MISSING, 1000.0),
        ]
        report = await store.create_report("r2", 2)
        assert report is not None
        assert report.gallery_tasks == () and report.released == (
            (7, "op-a", CORRUPT),
            (8, "op-b", MISSING),
        )
        # Persisted as it is sent: after a restart the same report goes out.
        assert PendingReport.from_row("r2", report.revision, report.to_json()) == report
        assert await store.in_flight_report() == report
        assert await store.acknowledge("r2")
        assert await store.released() == []
        assert await store.create_report("r3", 3) is None  # nothing left to say


@pytest_twisted.ensureDeferred
async def test_a_release_replaced_before_the_ack_stays_for_the_next_report(
    tmp_path: Path,
) -> None:
    async with opened(tmp_path) as store:
        await completed(store, 7, "op-a")
        await acknowledged(store, "r1")
        assert await store.release_archive(7, "op-a", EXPIRED) is not None
        carried = await store.create_report("r2", 2)
        assert carried is not None and carried.released == ((7, "op-a", EXPIRED),)
        cancelled = await store.cancel(7, "op-a")  # not held any more: released anyway
        assert not cancelled.held and cancelled.archive is None
        assert await store.acknowledge("r2")
        assert await store.released() == [(7, "op-a", CANCELLED)]


@pytest_twisted.ensureDeferred
async def test_a_completion_not_yet_acked_is_never_released_by_retention(
    tmp_path: Path,
) -> None:
    async with opened(tmp_path) as store:
        await completed(store, 7, "op-a")
        assert await store.eviction_candidates(10) == []
        assert await store.release_archive(7, "op-a", EXPIRED) is None
        await acknowledged(store, "r1")
        [candidate] = await store.eviction_candidates(10)
        assert await store.release_archive(7, "op-a", EXPIRED) == candidate
        assert await store.archives() == []


def test_a_report_persisted_by_an_older_node_has_no_released() -> None:
    body = json.dumps({"galleryTasks": [[1, 1, 0.5]], "operationIds": {"1": "op"}, "deleted": []})
    assert PendingReport.from_row("r", 5, body).released == ()
    with pytest.raises(ValueError, match="release reason"):
        from tasknet.node.store import _release

        _release(None, 0.0, 1, "op", "BORED")  # type: ignore[arg-type]


async def _held_then_wiped(site: ScriptedSite, data: Path, url: str) -> None:
    """A node completes GID, the site ACKs it, the node stops; its archive file goes."""
    async with logged_in_node(site, data):
        site.download("op-1", GID, url)
        await eventually(
            lambda: (
                node_rows(data, "SELECT gid FROM archive") == [(GID,)]
                and not node_rows(data, "SELECT * FROM task")
            ),
            what="completed and ACKed",
        )
    [archive] = (data / "archives").iterdir()
    archive.unlink()


def released_entries(site: ScriptedSite) -> list[tuple[str, tuple[ReleasedEntry, ...]]]:
    return [(r.report_id, r.released) for r in site.reports() if r.released]


@pytest_twisted.ensureDeferred
async def test_a_missing_file_found_at_start_is_released_until_acked(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        await _held_then_wiped(site, data, up.file_url(GID))
        before = len(site.reports())
        site.auto_ack = False
        async with logged_in_node(site, data, logins=2, ack_timeout=0.2):
            await eventually(
                lambda: len(released_entries(site)) >= 2, what="the release sent, then resent"
            )
            [first, again, *_] = released_entries(site)
            assert first == again  # resent unchanged until ACKed
            assert first[1] == (ReleasedEntry(GID, "op-1", MISSING),)
            site.ack(first[0])
            await eventually(lambda: node_rows(data, "SELECT * FROM released") == [], what="ACK")
            assert node_rows(data, "SELECT * FROM archive") == []
        later = [r for r in site.reports()[before:] if r.report_id != first[0]]
        assert all(not r.released for r in later)


@pytest_twisted.ensureDeferred
async def test_a_legacy_link_keeps_releases_for_the_next_v2_link(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        await _held_then_wiped(site, data, up.file_url(GID))
    legacy = ScriptedSite(SECRET, legacy=True)
    await legacy.listen()
    try:
        node = await start_node(legacy, data, trust_legacy_site=True)
        try:
            await legacy.logged_in()
            await eventually(
                lambda: node_rows(data, "SELECT reason FROM released") == [(MISSING,)],
                what="the release recorded",
            )
            legacy.legacy_download(GID + 1, "http://127.0.0.1:9/never")
            await eventually(lambda: len(legacy.received) >= 3, what="a legacy status report")
        finally:
            await node.stopService()
        assert not any(isinstance(m, TaskReport) for m in legacy.received)
        assert node_rows(data, "SELECT reason FROM released") == [(MISSING,)]
    finally:
        await legacy.stop()
    async with running(tmp_path) as (site, _up):
        async with logged_in_node(site, data):
            await eventually(lambda: released_entries(site), what="the release on v2")
            await eventually(lambda: node_rows(data, "SELECT * FROM released") == [], what="ACK")
    assert released_entries(site)[0][1] == (ReleasedEntry(GID, "op-1", MISSING),)


@pytest_twisted.ensureDeferred
async def test_an_archive_the_scrub_sets_aside_while_running_is_reported_corrupt(
    tmp_path: Path,
) -> None:
    from tests.node.test_scrub import flip_a_byte

    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        # The real clock: a pass every 0.1 s.
        async with logged_in_node(site, data, scrub_every=0.2):
            site.download("op-1", GID, up.file_url(GID))
            await eventually(
                lambda: (
                    node_rows(data, "SELECT scrubbed_at FROM archive") not in ([], [(None,)])
                    and not node_rows(data, "SELECT * FROM task")
                ),
                what="held whole and ACKed",
            )
            [archive] = (data / "archives").iterdir()
            flip_a_byte(archive, archive.stat().st_size - 30)
            # Nothing else changes: the release alone makes the next report.
            await eventually(lambda: released_entries(site), what="the release reported")
            await eventually(lambda: not node_rows(data, "SELECT * FROM released"), what="ACK")
    assert released_entries(site)[0][1] == (ReleasedEntry(GID, "op-1", CORRUPT),)
