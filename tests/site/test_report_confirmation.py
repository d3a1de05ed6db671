"""A report carries its connection's hold on its node and is judged against
it once, in its own transaction, on both backends (``storage/reports.py``,
``NOT_HELD``).  A report waiting for its holding (its session's take not
yet committed) is in flight: the pipeline's ``idle()`` (what a stopping
site waits for before closing node connections) waits for it, and it is
applied and ACKed once held, or refused without a write."""

from __future__ import annotations

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred

from tasknet.protocol.messages import TaskReport
from tasknet.site.report_pipeline import ReportPipeline
from tasknet.site.storage import node_sessions
from tasknet.site.storage.engine.database import Database, open_pool
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.node_sessions import Holding
from tests.runtime import site_runtime
from tests.site.helpers import RecordingSession, query


async def _take(db: Database, node_id: str = "n1") -> Holding:
    taken = await db.write(
        node_sessions.take, node_id, None, "test-site", 2, (), "2026-01-01T00:00:00Z"
    )
    return taken.holding


async def _report(target: str, holds: str) -> tuple[RecordingSession, list[str]]:
    """Submit a report whose holding is pending, check that the pipeline is
    busy until it fires, fire it and wait for idle: the session (its ACKs)
    and the refusals.  ``holds``: ``"its take"`` (the holding of a take of
    its node), ``"nothing"`` (``None``: its take failed, or it was replaced),
    ``"a taken node"`` (its take, and a newer take of the node committed
    before the report's transaction: a login here or at another site)."""
    db = open_pool(target, **site_runtime())
    try:
        pipeline = ReportPipeline(db, clock=reactor)
        session = RecordingSession("n1")
        pending: Deferred[Holding | None] = Deferred()
        refusals: list[str] = []
        report = TaskReport("r-1", 1000, (), {}, ())
        pipeline.submit(session, report, pending, refused=lambda: refusals.append("r-1"))
        idle = pipeline.idle()
        assert not idle.called  # still waiting for its holding: a stop must wait
        holding = None if holds == "nothing" else await _take(db)
        if holds == "a taken node":
            await _take(db)
        pending.callback(holding)
        await idle
    finally:
        db.close()
    return session, refusals


def _receipts(target: str) -> list[str]:
    return [row[0] for row in query(target, "SELECT report_id FROM report_receipt")]


@pytest_twisted.ensureDeferred
async def test_a_report_waiting_for_its_holding_keeps_the_pipeline_busy_until_it_is_acked(
    db_target: str,
) -> None:
    prepare_database(db_target)
    session, refusals = await _report(db_target, "its take")
    assert session.acks == [("r-1", "APPLIED")]
    assert refusals == []
    assert _receipts(db_target) == ["r-1"]


@pytest_twisted.ensureDeferred
async def test_a_session_that_holds_nothing_has_its_report_refused_without_a_write(
    db_target: str,
) -> None:
    prepare_database(db_target)
    session, refusals = await _report(db_target, "nothing")
    assert refusals == ["r-1"]
    assert session.acks == []
    assert _receipts(db_target) == []


@pytest_twisted.ensureDeferred
async def test_a_holding_taken_since_is_refused_in_the_reports_own_transaction(
    db_target: str,
) -> None:
    prepare_database(db_target)
    session, refusals = await _report(db_target, "a taken node")
    assert refusals == ["r-1"]
    assert session.acks == []
    assert _receipts(db_target) == []  # not even its receipt: the node sends it again
