"""Issue 38, Build 3: a bulk action acts on each gid once, on both backends.

Before: ``POST /api/tasks/bulk {"action": "delete", "gids": [1001] × 500}``
handled every repeat as a delete of its own (278 ``DELETE`` commands reached
the node) and answered 500 results.  Now a repeated gid is acted on once,
where it first appears, and ``duplicates`` says how many repeats were
dropped.  Over real HTTP, with a scripted node over real TCP counting the
``DELETE`` commands it is sent."""

from __future__ import annotations

import pytest_twisted

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.site.web.api import MAX_BULK
from tests.site.test_views_api import Fixture, with_fixture


@pytest_twisted.ensureDeferred
async def test_a_bulk_delete_of_one_gid_repeated_sends_one_command(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1")
        ops = {}
        for gid in (1001, 1002):
            await f.create(gid)
            command = await node.next(TaskCommand)
            ops[command.gid] = command.operation_id
        node.report("r1", 1, [(1001, 4, 1.0), (1002, 4, 1.0)], ops)
        await node.next(TaskReportAck)

        status, answer = await f.site.request(
            "POST",
            "/api/tasks/bulk",
            token=f.alice,
            body={"action": "delete", "gids": [1001] * MAX_BULK},
        )
        assert status == 200, answer
        assert answer["duplicates"] == MAX_BULK - 1
        assert [(r["gid"], r["status"]) for r in answer["results"]] == [(1001, 202)]
        # A report's ack comes after every command the site sent before it.
        node.report("r2", 2, [(1001, 4, 1.0), (1002, 4, 1.0)], ops)
        await node.next(TaskReportAck)
        sent = node.pending(TaskCommand)
        assert [(c.action, c.gid) for c in sent] == [("DELETE", 1001)]

        status, answer = await f.site.request(
            "POST",
            "/api/tasks/bulk",
            token=f.alice,
            body={"action": "retry", "gids": [1002, 1001, 1002, 1002]},
        )
        assert status == 200, answer
        assert answer["duplicates"] == 2
        assert [(r["gid"], r["status"]) for r in answer["results"]] == [(1002, 409), (1001, 409)]

        status, answer = await f.site.request(
            "POST", "/api/tasks/bulk", token=f.alice, body={"action": "delete", "gids": []}
        )
        assert (status, answer) == (200, {"results": [], "duplicates": 0})

    await with_fixture(db_target, test)
