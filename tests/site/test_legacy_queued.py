"""A legacy node's queue (issue 36, item 1), over the real node listener, a
real database (both backends) and a scripted legacy node on real TCP.

A legacy node cannot say "queued": every task it holds is reported at
status 1.  The site tells them apart as far as it can: an entry whose
progress never left 0 is QUEUED (the row, the QUEUED count, the panel's
queued), one that moved is downloading, and a queued one that starts to
move is downloading from that report on.
"""

from __future__ import annotations

import json

import pytest_twisted
from twisted.internet import reactor

from tasknet.protocol.messages import DownloadPost, StatusReport, TaskEntry
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.web import admin_nodes
from tests.eventually import eventually
from tests.site_protocol.harness import Site, add_task, add_user


def _keys(conn: dbmod.Connection) -> dict[int, tuple[str, int]]:
    return {
        int(r[0]): (r[1], int(r[2] or 0))
        for r in conn.execute("SELECT gid, status_key, queued FROM gallery ORDER BY gid")
    }


@pytest_twisted.ensureDeferred
async def test_a_legacy_nodes_unmoved_entries_are_queued_and_the_moved_downloading(
    db_target: str,
) -> None:
    site = await Site(db_target).start()
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        for gid in (1, 2, 3):
            add_task(conn, gid, uid, node_id="old", dispatched=1)
        old = await site.connect("old", v2=False)
        for _ in range(3):
            await old.next(DownloadPost)

        old.sendMessage(
            StatusReport((TaskEntry(1, 1, 0.25), TaskEntry(2, 1, 0.0), TaskEntry(3, 1, 0.0)))
        )
        await eventually(lambda: _keys(conn)[3][0] == "QUEUED")
        assert _keys(conn) == {1: ("DOWNLOADING", 0), 2: ("QUEUED", 1), 3: ("QUEUED", 1)}
        panel = json.loads(await admin_nodes.nodes_view(site.db, site.side.nodes, reactor))
        assert (panel[0]["runningTasks"], panel[0]["queuedTasks"]) == (1, 2)

        # Task 2 starts to move: downloading from this report on.
        old.sendMessage(StatusReport((TaskEntry(2, 1, 0.1), TaskEntry(3, 1, 0.0))))
        await eventually(lambda: _keys(conn)[2][0] == "DOWNLOADING")
        assert _keys(conn)[3] == ("QUEUED", 1)
        panel = json.loads(await admin_nodes.nodes_view(site.db, site.side.nodes, reactor))
        assert (panel[0]["runningTasks"], panel[0]["queuedTasks"]) == (2, 1)
    finally:
        conn.close()
        await site.stop()
