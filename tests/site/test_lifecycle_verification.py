"""The design note's 验证 list, one test per case, each named after it.

Real databases (``db_target``: a SQLite file, a PostgreSQL database) with
the real schema, trigger and unique index;
the real mock upstream over loopback HTTP; the upstream's own journal is the
witness of what was POSTed.
"""

from __future__ import annotations

import sqlite3

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import DeferredList
from twisted.internet.task import deferLater

from tasknet.runtime import SystemEntropy
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.storage import create, delete, eligibility, favorites, generation, usage, views
from tasknet.site.storage.engine.database import connect, open_pool
from tasknet.site.storage.engine.errors import DatabaseFailed, TaskError
from tasknet.site.transitions import IllegalTransition
from tasknet.status import OperationState
from tests.backends import INTEGRITY_ERRORS, add_failing_trigger, drop_failing_trigger
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import (
    dispatch_row,
    fail_usage_writes,
    fault,
    lifecycle_env,
    one,
    query,
    raw,
)

GID = 4242


def op_row(path: str, gid: int = GID) -> sqlite3.Row | None:
    return one(path, "SELECT * FROM task_operation WHERE gid = ?", gid)


def gallery(path: str, gid: int = GID) -> sqlite3.Row | None:
    return one(path, "SELECT * FROM gallery WHERE gid = ?", gid)


def used(path: str, user_id: int) -> int:
    row = one(path, "SELECT COALESCE(SUM(used), 0) FROM weekly_usage WHERE user_id = ?", user_id)
    return int(row[0])


async def submitted_task(env, gid: int = GID) -> str:
    created = await env.lifecycle.create(env.user_id, gid, "tok", "")
    assert created.status == 201
    return created.task["operationId"]


def mark_dispatched(path: str, gid: int, node: str = "node-1") -> None:
    connection = raw(path)
    try:
        connection.execute("UPDATE gallery SET node_id = ? WHERE gid = ?", (node, gid))
        connection.execute("UPDATE task_operation SET dispatched = 1 WHERE gid = ?", (gid,))
    finally:
        connection.close()


# 意图与占位行先于上游 POST;SUBMITTING 先于 submit。


@pytest_twisted.ensureDeferred
async def test_intent_and_placeholder_row_before_upstream_post(db_target):
    async with lifecycle_env(db_target, timeout=3.0) as env:
        # Hold the read-only prepare GET at the upstream: the intent and the
        # placeholder must already be committed while it is pending.
        env.upstream.set_faults([fault("latency", "GET", f"/api/galleries/{GID}", ms=400)])
        d = env.lifecycle.create(env.user_id, GID, "tok", "my name")
        await eventually(lambda: env.upstream.app.journal.requests >= 1)
        op = op_row(env.path)
        assert op is not None and op["state"] == "RESERVED"
        placeholder = gallery(env.path)
        assert placeholder is not None and placeholder["name"] == "my name"
        assert placeholder["url"] == ""
        assert env.upstream.stats()["postAttempts"] == {}
        created = await d
        assert created.status == 201
        assert created.task["operationId"] == op["operation_id"]
        assert env.posts(GID) == 1


@pytest_twisted.ensureDeferred
async def test_submitting_committed_before_submit(db_target):
    async with lifecycle_env(db_target, timeout=3.0) as env:
        # The POST arrives and is held (latency) before the upstream acts:
        # the database must already say SUBMITTING, and nothing is charged yet.
        env.upstream.set_faults([fault("latency", ms=400)])
        d = env.lifecycle.create(env.user_id, GID, "tok", "")
        await eventually(lambda: env.upstream.app.journal.post_attempts[GID] == 1)
        op = op_row(env.path)
        assert op["state"] == "SUBMITTING" and op["step"] == "submit"
        assert op["cost"] is not None and op["metered"] == 0
        assert env.upstream.journal()["entries"] == []  # not applied yet
        created = await d
        assert created.status == 201 and created.task["state"] == "SUBMITTED"
        entries = env.upstream.journal()["entries"]
        assert [e["gid"] for e in entries] == [GID]


# 同 gid 6 线程并发创建:上游只被提交一次、任务行不超过一条。


@pytest_twisted.ensureDeferred
async def test_six_concurrent_creates_of_one_gid_post_once_and_at_most_one_row(db_target):
    async with lifecycle_env(db_target, timeout=3.0) as env:
        results = await DeferredList(
            [env.lifecycle.create(env.user_id, GID, "tok", "") for _ in range(6)],
            consumeErrors=True,
        )
        outcomes = [r for ok, r in results if ok]
        failures = [r.value for ok, r in results if not ok]
        assert len(outcomes) == 1 and outcomes[0].status == 201
        assert len(failures) == 5
        assert all(isinstance(f, TaskError) and f.code == "conflict" for f in failures)
        assert env.posts(GID) == 1
        assert env.upstream.stats()["postAttempts"] == {str(GID): 1}
        assert one(env.path, "SELECT COUNT(*) FROM gallery WHERE gid = ?", GID)[0] == 1


@pytest_twisted.ensureDeferred
async def test_six_concurrent_creates_from_two_database_handles_post_once(db_target):
    # Two pools on one database (as two site processes would be): the unique
    # index and the write transactions, not our single writer thread, decide.
    async with lifecycle_env(db_target, timeout=3.0) as env:
        second_db = open_pool(env.path, **site_runtime())
        second = Lifecycle(
            second_db, env.client, upstream_timeout=3.0, clock=reactor, entropy=SystemEntropy()
        )
        try:
            calls = [
                (env.lifecycle if i % 2 else second).create(env.user_id, GID, "tok", "")
                for i in range(6)
            ]
            results = await DeferredList(calls, consumeErrors=True)
        finally:
            second_db.close()
        assert sum(1 for ok, _ in results if ok) == 1
        assert env.posts(GID) == 1
        assert one(env.path, "SELECT COUNT(*) FROM gallery WHERE gid = ?", GID)[0] == 1


# 上游超时后落 UNKNOWN;再次点击创建也不会第二次 POST。


@pytest_twisted.ensureDeferred
async def test_upstream_timeout_becomes_unknown_and_second_click_makes_no_post(db_target):
    async with lifecycle_env(db_target, timeout=0.3) as env:
        env.upstream.set_faults([fault("timeout")])
        created = await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert created.status == 202
        assert created.task["state"] == "UNKNOWN"
        assert created.task["statusText"] == "提交未知"
        op = op_row(env.path)
        assert op["step"] == "submit" and "timeout" in op["error"]
        assert env.posts(GID) == 1  # the upstream acted; the answer was lost
        env.upstream.clear_faults()
        with pytest.raises(TaskError) as again:
            await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert again.value.code == "conflict"
        assert env.upstream.stats()["postAttempts"] == {str(GID): 1}
        assert op_row(env.path)["operation_id"] == op["operation_id"]
        assert used(env.path, env.user_id) == 0  # not metered while UNKNOWN


# 重启恢复把中断的 SUBMITTING 判为 UNKNOWN(任务行同步显示「提交未知」),
# 安全释放 RESERVED 占位,且不改写 operationId、不重发。


@pytest_twisted.ensureDeferred
async def test_restart_recovery_submitting_to_unknown_reserved_released_no_rewrite_no_resend(
    db_target,
):
    async with lifecycle_env(db_target) as env:
        week = usage.iso_week()
        # The state a crash leaves: one create stopped after SUBMITTING was
        # committed, another right after its reservation.
        submitting_id = await env.db.write(create.reserve, 1, env.user_id, "", "t", week)
        assert await env.db.write(create.begin_submit, 1, submitting_id, 5, "title", week)
        reserved_id = await env.db.write(create.reserve, 2, env.user_id, "", "t", week)
        settled_id = await submitted_task(env, 3)
        posts_before = env.upstream.stats()["postAttempts"]
        env.db.close()

        # "Restart": a new database handle and lifecycle on the same file.
        env.db = open_pool(env.path, **site_runtime())
        env.lifecycle = Lifecycle(
            env.db, env.client, upstream_timeout=0.5, clock=reactor, entropy=SystemEntropy()
        )
        recovered = await env.lifecycle.recover()
        assert recovered.unknown == [1] and recovered.released == [2]

        op1 = op_row(env.path, 1)
        assert op1["state"] == "UNKNOWN" and op1["operation_id"] == submitting_id
        assert op1["step"] == "recovery"
        view = await env.db.read(views.task_view, 1)
        assert view["status"] == "SUBMIT_UNKNOWN" and view["statusText"] == "提交未知"
        assert op_row(env.path, 2) is None and gallery(env.path, 2) is None
        assert reserved_id != submitting_id
        assert op_row(env.path, 3)["operation_id"] == settled_id
        assert op_row(env.path, 3)["state"] == "SUBMITTED"
        assert env.upstream.stats()["postAttempts"] == posts_before  # nothing resent
        # Recovery again (a second restart) changes nothing.
        again = await env.lifecycle.recover()
        assert again.unknown == [] and again.released == []


# 额度写入失败时落库事务回滚,任务保持可对账的「提交未知」+ UNKNOWN。


@pytest_twisted.ensureDeferred
async def test_quota_write_failure_rolls_back_to_reconcilable_submit_unknown(db_target):
    async with lifecycle_env(db_target) as env:
        # A real failure of the weekly_usage write inside the persist transaction.
        fail_usage_writes(env.path)
        created = await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert created.status == 202
        assert created.task["state"] == "UNKNOWN" and created.task["statusText"] == "提交未知"
        op = op_row(env.path)
        assert op["step"] == "persist" and "simulated disk failure" in op["error"]
        assert op["metered"] == 0  # the persist rolled back as a whole
        assert gallery(env.path)["url"] == ""
        assert used(env.path, env.user_id) == 0
        assert env.posts(GID) == 1

        drop_failing_trigger(env.path, "usage_fails", "weekly_usage")
        listed = await env.lifecycle.unknown_with_evidence()
        assert [v["gid"] for v in listed] == [GID]
        assert listed[0]["evidence"]["upstream"]["audit"]["submissions"] == 1
        view = await env.lifecycle.resolve(GID, "submitted", "admin", "audit shows 1 POST")
        assert view["state"] == "SUBMITTED"
        assert used(env.path, env.user_id) == op["cost"]  # metered exactly once
        assert op_row(env.path)["metered"] == 1


@pytest_twisted.ensureDeferred
async def test_repeated_persist_does_not_meter_twice(db_target):
    async with lifecycle_env(db_target) as env:
        operation_id = await submitted_task(env)
        cost = op_row(env.path)["cost"]
        again = await env.db.write(
            create.persist_submitted, GID, operation_id, "http://x/f", cost, usage.iso_week()
        )
        assert again is False
        assert used(env.path, env.user_id) == cost


# 重投/重试复用同一 operationId。


@pytest_twisted.ensureDeferred
async def test_redispatch_and_retries_reuse_the_same_operation_id(db_target):
    async with lifecycle_env(db_target) as env:
        operation_id = await submitted_task(env)
        for _ in range(3):  # what dispatch reads on every (re)send
            row = await env.db.read(dispatch_row, GID)
            assert eligibility.is_dispatchable(row) and row["operation_id"] == operation_id
        await env.lifecycle.recover()
        with pytest.raises(TaskError):
            await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert op_row(env.path)["operation_id"] == operation_id
        # A delete retry reuses its delete id too.
        mark_dispatched(env.path, GID)
        first = await env.lifecycle.delete(env.user_id, GID)
        second = await env.lifecycle.delete(env.user_id, GID)
        assert first.delete_operation_id == second.delete_operation_id
        assert op_row(env.path)["operation_id"] == operation_id


# 判定为拒绝的任务(UNKNOWN 等)绝不下发,也不退化为无 operationId 的旧命令。


@pytest_twisted.ensureDeferred
async def test_rejected_tasks_never_dispatched_nor_downgraded_to_legacy_commands(db_target):
    async with lifecycle_env(db_target, timeout=0.3) as env:
        week = usage.iso_week()
        await env.db.write(create.reserve, 1, env.user_id, "", "t", week)  # RESERVED
        op2 = await env.db.write(create.reserve, 2, env.user_id, "", "t", week)
        await env.db.write(create.begin_submit, 2, op2, 1, "", week)  # SUBMITTING
        env.upstream.set_faults([fault("commit_then_drop")])
        assert (await env.lifecycle.create(env.user_id, 3, "t", "")).status == 202  # UNKNOWN
        env.upstream.clear_faults()
        await submitted_task(env, 4)
        mark_dispatched(env.path, 4)
        await env.lifecycle.delete(env.user_id, 4)  # DELETE_PENDING
        await submitted_task(env, 5)
        await env.lifecycle.delete(env.user_id, 5)  # never dispatched: DELETED at once
        await submitted_task(env, 6)  # SUBMITTED: the only eligible one
        connection = raw(env.path)
        # Make every refused row look "truly submitted" to the legacy rule
        # (URL and node status present): the operation state must still win.
        connection.execute("UPDATE gallery SET url = 'http://x/a', status = 1")
        connection.execute(
            "INSERT INTO gallery (gid, user_id, url) VALUES (7, ?, 'http://x/legacy')",
            (env.user_id,),
        )
        connection.execute("INSERT INTO gallery (gid, user_id) VALUES (8, ?)", (env.user_id,))
        connection.close()

        states = {
            r["gid"]: r["state"] for r in query(env.path, "SELECT gid, state FROM task_operation")
        }
        assert states == {
            1: "RESERVED",
            2: "SUBMITTING",
            3: "UNKNOWN",
            4: "DELETE_PENDING",
            5: "DELETED",
            6: "SUBMITTED",
        }
        rows = {gid: await env.db.read(dispatch_row, gid) for gid in range(1, 9)}
        eligible = {
            gid for gid, row in rows.items() if row is not None and eligibility.is_dispatchable(row)
        }
        assert eligible == {6, 7}  # SUBMITTED, and the legacy row with an archive URL
        assert eligibility.is_dispatchable({"state": "DELETED", "url": "u", "status": 4}) is False
        # A confirmed submission with no archive URL has nothing to download.
        assert (
            eligibility.is_dispatchable({"state": "SUBMITTED", "url": "", "status": None}) is False
        )
        assert eligibility.is_dispatchable({"state": None, "url": "", "status": 4}) is False
        # The SQL form of the rule agrees.
        sql_eligible = {
            r[0]
            for r in query(
                env.path,
                "SELECT g.gid FROM gallery AS g LEFT JOIN task_operation AS o ON o.gid = g.gid "
                f"WHERE {eligibility.DISPATCHABLE_SQL}",
            )
        }
        assert sql_eligible == eligible


# 删除失败保留任务行与意图,重试复用同一删除 ID;成功后清收藏、删行、留墓碑。


@pytest_twisted.ensureDeferred
async def test_delete_failure_keeps_row_and_intent_retry_reuses_id_success_clears_favorites(
    db_target,
):
    async with lifecycle_env(db_target) as env:
        operation_id = await submitted_task(env)
        await env.db.write(favorites.add_favorite, env.user_id, GID)
        mark_dispatched(env.path, GID)
        started = await env.lifecycle.delete(env.user_id, GID)
        assert not started.completed and started.task["state"] == "DELETE_PENDING"
        delete_id = started.delete_operation_id

        assert await env.db.write(delete.mark_delete_failed, GID, delete_id, "disk busy")
        view = await env.db.read(views.task_view, GID)
        assert view["status"] == "DELETE_FAILED" and view["statusText"] == "删除失败"
        assert gallery(env.path) is not None
        assert op_row(env.path)["state"] == "DELETE_PENDING"
        assert one(env.path, "SELECT COUNT(*) FROM favorite WHERE gid = ?", GID)[0] == 1

        retry = await env.lifecycle.delete(env.user_id, GID)
        assert retry.delete_operation_id == delete_id
        assert retry.task["status"] == "DELETE_PENDING"

        assert await env.db.write(delete.complete_delete, GID, delete_id)
        assert gallery(env.path) is None
        assert one(env.path, "SELECT COUNT(*) FROM favorite WHERE gid = ?", GID)[0] == 0
        tombstone = op_row(env.path)
        assert tombstone["state"] == "DELETED" and tombstone["operation_id"] == operation_id
        assert (await env.db.read(views.task_view, GID))["state"] == "DELETED"


# 删除意图 ID 不匹配时不得完成删除。


@pytest_twisted.ensureDeferred
async def test_mismatched_delete_operation_id_never_completes_the_delete(db_target):
    async with lifecycle_env(db_target) as env:
        operation_id = await submitted_task(env)
        mark_dispatched(env.path, GID)
        started = await env.lifecycle.delete(env.user_id, GID)
        for wrong in ("not-the-delete-id", operation_id):
            assert await env.db.write(delete.complete_delete, GID, wrong) is False
            assert await env.db.write(delete.mark_delete_failed, GID, wrong, "x") is False
        assert gallery(env.path) is not None
        assert op_row(env.path)["state"] == "DELETE_PENDING"
        assert op_row(env.path)["delete_operation_id"] == started.delete_operation_id


# 正在提交(RESERVED/SUBMITTING)的任务拒绝删除;释放预占只清匹配世代的记录与占位行。


@pytest_twisted.ensureDeferred
async def test_reserved_and_submitting_tasks_refuse_delete(db_target):
    async with lifecycle_env(db_target, timeout=0.3) as env:
        week = usage.iso_week()
        await env.db.write(create.reserve, 1, env.user_id, "", "t", week)
        op2 = await env.db.write(create.reserve, 2, env.user_id, "", "t", week)
        await env.db.write(create.begin_submit, 2, op2, 1, "", week)
        env.upstream.set_faults([fault("timeout")])
        await env.lifecycle.create(env.user_id, 3, "t", "")
        for gid, state in ((1, "RESERVED"), (2, "SUBMITTING"), (3, "UNKNOWN")):
            with pytest.raises(TaskError) as refused:
                await env.lifecycle.delete(env.user_id, gid)
            assert refused.value.code == "conflict"
            assert op_row(env.path, gid)["state"] == state
            assert gallery(env.path, gid) is not None


@pytest_twisted.ensureDeferred
async def test_release_clears_only_the_matching_generation(db_target):
    async with lifecycle_env(db_target) as env:
        week = usage.iso_week()
        mine = await env.db.write(create.reserve, 1, env.user_id, "", "t", week)
        other = await env.db.write(create.reserve, 2, env.user_id, "", "t", week)
        # A stale operationId for gid 1 releases nothing.
        assert await env.db.write(create.release, 1, other) is False
        assert op_row(env.path, 1)["operation_id"] == mine and gallery(env.path, 1) is not None
        # A later generation of gid 1 is not released by the earlier id.
        assert await env.db.write(create.release, 1, mine) is True
        newer = await env.db.write(create.reserve, 1, env.user_id, "", "t", week)
        assert await env.db.write(create.release, 1, mine) is False
        assert op_row(env.path, 1)["operation_id"] == newer and gallery(env.path, 1) is not None
        assert op_row(env.path, 2)["operation_id"] == other and gallery(env.path, 2) is not None
        # A settled generation is never "released" (the transition table refuses).
        settled = await submitted_task(env, 3)
        assert await env.db.write(create.release, 3, settled) is False
        assert op_row(env.path, 3)["state"] == "SUBMITTED"


# 落库严格匹配本次创建世代(expectedOperationId),被删除/换代后不得复活已删 gid。


@pytest_twisted.ensureDeferred
async def test_persist_matches_expected_operation_id_and_never_resurrects_deleted_gid(db_target):
    async with lifecycle_env(db_target) as env:
        week = usage.iso_week()
        old = await env.db.write(create.reserve, GID, env.user_id, "", "t", week)
        await env.db.write(create.begin_submit, GID, old, 3, "", week)
        await env.db.write(create.mark_unknown, GID, old, "submit", "timeout")
        # Reconciled "not submitted" meanwhile: the gid is free and gone.
        assert await env.lifecycle.resolve(GID, "not_submitted", "admin", "") is None
        late = await env.db.write(create.persist_submitted, GID, old, "http://x/f", 3, week)
        assert late is False
        assert gallery(env.path) is None and op_row(env.path) is None
        assert used(env.path, env.user_id) == 0
        # Regenerated: the old generation's persist does not touch the new one.
        new = await env.db.write(create.reserve, GID, env.user_id, "", "t", week)
        await env.db.write(create.begin_submit, GID, new, 3, "", week)
        assert await env.db.write(create.persist_submitted, GID, old, "u", 3, week) is False
        assert op_row(env.path)["state"] == "SUBMITTING"
        assert op_row(env.path)["operation_id"] == new
        assert await env.db.write(create.mark_unknown, GID, old, "submit", "late") is False
        # And after a delete the tombstone is not brought back by a late persist.
        assert await env.db.write(create.persist_submitted, GID, new, "u", 3, week) is True
        await env.lifecycle.delete(env.user_id, GID)  # never dispatched: deleted at once
        assert await env.db.write(create.persist_submitted, GID, new, "u", 3, week) is False
        assert gallery(env.path) is None and op_row(env.path)["state"] == "DELETED"
        assert used(env.path, env.user_id) == 3


# 墓碑永久忽略所有上报(含同一 operationId),只允许显式 CREATE 用新 operationId 重建。


@pytest_twisted.ensureDeferred
async def test_tombstone_only_replaced_by_explicit_create_with_new_operation_id(db_target):
    async with lifecycle_env(db_target) as env:
        first = await submitted_task(env)
        await env.lifecycle.delete(env.user_id, GID)
        assert op_row(env.path)["state"] == "DELETED"
        # Nothing but CREATE moves a tombstone: every other write is refused or a no-op.
        week = usage.iso_week()
        assert await env.db.write(create.persist_submitted, GID, first, "u", 1, week) is False
        assert await env.db.write(create.mark_unknown, GID, first, "x", "y") is False
        assert await env.db.write(create.release, GID, first) is False
        with pytest.raises(IllegalTransition):
            await env.db.write(
                lambda c: generation.change_state(
                    c, GID, first, OperationState.DELETED, OperationState.SUBMITTED
                )
            )
        with pytest.raises(DatabaseFailed) as refused:  # the trigger, for raw SQL
            await env.db.write(
                lambda c: c.execute(
                    "UPDATE task_operation SET state = 'SUBMITTED' WHERE gid = ?", (GID,)
                )
            )
        assert isinstance(refused.value.__cause__, INTEGRITY_ERRORS)
        assert op_row(env.path)["state"] == "DELETED"
        second = await submitted_task(env)
        assert second != first
        assert op_row(env.path)["operation_id"] == second
        assert op_row(env.path)["state"] == "SUBMITTED"


@pytest_twisted.ensureDeferred
async def test_transition_check_runs_before_the_trigger(db_target):
    # Both layers refuse: the Python table before writing, the trigger after.
    async with lifecycle_env(db_target) as env:
        operation_id = await submitted_task(env)
        with pytest.raises(IllegalTransition):
            await env.db.write(
                lambda c: generation.change_state(
                    c,
                    GID,
                    operation_id,
                    OperationState.SUBMITTED,
                    OperationState.UNKNOWN,
                )
            )
        assert op_row(env.path)["state"] == "SUBMITTED"


@pytest_twisted.ensureDeferred
async def test_quota_is_checked_with_the_known_cost_before_submitting(db_target):
    async with lifecycle_env(db_target, quota=1) as env:
        from tasknet.upstream import catalog

        gid = next(g for g in range(1, 500) if catalog.gallery(g).cost > 1)
        with pytest.raises(TaskError) as refused:
            await env.lifecycle.create(env.user_id, gid, "t", "")
        assert refused.value.code == "quota_exceeded"
        assert gallery(env.path, gid) is None and op_row(env.path, gid) is None
        assert env.upstream.stats()["postAttempts"] == {}


@pytest_twisted.ensureDeferred
async def test_concurrent_creates_of_different_gids_cannot_overshoot_the_quota(db_target):
    from tasknet.upstream import catalog

    gids = [g for g in range(1, 2000) if catalog.gallery(g).cost == 10][:3]
    async with lifecycle_env(db_target, quota=25, timeout=3.0) as env:
        env.upstream.set_faults([fault("latency", ms=200)])
        results = await DeferredList(
            [env.lifecycle.create(env.user_id, g, "t", "") for g in gids], consumeErrors=True
        )
        ok = [r for success, r in results if success]
        refused = [r.value.code for success, r in results if not success]
        assert len(ok) == 2 and refused == ["quota_exceeded"]
        assert used(env.path, env.user_id) == 20


def test_week_helpers(tmp_path):
    from datetime import UTC, datetime

    from tasknet.site.storage.engine.sources import Sources

    assert usage.iso_week(datetime(2026, 12, 3, tzinfo=UTC)) == "2026-W49"
    # Unparsable: the week of the connection's wall clock.
    moment = datetime(2031, 1, 1, 12, tzinfo=UTC).timestamp()
    connection = connect(str(tmp_path / "weeks.sqlite"), Sources(lambda: moment, SystemEntropy()))
    try:
        cursor = connection.cursor()
        assert usage.week_of_timestamp(cursor, "2026-12-03T10:00:00.000000Z") == "2026-W49"
        assert usage.week_of_timestamp(cursor, "not a time") == "2031-W01"
        assert usage.this_week(cursor) == "2031-W01"
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_persist_and_unknown_both_failing_are_settled_by_recovery(db_target):
    async with lifecycle_env(db_target) as env:
        fail_usage_writes(env.path, "disk failure")
        add_failing_trigger(
            env.path,
            "unknown_fails",
            "task_operation",
            "disk failure",
            event="UPDATE OF state",
            when="NEW.state = 'UNKNOWN'",
        )
        answer = await env.lifecycle.create(env.user_id, GID, "tok", "")
        # Honest answer: not a success and never a 500 (SCALE.md "Database
        # failover"): 202, the outcome unknown, the task as it will be once
        # the background retry or the recovery records it.  Still
        # SUBMITTING (提交中) meanwhile, never resent.
        assert answer.status == 202
        assert (answer.task["state"], answer.task["status"]) == ("UNKNOWN", "SUBMIT_UNKNOWN")
        assert op_row(env.path)["state"] == "SUBMITTING"
        operation_id = op_row(env.path)["operation_id"]
        drop_failing_trigger(env.path, "unknown_fails", "task_operation")
        # The failed UNKNOWN write is retried in the background; stop that
        # (as a stopping site does) to see what the next start's recovery does.
        env.lifecycle.stop()
        await deferLater(reactor, 0, lambda: None)
        recovered = await env.lifecycle.recover()  # what the next start does
        assert recovered.unknown == [GID]
        op = op_row(env.path)
        assert (op["state"], op["operation_id"], op["metered"]) == ("UNKNOWN", operation_id, 0)
        assert env.posts(GID) == 1
        assert used(env.path, env.user_id) == 0


@pytest_twisted.ensureDeferred
async def test_used_up_quota_still_answers_conflict_for_an_existing_gid(db_target):
    # The quota is checked after prepare, with the cost: a gid that already
    # has a task is a 409 whatever the quota, and nothing is asked upstream.
    async with lifecycle_env(db_target, quota=0) as env:
        from tests.site.helpers import add_user

        rich, _ = add_user(env.path, "rich", quota=5000)
        created = await env.lifecycle.create(rich, GID, "t", "")
        assert created.status == 201
        requests = env.upstream.app.journal.requests
        with pytest.raises(TaskError) as refused:
            await env.lifecycle.create(env.user_id, GID, "t", "")
        assert refused.value.code == "conflict"
        assert env.upstream.app.journal.requests == requests


def test_a_cost_zero_gallery_fits_a_quota_exactly_used_up(db_target):
    from tasknet.site.storage.engine.database import connect, run_write
    from tasknet.site.storage.engine.schema import prepare_database
    from tests.site.helpers import add_user

    path = db_target
    prepare_database(path)
    user_id, _ = add_user(path, "alice", quota=3)
    week = usage.iso_week()
    connection = connect(path)
    try:
        first = run_write(connection, create.reserve, 1, user_id, "", "t", week)
        assert run_write(connection, create.begin_submit, 1, first, 3, "", week)
        run_write(connection, create.persist_submitted, 1, first, "http://u/1", 3, week)
        # used == quota: a cost-0 gallery still fits (used + 0 > quota is false) ...
        free = run_write(connection, create.reserve, 2, user_id, "", "t", week)
        assert run_write(connection, create.begin_submit, 2, free, 0, "", week)
        # ... a cost-1 one does not, and is released.
        paid = run_write(connection, create.reserve, 3, user_id, "", "t", week)
        assert not run_write(connection, create.begin_submit, 3, paid, 1, "", week)
        assert connection.execute("SELECT COUNT(*) FROM gallery WHERE gid = 3").fetchone()[0] == 0
    finally:
        connection.close()
