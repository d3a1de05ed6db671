"""Reliable reports end to end: a real node, a scripted site over TCP, the mock upstream."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest_twisted

from tasknet.protocol.messages import Goodbye, TaskReport
from tasknet.upstream import catalog
from tests.eventually import eventually
from tests.node.harness import file_fault, logged_in_node, node_rows, running
from tests.node.site_peer import ScriptedSite

GID = 5150


def carries(report: TaskReport, gid: int, status: int) -> bool:
    return any(e.gid == gid and e.status == status for e in report.gallery_tasks)


async def report_with(site: ScriptedSite, gid: int, status: int, *, ack_others: bool) -> TaskReport:
    """Wait for a report carrying ``gid`` at ``status``, ACKing the others if asked."""
    seen = 0

    def check() -> TaskReport | None:
        nonlocal seen
        for report in site.reports()[seen:]:
            seen += 1
            if carries(report, gid, status):
                return report
            if ack_others and report.report_id not in site.acked:
                site.ack(report.report_id)
        return None

    return await eventually(check, what=f"a report with gid {gid} at status {status}")


@pytest_twisted.ensureDeferred
async def test_download_is_reported_complete_and_forgotten_after_the_ack(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            done = await report_with(site, GID, 4, ack_others=False)
            await eventually(lambda: not node_rows(data, "SELECT * FROM task"), what="forget")
        # A graceful stop says so.
        await eventually(lambda: isinstance(site.received[-1], Goodbye), what="Goodbye")
    assert done.operation_ids[GID] == "op-1"
    revisions = [r.revision for r in site.reports()]
    assert revisions == sorted(set(revisions)), "each new snapshot has a higher revision"
    [archive] = (data / "archives").iterdir()
    with zipfile.ZipFile(archive) as zf:
        assert zf.read(f"{GID}-1.bin") == catalog.archive_bytes(GID)
    assert node_rows(data, "SELECT gid, operation_id, action, protocol FROM received_command") == [
        (GID, "op-1", "DOWNLOAD", 2)
    ]


@pytest_twisted.ensureDeferred
async def test_unacked_report_is_resent_unchanged_then_the_next_one_follows_the_ack(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, auto_ack=False) as (site, up):
        # Slow enough that the first report is not the last one (complete:
        # once ACKed the node would have nothing more to say).
        up.set_faults(file_fault("slow_body", bytes_per_s=catalog.gallery(GID).size / 3))
        async with logged_in_node(site, tmp_path / "node", ack_timeout=0.2):
            site.download("op-1", GID, up.file_url(GID))
            await eventually(lambda: len(site.reports()) >= 3, what="two resends")
            first = site.reports()[0]
            # Whatever changed meanwhile, the in-flight report goes out unchanged.
            assert all(r == first for r in site.reports())
            site.ack(first.report_id)
            await eventually(lambda: site.reports()[-1].report_id != first.report_id)
            after = site.reports()[-1]
    assert after.revision > first.revision


@pytest_twisted.ensureDeferred
async def test_completion_and_the_in_flight_report_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path, auto_ack=False) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            carried = await report_with(site, GID, 4, ack_others=True)
        await eventually(lambda: not site.connections, what="the old connection to close")
        before = len(site.reports())
        async with logged_in_node(site, data, logins=2):
            await eventually(lambda: len(site.reports()) > before, what="the resend")
            resent = site.reports()[before]
            assert resent == carried  # same reportId, same revision, same content
            site.ack(resent.report_id)
            await eventually(lambda: not node_rows(data, "SELECT * FROM task"), what="forget")
    assert node_rows(data, "SELECT * FROM in_flight_report") == []


@pytest_twisted.ensureDeferred
async def test_revision_keeps_increasing_across_restarts_and_a_wiped_data_dir(
    tmp_path: Path,
) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        revisions: list[int] = []
        for round_, wipe in enumerate((False, False, True)):
            if wipe:
                shutil.rmtree(data)
            async with logged_in_node(site, data, logins=round_ + 1):
                count = len(site.reports())
                site.download(f"op-{round_}", GID + round_, up.file_url(GID + round_))
                await eventually(lambda: len(site.reports()) > count)  # noqa: B023
                revisions.append(site.reports()[-1].revision)
    assert revisions[0] < revisions[1] < revisions[2]


@pytest_twisted.ensureDeferred
async def test_node_restarted_mid_download_resumes_with_range(tmp_path: Path) -> None:
    data = tmp_path / "node"
    size = catalog.gallery(GID).size
    async with running(tmp_path) as (site, up):
        # About ten seconds for the whole file: stopped well before the end.
        up.set_faults(file_fault("slow_body", bytes_per_s=size / 10))
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            await eventually(
                lambda: any(p.stat().st_size > size // 10 for p in (data / "partial").iterdir()),
                what="part of the file",
            )
        [part] = (data / "partial").iterdir()
        assert 0 < part.stat().st_size < size
        async with logged_in_node(site, data, logins=2):
            await report_with(site, GID, 4, ack_others=False)
        stats = up.stats()
    assert stats["fileGets"] == {f"{GID}-1.bin": 2}
    assert stats["rangedGets"] == {f"{GID}-1.bin": 1}  # the rest only, not the whole again
    [archive] = (data / "archives").iterdir()
    with zipfile.ZipFile(archive) as zf:
        assert zf.read(f"{GID}-1.bin") == catalog.archive_bytes(GID)


@pytest_twisted.ensureDeferred
async def test_a_task_waiting_for_a_download_slot_is_reported_queued(tmp_path: Path) -> None:
    first, second = GID, GID + 1
    async with running(tmp_path) as (site, up):
        # One slot, held by a slow first download.
        up.set_faults(file_fault("slow_body", bytes_per_s=600_000, times=1))
        async with logged_in_node(site, tmp_path / "node", downloads=1):
            site.download("op-1", first, up.file_url(first))
            await eventually(lambda: up.stats()["fileGets"], what="the first GET")
            site.download("op-2", second, up.file_url(second))

            def entry(gid: int, **want: object) -> bool:
                return any(
                    e.gid == gid and all(getattr(e, k) == v for k, v in want.items())
                    for r in site.reports()
                    for e in r.gallery_tasks
                )

            await eventually(lambda: entry(second, queued=True, status=1, progress=0.0))
            assert not entry(first, queued=True)  # it holds the slot
            await eventually(lambda: entry(second, status=4), what="the second done")
    # Once it had its slot it was no longer queued.
    last = [e for r in site.reports() for e in r.gallery_tasks if e.gid == second][-1]
    assert not last.queued
