"""The straight path of a create and of a verdict (issue 22): the outbox is
woken only after a commit that announces something (a reservation is not
announced), a verdict is checked once before anything is read or asked,
``_resolve`` reads the one ``UNKNOWN`` row it needs by its key, and
``tasknet_creates_total`` is labelled from the answer the API gave, never
by reading it back.  Real databases (``db_target``), the real mock
upstream."""

from __future__ import annotations

import sqlite3

import pytest
import pytest_twisted

from tasknet.site import metrics
from tasknet.site.storage import create, reconcile, usage, users
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.errors import TaskError
from tasknet.upstream.testing import start_upstream
from tests.eventually import eventually
from tests.site.helpers import (
    SiteWithUsers,
    add_user,
    fault,
    lifecycle_env,
    one,
    running_site,
    site_options,
)

GID = 4343


@pytest_twisted.ensureDeferred
async def test_a_create_wakes_the_outbox_only_after_the_commits_that_announce(db_target):
    async with lifecycle_env(db_target, timeout=3.0) as env:
        wakes: list[str | None] = []

        def woken() -> None:
            row = one(env.path, "SELECT state FROM task_operation WHERE gid = ?", GID)
            wakes.append(row["state"] if row is not None else None)

        env.lifecycle.on_commit = woken
        # Hold the prepare GET: the reservation is committed meanwhile.
        env.upstream.set_faults([fault("latency", "GET", f"/api/galleries/{GID}", ms=300)])
        created = env.lifecycle.create(env.user_id, GID, "tok", "")
        await eventually(lambda: env.upstream.app.journal.requests >= 1)
        assert one(env.path, "SELECT state FROM task_operation WHERE gid = ?", GID)
        assert wakes == []  # RESERVED announces nothing: nobody to wake
        assert (await created).status == 201
        # SUBMITTING (others first hear of the task), then SUBMITTED.
        assert wakes == ["SUBMITTING", "SUBMITTED"]


def _unknown(conn: sqlite3.Connection, gid: int) -> str:
    uid = dbmod.run_write(conn, lambda c: users.create_user(c, f"user-{gid}"))[0].id
    week = usage.iso_week()
    op = dbmod.run_write(conn, create.reserve, gid, uid, "", "tok", week)
    assert dbmod.run_write(conn, create.begin_submit, gid, op, 5, f"title {gid}", week)
    assert dbmod.run_write(conn, create.mark_unknown, gid, op, "submit", f"timed out {gid}")
    return op


def test_one_unknown_operation_is_read_by_its_key(conn: sqlite3.Connection) -> None:
    ops = {gid: _unknown(conn, gid) for gid in (11, 12, 13)}
    listed = {v["gid"]: v for v in dbmod.run_read(conn, reconcile.unknown_operations)}
    for gid, op in ops.items():
        one_view = dbmod.run_read(conn, reconcile.unknown_operation, gid)
        assert one_view == listed[gid]
        assert one_view["evidence"]["operationId"] == op
    assert dbmod.run_read(conn, reconcile.unknown_operation, 99) is None  # no such task
    dbmod.run_write(conn, reconcile.resolve_unknown, 12, "not_submitted", "ops", "x", None, None)
    assert dbmod.run_read(conn, reconcile.unknown_operation, 12) is None  # no longer UNKNOWN


@pytest_twisted.ensureDeferred
async def test_an_unknown_verdict_is_refused_before_anything_is_read(db_target, monkeypatch):
    async with lifecycle_env(db_target) as env:
        conn = dbmod.connect(env.path)
        try:
            _unknown(conn, 21)
        finally:
            conn.close()

        def unread(cursor: object, gid: int) -> None:
            raise AssertionError("the verdict was checked after a read")

        monkeypatch.setattr(reconcile, "unknown_operation", unread)
        with pytest.raises(TaskError) as refused:
            await env.lifecycle.resolve(21, "maybe", "ops")
        assert refused.value.code == "invalid_request"
        assert env.upstream.stats()["requests"] == 0  # no audit asked either
        row = one(env.path, "SELECT state FROM task_operation WHERE gid = 21")
        assert row is not None and row["state"] == "UNKNOWN"


def _creates(outcome: str) -> float:
    value = metrics.REGISTRY.get_sample_value("tasknet_creates_total", {"outcome": outcome})
    return value or 0.0


@pytest_twisted.ensureDeferred
async def test_creates_are_counted_by_the_answer_given(db_target):
    upstream = await start_upstream()
    try:
        options = site_options(db_target, upstream.base_url, "--demo")
        async with running_site(options) as site:
            f = SiteWithUsers(site, db_target, upstream)
            _, broke = add_user(db_target, "broke", quota=0)
            outcomes = ("created", "conflict", "invalid", "quota_exceeded")
            before = {outcome: _creates(outcome) for outcome in outcomes}
            created = await site.request(
                "POST", "/api/tasks", token=f.alice, body={"gid": 5, "token": "t"}
            )
            again = await site.request(
                "POST", "/api/tasks", token=f.bob, body={"gid": 5, "token": "t"}
            )
            invalid = await site.request("POST", "/api/tasks", token=f.alice, body={"gid": 0})
            # An error answered with a document of its own (its numbers).
            poor = await site.request(
                "POST", "/api/tasks", token=broke, body={"gid": 6, "token": "t"}
            )
            unauthorized = await site.request("POST", "/api/tasks", body={"gid": 7, "token": "t"})
            assert [a[0] for a in (created, again, invalid, poor, unauthorized)] == [
                201,
                409,
                400,
                429,
                401,
            ]
            assert poor[1]["error"]["code"] == "quota_exceeded"
            after = {outcome: _creates(outcome) for outcome in outcomes}
            assert {o: after[o] - before[o] for o in outcomes} == dict.fromkeys(outcomes, 1.0)
    finally:
        await upstream.stop()
