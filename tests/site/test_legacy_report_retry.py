"""A legacy report the site read but could not commit is tried again by the
site: no legacy node ever sends it again (it forgets a finished task once
its status is on the wire), so the site holds the only copy
(``report_pipeline.py``; found by the simulator, seeds 445 and 795).  The
database fails the report's first commits with the driver's own error, on
both backends; the pipeline's backoff runs on a ``task.Clock``."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet.task import Clock

from tasknet.protocol.messages import DeleteResult, StatusReport, TaskEntry
from tasknet.site.report_pipeline import LEGACY_RETRY_FIRST, ReportPipeline
from tasknet.site.storage import delete
from tasknet.site.storage.engine.database import connect, open_pool, run_write
from tests.backends import FailingCommits
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import RecordingSession, one, settle
from tests.site_protocol.harness import add_task, add_user


def _task_on_n1(conn: Any, gid: int, status: int) -> None:
    user_id, _ = add_user(conn, f"u{gid}")
    add_task(conn, gid, user_id, node_id="n1", status=status)


async def _submit_failing(
    target: str, message: Any, commits_failing: int
) -> tuple[ReportPipeline, Clock, Any]:
    clock = Clock()
    faults = FailingCommits(target, commits_failing)
    db = open_pool(target, storage_faults=faults, **site_runtime())
    pipeline = ReportPipeline(db, clock=clock)
    done: list[object] = []
    pipeline.submit(RecordingSession("n1"), message).addBoth(done.append)
    await _answered(pipeline, done)
    return pipeline, clock, (db, done)


async def _answered(pipeline: ReportPipeline, done: list[object]) -> None:
    """Until the report is answered or waits on the clock to be tried again."""
    await eventually(
        lambda: done or pipeline.legacy_retries_waiting, what="report answered or waiting"
    )


async def _advance_until(
    pipeline: ReportPipeline, clock: Clock, done: list[object], seconds: float
) -> None:
    waited = 0.0
    while not done and waited < seconds:
        clock.advance(1.0)
        waited += 1.0
        await _answered(pipeline, done)


@pytest_twisted.ensureDeferred
async def test_a_legacy_completion_that_failed_to_commit_lands_on_a_later_try(
    conn: Any, db_target: str
) -> None:
    _task_on_n1(conn, 101, 1)
    report = StatusReport((TaskEntry(101, 4, 1.0),))
    pipeline, clock, (db, done) = await _submit_failing(db_target, report, commits_failing=3)
    try:
        assert not done  # waiting to be tried again: in flight
        assert pipeline.reports_failed == 1
        assert one(db_target, "SELECT status FROM gallery WHERE gid = 101")[0] == 1
        await _advance_until(pipeline, clock, done, 60)
        assert done
        assert pipeline.reports_failed == 3 and pipeline.reports_committed == 1
        assert one(db_target, "SELECT status FROM gallery WHERE gid = 101")[0] == 4
    finally:
        db.close()


@pytest_twisted.ensureDeferred
async def test_a_legacy_delete_result_that_failed_to_commit_lands_on_a_later_try(
    conn: Any, db_target: str
) -> None:
    _task_on_n1(conn, 102, 4)
    started = connect(db_target)
    try:
        run_write(started, delete.request_delete, 102, None)
    finally:
        started.close()
    pipeline, clock, (db, done) = await _submit_failing(
        db_target, DeleteResult(102, True, ""), commits_failing=1
    )
    try:
        assert not done
        await _advance_until(pipeline, clock, done, LEGACY_RETRY_FIRST)  # the first try: 1 s on
        assert done
        assert one(db_target, "SELECT state FROM task_operation WHERE gid = 102")[0] == "DELETED"
    finally:
        db.close()


@pytest_twisted.ensureDeferred
async def test_progress_alone_is_not_tried_again_and_a_stop_gives_retries_up(
    conn: Any, db_target: str
) -> None:
    _task_on_n1(conn, 103, 1)
    _task_on_n1(conn, 104, 1)
    # Only progress: the node's next snapshot says it again.
    progress = StatusReport((TaskEntry(103, 3, 0.5),))
    pipeline, clock, (db, done) = await _submit_failing(db_target, progress, commits_failing=1)
    try:
        assert done and pipeline.reports_failed == 1
    finally:
        db.close()
    # A completion waiting to be tried again is given up at the stop.
    completion = StatusReport((TaskEntry(104, 4, 1.0),))
    pipeline, clock, (db, done) = await _submit_failing(db_target, completion, commits_failing=1)
    try:
        idle = pipeline.idle()
        assert not idle.called
        pipeline.stop_retrying()
        assert idle.called and done
        assert pipeline.legacy_retries_waiting == 0
        clock.advance(LEGACY_RETRY_FIRST * 10)
        await settle()
        assert one(db_target, "SELECT status FROM gallery WHERE gid = 104")[0] == 1
    finally:
        db.close()
