"""DOWNLOAD and DELETE as the site sends them: repeats, generations, delete results."""

from __future__ import annotations

from pathlib import Path

import pytest_twisted
from twisted.logger import formatEvent, globalLogPublisher

from tasknet.protocol.messages import Error, TaskReport
from tasknet.upstream import catalog
from tests.eventually import eventually
from tests.node.harness import file_fault, logged_in_node, node_rows, running
from tests.node.site_peer import ScriptedSite

GID = 777


def deleted_entry(site: ScriptedSite, gid: int, operation_id: str) -> tuple[TaskReport, object]:
    for report in site.reports():
        for entry in report.deleted:
            if entry.gid == gid and entry.operation_id == operation_id:
                return report, entry
    return None  # type: ignore[return-value]


def completed(site: ScriptedSite, gid: int, operation_id: str) -> bool:
    return any(
        e.gid == gid and e.status == 4 and r.operation_ids.get(gid) == operation_id
        for r in site.reports()
        for e in r.gallery_tasks
    )


@pytest_twisted.ensureDeferred
async def test_the_same_operation_twice_downloads_once(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            site.download("op-1", GID, up.file_url(GID))
            await eventually(lambda: completed(site, GID, "op-1"))
            site.download("op-1", GID, up.file_url(GID))  # after completion and ACK too
            await eventually(lambda: len(node_rows(data, "SELECT * FROM received_command")) == 3)
        assert up.stats()["fileGets"] == {f"{GID}-1.bin": 1}
    assert node_rows(data, "SELECT * FROM task") == []


@pytest_twisted.ensureDeferred
async def test_downloads_sent_again_are_one_summary_line(tmp_path: Path) -> None:
    """A site sends every held task again when a node reconnects: one line
    says so, not one per gid (issue 36, item 12)."""
    data = tmp_path / "node"
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        async with running(tmp_path) as (site, up):
            async with logged_in_node(site, data):
                gids = list(range(GID, GID + 12))
                for gid in gids:
                    site.download(f"op-{gid}", gid, up.file_url(gid))
                await eventually(lambda: all(completed(site, gid, f"op-{gid}") for gid in gids))
                for gid in gids:  # as after a reconnect
                    site.download(f"op-{gid}", gid, up.file_url(gid))
                summaries = await eventually(
                    lambda: [e for e in events if "DOWNLOAD again for" in formatEvent(e)],
                    what="the summary line",
                )
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert [formatEvent(e) for e in summaries] == [
        "DOWNLOAD again for 12 task(s) already held: nothing to do (gids "
        + ", ".join(str(gid) for gid in gids[:10])
        + " and 2 more)"
    ]
    assert not [e for e in events if "again: nothing to do" in formatEvent(e)]


@pytest_twisted.ensureDeferred
async def test_a_new_operation_is_a_new_generation(tmp_path: Path) -> None:
    data = tmp_path / "node"
    size = catalog.gallery(GID).size
    async with running(tmp_path) as (site, up):
        up.set_faults(file_fault("slow_body", bytes_per_s=size / 10))
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID, 1))
            await eventually(lambda: any((data / "partial").iterdir()), what="op-1 downloading")
            [old_part] = (data / "partial").iterdir()
            site.download("op-2", GID, up.file_url(GID, 2))
            await eventually(lambda: completed(site, GID, "op-2"), what="op-2 complete")
        stats = up.stats()
    assert not old_part.exists()
    assert not completed(site, GID, "op-1")
    assert stats["fileGets"] == {f"{GID}-1.bin": 1, f"{GID}-2.bin": 1}
    assert len(list((data / "archives").iterdir())) == 1


@pytest_twisted.ensureDeferred
async def test_delete_of_a_present_and_of_an_absent_gid(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            await eventually(lambda: completed(site, GID, "op-1"))
            # ACKed: the task left the queue, but its archive is still on disk.
            await eventually(lambda: not node_rows(data, "SELECT * FROM task"))
            assert any((data / "archives").iterdir())
            site.delete("del-1", GID)
            site.delete("del-2", GID + 1)
            await eventually(lambda: deleted_entry(site, GID, "del-1"), what="del-1")
            await eventually(lambda: deleted_entry(site, GID + 1, "del-2"), what="del-2")
            report, present = deleted_entry(site, GID, "del-1")
            other, absent = deleted_entry(site, GID + 1, "del-2")
            # A gid held only as a deletion maps to its delete id (vector r-0002).
            assert report.operation_ids[GID] == "del-1"
            assert other.operation_ids[GID + 1] == "del-2"
            # Repeating a delete is safe.
            site.delete("del-1", GID)
            await eventually(lambda: len(node_rows(data, "SELECT * FROM received_command")) == 4)
            await eventually(lambda: not node_rows(data, "SELECT * FROM deletion"))
    assert (present.result, absent.result) == ("DELETED", "NOT_FOUND")  # type: ignore[attr-defined]
    assert list((data / "archives").iterdir()) == []


@pytest_twisted.ensureDeferred
async def test_a_delete_that_cannot_remove_the_archive_reports_failed(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            await eventually(lambda: completed(site, GID, "op-1"))
            [archive] = (data / "archives").iterdir()
            # A non-empty directory where the archive was: unlink fails, even for root.
            archive.unlink()
            archive.mkdir()
            (archive / "keep").write_bytes(b"x")
            site.delete("del-1", GID)
            await eventually(lambda: deleted_entry(site, GID, "del-1"), what="the result")
            _report, entry = deleted_entry(site, GID, "del-1")
    assert entry.result == "FAILED"  # type: ignore[attr-defined]
    assert "Is a directory" in entry.reason  # type: ignore[attr-defined]
    assert archive.is_dir()


@pytest_twisted.ensureDeferred
async def test_a_bad_command_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, upstream):
        async with logged_in_node(site, data):
            site.download("op-1", GID, "file:///etc/passwd")
            # The link survives the refused command: a good one still works.
            site.download("op-2", GID + 1, upstream.file_url(GID + 1))
            await eventually(
                lambda: node_rows(data, "SELECT gid FROM received_command"),
                what="the good command recorded",
            )
            assert site.of_type(Error) == []
    assert node_rows(data, "SELECT gid, operation_id FROM received_command") == [(GID + 1, "op-2")]
    assert node_rows(data, "SELECT gid FROM task") == [(GID + 1,)]
