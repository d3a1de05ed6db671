"""A report waiting for its ownership confirmation is in flight: the
pipeline's ``idle()`` (what a stopping site waits for before closing node
connections) waits for it, and it is applied and ACKed once confirmed, or
refused without a write."""

from __future__ import annotations

import pytest_twisted
from twisted.internet.defer import Deferred

from tasknet.protocol.messages import TaskReport
from tasknet.site.report_pipeline import ReportPipeline
from tasknet.site.storage.engine.database import open_pool
from tasknet.site.storage.engine.schema import prepare_database
from tests.site.helpers import RecordingSession, query


async def _confirm(tmp_path, held: bool) -> tuple[RecordingSession, list[str], str]:
    """Submit a report whose confirmation is pending, check that the
    pipeline is busy until it is decided, decide it (``held``) and wait for
    idle: the session (its ACKs), the refusals, the database path."""
    path = str(tmp_path / "site.sqlite")
    prepare_database(path)
    db = open_pool(path)
    try:
        pipeline = ReportPipeline(db)
        session = RecordingSession("n1")
        confirmed: Deferred[bool] = Deferred()
        refusals: list[str] = []
        report = TaskReport("r-1", 1000, (), {}, ())
        pipeline.submit_when(confirmed, session, report, refused=lambda: refusals.append("r-1"))
        idle = pipeline.idle()
        assert not idle.called  # still being confirmed: a stop must wait
        confirmed.callback(held)
        await idle
    finally:
        db.close()
    return session, refusals, path


def _receipts(path: str) -> list[str]:
    return [row[0] for row in query(path, "SELECT report_id FROM report_receipt")]


@pytest_twisted.ensureDeferred
async def test_a_report_being_confirmed_keeps_the_pipeline_busy_until_it_is_acked(
    tmp_path,
) -> None:
    session, refusals, path = await _confirm(tmp_path, held=True)
    assert session.acks == [("r-1", "APPLIED")]
    assert refusals == []
    assert _receipts(path) == ["r-1"]


@pytest_twisted.ensureDeferred
async def test_a_refused_report_is_not_applied_and_ends_the_wait(tmp_path) -> None:
    session, refusals, path = await _confirm(tmp_path, held=False)
    assert refusals == ["r-1"]
    assert session.acks == []
    assert _receipts(path) == []
