"""DELIVERY.md "Integrity", node side: the archive's SHA-256 computed while it
is written, kept with its size, and carried by the v2 completion report."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest
import pytest_twisted

from tasknet.node.compress import BLOCK, CompressionAborted, build_archive
from tasknet.protocol.messages import StatusReport
from tasknet.upstream import catalog
from tests.eventually import eventually
from tests.node.harness import logged_in_node, node_rows, running

GID = 4242
MEMBER = "payload.bin"

SOURCES = {
    "empty": b"",
    "small": b"hello, archive\n" * 10,
    # Over a few MiB, partly incompressible, so the archive spans many blocks.
    "large": os.urandom(3 * BLOCK + 12345) + b"\0" * (2 * BLOCK),
}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_the_digest_is_of_exactly_the_bytes_written(tmp_path: Path, kind: str) -> None:
    source = tmp_path / "source.part"
    source.write_bytes(SOURCES[kind])
    final = tmp_path / "a.zip"
    built = build_archive(source, tmp_path / "a.zip.tmp", final, MEMBER, threading.Event())
    assert built.size == final.stat().st_size
    assert built.sha256 == sha256_of(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zip", "source.part"]
    with zipfile.ZipFile(final) as zf:
        assert zf.testzip() is None
        [info] = zf.infolist()
        # Written forward only: the sizes follow the data (a data descriptor).
        assert info.flag_bits & 0x08
        assert zf.read(MEMBER) == SOURCES[kind]
    if shutil.which("unzip"):
        checked = subprocess.run(["unzip", "-t", str(final)], capture_output=True, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_aborted_compression_leaves_nothing(tmp_path: Path) -> None:
    source = tmp_path / "source.part"
    source.write_bytes(SOURCES["large"])
    abort = threading.Event()
    abort.set()
    with pytest.raises(CompressionAborted):
        build_archive(source, tmp_path / "a.zip.tmp", tmp_path / "a.zip", MEMBER, abort)
    assert [p.name for p in tmp_path.iterdir()] == ["source.part"]


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        build_archive(
            tmp_path / "missing.part",
            tmp_path / "a.zip.tmp",
            tmp_path / "a.zip",
            MEMBER,
            threading.Event(),
        )
    assert list(tmp_path.iterdir()) == []


@pytest_twisted.ensureDeferred
async def test_the_completion_report_carries_size_and_digest(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID), name="the task")
            done = await eventually(
                lambda: (e := site.latest_entry(GID)) is not None and e.status == 4 and e,
                what="the completion",
            )
            await eventually(lambda: not node_rows(data, "SELECT * FROM task"), what="ACK")
    [archive] = (data / "archives").iterdir()
    with zipfile.ZipFile(archive) as zf:
        assert zf.read(f"{GID}-1.bin") == catalog.archive_bytes(GID)
    assert (done.size, done.sha256) == (archive.stat().st_size, sha256_of(archive))
    # Held past the ACK, under the task's name.
    assert node_rows(data, "SELECT gid, operation_id, name, file, size, sha256 FROM archive") == [
        (GID, "op-1", "the task", archive.name, done.size, done.sha256)
    ]


@pytest_twisted.ensureDeferred
async def test_a_legacy_status_report_never_carries_them(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data, protocol=1):
            site.legacy_download(GID, up.file_url(GID))
            await eventually(
                lambda: any(
                    e.status == 4 for r in site.of_type(StatusReport) for e in r.gallery_tasks
                ),
                what="status 4",
            )
    entries = [e for r in site.of_type(StatusReport) for e in r.gallery_tasks]
    assert all((e.size, e.sha256) == (0, "") for e in entries)
    # The node holds it all the same, with its digest.
    [archive] = (data / "archives").iterdir()
    assert node_rows(data, "SELECT size, sha256 FROM archive") == [
        (archive.stat().st_size, sha256_of(archive))
    ]


@pytest_twisted.ensureDeferred
async def test_a_new_generation_replaces_the_held_archive(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data):
            site.download("op-1", GID, up.file_url(GID))
            await eventually(
                lambda: (
                    node_rows(data, "SELECT operation_id FROM archive") == [("op-1",)]
                    and not node_rows(data, "SELECT * FROM task")
                ),
                what="op-1 held and ACKed",
            )
            # The task row of op-1 is gone; its archive still makes op-2 a new
            # generation, whose start removes op-1's file.
            site.download("op-2", GID, up.file_url(GID))
            await eventually(
                lambda: node_rows(data, "SELECT operation_id FROM archive") == [("op-2",)],
                what="op-2 held",
            )
    [archive] = (data / "archives").iterdir()
    assert node_rows(data, "SELECT file, sha256 FROM archive") == [
        (archive.name, sha256_of(archive))
    ]


def test_the_same_source_and_time_give_the_same_digest(tmp_path: Path) -> None:
    source = tmp_path / "source.part"
    source.write_bytes(SOURCES["small"])
    built = [
        build_archive(
            source, tmp_path / f"{n}.tmp", tmp_path / f"{n}.zip", MEMBER, threading.Event(), 0.0
        )
        for n in ("a", "b")
    ]
    os.utime(source, (1_900_000_000, 1_900_000_000))  # the file's own time does not count
    built.append(
        build_archive(
            source, tmp_path / "c.tmp", tmp_path / "c.zip", MEMBER, threading.Event(), 0.0
        )
    )
    assert len({b.sha256 for b in built}) == 1
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        # Unix time 0 is before zip's epoch: the earliest date a zip can carry.
        assert zf.getinfo(MEMBER).date_time == (1980, 1, 1, 0, 0, 0)
