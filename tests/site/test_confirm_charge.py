"""Getting an archive again (DELIVERY.md "Custody: Getting it again"), on
both backends: the real site and mock upstream over loopback HTTP, a
scripted v2 node over real TCP completing and then releasing the task.

Creating a gid whose task is ``ARCHIVE_GONE`` without ``"confirmCharge":
true`` is ``409 charge_confirmation_required`` with the last cost (absent or
false alike: nothing written, nothing POSTed); with it, a new generation: a
new operationId, one more POST in the upstream's journal, and the quota
counts the new charge.  A ``COMPLETED`` task whose archive is held is ``409
already_completed``; a non-boolean ``confirmCharge`` is ``400``."""

from __future__ import annotations

from typing import Any

import pytest_twisted

from tasknet.protocol.messages import (
    ReleasedEntry,
    TaskCommand,
    TaskEntry,
    TaskReport,
    TaskReportAck,
)
from tests.site.test_archive_digest import _events, _push_of
from tests.site.test_views_api import Fixture, with_fixture
from tests.site_protocol.harness import ScriptedNode

GID = 401


async def _post(f: Fixture, body: dict[str, Any], token: str | None = None) -> tuple[int, Any]:
    return await f.site.request("POST", "/api/tasks", token=token or f.alice, body=body)  # type: ignore[no-any-return]


async def _report(node: ScriptedNode, report_id: str, revision: int, **parts: Any) -> None:
    node.sendMessage(
        TaskReport(
            report_id,
            revision,
            tuple(TaskEntry(*t) for t in parts.get("tasks", ())),
            parts.get("ops", {}),
            (),
            tuple(ReleasedEntry(*r) for r in parts.get("released", ())),
        )
    )
    assert (await node.next(TaskReportAck)).result == "APPLIED"


async def _completed(f: Fixture, node: ScriptedNode, revision: int) -> tuple[str, dict[str, Any]]:
    """Create GID, let the node complete it; its operationId and task object."""
    task = await f.create(GID)
    command = await node.next(TaskCommand)
    assert command.gid == GID and command.operation_id == task["operationId"]
    await _report(
        node, f"done-{revision}", revision, tasks=[(GID, 4, 1.0)], ops={GID: command.operation_id}
    )
    status, body = await f.get(f"/api/tasks/{GID}")
    assert status == 200 and body["task"]["status"] == "COMPLETED"
    return command.operation_id, body["task"]


async def _used(f: Fixture) -> int:
    status, body = await f.get("/api/usage")
    assert status == 200, body
    return int(body["used"])


@pytest_twisted.ensureDeferred
async def test_confirm_charge_absent_false_and_true_on_a_gone_archive(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1")
        first_op, task = await _completed(f, node, 10)
        cost = task["cost"]
        assert cost > 0

        # Held: nothing to fetch again, whatever the body says.
        status, body = await _post(f, {"gid": GID, "token": "t"})
        assert (status, body["error"]["code"]) == (409, "already_completed")
        status, body = await _post(f, {"gid": GID, "token": "t", "confirmCharge": True})
        assert (status, body["error"]["code"]) == (409, "already_completed")

        events = await _events(f, f.alice)
        try:
            await _report(node, "gone", 11, released=[(GID, first_op, "EXPIRED")])
            pushed = await _push_of(events, GID, "ARCHIVE_GONE")
        finally:
            await events.shut()
        assert pushed["archiveGone"]["reason"] == "EXPIRED"
        status, body = await f.site.request(
            "POST", "/api/tasks/archive-links", token=f.alice, body={"gids": [GID]}
        )
        assert status == 200 and body["missing"] == [{"gid": GID, "code": "archive_gone"}]
        # The list's filter and counts know the status (the UI's "needs attention" tab).
        status, body = await f.get("/api/tasks?status=ARCHIVE_GONE")
        assert status == 200 and [t["gid"] for t in body["tasks"]] == [GID]
        status, body = await f.get("/api/tasks/counts")
        assert status == 200 and body["counts"]["ARCHIVE_GONE"] == 1, body
        status, body = await f.get(f"/api/tasks/{GID}")
        gone = body["task"]
        assert (gone["status"], gone["statusText"]) == ("ARCHIVE_GONE", "归档已失效")
        assert gone["archiveGone"]["reason"] == "EXPIRED"
        assert gone["archiveGone"]["node"] == "n1" and gone["archiveGone"]["at"]
        status, body = await f.site.request(
            "GET",
            f"/api/tasks/{GID}/archive",
            token=f.alice,
            headers={"Accept": ["application/json"]},
        )
        assert (status, body["error"]["code"], body["error"]["reason"]) == (
            410,
            "archive_gone",
            "EXPIRED",
        )

        posts, used = f.upstream.app.journal.posts.get(GID, 0), await _used(f)
        assert posts == 1 and used == cost
        for body in (
            {"gid": GID, "token": "t"},
            {"gid": GID, "token": "t", "confirmCharge": False},
        ):
            status, answer = await _post(f, body)
            assert status == 409, answer
            assert answer["error"]["code"] == "charge_confirmation_required"
            assert answer["error"]["cost"] == cost
        for bad in ("yes", 1, None, [True]):
            status, answer = await _post(f, {"gid": GID, "token": "t", "confirmCharge": bad})
            assert (status, answer["error"]["code"]) == (400, "invalid_request"), bad
            assert "confirmCharge" in answer["error"]["message"]
        # Another user's gone task is not theirs to fetch again.
        status, answer = await _post(f, {"gid": GID, "token": "t", "confirmCharge": True}, f.bob)
        assert (status, answer["error"]["code"]) == (409, "conflict")
        # Nothing of the refusals was written or sent.
        _, body = await f.get(f"/api/tasks/{GID}")
        assert body["task"] == gone
        assert f.upstream.app.journal.posts.get(GID, 0) == 1 and await _used(f) == cost

        status, answer = await _post(f, {"gid": GID, "token": "t", "confirmCharge": True})
        assert status == 201, answer
        again = answer["task"]
        assert again["operationId"] != first_op
        assert again["status"] == "SUBMITTED" and again["archiveGone"] is None
        assert (again["archiveSize"], again["archiveSha256"], again["node"]) == (None, None, None)
        assert f.upstream.app.journal.posts[GID] == 2
        assert await _used(f) == 2 * cost
        # The new generation goes to a node, as any new task does; the old
        # generation's late release changes nothing.
        command = await node.next(TaskCommand)
        while command.operation_id == first_op:  # a resend of the first DOWNLOAD, if any
            command = await node.next(TaskCommand)
        assert (command.gid, command.operation_id) == (GID, again["operationId"])
        await _report(node, "late", 12, released=[(GID, first_op, "DISK_BUDGET")])
        _, body = await f.get(f"/api/tasks/{GID}")
        assert body["task"]["status"] == "SUBMITTED" and body["task"]["archiveGone"] is None

    await with_fixture(db_target, test)
