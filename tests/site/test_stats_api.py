"""``GET /api/stats`` over real loopback HTTP with a scripted node (issue
23): the 24 h window in quarter-hour buckets, the 1 h window in minutes,
``byNode`` of the top nodes plus ``other``, each user seeing only their
own throughput and an admin everyone's; the node's bytes stay after it
has gone."""

from __future__ import annotations

import pytest_twisted

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.site.storage import throughput
from tasknet.upstream import catalog
from tests.site.test_views_api import Fixture, with_fixture


def _total(stats: dict, field: str = "bytes") -> int:
    return sum(int(b[field]) for b in stats["buckets"])


def _adds_up(stats: dict) -> None:
    for bucket in stats["buckets"]:
        assert set(bucket) == {"start", "completed", "bytes", "byNode", "other"}
        assert list(bucket["byNode"]) == stats["nodes"]
        assert bucket["bytes"] == bucket["other"] + sum(bucket["byNode"].values())


@pytest_twisted.ensureDeferred
async def test_stats_windows_scopes_and_a_gone_node(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1")
        await f.create(301)
        await f.create(302, f.bob)
        ops = {}
        for _ in range(2):
            command = await node.next(TaskCommand)
            ops[command.gid] = command.operation_id
        alice_size, bob_size = catalog.gallery(301).size, catalog.gallery(302).size
        node.report("r1", 1, [(301, 1, 0.0), (302, 1, 0.0)], ops)
        await node.next(TaskReportAck)
        node.report("r2", 2, [(301, 1, 0.5), (302, 4, 1.0)], ops)
        await node.next(TaskReportAck)
        alice_bytes = round(0.5 * alice_size)

        for window, seconds, count in ((86400, 900, 96), (3600, 60, 60), (21600, 900, 24)):
            status, alice = await f.get(f"/api/stats?window={window}")
            assert status == 200
            assert alice["window"] == window and alice["bucketSeconds"] == seconds
            assert len(alice["buckets"]) == count
            assert alice["nodes"] == ["n1"] and alice["otherNodes"] == 0
            assert alice["nodeLimit"] == throughput.TOP_NODES
            assert _total(alice) == alice_bytes and _total(alice, "completed") == 0
            assert _total(alice, "other") == 0
            _adds_up(alice)
            assert len(alice["usage"]["weeks"]) == 8
            _, bob = await f.get(f"/api/stats?window={window}", f.bob)
            assert _total(bob) == bob_size and _total(bob, "completed") == 1
            _adds_up(bob)
            _, admin = await f.get(f"/api/stats?window={window}", f.admin)
            assert _total(admin) == alice_bytes + bob_size
            assert _total(admin, "completed") == 1 and admin["nodes"] == ["n1"]
            _adds_up(admin)

        # The node goes: its bytes stay in the window.
        await node.disconnect()
        f.nodes.remove(node)
        _, admin = await f.get("/api/stats?window=86400", f.admin)
        assert admin["nodes"] == ["n1"] and _total(admin) == alice_bytes + bob_size

    await with_fixture(db_target, test)
