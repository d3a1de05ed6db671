"""What a node finishes at startup after a crash: interrupted deletes, leftovers."""

from __future__ import annotations

from pathlib import Path

import pytest_twisted
from twisted.internet import reactor

from tasknet.node.paths import DataDir
from tasknet.node.store import NodeStore
from tasknet.runtime import RealThreadPools
from tests.eventually import eventually
from tests.node.harness import logged_in_node, node_rows, running

GID = 2468


@pytest_twisted.ensureDeferred
async def test_an_interrupted_delete_finishes_before_any_work_resumes(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "node")
    async with running(tmp_path) as (site, up):
        # The state a crash leaves between "delete recorded" and "files removed".
        store = NodeStore(data, reactor=reactor, clock=reactor, threads=RealThreadPools())
        await store.create_schema()
        await store.accept_download(GID, "op-1", "n", up.file_url(GID), 2)
        await store.begin_delete(GID, "del-1", 2)
        store.close()
        data.part_path(GID, "op-1").write_bytes(b"partial")
        stray_tmp = data.archive_tmp_path(GID, "op-0")
        stray_tmp.write_bytes(b"half a zip")
        stray_part = data.partial / "99-000000000000.part"
        stray_part.write_bytes(b"orphan")
        async with logged_in_node(site, data.root):
            await eventually(
                lambda: any(e.operation_id == "del-1" for r in site.reports() for e in r.deleted),
                what="the delete result",
            )
        assert up.stats()["fileGets"] == {}  # the deleted task was never downloaded
    [entry] = [e for r in site.reports() for e in r.deleted]
    assert (entry.gid, entry.result) == (GID, "DELETED")
    assert data.files_of(GID) == [] and not stray_part.exists()
    assert node_rows(data.root, "SELECT * FROM task") == []
