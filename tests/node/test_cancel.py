"""CANCEL (PROTOCOL.md "Archives (v2)") as a scripted site sends it over TCP to
a real node downloading from the mock upstream."""

from __future__ import annotations

from pathlib import Path

import pytest_twisted

from tasknet.protocol.messages import Error, ReleasedEntry
from tasknet.upstream import catalog
from tests.eventually import eventually
from tests.node.harness import file_fault, logged_in_node, node_rows, running
from tests.node.site_peer import ScriptedSite
from tests.node.test_commands import completed

GID = 3131


def released(site: ScriptedSite) -> list[ReleasedEntry]:
    return [e for r in site.reports() for e in r.released]


def files(data: Path) -> list[str]:
    return sorted(p.name for d in ("archives", "partial") for p in (data / d).iterdir())


@pytest_twisted.ensureDeferred
async def test_a_cancel_for_a_generation_never_held_is_released_at_once(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, _up):
        async with logged_in_node(site, data):
            site.cancel("op-never", GID)
            await eventually(lambda: released(site), what="the release")
            await eventually(lambda: not node_rows(data, "SELECT * FROM released"), what="ACK")
            site.cancel("op-never", GID)  # repeating it is safe: released again
            await eventually(lambda: len(released(site)) == 2, what="the second release")
            assert site.of_type(Error) == []
    assert released(site) == [ReleasedEntry(GID, "op-never", "CANCELLED")] * 2
    assert node_rows(data, "SELECT * FROM task") == []
    assert node_rows(data, "SELECT action FROM received_command") == [("CANCEL",), ("CANCEL",)]


@pytest_twisted.ensureDeferred
async def test_a_cancel_stops_the_download_and_removes_its_files(tmp_path: Path) -> None:
    data = tmp_path / "node"
    size = catalog.gallery(GID).size
    async with running(tmp_path) as (site, up):
        up.set_faults(file_fault("slow_body", bytes_per_s=size / 20))
        async with logged_in_node(site, data) as node:
            site.download("op-1", GID, up.file_url(GID))
            await eventually(lambda: files(data), what="downloading")
            site.cancel("op-1", GID)
            await eventually(lambda: released(site), what="the release")
            assert node.worker is not None and node.worker.active() == {}
            assert files(data) == []
            assert node_rows(data, "SELECT * FROM task") == []
            # The site may send that generation again later (moved back here).
            up.set_faults([])
            site.download("op-1", GID, up.file_url(GID))
            await eventually(lambda: completed(site, GID, "op-1"), what="downloaded again")
    assert released(site) == [ReleasedEntry(GID, "op-1", "CANCELLED")]
    assert node_rows(data, "SELECT * FROM released") == []


@pytest_twisted.ensureDeferred
async def test_a_cancel_removes_a_held_archive_and_never_another_generation(
    tmp_path: Path,
) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            site.download("op-9", GID + 1, up.file_url(GID + 1))
            await eventually(
                lambda: completed(site, GID, "op-1") and completed(site, GID + 1, "op-9")
            )
            await eventually(lambda: not node_rows(data, "SELECT * FROM task"), what="ACKed")
            # A CANCEL of an older generation of GID + 1 leaves op-9 alone.
            site.cancel("op-8", GID + 1)
            site.cancel("op-1", GID)
            await eventually(lambda: len(released(site)) == 2, what="both released")
            held = node_rows(data, "SELECT gid, operation_id FROM archive")
    assert sorted(released(site)) == [
        ReleasedEntry(GID, "op-1", "CANCELLED"),
        ReleasedEntry(GID + 1, "op-8", "CANCELLED"),
    ]
    assert held == [(GID + 1, "op-9")]
    assert [name.split("-")[0] for name in files(data)] == [str(GID + 1)]
