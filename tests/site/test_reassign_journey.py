"""A node that is gone, end to end (DELIVERY.md "A node that is gone"):
the real site built by its composition root, the real mock upstream, the
admin HTTP endpoints and scripted v2 nodes over real TCP, on both backends.

A task created through the API is downloading on n1 when n1 goes; the
operator's reassign moves it to n2 with the same operationId (the
upstream's journal shows one POST of that gid, ever), n1 is sent CANCEL
when it returns and its late completion is ``not_owner``; n2 completes it.
Retiring n2 then marks the task ``ARCHIVE_GONE`` (``NODE_RETIRED``), closes
n2's connection and its key no longer logs in.  Every bad request changes
nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import closing
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.site.storage import reassign, users
from tasknet.site.storage.engine import database as db
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.site.helpers import RunningSite, add_user, assert_error, running_site, site_options
from tests.site_protocol.harness import TIMEOUT, ScriptedNode, dropped_entries, secret_of

GID = 4242


@pytest_twisted.async_yield_fixture
async def upstream() -> AsyncIterator[RunningUpstream]:
    running = await start_upstream()
    try:
        yield running
    finally:
        await running.stop()


async def _connect(site: RunningSite, node_id: str) -> tuple[ScriptedNode, bool]:
    node = ScriptedNode(node_id)
    port = site.service.nodes_port.getHost().port
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), node)
    accepted = await node.logged_in.addTimeout(TIMEOUT, reactor)
    return node, accepted


async def _task(site: RunningSite, token: str) -> dict[str, Any]:
    status, body = await site.request("GET", f"/api/tasks/{GID}", token=token)
    assert status == 200, body
    return body["task"]  # type: ignore[no-any-return]


def _custody_rows(target: str) -> tuple[int, int, list[tuple[str, int, int]]]:
    with closing(db.connect(target)) as conn:
        cancels = conn.execute("SELECT COUNT(*) FROM node_cancel").fetchone()[0]
        audit = conn.execute(
            "SELECT action, tasks, archives FROM node_custody_audit ORDER BY id"
        ).fetchall()
        dropped = dropped_entries(conn.cursor()).get("n1", {}).get("not_owner", 0)
    return cancels, dropped, [tuple(r) for r in audit]


@pytest_twisted.ensureDeferred
async def test_a_task_moves_off_a_gone_node_without_a_second_post(
    db_target: str, upstream: RunningUpstream
) -> None:
    prepare_database(db_target)
    _, admin = add_user(db_target, "root", admin=True)
    _, alice = add_user(db_target, "alice")
    with closing(db.connect(db_target)) as conn:
        for node_id in ("n1", "n2"):
            db.run_write(conn, lambda c, n=node_id: users.add_node_key(c, n, secret_of(n)))
    options = site_options(db_target, upstream.base_url)
    async with running_site(options) as site:
        status, created = await site.request(
            "POST", "/api/tasks", token=alice, body={"gid": GID, "token": "tok"}
        )
        assert status == 201, created
        n1, accepted = await _connect(site, "n1")
        assert accepted
        download = await n1.next(TaskCommand)
        operation_id = download.operation_id
        assert (download.action, download.gid) == ("DOWNLOAD", GID)
        n1.report("n1-a", 10, [(GID, 1, 0.3)], {GID: operation_id})
        assert await n1.next(TaskReportAck) == TaskReportAck("n1-a", "APPLIED")
        assert (await _task(site, alice))["node"] == "n1"
        await n1.disconnect()
        n2, _ = await _connect(site, "n2")

        # Bad requests first: each changes nothing.
        before = _custody_rows(db_target)
        for path, token, body, status_code, code in (
            ("/api/admin/nodes/ghost/reassign", admin, {}, 404, "not_found"),
            ("/api/admin/nodes/ghost/retire", admin, {}, 404, "not_found"),
            ("/api/admin/nodes/bad%20id/retire", admin, {}, 404, "not_found"),
            ("/api/admin/nodes/n1/reassign", alice, {}, 403, "forbidden"),
            ("/api/admin/nodes/n1/retire", None, {}, 401, "unauthorized"),
            ("/api/admin/nodes/n1/reassign", admin, {"note": 5}, 400, "invalid_request"),
            ("/api/admin/nodes/n1/retire", admin, [], 400, "invalid_request"),
        ):
            assert_error(
                await site.request("POST", path, token=token, body=body), status_code, code
            )
        status, answer = await site.request("GET", "/api/admin/nodes/n1/reassign", token=admin)
        assert status == 405, answer
        assert _custody_rows(db_target) == before
        assert (await _task(site, alice))["node"] == "n1"

        # The operator moves it now: same operationId, to the connected n2.
        status, moved = await site.request(
            "POST", "/api/admin/nodes/n1/reassign", token=admin, body={"note": "n1 is dead"}
        )
        assert status == 200, moved
        assert moved == {"node": "n1", "tasks": 1, "sent": 1, "waiting": 0, "cancels": 1}
        again = await n2.next(TaskCommand)
        assert (again.action, again.gid, again.operation_id) == ("DOWNLOAD", GID, operation_id)
        task = await _task(site, alice)
        assert (task["node"], task["operationId"], task["progress"]) == ("n2", operation_id, 0)
        assert upstream.app.journal.posts[GID] == 1  # one POST of the gid, ever

        # n1 comes back: CANCEL first; its late completion is not_owner.
        n1, accepted = await _connect(site, "n1")
        assert accepted
        cancel = await n1.next(TaskCommand)
        assert (cancel.action, cancel.gid, cancel.operation_id) == ("CANCEL", GID, operation_id)
        n1.report("n1-late", 20, [(GID, 4, 1.0)], {GID: operation_id})
        assert await n1.next(TaskReportAck) == TaskReportAck("n1-late", "APPLIED")
        assert (await _task(site, alice))["status"] != "COMPLETED"
        assert _custody_rows(db_target)[1] == 1  # n1's entry dropped not_owner

        # n2 completes it.
        n2.report("n2-done", 1, [(GID, 4, 1.0)], {GID: operation_id})
        assert await n2.next(TaskReportAck) == TaskReportAck("n2-done", "APPLIED")
        assert (await _task(site, alice))["status"] == "COMPLETED"
        assert upstream.app.journal.posts[GID] == 1

        # Retire n2: the archive it held is gone, its session closed, its key refused.
        status, retired = await site.request(
            "POST", "/api/admin/nodes/n2/retire", token=admin, body={"note": "sold"}
        )
        assert status == 200, retired
        assert retired == {
            "node": "n2",
            "tasks": 0,
            "sent": 0,
            "waiting": 0,
            "archives": 1,
            "keyRemoved": True,
        }
        await n2.lost.addTimeout(TIMEOUT, reactor)
        task = await _task(site, alice)
        assert task["status"] == "ARCHIVE_GONE", task
        _, accepted = await _connect(site, "n2")
        assert not accepted
        cancels, _, audit = _custody_rows(db_target)
        assert audit == [("REASSIGN", 1, 0), ("RETIRE", 0, 1)]
        with closing(db.connect(db_target)) as conn:
            entries = db.run_read(conn, reassign.custody_audit, "n1")
        assert [(e.actor, e.note) for e in entries] == [("root", "n1 is dead")]
        await n1.disconnect()
