"""Issue 38, Build 1: a verdict with no readable evidence is treated as a
contradicting one, by API and by ``tasknet-admin`` (either backend, the
real site, the real mock upstream with its audit answering ``503``).

Before: with ``GET /api/galleries/*/archive`` failing, ``not_submitted``
without a note answered ``200 {"task": null}`` and the audit row said
``"contradicts": false`` (the gid re-opened although the upstream had
counted its POST); ``tasknet-admin resolve`` read the audit from
``127.0.0.1:7200`` (its own default, not the site's upstream) and exited 0.
After: refused ``409 note_required`` (exit 1) changing nothing; with a note
taken, the audit row saying ``"evidence": "unavailable"`` and why; the CLI
reads the audit from the upstream the site recorded at its start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet.threads import deferToThread

from tasknet.process import free_port
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import SiteWithUsers, fault, one, running_site, site_options

AUDIT = "/api/galleries/*/archive"


async def with_fixture(target: str, test: Any) -> None:
    upstream = await start_upstream()
    try:
        async with running_site(site_options(target, upstream.base_url, "--demo")) as site:
            await test(SiteWithUsers(site, target, upstream))
    finally:
        await upstream.stop()


async def _make_unknown(f: SiteWithUsers, gid: int) -> None:
    """The POST counted upstream, its answer lost: UNKNOWN, 1 submission."""
    f.upstream.set_faults([fault("commit_then_drop")])
    status, body = await f.site.request(
        "POST", "/api/tasks", token=f.alice, body={"gid": gid, "token": "t"}
    )
    f.upstream.clear_faults()
    assert status == 202 and body["task"]["state"] == "UNKNOWN", body


def _audit_fails(f: SiteWithUsers) -> None:
    f.upstream.set_faults([fault("error", "GET", AUDIT, status=503, charged=False)])


def _state(f: SiteWithUsers, gid: int) -> str | None:
    row = one(f.path, "SELECT state FROM task_operation WHERE gid = ?", gid)
    return None if row is None else row[0]


def _audits(f: SiteWithUsers) -> int:
    return int(one(f.path, "SELECT COUNT(*) FROM reconciliation_audit")[0])


@pytest_twisted.ensureDeferred
async def test_api_a_verdict_without_readable_evidence_needs_a_note(db_target):
    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 6003)
        _audit_fails(f)
        status, listed = await f.site.request("GET", "/api/admin/unknown", token=f.admin)
        assert status == 200
        (task,) = listed["tasks"]
        assert task["evidence"]["upstream"]["available"] is False
        # Both verdicts now need a note, and the list says why.
        against = task["evidence"]["contradictions"]
        assert set(against) == {"submitted", "not_submitted"}
        assert "no readable evidence" in against["not_submitted"]

        for verdict in ("not_submitted", "submitted"):
            for note in (None, "", "  "):
                body = {"verdict": verdict} | ({"note": note} if note is not None else {})
                status, document = await f.site.request(
                    "POST", "/api/admin/tasks/6003/resolve", token=f.admin, body=body
                )
                assert status == 409, document
                assert document["error"]["code"] == "note_required"
                message = document["error"]["message"]
                assert "no readable evidence" in message and "503" in message
        assert _state(f, 6003) == "UNKNOWN" and _audits(f) == 0

        status, document = await f.site.request(
            "POST",
            "/api/admin/tasks/6003/resolve",
            token=f.admin,
            body={"verdict": "submitted", "note": "upstream support confirmed the POST"},
        )
        assert status == 200 and document["task"]["state"] == "SUBMITTED", document
        stored = json.loads(
            one(f.path, "SELECT evidence FROM reconciliation_audit WHERE gid = 6003")[0]
        )
        assert stored["evidence"] == "unavailable"
        assert "503" in stored["evidenceError"]
        assert stored["contradicts"] is True and "no readable evidence" in stored["contradiction"]
        assert f.upstream.stats()["postAttempts"] == {"6003": 1}

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_api_a_readable_audit_is_recorded_as_read(db_target):
    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 6005)  # the audit: 1 POST, "submitted" agrees
        status, document = await f.site.request(
            "POST", "/api/admin/tasks/6005/resolve", token=f.admin, body={"verdict": "submitted"}
        )
        assert status == 200, document
        stored = json.loads(
            one(f.path, "SELECT evidence FROM reconciliation_audit WHERE gid = 6005")[0]
        )
        assert stored["evidence"] == "read" and stored["contradicts"] is False
        assert "evidenceError" not in stored

    await with_fixture(db_target, test)


def _admin(db: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``tasknet-admin`` as a real process (it runs its own reactor)."""
    script = Path(sys.executable).with_name("tasknet-admin")
    return subprocess.run(
        [str(script), "--db", db, "--audit-timeout", "5", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _run(db: str, *argv: str) -> subprocess.CompletedProcess[str]:
    # In a thread, so the in-process site and upstream keep answering.
    return await deferToThread(_admin, db, *argv)


@pytest_twisted.ensureDeferred
async def test_cli_reads_the_sites_upstream_and_refuses_without_a_note(db_target):
    async def test(f: SiteWithUsers) -> None:
        await _make_unknown(f, 6004)
        # No --upstream: the audit comes from the site's upstream (1 POST recorded).
        result = await _run(f.path, "unknown", "--json")
        assert result.returncode == 0, result.stderr
        (task,) = json.loads(result.stdout)["tasks"]
        assert task["evidence"]["upstream"]["audit"]["submissions"] == 1

        _audit_fails(f)
        result = await _run(f.path, "resolve", "6004", "not_submitted")
        assert result.returncode == 1, result
        assert "no readable evidence" in result.stderr and "--note" in result.stderr
        assert "503" in result.stderr
        assert _state(f, 6004) == "UNKNOWN" and _audits(f) == 0

        # Refused the same when the upstream cannot be reached at all.
        closed = f"http://127.0.0.1:{free_port()}"
        result = await _run(f.path, "--upstream", closed, "resolve", "6004", "submitted")
        assert result.returncode == 1 and "no readable evidence" in result.stderr, result
        assert _state(f, 6004) == "UNKNOWN" and _audits(f) == 0

        result = await _run(
            f.path, "resolve", "6004", "submitted", "--note", "the upstream's invoice shows it"
        )
        assert result.returncode == 0, result.stderr
        assert "warning: the upstream's audit could not be read" in result.stderr
        assert "on your note alone" in result.stderr
        assert _state(f, 6004) == "SUBMITTED"
        stored = json.loads(
            one(f.path, "SELECT evidence FROM reconciliation_audit WHERE gid = 6004")[0]
        )
        assert stored["evidence"] == "unavailable" and "503" in stored["evidenceError"]
        assert f.upstream.stats()["postAttempts"] == {"6004": 1}

    await with_fixture(db_target, test)


def test_cli_without_a_recorded_upstream_asks_for_one(tmp_path):
    """A database no site of this version started on: no silent default."""
    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    result = _admin(path, "unknown")
    assert result.returncode == 1
    assert "records no upstream" in result.stderr and "--upstream" in result.stderr
