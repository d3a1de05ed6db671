"""The whole site (makeService, as twistd runs it) with a scripted node:
create → DOWNLOAD → progress → 下载完成 over HTTP and WebSocket → delete →
tombstone.  Prints the session log the issue asks for (``pytest -s``)."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.site import root
from tasknet.upstream.testing import running_upstream
from tests.eventually import eventually
from tests.site_protocol.harness import ScriptedNode, events_client, secret_of


def log(line: str) -> None:
    print(f"  | {line}")


async def _json(pool: HTTPConnectionPool, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    response = await treq.request(
        method, url, headers=Headers({"Authorization": ["Bearer demo"]}), pool=pool, **kw
    )
    return response.code, json.loads(await treq.content(response))


@pytest_twisted.ensureDeferred
async def test_session_through_the_whole_site(db_target: str) -> None:
    pool = HTTPConnectionPool(reactor, persistent=False)
    async with running_upstream() as upstream:
        options = root.Options()
        options.parseOptions(
            [
                "--db", db_target,
                "--http", "tcp:0:interface=127.0.0.1",
                "--nodes", "tcp:0:interface=127.0.0.1",
                "--upstream", upstream.base_url,
                "--node-key", f"n1:{secret_of('n1')}",
                "--demo",
            ]
        )  # fmt: skip
        site_service = root.makeService(options)
        site_service.startService()
        await site_service.ready
        http = f"http://127.0.0.1:{site_service.http_port.getHost().port}"
        node = ScriptedNode("n1")
        ws = None
        try:
            from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

            await connectProtocol(
                TCP4ClientEndpoint(reactor, "127.0.0.1", site_service.nodes_port.getHost().port),
                node,
            )
            assert await node.logged_in
            log("node n1 logged in (v2)")
            ws = await events_client(site_service.http_port.getHost().port, "demo")
            log("WebSocket client 'demo' connected to /api/events")

            code, body = await _json(
                pool, "POST", f"{http}/api/tasks", json={"gid": 4242, "token": "t"}
            )
            assert code == 201, body
            op = body["task"]["operationId"]
            log(f"POST /api/tasks gid=4242 -> {code} {body['task']['status']} op={op}")

            command = await node.next(TaskCommand)
            log(f"node got {command}")
            assert (command.action, command.gid, command.operation_id) == ("DOWNLOAD", 4242, op)

            for i, (status, progress) in enumerate([(1, 0.4), (3, 0.95), (4, 1.0)]):
                node.report(f"rep-{i}", 10_000 + i, [(4242, status, progress)], {4242: op})
                ack = await node.next(TaskReportAck)
                log(f"node reported status={status} progress={progress} -> {ack}")
            pushes: list[dict[str, Any]] = []
            while not pushes or pushes[-1]["task"]["status"] != "COMPLETED":
                pushes.append(await ws.next())
                t = pushes[-1]["task"]
                log(f"WebSocket push: {t['gid']} {t['status']} {t['statusText']} {t['progress']}")
            assert pushes[-1]["task"]["statusText"] == "下载完成"

            code, body = await _json(pool, "GET", f"{http}/api/tasks/4242")
            task = body["task"]
            log(f"GET /api/tasks/4242 -> {code} {task['status']} {task['statusText']}")
            assert (code, body["task"]["statusText"]) == (200, "下载完成")

            code, body = await _json(pool, "GET", f"{http}/api/admin/nodes")
            log(f"GET /api/admin/nodes -> {code} {body}")
            assert code == 200
            [entry] = body["nodes"]
            assert entry["id"] == "n1" and entry["protocol"] == 2
            assert entry["features"] == ["reliable-task-v2"]
            assert entry["lastRevision"] == 10_002 and entry["assigned"] == 1
            assert entry["connectedAt"].endswith("Z")

            code, body = await _json(pool, "DELETE", f"{http}/api/tasks/4242")
            assert code == 202, body
            delete_id = body["task"]["deleteOperationId"]
            log(f"DELETE /api/tasks/4242 -> {code} {body['task']['status']} delete={delete_id}")
            command = await node.next(TaskCommand)
            log(f"node got {command}")
            assert (command.action, command.operation_id) == ("DELETE", delete_id)
            node.report("rep-del", 10_010, [], deleted=[(4242, delete_id, "DELETED", "")])
            log(f"node confirmed the delete -> {await node.next(TaskReportAck)}")
            await eventually(
                lambda: bool(ws.received) and ws.received[-1]["task"]["state"] == "DELETED"
            )
            log(f"WebSocket push: {ws.received[-1]['task']['state']}")
            code, body = await _json(pool, "GET", f"{http}/api/tasks/4242")
            log(f"GET /api/tasks/4242 -> {code}")
            assert code == 404
        finally:
            if ws is not None:
                await ws.shut()
            await node.disconnect()
            await site_service.stopService()
            await pool.closeCachedConnections()
