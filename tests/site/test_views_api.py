"""The views for people with many tasks, over real loopback HTTP: the task
object's new fields, filter/search/order with stable cursors, counts,
``/api/stats`` and the richer ``/api/admin/nodes``, with the real mock
upstream and a scripted node over real TCP reporting progress."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import deferLater

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.status import TaskStatus
from tasknet.upstream import catalog
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import (
    SiteWithUsers,
    assert_error,
    one,
    running_site,
    site_options,
)
from tests.site_protocol.harness import TIMEOUT, ScriptedNode, secret_of


class Fixture(SiteWithUsers):
    """A :class:`SiteWithUsers` that also connects scripted nodes."""

    def __init__(self, site: Any, path: str, upstream: Any) -> None:
        super().__init__(site, path, upstream)
        self.nodes: list[ScriptedNode] = []

    async def get(self, path: str, token: str | None = None) -> tuple[int, Any]:
        return await self.site.request("GET", path, token=token or self.alice)

    async def create(self, gid: int, token: str | None = None, name: str = "") -> dict:
        body: dict[str, Any] = {"gid": gid, "token": "t"}
        if name:
            body["name"] = name
        status, answer = await self.site.request(
            "POST", "/api/tasks", token=token or self.alice, body=body
        )
        assert status == 201, answer
        return answer["task"]

    async def connect(self, node_id: str) -> ScriptedNode:
        node = ScriptedNode(node_id)
        port = self.site.service.nodes_port.getHost().port
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), node)
        assert await node.logged_in.addTimeout(TIMEOUT, reactor)
        self.nodes.append(node)
        return node


async def with_fixture(target: str, test: Any, *extra: str) -> None:
    """``test(fixture)`` against a site on ``target`` (``extra``: more site options)."""
    upstream = await start_upstream()
    path = target
    keys = [f"--node-key=n{i}:{secret_of(f'n{i}')}" for i in (1, 2)]
    try:
        options = site_options(path, upstream.base_url, "--demo", *keys, *extra)
        async with running_site(options) as site:
            fixture = Fixture(site, path, upstream)
            try:
                await test(fixture)
            finally:
                for node in fixture.nodes:
                    await node.disconnect()
    finally:
        await upstream.stop()


def _gids(page: dict) -> list[int]:
    return [t["gid"] for t in page["tasks"]]


async def _all_pages(f: Fixture, query: str, limit: int = 2) -> list[int]:
    gids: list[int] = []
    after = None
    while True:
        cursor = f"&after={quote(str(after))}" if after is not None else ""
        status, page = await f.get(f"/api/tasks?limit={limit}{query}{cursor}")
        assert status == 200, page
        gids += _gids(page)
        after = page["next"]
        if after is None:
            return gids


@pytest_twisted.ensureDeferred
async def test_task_object_has_owner_size_and_progress_fields(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        task = await f.create(101)
        assert task["owner"] == "alice"
        assert task["size"] == catalog.gallery(101).size
        assert task["bytesDone"] == 0
        assert task["speed"] is None and task["eta"] is None and task["completedAt"] is None
        status, body = await f.get("/api/tasks/101", f.admin)
        assert status == 200 and body["task"]["owner"] == "alice"

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_newest_first_and_cursor_stable_while_tasks_are_added(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        for gid in (30, 10, 50, 20, 40):
            await f.create(gid)
        status, first = await f.get("/api/tasks?limit=2")
        assert status == 200 and _gids(first) == [40, 20]
        assert isinstance(first["next"], str)
        # Tasks created while paging show on a fresh page 1, never shift later pages.
        await f.create(5)
        await f.create(60)
        rest = []
        after = first["next"]
        while after is not None:
            status, page = await f.get(f"/api/tasks?limit=2&after={quote(after)}")
            assert status == 200, page
            rest += _gids(page)
            after = page["next"]
        assert rest == [50, 10, 30]
        assert await _all_pages(f, "") == [60, 5, 40, 20, 50, 10, 30]
        assert await _all_pages(f, "&order=oldest") == [30, 10, 50, 20, 40, 5, 60]
        assert await _all_pages(f, "&order=gid", limit=3) == [5, 10, 20, 30, 40, 50, 60]
        # The admin pages everyone's; bob has none.
        _, bob = await f.get("/api/tasks", f.bob)
        assert bob == {"tasks": [], "next": None, "total": 0}
        await f.create(70, f.bob)
        assert _gids((await f.get("/api/tasks?limit=3", f.admin))[1]) == [70, 60, 5]

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_status_filter_search_and_counts(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1")
        await f.create(201, name="Holiday pictures")
        await f.create(202, name="holiday 50% off")
        await f.create(2030, name="Work")
        ops = {}
        for _ in range(3):
            command = await node.next(TaskCommand)
            ops[command.gid] = command.operation_id
        node.report("r1", 1, [(201, 1, 0.5), (202, 4, 1.0)], ops)
        await node.next(TaskReportAck)

        status, page = await f.get("/api/tasks?status=DOWNLOADING")
        assert status == 200 and _gids(page) == [201]
        _, page = await f.get("/api/tasks?status=COMPLETED,DOWNLOADING&order=gid")
        assert _gids(page) == [201, 202]
        _, page = await f.get("/api/tasks?status=SUBMITTED")
        assert _gids(page) == [2030]
        # q: the name, case-insensitively, or the start of the gid.
        _, page = await f.get("/api/tasks?q=HOLIDAY&order=gid")
        assert _gids(page) == [201, 202]
        _, page = await f.get("/api/tasks?q=20&order=gid")
        assert _gids(page) == [201, 202, 2030]
        _, page = await f.get("/api/tasks?q=203")
        assert _gids(page) == [2030]
        _, page = await f.get(f"/api/tasks?q={quote('50%')}")  # % is a character, not a wildcard
        assert _gids(page) == [202]
        _, page = await f.get(f"/api/tasks?q={quote('o%f')}")
        assert _gids(page) == []
        _, page = await f.get("/api/tasks?q=work&status=COMPLETED")
        assert _gids(page) == []

        status, body = await f.get("/api/tasks/counts")
        assert status == 200
        assert set(body["counts"]) == {s.value for s in TaskStatus} | {"QUEUED"}
        assert body["counts"]["QUEUED"] == 0
        assert body["counts"]["DOWNLOADING"] == 1 and body["counts"]["COMPLETED"] == 1
        assert body["counts"]["SUBMITTED"] == 1 and body["counts"]["DELETE_FAILED"] == 0
        assert body["total"] == 3
        _, body = await f.get("/api/tasks/counts?q=holiday")
        assert body["total"] == 2 and body["counts"]["SUBMITTED"] == 0
        _, body = await f.get("/api/tasks/counts", f.bob)
        assert body["total"] == 0 and all(n == 0 for n in body["counts"].values())

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_bad_view_parameters_answer_400(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        await f.create(7)
        for query in (
            "status=BOGUS",
            "status=DOWNLOADING,",
            "status=downloading",
            "order=random",
            "order=",
            "after=5",  # a gid is not a cursor of order=newest
            "after=2026-12-01T08:12:50.123Z",
            "order=gid&after=2026-12-01T08:12:50.123Z~5",
            "order=gid&after=-1",
            "limit=0",
            "limit=501",
            f"q={'x' * 257}",
            "q=%01",
            "q=%ff",
        ):
            assert_error(await f.get(f"/api/tasks?{query}"), 400, "invalid_request")
        assert_error(await f.get(f"/api/tasks/counts?q={'x' * 257}"), 400, "invalid_request")
        for window in ("59", "86401", "x", "-60", "3600.5"):
            assert_error(await f.get(f"/api/stats?window={window}"), 400, "invalid_request")
        assert_error(await f.get("/api/tasks/counts", "nobody"), 401, "unauthorized")
        assert_error(await f.get("/api/stats", "nobody"), 401, "unauthorized")
        assert_error(await f.get("/api/admin/nodes"), 403, "forbidden")

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_progress_gives_speed_eta_stats_and_node_activity(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1")
        await f.create(301)
        await f.create(302, f.bob)
        ops = {}
        for _ in range(2):
            command = await node.next(TaskCommand)
            ops[command.gid] = command.operation_id
        size = catalog.gallery(301).size
        for revision, progress in enumerate((0.1, 0.3, 0.6), 1):
            node.report(f"r{revision}", revision, [(301, 1, progress), (302, 1, 0.0)], ops)
            await node.next(TaskReportAck)
        # An entry of an older generation is dropped, and counted for the node.
        node.report("r9", 9, [(302, 1, 0.5)], {302: "op-of-another-generation"})
        await node.next(TaskReportAck)

        _, body = await f.get("/api/tasks/301")
        task = body["task"]
        assert task["status"] == "DOWNLOADING"
        assert task["bytesDone"] == round(0.6 * size)
        assert task["speed"] is not None and task["speed"] > 0
        assert task["eta"] is not None and task["eta"] >= 0

        status, stats = await f.get("/api/stats?window=120")
        assert status == 200 and len(stats["buckets"]) == 2
        assert sum(b["bytes"] for b in stats["buckets"]) == round(0.6 * size)
        assert stats["nodes"] == ["n1"]
        assert stats["usage"]["quota"] == 5000 and len(stats["usage"]["weeks"]) == 8
        assert stats["usage"]["weeks"][-1]["used"] == catalog.gallery(301).cost
        _, bob_stats = await f.get("/api/stats", f.bob)
        assert (
            len(bob_stats["buckets"]) == 60 and sum(b["bytes"] for b in bob_stats["buckets"]) == 0
        )

        node.report("r10", 10, [(301, 4, 1.0), (302, 1, 0.0)], ops)
        await node.next(TaskReportAck)
        _, body = await f.get("/api/tasks/301")
        assert body["task"]["completedAt"] is not None and body["task"]["speed"] is None
        _, stats = await f.get("/api/stats?window=60", f.admin)
        assert sum(b["bytes"] for b in stats["buckets"]) == size
        assert sum(b["completed"] for b in stats["buckets"]) == 1

        # The site's metrics count the same bytes, and split display statuses.
        status, page = await f.site.request("GET", "/metrics")
        families = {m.name: m for m in text_string_to_metric_families(page.decode())}
        samples = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for family in families.values()
            for x in family.samples
        }
        assert samples[("tasknet_bytes_downloaded_total", ())] == size
        assert samples[("tasknet_node_bytes_downloaded_total", (("node", "n1"),))] == size
        assert samples[("tasknet_tasks_by_status", (("status", "COMPLETED"),))] == 1
        assert samples[("tasknet_tasks_by_status", (("status", "DOWNLOADING"),))] == 1
        assert samples[("tasknet_tasks_by_status", (("status", "DELETE_FAILED"),))] == 0
        assert samples[("tasknet_tasks", (("state", "SUBMITTED"),))] == 2
        assert samples[("tasknet_tasks", (("state", "UNKNOWN"),))] == 0

        status, body = await f.get("/api/admin/nodes", f.admin)
        assert status == 200
        [entry] = body["nodes"]
        assert entry["id"] == "n1" and entry["connected"] is True
        assert entry["assigned"] == 2 and entry["activeTasks"] == 1  # 301 is completed
        assert entry["lastReportAt"].endswith("Z") and entry["lastSeenAt"].endswith("Z")
        assert entry["connectedAt"].endswith("Z")
        # The bytes of the last full minute's bucket of /api/stats, per second.
        _, recent = await f.get("/api/stats?window=120", f.admin)
        last_full = recent["buckets"][-2]["byNode"].get("n1", 0)
        assert entry["bytesPerSecond"] == round(last_full / 60, 1)
        assert entry["runningTasks"] == 1 and entry["queuedTasks"] == 0
        assert entry["droppedEntries"] == {"old_generation": 1}

        # Disconnected, the node stays listed, greyed by "connected": false.
        await node.disconnect()
        f.nodes.remove(node)

        # The disconnect is recorded after the socket closes: poll for it.
        for _ in range(500):
            _, body = await f.get("/api/admin/nodes", f.admin)
            if body["nodes"] and body["nodes"][0]["connected"] is False:
                break
            await deferLater(reactor, 0.01, lambda: None)
        [entry] = body["nodes"]
        assert entry["connectedAt"] is None and entry["lastRevision"] is None
        assert entry["protocol"] == 2 and entry["lastSeenAt"].endswith("Z")
        assert entry["activeTasks"] == 1
        assert one(f.path, "SELECT COUNT(*) FROM node_seen")[0] == 1

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_list_filters_total_bulk_and_site_name(db_target: str) -> None:
    """Issue 21 (API): favourite/node filters, gid substring, ``total``,
    ``POST /api/tasks/bulk`` as the single routes answer, ``/api/me``'s site."""

    async def test(f: Fixture) -> None:
        await f.create(101777)
        await f.create(5)
        await f.create(6, f.bob)
        _, page = await f.get("/api/tasks?q=1777&limit=1")
        assert _gids(page) == [101777] and page["total"] == 1
        _, page = await f.get("/api/tasks?limit=1")
        assert page["total"] == 2 and len(page["tasks"]) == 1
        status, _ = await f.site.request("PUT", "/api/favorites/5", token=f.alice)
        assert status == 200
        _, page = await f.get("/api/tasks?favorite=1")
        assert _gids(page) == [5] and page["total"] == 1
        _, page = await f.get("/api/tasks?favorite=1", f.admin)  # the admin's own: none
        assert page["total"] == 0
        _, page = await f.get("/api/tasks?node=nobody")
        assert page["total"] == 0
        for order in ("size", "progress", "status"):
            assert sorted(await _all_pages(f, f"&order={order}", limit=1)) == [5, 101777]
        for query in ("favorite=yes", "node=", "order=size&after=2026-01-01Z~5", "status=queued"):
            assert_error(await f.get(f"/api/tasks?{query}"), 400, "invalid_request")
        _, counts = await f.get("/api/tasks/counts")
        assert counts["counts"]["QUEUED"] == 0 and counts["total"] == 2

        async def bulk(body: Any, token: str | None = None) -> tuple[int, Any]:
            return await f.site.request(
                "POST", "/api/tasks/bulk", token=token or f.alice, body=body
            )

        for body in (
            {"action": "purge", "gids": [5]},
            {"action": "delete"},
            {"action": "delete", "gids": "5"},
            {"action": "delete", "gids": ["5"]},
            {"action": "delete", "gids": [0]},
            {"action": "delete", "gids": list(range(1, 502))},
            [5],
        ):
            assert_error(await bulk(body), 400, "invalid_request")
        status, answer = await bulk({"action": "retry", "gids": [5, 6, 999]})
        assert status == 200
        assert [(r["gid"], r["status"]) for r in answer["results"]] == [
            (5, 409),  # not DELETE_FAILED
            (6, 404),  # bob's, as GET /api/tasks/6 answers alice
            (999, 404),
        ]
        assert answer["results"][0]["error"]["code"] == "conflict"
        status, answer = await bulk({"action": "delete", "gids": [5, 6]})
        assert status == 200
        first, second = answer["results"]
        # No node holds 5: deleted at once, as DELETE /api/tasks/5 answers 200.
        assert first["gid"] == 5 and first["status"] in (200, 202)
        assert second == {
            "gid": 6,
            "status": 404,
            "error": {"code": "not_found", "message": second["error"]["message"]},
        }
        status, answer = await bulk({"action": "delete", "gids": [6]}, f.admin)
        assert answer["results"][0]["status"] in (200, 202)  # an admin: any task

        status, me = await f.get("/api/me")
        assert status == 200 and me["user"]["name"] == "alice" and isinstance(me["site"], str)
        assert me["site"]

    await with_fixture(db_target, test)
