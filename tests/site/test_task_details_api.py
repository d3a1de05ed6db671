"""``GET /api/tasks/{gid}/details`` (issue 36, item 5) with the real site and
the real mock upstream, on either backend: a task that went ``UNKNOWN`` (the
upstream counted the POST and its answer was lost) and was reconciled
``submitted`` shows each state with when and why, the verdict with who and
the note, the evidence it was taken on, its generation and operation ids and
its cost; only its owner and admins see it; bad gids are clear 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq

from tasknet.upstream.testing import start_upstream
from tests.site.helpers import SiteWithUsers, assert_error, fault, one, running_site, site_options


async def with_fixture(target: str, test: Any) -> None:
    upstream = await start_upstream()
    try:
        async with running_site(site_options(target, upstream.base_url, "--demo")) as site:
            await test(SiteWithUsers(site, target, upstream))
    finally:
        await upstream.stop()


async def _resolve(f: SiteWithUsers, gid: int, verdict: str, note: str) -> None:
    response = await treq.post(
        f"{f.site.base_url}/api/admin/tasks/{gid}/resolve",
        data=json.dumps({"verdict": verdict, "note": note}).encode(),
        headers={"Authorization": [f"Bearer {f.admin}"], "Content-Type": ["application/json"]},
        pool=f.site.pool,
    )
    assert response.code == 200, await treq.content(response)


@pytest_twisted.ensureDeferred
async def test_details_of_a_task_that_went_unknown_and_was_reconciled(db_target):
    async def test(f: SiteWithUsers) -> None:
        f.upstream.set_faults([fault("commit_then_drop")])
        status, body = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 71, "token": "t"}
        )
        f.upstream.clear_faults()
        assert status == 202 and body["task"]["state"] == "UNKNOWN", body
        await _resolve(f, 71, "submitted", "the upstream's audit counts one POST")

        status, details = await f.site.request("GET", "/api/tasks/71/details", token=f.alice)
        assert status == 200, details
        operation_id = one(f.path, "SELECT operation_id FROM task_operation WHERE gid = ?", 71)[0]
        operation = details["operation"]
        assert operation["operationId"] == operation_id == details["task"]["operationId"]
        assert operation["state"] == "SUBMITTED"
        assert operation["cost"] == details["task"]["cost"] and operation["cost"] > 0
        assert operation["unknownAt"] and operation["error"] and operation["step"]

        history = details["history"]
        kinds = [(entry["kind"], entry.get("status") or entry.get("verdict")) for entry in history]
        assert ("status", "SUBMIT_UNKNOWN") in kinds, kinds
        assert ("verdict", "submitted") in kinds, kinds
        unknown_at = kinds.index(("status", "SUBMIT_UNKNOWN"))
        verdict_at = kinds.index(("verdict", "submitted"))
        assert unknown_at < verdict_at, kinds
        assert history[0]["kind"] == "created" and history[0]["cost"] == operation["cost"]
        assert history[0]["at"] == operation["createdAt"]
        assert history[unknown_at]["at"] <= operation["unknownAt"] or any(
            entry.get("source") == "outbox" for entry in history
        )
        verdict = history[verdict_at]
        assert (
            verdict["actor"] == "demo" and verdict["note"] == "the upstream's audit counts one POST"
        )
        assert [entry["at"] for entry in history] == sorted(entry["at"] for entry in history)
        outbox = [entry["at"] for entry in history if entry.get("source") == "outbox"]
        assert details["historyFrom"] == (outbox[0] if outbox else None)
        assert details["historyTruncated"] is False
        assert isinstance(details["evidence"], dict) and details["evidence"]

        # An admin sees it too; another user's task answers like a missing one.
        status, by_admin = await f.site.request("GET", "/api/tasks/71/details", token=f.admin)
        assert status == 200 and by_admin["operation"] == operation, by_admin
        # Without --webhook the outbox rows go once pushed, which may fall
        # between the two reads (the task's own rows then say SUBMIT_UNKNOWN):
        # what the task's rows and the audits said, the admin sees too.
        for entry in history:
            if entry.get("source") != "outbox":
                assert entry in by_admin["history"], (entry, by_admin["history"])
        assert ("status", "SUBMIT_UNKNOWN") in [
            (entry["kind"], entry.get("status")) for entry in by_admin["history"]
        ]
        assert_error(
            await f.site.request("GET", "/api/tasks/71/details", token=f.bob), 404, "not_found"
        )
        assert_error(
            await f.site.request("GET", "/api/tasks/72/details", token=f.admin), 404, "not_found"
        )
        assert_error(
            await f.site.request("GET", "/api/tasks/0/details", token=f.admin),
            400,
            "invalid_request",
        )
        status, _ = await f.site.request("GET", "/api/tasks/71/details")
        assert status == 401

    await with_fixture(db_target, test)
