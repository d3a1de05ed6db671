"""Task views, the outbox written with each change, and legacy rows."""

from __future__ import annotations

import json

import pytest_twisted

from tasknet.site.storage import eligibility, views
from tests.site.helpers import (
    dispatch_row,
    fail_usage_writes,
    fault,
    lifecycle_env,
    one,
    query,
    raw,
)


def outbox(path: str, gid: int) -> list[dict]:
    rows = query(
        path, "SELECT payload, user_id FROM notification_outbox WHERE gid = ? ORDER BY id", gid
    )
    return [json.loads(r["payload"]) | {"_user": r["user_id"]} for r in rows]


@pytest_twisted.ensureDeferred
async def test_every_visible_change_is_in_the_outbox_of_its_transaction(db_target):
    async with lifecycle_env(db_target, timeout=0.3) as env:
        await env.lifecycle.create(env.user_id, 1, "t", "")
        pushed = outbox(env.path, 1)
        assert [p["task"]["state"] for p in pushed] == [
            "SUBMITTING",
            "SUBMITTED",
        ]  # a reservation is not announced
        assert all(p["type"] == "task" and p["_user"] == env.user_id for p in pushed)

        env.upstream.set_faults([fault("reject")])
        await env.lifecycle.create(env.user_id, 2, "t", "").addErrback(lambda _: None)
        pushed = outbox(env.path, 2)
        assert [p["task"]["state"] for p in pushed] == ["SUBMITTING", None]
        assert pushed[-1]["task"]["status"] is None and pushed[-1]["_user"] == env.user_id

        env.upstream.set_faults([fault("timeout")])
        await env.lifecycle.create(env.user_id, 3, "t", "")
        assert outbox(env.path, 3)[-1]["task"]["status"] == "SUBMIT_UNKNOWN"

        await env.lifecycle.delete(env.user_id, 1)  # never dispatched: at once
        last = outbox(env.path, 1)[-1]["task"]
        assert last["state"] == "DELETED" and last["status"] is None


@pytest_twisted.ensureDeferred
async def test_outbox_row_rolls_back_with_its_change(db_target):
    async with lifecycle_env(db_target) as env:
        fail_usage_writes(env.path)
        await env.lifecycle.create(env.user_id, 1, "t", "")
        states = [p["task"]["state"] for p in outbox(env.path, 1)]
        assert states == ["SUBMITTING", "UNKNOWN"]  # no SUBMITTED was ever announced


@pytest_twisted.ensureDeferred
async def test_legacy_rows_view_eligibility_and_delete(db_target):
    async with lifecycle_env(db_target) as env:
        connection = raw(env.path)
        connection.execute(
            "INSERT INTO gallery (gid, user_id, name, url, status, progress, node_id, cost) "
            "VALUES (10, ?, 'old', 'http://u/10', 3, 0.5, 'node-1', 4)",
            (env.user_id,),
        )
        connection.execute(
            "INSERT INTO gallery (gid, user_id, name, cost) VALUES (11, ?, 'never', 4)",
            (env.user_id,),
        )
        connection.close()
        view = await env.db.read(views.task_view, 10)
        assert view["state"] is None and view["status"] == "COMPRESSING"
        assert view["statusText"] == "压缩中" and view["node"] == "node-1"
        assert eligibility.is_dispatchable(await env.db.read(dispatch_row, 10))
        assert not eligibility.is_dispatchable(await env.db.read(dispatch_row, 11))

        # On a node: its one backfilled generation, then DELETE_PENDING.
        pending = await env.lifecycle.delete(env.user_id, 10)
        assert not pending.completed and pending.node == "node-1"
        op = one(env.path, "SELECT * FROM task_operation WHERE gid = 10")
        assert (op["state"], op["legacy"], op["dispatched"]) == ("DELETE_PENDING", 1, 1)
        # Never on a node: deleted at once, tombstone left.
        done = await env.lifecycle.delete(env.user_id, 11)
        assert done.completed
        op = one(env.path, "SELECT * FROM task_operation WHERE gid = 11")
        assert (op["state"], op["legacy"]) == ("DELETED", 1)
        assert one(env.path, "SELECT COUNT(*) FROM gallery WHERE gid = 11")[0] == 0
