"""The site HTTP API over real loopback HTTP, with the real mock upstream:
every error code, ownership, and the lifecycle seen through the API."""

from __future__ import annotations

import socket

import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList

from tasknet.upstream import catalog
from tasknet.upstream.testing import start_upstream
from tests.backends import add_failing_trigger, backend_of, replication_of
from tests.site.helpers import (
    SiteWithUsers,
    add_user,
    assert_error,
    fault,
    one,
    raw,
    running_site,
    site_options,
)


async def _site(target, upstream, *extra):
    path = target
    return path, running_site(site_options(path, upstream.base_url, *extra))


async def with_fixture(target, test, *extra):
    upstream = await start_upstream()
    path = target
    try:
        async with running_site(site_options(path, upstream.base_url, "--demo", *extra)) as site:
            await test(SiteWithUsers(site, path, upstream))
    finally:
        await upstream.stop()


@pytest_twisted.ensureDeferred
async def test_create_get_list_and_paginate(db_target):
    async def test(f):
        for gid in (5, 3, 9):
            status, body = await f.site.request(
                "POST", "/api/tasks", token=f.alice, body={"gid": gid, "token": "t", "x": 1}
            )
            assert status == 201, body
            assert body["task"]["state"] == "SUBMITTED" and body["task"]["statusText"] == "已提交"
            assert body["task"]["name"] == catalog.gallery(gid).title
        status, body = await f.site.request("GET", "/api/tasks/3", token=f.alice)
        assert status == 200 and body["task"]["gid"] == 3
        assert body["task"]["cost"] == catalog.gallery(3).cost
        status, page = await f.site.request("GET", "/api/tasks?order=gid&limit=2", token=f.alice)
        assert [t["gid"] for t in page["tasks"]] == [3, 5] and page["next"] == 5
        path = "/api/tasks?order=gid&limit=2&after=5"
        status, page = await f.site.request("GET", path, token=f.alice)
        assert [t["gid"] for t in page["tasks"]] == [9] and page["next"] is None
        # The default order is newest first (tests/site/test_views_api.py pages it).
        status, page = await f.site.request("GET", "/api/tasks", token=f.alice)
        assert [t["gid"] for t in page["tasks"]] == [9, 3, 5]
        # Bob sees none of them; the admin sees all.
        assert (await f.site.request("GET", "/api/tasks", token=f.bob))[1]["tasks"] == []
        admin = await f.site.request("GET", "/api/tasks", token=f.admin)
        assert sorted(t["gid"] for t in admin[1]["tasks"]) == [3, 5, 9]
        usage = (await f.site.request("GET", "/api/usage", token=f.alice))[1]
        expected = sum(catalog.gallery(g).cost for g in (3, 5, 9))
        assert usage["used"] == expected and usage["quota"] == 5000
        assert usage["week"].count("-W") == 1

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_invalid_requests_answer_400_and_change_nothing(db_target):
    async def test(f):
        bad_bodies = [
            b"not json",
            b"[1, 2]",
            b'{"gid": NaN, "token": "t"}',
            b'{"gid": true, "token": "t"}',
            b'{"gid": "12", "token": "t"}',
            b'{"gid": 1.5, "token": "t"}',
            b'{"gid": 0, "token": "t"}',
            b'{"gid": -3, "token": "t"}',
            b'{"gid": 2147483649, "token": "t"}',
            b'{"token": "t"}',
            b'{"gid": 12}',
            b'{"gid": 12, "token": ""}',
            b'{"gid": 12, "token": 5}',
            b'{"gid": 12, "token": "t", "name": ["x"]}',
            b"\xff\xfe",
        ]
        for data in bad_bodies:
            answer = await f.site.request("POST", "/api/tasks", token=f.alice, data=data)
            assert_error(answer, 400, "invalid_request")
        for path in ("/api/tasks/abc", "/api/tasks/0", "/api/tasks/99999999999"):
            assert_error(await f.site.request("GET", path, token=f.alice), 400, "invalid_request")
        for query in ("limit=0", "limit=501", "limit=x", "after=-1"):
            answer = await f.site.request("GET", f"/api/tasks?{query}", token=f.alice)
            assert_error(answer, 400, "invalid_request")
        answer = await f.site.request(
            "POST", "/api/admin/tasks/5/resolve", token=f.admin, body={"verdict": "maybe"}
        )
        assert_error(answer, 400, "invalid_request")
        assert one(f.path, "SELECT COUNT(*) FROM gallery")[0] == 0
        assert one(f.path, "SELECT COUNT(*) FROM task_operation")[0] == 0
        assert f.upstream.stats()["requests"] == 0

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_auth_errors_401_and_403(db_target):
    async def test(f):
        assert_error(await f.site.request("GET", "/api/tasks"), 401, "unauthorized")
        assert_error(await f.site.request("GET", "/api/tasks", token="wrong"), 401, "unauthorized")
        answer = await f.site.request(
            "GET", "/api/tasks", headers={"Authorization": ["Basic YTpi"]}
        )
        assert_error(answer, 401, "unauthorized")
        answer = await f.site.request("POST", "/api/tasks", body={"gid": 1, "token": "t"})
        assert_error(answer, 401, "unauthorized")
        assert_error(
            await f.site.request("GET", "/api/admin/unknown", token=f.alice), 403, "forbidden"
        )
        answer = await f.site.request(
            "POST", "/api/admin/tasks/1/resolve", token=f.alice, body={"verdict": "submitted"}
        )
        assert_error(answer, 403, "forbidden")
        assert_error(
            await f.site.request("GET", "/api/admin/nodes", token=f.alice), 403, "forbidden"
        )
        assert f.upstream.stats()["requests"] == 0

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_user_cannot_read_delete_or_favorite_another_users_task(db_target):
    async def test(f):
        assert (
            await f.site.request(
                "POST", "/api/tasks", token=f.alice, body={"gid": 11, "token": "t"}
            )
        )[0] == 201
        for method, path in (
            ("GET", "/api/tasks/11"),
            ("DELETE", "/api/tasks/11"),
            ("PUT", "/api/favorites/11"),
            ("DELETE", "/api/favorites/11"),
        ):
            answer = await f.site.request(method, path, token=f.bob)
            assert_error(answer, 404, "not_found")
            # Exactly what a gid nobody has looks like: existence is not leaked.
            missing = await f.site.request(method, path.replace("11", "12"), token=f.bob)
            assert missing[1]["error"]["code"] == answer[1]["error"]["code"]
        assert one(f.path, "SELECT COUNT(*) FROM favorite")[0] == 0
        assert one(f.path, "SELECT state FROM task_operation WHERE gid = 11")[0] == "SUBMITTED"
        # Alice may; a favorite lists and unlists.
        assert (await f.site.request("PUT", "/api/favorites/11", token=f.alice))[1] == {
            "gid": 11,
            "favorite": True,
        }
        listed = (await f.site.request("GET", "/api/favorites", token=f.alice))[1]
        assert [t["gid"] for t in listed["tasks"]] == [11]
        assert (await f.site.request("DELETE", "/api/favorites/11", token=f.alice))[0] == 200
        assert (await f.site.request("GET", "/api/favorites", token=f.alice))[1]["tasks"] == []

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_conflict_409_quota_429_rejected_422_unavailable_502_missing_404(db_target):
    async def test(f):
        create = {"gid": 21, "token": "t"}
        assert (await f.site.request("POST", "/api/tasks", token=f.alice, body=create))[0] == 201
        answer = await f.site.request("POST", "/api/tasks", token=f.bob, body=create)
        assert_error(answer, 409, "conflict")

        _, poor = add_user(f.path, "poor", quota=0)
        answer = await f.site.request(
            "POST", "/api/tasks", token=poor, body={"gid": 22, "token": "t"}
        )
        assert_error(answer, 429, "quota_exceeded")

        f.upstream.set_faults([fault("reject", status=403)])
        answer = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 23, "token": "t"}
        )
        assert_error(answer, 422, "upstream_rejected")

        f.upstream.set_faults([fault("timeout", "GET", "/api/galleries/24")])
        answer = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 24, "token": "t"}
        )
        assert_error(answer, 502, "upstream_unavailable")

        f.upstream.set_faults([fault("missing", "GET", "/api/galleries/25")])
        answer = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 25, "token": "t"}
        )
        assert_error(answer, 404, "not_found")

        assert_error(
            await f.site.request("GET", "/api/nothing-here", token=f.alice), 404, "not_found"
        )
        for gid in (22, 23, 24, 25):
            assert one(f.path, "SELECT COUNT(*) FROM gallery WHERE gid = ?", gid)[0] == 0
            assert one(f.path, "SELECT COUNT(*) FROM task_operation WHERE gid = ?", gid)[0] == 0
        assert f.upstream.stats()["postAttempts"] == {"21": 1, "23": 1}  # 23 refused
        assert f.upstream.stats()["posts"] == {"21": 1}

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_body_over_the_limit_is_413(db_target):
    async def test(f):
        big = b'{"gid": 1, "token": "' + b"x" * (1024 * 1024) + b'"}'
        answer = await f.site.request("POST", "/api/tasks", token=f.alice, data=big)
        assert_error(answer, 413, "payload_too_large")
        assert one(f.path, "SELECT COUNT(*) FROM gallery")[0] == 0

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_database_failure_is_500_and_commits_nothing(db_target):
    async def test(f):
        add_failing_trigger(f.path, "reserve_fails", "task_operation", "simulated failure")
        answer = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 31, "token": "t"}
        )
        assert_error(answer, 500, "internal")
        assert "simulated" not in answer[1]["error"]["message"]  # internals stay in the log
        assert one(f.path, "SELECT COUNT(*) FROM gallery")[0] == 0
        assert one(f.path, "SELECT COUNT(*) FROM task_operation")[0] == 0
        assert f.upstream.stats()["requests"] == 0

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_six_concurrent_creates_of_one_gid_over_http_post_once_one_row(db_target):
    async def test(f):
        f.upstream.set_faults([fault("latency", ms=100)])
        results = await DeferredList(
            [
                Deferred.fromCoroutine(
                    f.site.request(
                        "POST", "/api/tasks", token=f.alice, body={"gid": 41, "token": "t"}
                    )
                )
                for _ in range(6)
            ]
        )
        statuses = sorted(answer[0] for ok, answer in results if ok)
        assert statuses == [201, 409, 409, 409, 409, 409]
        assert f.upstream.stats()["postAttempts"] == {"41": 1}
        assert f.upstream.stats()["posts"] == {"41": 1}
        assert one(f.path, "SELECT COUNT(*) FROM gallery WHERE gid = 41")[0] == 1

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_unknown_listed_with_evidence_and_resolved_over_http(db_target):
    async def test(f):
        f.upstream.set_faults([fault("commit_then_drop")])
        status, body = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 51, "token": "t"}
        )
        assert status == 202 and body["task"]["status"] == "SUBMIT_UNKNOWN"
        f.upstream.clear_faults()
        assert_error(
            await f.site.request(
                "POST", "/api/tasks", token=f.alice, body={"gid": 51, "token": "t"}
            ),
            409,
            "conflict",
        )
        assert_error(
            await f.site.request("DELETE", "/api/tasks/51", token=f.alice), 409, "conflict"
        )
        status, listed = await f.site.request("GET", "/api/admin/unknown", token=f.admin)
        assert status == 200 and [t["gid"] for t in listed["tasks"]] == [51]
        evidence = listed["tasks"][0]["evidence"]
        assert evidence["step"] == "submit" and evidence["unknownAt"]
        assert evidence["upstream"]["audit"]["submissions"] == 1
        resolve = "/api/admin/tasks/51/resolve"
        status, body = await f.site.request(
            "POST", resolve, token=f.admin, body={"verdict": "submitted", "note": "audit: 1"}
        )
        assert status == 200 and body["task"]["state"] == "SUBMITTED"
        again = await f.site.request("POST", resolve, token=f.admin, body={"verdict": "submitted"})
        assert again[0] == 200 and again[1]["task"]["state"] == "SUBMITTED"
        other = await f.site.request(
            "POST", resolve, token=f.admin, body={"verdict": "not_submitted"}
        )
        assert_error(other, 409, "conflict")
        audit = one(f.path, "SELECT actor, note, evidence FROM reconciliation_audit WHERE gid = 51")
        assert audit["actor"] == "demo" and audit["note"] == "audit: 1"
        assert '"submissions": 1' in audit["evidence"]
        usage = (await f.site.request("GET", "/api/usage", token=f.alice))[1]
        assert usage["used"] == catalog.gallery(51).cost
        assert f.upstream.stats()["postAttempts"] == {"51": 1}
        assert_error(
            await f.site.request(
                "POST", "/api/admin/tasks/52/resolve", token=f.admin, body={"verdict": "submitted"}
            ),
            404,
            "not_found",
        )

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_delete_over_http_at_once_or_pending(db_target):
    async def test(f):
        for gid in (61, 62):
            await f.site.request(
                "POST", "/api/tasks", token=f.alice, body={"gid": gid, "token": "t"}
            )
        assert await f.site.request("DELETE", "/api/tasks/61", token=f.alice) == (
            200,
            {"deleted": 61},
        )
        assert_error(await f.site.request("GET", "/api/tasks/61", token=f.alice), 404, "not_found")
        connection = raw(f.path)
        connection.execute("UPDATE gallery SET node_id = 'node-1' WHERE gid = 62")
        connection.close()
        status, body = await f.site.request("DELETE", "/api/tasks/62", token=f.alice)
        assert status == 202 and body["task"]["state"] == "DELETE_PENDING"
        again = await f.site.request("DELETE", "/api/tasks/62", token=f.alice)
        assert again[1]["task"]["deleteOperationId"] == body["task"]["deleteOperationId"]
        # The delete can be re-created (a new generation) only after it completes.
        answer = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 62, "token": "t"}
        )
        assert_error(answer, 409, "conflict")
        status, body = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 61, "token": "t"}
        )
        assert status == 201

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_health_metrics_ui_and_admin_nodes(db_target):
    async def test(f):
        assert await f.site.request("GET", "/healthz") == (
            200,
            {
                "site": f.site.site.health.site,
                "backend": backend_of(db_target),
                "recovery": "done",
                "dispatch": "enabled",
                "database": "ok",
                "replication": replication_of(db_target),
            },
        )
        assert f.site.site.health.site == f"{socket.gethostname()}:0"  # --name's default
        status, page = await f.site.request("GET", "/metrics")
        assert status == 200 and b"tasknet_creates_total" in page
        status, index = await f.site.request("GET", "/")
        assert status == 200 and b"<html" in index.lower()
        assert await f.site.request("GET", "/api/admin/nodes", token=f.admin) == (
            200,
            {"nodes": []},
        )
        assert_error(
            await f.site.request("GET", "/api/admin/nodes", token=f.alice), 403, "forbidden"
        )

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_client_hanging_up_does_not_cut_the_create_chain(db_target):
    import json as _json

    import treq

    from tests.eventually import eventually

    async def test(f):
        f.upstream.set_faults([fault("latency", ms=300)])
        d = treq.post(
            f.site.base_url + "/api/tasks",
            data=_json.dumps({"gid": 71, "token": "t"}).encode(),
            headers={"Authorization": [f"Bearer {f.alice}"]},
            pool=f.site.pool,
        )
        await eventually(lambda: f.upstream.app.journal.post_attempts[71] == 1)
        d.cancel()  # the browser goes away while the POST is in flight
        d.addErrback(lambda _: None)
        await eventually(
            lambda: one(f.path, "SELECT state FROM task_operation WHERE gid = 71")[0] == "SUBMITTED"
        )
        assert f.upstream.stats()["posts"] == {"71": 1}

    await with_fixture(db_target, test)
