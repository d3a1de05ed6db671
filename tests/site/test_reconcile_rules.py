"""The two rules that guard a reconciliation verdict (storage layer, real
databases, either backend; ``tasknet/site/storage/reconcile.py``):

* the verdict wait (SCALE.md "Fencing" 2): ``not_submitted`` for an
  ``UNKNOWN`` whose ``verdict_not_before`` is still ahead by the database's
  clock is refused (``verdict_too_early``, with the moment); ``submitted``
  is allowed at any time;
* a verdict the upstream's audit contradicts needs a note
  (``note_required``), and its audit row says it contradicted the evidence;
  so does a verdict with no readable audit (issue 38: nothing confirms it),
  and its audit row says ``"evidence": "unavailable"`` and why.

The tests set ``verdict_not_before`` in the row directly (a reap writes it in
the product), to a moment an hour ahead or an hour behind."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tasknet.site.storage import create, reconcile, throughput, usage, users
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.errors import TaskError

GID = 4711
HOUR = 3600.0


def _unknown(conn: sqlite3.Connection, gid: int = GID, *, not_before: str | None = None) -> str:
    """A task left UNKNOWN by its POST (the lifecycle's own transactions),
    with ``verdict_not_before`` set as a reap would."""
    uid = dbmod.run_write(conn, lambda c: users.create_user(c, f"user-{gid}"))[0].id
    week = usage.iso_week()
    op = dbmod.run_write(conn, create.reserve, gid, uid, "", "tok", week)
    assert dbmod.run_write(conn, create.begin_submit, gid, op, 5, f"title {gid}", week)
    assert dbmod.run_write(conn, create.mark_unknown, gid, op, "submit", "timed out")
    if not_before is not None:
        dbmod.run_write(
            conn,
            lambda c: c.execute(
                "UPDATE task_operation SET verdict_not_before = ? WHERE gid = ?", (not_before, gid)
            ),
        )
    return op


def _resolve(
    conn: sqlite3.Connection,
    verdict: str,
    note: str = "",
    evidence: dict[str, Any] | None = None,
    gid: int = GID,
) -> Any:
    return dbmod.run_write(
        conn, reconcile.resolve_unknown, gid, verdict, "ops", note, evidence, None
    )


def _state(conn: sqlite3.Connection, gid: int = GID) -> str | None:
    row = conn.execute("SELECT state FROM task_operation WHERE gid = ?", (gid,)).fetchone()
    return None if row is None else row[0]


def _audits(conn: sqlite3.Connection, gid: int = GID) -> list[Any]:
    return conn.execute(
        "SELECT verdict, note, evidence FROM reconciliation_audit WHERE gid = ? ORDER BY id",
        (gid,),
    ).fetchall()


def _audit(submissions: int | None, *, available: bool = True) -> dict[str, Any]:
    """Evidence as the lifecycle hands it over: the upstream's audit answer."""
    if not available:
        return {"upstream": {"available": False, "error": "upstream audit unavailable: down"}}
    return {
        "upstream": {
            "available": True,
            "audit": {"submissions": submissions, "lastAt": "2026-01-02T03:04:05.000Z"},
        }
    }


# -- the verdict wait ---------------------------------------------------------------------


def test_not_submitted_before_the_wait_ends_is_refused_and_changes_nothing(conn):
    ahead = throughput.iso(time.time() + HOUR)
    _unknown(conn, not_before=ahead)
    with pytest.raises(reconcile.VerdictTooEarly) as refused:
        _resolve(conn, "not_submitted", "audit says 0", _audit(0))
    error = refused.value
    assert isinstance(error, TaskError) and error.code == reconcile.VERDICT_TOO_EARLY
    assert error.not_before == ahead and ahead in error.message
    assert HOUR - 120 < error.wait <= HOUR
    assert HOUR - 120 < error.retry_after <= HOUR + 1
    assert _state(conn) == "UNKNOWN" and _audits(conn) == []


def test_submitted_is_allowed_during_the_wait(conn):
    _unknown(conn, not_before=throughput.iso(time.time() + HOUR))
    view = _resolve(conn, "submitted", "audit: 1 POST", _audit(1))
    assert view is not None and view["state"] == "SUBMITTED"
    assert [a["verdict"] for a in _audits(conn)] == ["submitted"]


def test_not_submitted_after_the_wait_is_taken(conn):
    _unknown(conn, not_before=throughput.iso(time.time() - HOUR))
    assert _resolve(conn, "not_submitted", "", _audit(0)) is None
    assert _state(conn) is None
    (audit,) = _audits(conn)
    assert audit["verdict"] == "not_submitted"


def test_no_wait_recorded_means_no_wait(conn):
    _unknown(conn)
    assert _resolve(conn, "not_submitted", "", _audit(0)) is None
    assert _state(conn) is None


def test_now_is_the_database_clock(conn):
    """The wait is judged by the database's clock, read in the deciding
    transaction: a moment just behind the database's now passes, one just
    ahead of it does not."""
    _unknown(conn, GID, not_before="2000-01-01T00:00:00.000Z")
    _unknown(conn, GID + 1, not_before="2999-01-01T00:00:00.000Z")
    assert _resolve(conn, "not_submitted", evidence=_audit(0), gid=GID) is None
    with pytest.raises(reconcile.VerdictTooEarly) as refused:
        _resolve(conn, "not_submitted", evidence=_audit(0), gid=GID + 1)
    assert refused.value.not_before == "2999-01-01T00:00:00.000Z"
    database_now = reconcile._database_now(conn.cursor())
    seconds = (datetime(2999, 1, 1, tzinfo=UTC) - database_now).total_seconds()
    assert abs(refused.value.wait - seconds) < 60


def test_the_list_shows_when_not_submitted_becomes_possible(conn):
    ahead = throughput.iso(time.time() + HOUR)
    _unknown(conn, GID, not_before=ahead)
    _unknown(conn, GID + 1, not_before=throughput.iso(time.time() - HOUR))
    _unknown(conn, GID + 2)
    listed = {t["gid"]: t["evidence"] for t in dbmod.run_read(conn, reconcile.unknown_operations)}
    assert listed[GID]["notBefore"] == ahead
    assert HOUR - 120 < listed[GID]["verdictWaitSeconds"] <= HOUR + 1
    assert listed[GID + 1]["notBefore"] is not None
    assert listed[GID + 1]["verdictWaitSeconds"] == 0
    assert listed[GID + 2]["notBefore"] is None and listed[GID + 2]["verdictWaitSeconds"] == 0


def test_a_repeat_after_the_verdict_is_not_held_by_the_wait(conn):
    """The same verdict again answers the same, whatever is stored."""
    _unknown(conn, not_before=throughput.iso(time.time() - 1))
    assert _resolve(conn, "not_submitted", evidence=_audit(0)) is None
    assert _resolve(conn, "not_submitted") is None


# -- a verdict against the evidence ---------------------------------------------------------


def test_not_submitted_against_recorded_posts_needs_a_note(conn):
    _unknown(conn)
    with pytest.raises(TaskError) as refused:
        _resolve(conn, "not_submitted", "  ", _audit(2))
    assert refused.value.code == reconcile.NOTE_REQUIRED
    assert "2 archive POST(s)" in refused.value.message
    assert "2026-01-02T03:04:05.000Z" in refused.value.message
    assert _state(conn) == "UNKNOWN" and _audits(conn) == []
    assert _resolve(conn, "not_submitted", "charged by mistake, refunded", _audit(2)) is None
    (audit,) = _audits(conn)
    assert audit["note"] == "charged by mistake, refunded"
    evidence = json.loads(audit["evidence"])
    assert evidence["contradicts"] is True
    assert "2 archive POST(s)" in evidence["contradiction"]
    assert evidence["upstream"]["audit"]["submissions"] == 2


def test_submitted_against_an_audit_of_no_post_needs_a_note(conn):
    _unknown(conn)
    with pytest.raises(TaskError) as refused:
        _resolve(conn, "submitted", "", _audit(0))
    assert refused.value.code == reconcile.NOTE_REQUIRED
    assert "no archive POST" in refused.value.message
    view = _resolve(conn, "submitted", "upstream support confirmed it", _audit(0))
    assert view is not None and view["state"] == "SUBMITTED"
    assert json.loads(_audits(conn)[0]["evidence"])["contradicts"] is True


@pytest.mark.parametrize(
    ("verdict", "evidence"),
    [
        ("not_submitted", _audit(0)),
        ("submitted", _audit(1)),
    ],
)
def test_no_contradiction_needs_no_note(conn, verdict, evidence):
    _unknown(conn)
    _resolve(conn, verdict, "", evidence)
    (audit,) = _audits(conn)
    stored = json.loads(audit["evidence"])
    assert stored["contradicts"] is False and "contradiction" not in stored
    assert stored["evidence"] == "read" and "evidenceError" not in stored


@pytest.mark.parametrize("verdict", ["not_submitted", "submitted"])
@pytest.mark.parametrize(
    ("evidence", "why"),
    [
        (_audit(3, available=False), "upstream audit unavailable: down"),
        (_audit(None), "no usable 'submissions' count"),  # an audit that says nothing usable
        ({}, "was not read"),
        (None, "was not read"),
    ],
)
def test_no_readable_evidence_needs_a_note(conn, verdict, evidence, why):
    """Issue 38: an audit that could not be read confirms no verdict (before,
    it "contradicted nothing" and a 503 re-opened a charged gid)."""
    _unknown(conn)
    with pytest.raises(TaskError) as refused:
        _resolve(conn, verdict, " ", evidence)
    assert refused.value.code == reconcile.NOTE_REQUIRED
    assert "no readable evidence" in refused.value.message and why in refused.value.message
    assert _state(conn) == "UNKNOWN" and _audits(conn) == []
    _resolve(conn, verdict, "the upstream's support answered by mail", evidence)
    (audit,) = _audits(conn)
    stored = json.loads(audit["evidence"])
    assert stored["evidence"] == "unavailable" and why in stored["evidenceError"]
    assert stored["contradicts"] is True and "no readable evidence" in stored["contradiction"]


def test_the_wait_is_judged_before_the_note(conn):
    """A note cannot make a too-early verdict possible."""
    _unknown(conn, not_before=throughput.iso(time.time() + HOUR))
    with pytest.raises(reconcile.VerdictTooEarly):
        _resolve(conn, "not_submitted", "", _audit(1))
    with pytest.raises(reconcile.VerdictTooEarly):
        _resolve(conn, "not_submitted", "I am sure", _audit(1))


def test_contradictions_by_verdict():
    assert set(reconcile.contradictions(7, _audit(1))) == {"not_submitted"}
    assert set(reconcile.contradictions(7, _audit(0))) == {"submitted"}
    unreadable = set(reconcile.VERDICTS)
    assert set(reconcile.contradictions(7, _audit(1, available=False))) == unreadable
    assert set(reconcile.contradictions(7, {})) == unreadable


def test_the_audits_last_post_is_named_in_iso_8601():
    """Our mock answers ``lastAt`` in unix seconds; the message names it as
    the site names every moment."""
    evidence = _audit(1)
    evidence["upstream"]["audit"]["lastAt"] = 1_796_000_000.25
    why = reconcile.contradiction(7, "not_submitted", evidence)
    assert why is not None and "the last at 2026-11-30T" in why and why.count(".250Z") == 1


def test_without_a_readable_audit_a_stored_post_answer_confirms_submitted():
    """The POST's own answer (stored when its persist failed) is the one
    evidence left when the audit cannot be read: it confirms ``submitted``
    and stands against ``not_submitted``."""
    down = _audit(1, available=False)
    assert reconcile.contradiction(7, "submitted", down, posted=True) is None
    against = reconcile.contradiction(7, "not_submitted", down, posted=True)
    assert against is not None and "POST's answer is stored" in against
    listed = {**down, "archiveUrlSource": "submit"}
    assert set(reconcile.contradictions(7, listed)) == {"not_submitted"}
