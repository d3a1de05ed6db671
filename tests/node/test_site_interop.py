"""The real node against the real site's protocol side, over loopback TCP.

The node's reports carry, for a gid it holds only as a deletion, the delete
operation id in ``operationIds`` (as the golden vector TaskReport r-0002
does).  These tests check that the site reads that as PROTOCOL.md means it:
the ``deleted`` entry settles the delete; nothing takes it for a generation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_twisted

from tasknet.site.storage import delete
from tasknet.upstream import catalog
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.eventually import eventually
from tests.node.harness import node_rows, start_node
from tests.site_protocol.harness import Site, add_task, add_user, row, secret_of

GID = 6100
NODE = "node-t"  # the node id harness.start_node uses


@pytest_twisted.async_yield_fixture
async def site_and_upstream(db_target: str) -> AsyncIterator[tuple[Site, RunningUpstream]]:
    site = await Site(db_target).start()
    up = await start_upstream()
    try:
        yield site, up
    finally:
        await site.stop()
        await up.stop()


async def request_delete(site: Site, gid: int) -> str:
    # What the lifecycle does: the delete transaction, then hand it to dispatch.
    started = await site.db.write(delete.request_delete, gid, None)
    await site.side.dispatcher.task_changed(gid)
    return started.delete_operation_id


@pytest_twisted.ensureDeferred
async def test_the_nodes_delete_report_settles_the_delete_on_the_site(
    tmp_path: Path, site_and_upstream: tuple[Site, RunningUpstream]
) -> None:
    site, up = site_and_upstream
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        # Completed on the site and assigned to this node, whose data is fresh.
        add_task(conn, GID, uid, node_id=NODE, status=4, progress=1.0, url=up.file_url(GID))
        endpoint = f"tcp:127.0.0.1:{site.port.getHost().port}"
        node = await start_node(endpoint, tmp_path / "node", secret=secret_of(NODE))
        try:
            await eventually(lambda: NODE in site.factory.nodes, what="login")
            await site.side.dispatcher.idle()
            delete_id = await request_delete(site, GID)
            await eventually(lambda: row(conn, GID)["state"] == "DELETED", what="tombstone")
            # ACKed: the node forgot the deletion it reported.
            data = tmp_path / "node"
            await eventually(lambda: not node_rows(data, "SELECT * FROM deletion"), what="ACK")
            [(sent_delete_id,)] = node_rows(
                data, "SELECT operation_id FROM received_command WHERE action = 'DELETE'"
            )
        finally:
            await node.stopService()
        assert sent_delete_id == delete_id
        assert row(conn, GID)["delete_operation_id"] == delete_id
    finally:
        conn.close()


def gone(conn: object, gid: int) -> tuple[str | None, str | None]:
    found = conn.execute(  # type: ignore[attr-defined]
        "SELECT archive_gone_reason, archive_gone_node FROM gallery WHERE gid = ?", (gid,)
    ).fetchone()
    return (found[0], found[1]) if found else (None, None)


@pytest_twisted.ensureDeferred
async def test_an_archive_the_nodes_budget_removes_is_gone_on_the_site(
    tmp_path: Path, site_and_upstream: tuple[Site, RunningUpstream]
) -> None:
    site, up = site_and_upstream
    conn = site.sql()
    first, second = GID + 1, GID + 2
    data = tmp_path / "node"
    try:
        uid, _ = add_user(conn, "bob")
        endpoint = f"tcp:127.0.0.1:{site.port.getHost().port}"
        # Room for one archive of either: the second one's completion
        # pushes the first (served longest ago: never) out.
        budget = max(catalog.gallery(first).size, catalog.gallery(second).size) * 3 // 2
        node = await start_node(
            endpoint, data, secret=secret_of(NODE), disk_budget=budget, min_free=0
        )
        try:
            await eventually(lambda: NODE in site.factory.nodes, what="login")
            add_task(conn, first, uid, dispatched=0, url=up.file_url(first))
            await site.side.dispatcher.task_changed(first)
            await eventually(lambda: row(conn, first)["status"] == 4, what="the first complete")
            add_task(conn, second, uid, dispatched=0, url=up.file_url(second))
            await site.side.dispatcher.task_changed(second)
            await eventually(lambda: row(conn, second)["status"] == 4, what="the second complete")
            await eventually(lambda: gone(conn, first)[0] is not None, what="the first gone")
            await eventually(lambda: not node_rows(data, "SELECT * FROM released"), what="ACK")
        finally:
            await node.stopService()
        assert gone(conn, first) == ("DISK_BUDGET", NODE)
        assert gone(conn, second) == (None, None)
        assert node_rows(data, "SELECT gid FROM archive") == [(second,)]
    finally:
        conn.close()
