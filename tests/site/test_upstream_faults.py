"""Every mock-upstream fault kind gives the documented state, checked
against the upstream's own journal (what it actually applied and charged)."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from tasknet.site.storage.engine.errors import TaskError
from tests.site.helpers import fault, lifecycle_env, one

GID = 777
PREPARE = f"/api/galleries/{GID}"


def state(path: str) -> str | None:
    row = one(path, "SELECT state FROM task_operation WHERE gid = ?", GID)
    return None if row is None else row[0]


def rows(path: str) -> int:
    return int(one(path, "SELECT COUNT(*) FROM gallery WHERE gid = ?", GID)[0])


def charged(env) -> int:
    return int(env.upstream.stats()["charged"])


# (fault on the archive POST, expected state, HTTP status of the create, POSTs applied)
POST_FAULTS = [
    ("latency", {"ms": 50}, "SUBMITTED", 201, 1),
    ("timeout", {}, "UNKNOWN", 202, 1),
    ("commit_then_drop", {}, "UNKNOWN", 202, 1),
    ("drop_before", {}, "UNKNOWN", 202, 0),  # indistinguishable from the client side
    ("error", {"status": 500, "charged": True}, "UNKNOWN", 202, 1),
    ("error", {"status": 503, "charged": False}, "UNKNOWN", 202, 0),
    ("slow_body", {"bytes_per_s": 10}, "UNKNOWN", 202, 1),
    ("reset_mid_body", {"after_bytes": 5}, "UNKNOWN", 202, 1),
]


@pytest.mark.parametrize(("kind", "params", "expected", "status", "applied"), POST_FAULTS)
@pytest_twisted.ensureDeferred
async def test_post_fault_gives_documented_state(
    db_target, kind, params, expected, status, applied
):
    async with lifecycle_env(db_target, timeout=0.4) as env:
        env.upstream.set_faults([fault(kind, **params)])
        created = await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert (created.status, created.task["state"]) == (status, expected)
        assert env.posts(GID) == applied
        assert env.upstream.stats()["postAttempts"] == {str(GID): 1}  # never a second POST
        journal = [e for e in env.upstream.journal()["entries"] if e["gid"] == GID]
        assert len(journal) == applied
        metered = one(env.path, "SELECT metered FROM task_operation WHERE gid = ?", GID)[0]
        assert metered == (1 if expected == "SUBMITTED" else 0)
        if expected == "UNKNOWN":
            listed = await env.lifecycle.unknown_with_evidence()
            assert listed[0]["evidence"]["step"] == "submit"
            env.upstream.clear_faults()
            assert listed[0]["evidence"]["upstream"]["audit"]["submissions"] == applied


@pytest.mark.parametrize(
    ("kind", "params", "code"),
    [("reject", {"status": 403}, "upstream_rejected"), ("missing", {}, "upstream_rejected")],
)
@pytest_twisted.ensureDeferred
async def test_post_definite_refusal_releases_and_charges_nothing(db_target, kind, params, code):
    async with lifecycle_env(db_target) as env:
        env.upstream.set_faults([fault(kind, **params)])
        with pytest.raises(TaskError) as refused:
            await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert refused.value.code == code
        assert state(env.path) is None and rows(env.path) == 0  # gid free
        assert env.posts(GID) == 0 and charged(env) == 0
        env.upstream.clear_faults()
        assert (await env.lifecycle.create(env.user_id, GID, "tok", "")).status == 201


@pytest.mark.parametrize(
    ("kind", "params", "code"),
    [
        ("timeout", {}, "upstream_unavailable"),
        ("drop_before", {}, "upstream_unavailable"),
        ("error", {"status": 500}, "upstream_unavailable"),
        ("slow_body", {"bytes_per_s": 10}, "upstream_unavailable"),
        ("reset_mid_body", {"after_bytes": 5}, "upstream_unavailable"),
        ("missing", {}, "not_found"),
        ("reject", {"status": 401}, "upstream_rejected"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_prepare_fault_releases_the_reservation_and_never_posts(
    db_target, kind, params, code
):
    async with lifecycle_env(db_target, timeout=0.4) as env:
        env.upstream.set_faults([fault(kind, "GET", PREPARE, **params)])
        with pytest.raises(TaskError) as refused:
            await env.lifecycle.create(env.user_id, GID, "tok", "")
        assert refused.value.code == code
        assert state(env.path) is None and rows(env.path) == 0
        assert env.upstream.stats()["postAttempts"] == {}


@pytest_twisted.ensureDeferred
async def test_prepare_latency_within_the_deadline_still_submits(db_target):
    async with lifecycle_env(db_target, timeout=1.0) as env:
        env.upstream.set_faults([fault("latency", "GET", PREPARE, ms=50)])
        assert (await env.lifecycle.create(env.user_id, GID, "tok", "")).status == 201
        assert env.posts(GID) == 1


@pytest_twisted.ensureDeferred
async def test_commit_then_drop_resolved_submitted_is_metered_once(db_target):
    async with lifecycle_env(db_target, timeout=0.4) as env:
        env.upstream.set_faults([fault("commit_then_drop")])
        await env.lifecycle.create(env.user_id, GID, "tok", "")
        env.upstream.clear_faults()
        cost = one(env.path, "SELECT cost FROM task_operation WHERE gid = ?", GID)[0]
        first = await env.lifecycle.resolve(GID, "submitted", "root", "audit says 1")
        again = await env.lifecycle.resolve(GID, "submitted", "root", "again")
        assert first["state"] == again["state"] == "SUBMITTED"
        used = one(env.path, "SELECT SUM(used) FROM weekly_usage")[0]
        assert used == cost == charged(env)
        audits = one(env.path, "SELECT COUNT(*) FROM reconciliation_audit WHERE gid = ?", GID)[0]
        assert audits == 1
        with pytest.raises(TaskError) as other:
            await env.lifecycle.resolve(GID, "not_submitted", "root", "")
        assert other.value.code == "conflict"
        assert env.upstream.stats()["postAttempts"] == {str(GID): 1}


@pytest_twisted.ensureDeferred
async def test_drop_before_resolved_not_submitted_frees_the_gid(db_target):
    async with lifecycle_env(db_target, timeout=0.4) as env:
        env.upstream.set_faults([fault("drop_before")])
        await env.lifecycle.create(env.user_id, GID, "tok", "")
        env.upstream.clear_faults()
        assert await env.lifecycle.resolve(GID, "not_submitted", "root", "0 submissions") is None
        assert await env.lifecycle.resolve(GID, "not_submitted", "root", "again") is None
        assert state(env.path) is None and rows(env.path) == 0
        assert one(env.path, "SELECT COALESCE(SUM(used), 0) FROM weekly_usage")[0] == 0
        assert (await env.lifecycle.create(env.user_id, GID, "tok", "")).status == 201
        assert env.posts(GID) == 1


@pytest_twisted.ensureDeferred
async def test_unknown_evidence_says_when_the_audit_is_unavailable(db_target):
    async with lifecycle_env(db_target, timeout=0.3) as env:
        env.upstream.set_faults(
            [fault("timeout"), fault("error", "GET", f"/api/galleries/{GID}/archive", status=500)]
        )
        await env.lifecycle.create(env.user_id, GID, "tok", "")
        listed = await env.lifecycle.unknown_with_evidence()
        upstream = listed[0]["evidence"]["upstream"]
        assert upstream["available"] is False and "HTTP 500" in upstream["error"]


@pytest_twisted.ensureDeferred
async def test_submit_after_the_upstream_closed_its_idle_connections_succeeds(db_target):
    from tasknet.site.upstream_client import Outcome, PrepareOutcome, UpstreamClient

    async with lifecycle_env(db_target) as env:
        client = UpstreamClient(env.upstream.base_url, reactor=reactor)  # persistent, as the site's
        try:
            prepared = await client.prepare(GID, "tok")
            assert prepared.outcome is PrepareOutcome.OK  # leaves an idle pooled connection
            # The upstream drops its idle connections; the client has not seen
            # it yet when the POST goes out (same reactor turn).
            closed = env.upstream.app.close_connections()
            submitted = client.submit(GID, "tok", 3.0)
            await closed
            result = await submitted
            assert result.outcome is Outcome.OK, result.error
            assert env.posts(GID) == 1
            # GETs still use (and recover) the pool.
            assert (await client.prepare(GID, "tok")).outcome is PrepareOutcome.OK
        finally:
            await client.close()
