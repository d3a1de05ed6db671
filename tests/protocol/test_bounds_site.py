"""Out-of-bounds values against the real site: a real SQLite file, the real
node listener and report handler, a scripted node over loopback TCP.

The issue's cases: a ``revision`` of 2^63 passed the decoder, failed in
SQLite, was never ACKed and blocked the node's every later report; a 1 MiB
``reportId`` was stored.  Now each is ``Error{bad_message}`` and a close,
nothing is committed, and the node's next honest report applies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from tasknet.protocol.messages import HEADER, Error, StatusReport, TaskReportAck, decode
from tests.site_protocol.harness import TIMEOUT, ScriptedNode, Site, add_task, add_user, row


def send_raw(node: ScriptedNode, type_: int, obj: dict[str, Any]) -> None:
    payload = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    transport: Any = node.transport
    transport.write(HEADER.pack(type_, len(payload)) + payload)


def errors(node: ScriptedNode) -> list[Any]:
    return [decode(t, p) for t, p in node.frames if t == Error.TYPE]


def receipts(site: Site) -> int:
    with site.sql() as conn:
        return int(conn.execute("SELECT COUNT(*) FROM report_receipt").fetchone()[0])


def report(report_id: str, revision: int, gid: int = 1) -> dict[str, Any]:
    return {
        "reportId": report_id,
        "revision": revision,
        "galleryTasks": [{"gid": gid, "status": 4, "progress": 1.0}],
        "operationIds": {str(gid): f"op-{gid}"},
        "deleted": [],
    }


@pytest.mark.parametrize(
    "hostile",
    [
        report("r-far-future", 2**63),
        report("x" * 2**20, 1000),  # a 1 MiB reportId: over 64 KiB, fine after login
        report("r-big-gid", 1000, gid=2**31),
        {**report("r-long-op", 1000), "operationIds": {"1": "o" * 129}},
    ],
    ids=["revision-2^63", "reportId-1MiB", "gid-2^31", "operationId-129"],
)
@pytest_twisted.ensureDeferred
async def test_an_out_of_bounds_report_commits_nothing_and_does_not_block_the_node(
    site: Site, hostile: dict[str, Any]
) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    before = row(conn, 1)
    node = await site.connect("n1")
    send_raw(node, 12, hostile)
    await node.lost.addTimeout(TIMEOUT, reactor)
    assert [e.code for e in errors(node)] == ["bad_message"]
    assert node.pending(TaskReportAck) == []
    assert receipts(site) == 0
    assert row(conn, 1) == before

    # The node's next honest report (a new connection, as a real node would make) applies.
    again = await site.connect("n1")
    again.report("r-honest", 1000, [(1, 4, 1.0)], {1: "op-1"})
    assert await again.next(TaskReportAck) == TaskReportAck("r-honest", "APPLIED")
    assert row(conn, 1)["status"] == 4
    assert receipts(site) == 1
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_legacy_status_report_with_a_gid_out_of_bounds_commits_nothing(
    site: Site,
) -> None:
    conn = site.sql()
    uid, _ = add_user(conn, "alice")
    add_task(conn, 1, uid, node_id="n1")
    before = row(conn, 1)
    node = await site.connect("n1", v2=False)
    send_raw(node, StatusReport.TYPE, {"galleryTasks": [{"gid": 0, "status": 4, "progress": 1.0}]})
    await node.lost.addTimeout(TIMEOUT, reactor)
    assert [e.code for e in errors(node)] == ["bad_message"]
    assert row(conn, 1) == before
    conn.close()
