"""Reconciliation over HTTP with the real site and the real mock upstream
(either backend): the verdict wait (SCALE.md "Fencing" 2: ``409
verdict_too_early`` with ``notBefore`` and ``Retry-After``) and the note a
verdict against the upstream's audit needs (``409 note_required``).

UNKNOWNs are made by the upstream's own faults (``commit_then_drop``: the
POST counted, its answer lost; ``drop_before``: nothing counted); the wait
is set in the row directly, as a reap would write it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest_twisted
import treq

from tasknet.site.storage import throughput
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import (
    SiteWithUsers,
    assert_error,
    fault,
    one,
    raw,
    running_site,
    site_options,
)

HOUR = 3600.0
AUDIT = "/api/galleries/*/archive"


async def with_fixture(target: str, test: Any) -> None:
    upstream = await start_upstream()
    try:
        async with running_site(site_options(target, upstream.base_url, "--demo")) as site:
            await test(SiteWithUsers(site, target, upstream))
    finally:
        await upstream.stop()


async def _make_unknown(f: SiteWithUsers, gid: int, kind: str) -> None:
    f.upstream.set_faults([fault(kind)])
    status, body = await f.site.request(
        "POST", "/api/tasks", token=f.alice, body={"gid": gid, "token": "t"}
    )
    f.upstream.clear_faults()
    assert status == 202 and body["task"]["state"] == "UNKNOWN", body


def _set_wait(f: SiteWithUsers, gid: int, not_before: str | None) -> None:
    connection = raw(f.path)
    try:
        connection.execute(
            "UPDATE task_operation SET verdict_not_before = ? WHERE gid = ?", (not_before, gid)
        )
    finally:
        connection.close()


async def _resolve(
    f: SiteWithUsers, gid: int, verdict: str, note: str | None = None
) -> tuple[int, Any, Any]:
    """``(status, document, headers)`` of one resolve call."""
    body: dict[str, Any] = {"verdict": verdict}
    if note is not None:
        body["note"] = note
    response = await treq.post(
        f"{f.site.base_url}/api/admin/tasks/{gid}/resolve",
        data=json.dumps(body).encode(),
        headers={"Authorization": [f"Bearer {f.admin}"], "Content-Type": ["application/json"]},
        pool=f.site.pool,
    )
    document = json.loads(await treq.content(response))
    return response.code, document, response.headers


async def _evidence(f: SiteWithUsers) -> dict[int, dict[str, Any]]:
    status, listed = await f.site.request("GET", "/api/admin/unknown", token=f.admin)
    assert status == 200
    return {t["gid"]: t["evidence"] for t in listed["tasks"]}


def _state(f: SiteWithUsers, gid: int) -> str | None:
    row = one(f.path, "SELECT state FROM task_operation WHERE gid = ?", gid)
    return None if row is None else row[0]


@pytest_twisted.ensureDeferred
async def test_not_submitted_waits_for_not_before_with_retry_after(db_target):
    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 61, "drop_before")  # the audit: 0 POSTs, no contradiction
        await _make_unknown(f, 62, "drop_before")
        ahead = throughput.iso(time.time() + HOUR)
        _set_wait(f, 61, ahead)
        _set_wait(f, 62, throughput.iso(time.time() - HOUR))
        evidence = await _evidence(f)
        assert evidence[61]["notBefore"] == ahead
        assert HOUR - 120 < evidence[61]["verdictWaitSeconds"] <= HOUR + 1
        assert evidence[62]["verdictWaitSeconds"] == 0

        status, document, headers = await _resolve(f, 61, "not_submitted", "audit says 0")
        assert status == 409, document
        error = document["error"]
        assert error["code"] == "verdict_too_early" and error["notBefore"] == ahead
        assert ahead in error["message"]
        retry_after = int(headers.getRawHeaders("Retry-After")[0])
        assert HOUR - 120 < retry_after <= HOUR + 1
        assert _state(f, 61) == "UNKNOWN"
        assert one(f.path, "SELECT COUNT(*) FROM reconciliation_audit")[0] == 0

        # The wait is past for 62: taken.
        status, document, _ = await _resolve(f, 62, "not_submitted")
        assert status == 200 and document == {"task": None}
        assert _state(f, 62) is None

        # "submitted" is allowed during the wait (with a note: the audit says 0 POSTs).
        status, document, _ = await _resolve(f, 61, "submitted", "upstream support: it arrived")
        assert status == 200 and document["task"]["state"] == "SUBMITTED", document
        assert f.upstream.stats()["postAttempts"] == {"61": 1, "62": 1}

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_no_wait_recorded_lists_null_and_takes_the_verdict(db_target):
    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 63, "drop_before")
        evidence = (await _evidence(f))[63]
        assert evidence["notBefore"] is None and evidence["verdictWaitSeconds"] == 0
        status, document, _ = await _resolve(f, 63, "not_submitted")
        assert status == 200 and document == {"task": None}

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_a_verdict_against_the_audit_needs_a_note(db_target):
    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 71, "commit_then_drop")  # the audit: 1 POST
        await _make_unknown(f, 72, "drop_before")  # the audit: 0 POSTs
        evidence = await _evidence(f)
        assert set(evidence[71]["contradictions"]) == {"not_submitted"}
        assert set(evidence[72]["contradictions"]) == {"submitted"}

        for note in (None, "", "   "):
            status, document, _ = await _resolve(f, 71, "not_submitted", note)
            assert status == 409 and document["error"]["code"] == "note_required", document
        message = document["error"]["message"]
        assert "1 archive POST(s)" in message and "not_submitted" in message
        assert _state(f, 71) == "UNKNOWN"
        status, document, _ = await _resolve(f, 72, "submitted")
        assert status == 409 and document["error"]["code"] == "note_required"
        assert "no archive POST" in document["error"]["message"]
        assert one(f.path, "SELECT COUNT(*) FROM reconciliation_audit")[0] == 0

        status, document, _ = await _resolve(f, 71, "not_submitted", "refunded by the upstream")
        assert status == 200 and document == {"task": None}
        audit = one(f.path, "SELECT note, evidence FROM reconciliation_audit WHERE gid = 71")
        assert audit["note"] == "refunded by the upstream"
        stored = json.loads(audit["evidence"])
        assert stored["contradicts"] is True and "1 archive POST(s)" in stored["contradiction"]
        assert stored["upstream"]["audit"]["submissions"] == 1

        # The verdict the audit supports needs no note, and says it agreed.
        status, document, _ = await _resolve(f, 72, "not_submitted")
        assert status == 200
        audit = one(f.path, "SELECT evidence FROM reconciliation_audit WHERE gid = 72")
        assert json.loads(audit["evidence"])["contradicts"] is False
        assert f.upstream.stats()["postAttempts"] == {"71": 1, "72": 1}

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_an_unavailable_audit_confirms_no_verdict(db_target):
    """Issue 38 (tests/site/test_reconcile_unreadable.py has the rest)."""

    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 81, "commit_then_drop")  # 1 POST, but the audit will not say
        f.upstream.set_faults([fault("error", "GET", AUDIT, status=503, charged=False)])
        evidence = (await _evidence(f))[81]
        assert evidence["upstream"]["available"] is False
        assert set(evidence["contradictions"]) == {"submitted", "not_submitted"}
        status, document, _ = await _resolve(f, 81, "not_submitted")
        assert status == 409 and document["error"]["code"] == "note_required", document
        assert _state(f, 81) == "UNKNOWN"
        status, document, _ = await _resolve(f, 81, "not_submitted", "refunded by the upstream")
        assert status == 200, document
        audit = one(f.path, "SELECT evidence FROM reconciliation_audit WHERE gid = 81")
        stored = json.loads(audit["evidence"])
        assert stored["contradicts"] is True and stored["evidence"] == "unavailable"

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_resolve_error_answers_are_409_with_the_envelope(db_target):
    """The two refusals keep the API's error envelope (code, message)."""

    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 91, "commit_then_drop")
        answer = await f.site.request(
            "POST", "/api/admin/tasks/91/resolve", token=f.admin, body={"verdict": "not_submitted"}
        )
        assert_error(answer, 409, "note_required")
        _set_wait(f, 91, throughput.iso(time.time() + 30))
        answer = await f.site.request(
            "POST",
            "/api/admin/tasks/91/resolve",
            token=f.admin,
            body={"verdict": "not_submitted", "note": "x"},
        )
        assert_error(answer, 409, "verdict_too_early")

    await with_fixture(db_target, test)
