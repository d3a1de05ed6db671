"""The node reporter's timers on ``task.Clock``: debounce, ACK-timeout resend,
retry after an error.  The store is a real SQLite file; the link is a
recorder of what the reporter sends (the loopback TCP tests in
test_reports.py cover the same paths end to end)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from tasknet.node.paths import DataDir
from tasknet.node.reporter import DEBOUNCE, RETRY_AFTER_ERROR, Reporter
from tasknet.node.store import NodeStore
from tasknet.protocol.messages import Message, StatusReport, TaskReport, TaskReportAck
from tasknet.runtime import RealThreadPools, SeededEntropy

ACK_TIMEOUT = 10.0


class RecordingLink:
    """What the reporter needs of a SiteLink; ``fail_sends`` sends raise
    first, as a write to a transport that has just failed would."""

    def __init__(self, protocol_version: int = 2, fail_sends: int = 0) -> None:
        self.protocol_version = protocol_version
        self.sent: list[Message] = []
        self.fail_sends = fail_sends

    def send(self, message: Message) -> None:
        if self.fail_sends:
            self.fail_sends -= 1
            raise ConnectionError("transport gone")
        self.sent.append(message)

    def close(self, reason: str) -> None:
        pass


async def store_with_task(tmp_path: Path, gid: int = 7) -> NodeStore:
    store = NodeStore(
        DataDir(tmp_path / "node"), reactor=reactor, clock=reactor, threads=RealThreadPools()
    )
    await store.create_schema()
    await store.accept_download(gid, f"op-{gid}", f"{gid}.bin", f"http://x/{gid}", 2)
    return store


@asynccontextmanager
async def on_clock(
    tmp_path: Path, *, legacy: bool = False, fail_sends: int = 0
) -> AsyncIterator[tuple[NodeStore, Clock, Reporter, RecordingLink]]:
    """A reporter on a fresh ``task.Clock`` over a store holding one task,
    its link up; stopped (no timer left behind) at the end."""
    store = await store_with_task(tmp_path)
    clock = Clock()
    reporter = Reporter(
        store, legacy_node=legacy, ack_timeout=ACK_TIMEOUT, clock=clock, entropy=SeededEntropy(0)
    )
    link = RecordingLink(protocol_version=1 if legacy else 2, fail_sends=fail_sends)
    try:
        reporter.link_up(link)  # nothing in flight: a change, debounced
        yield store, clock, reporter, link
    finally:
        reporter.stop()
        store.close()
    assert clock.getDelayedCalls() == []


async def advance(clock: Clock, reporter: Reporter, seconds: float) -> None:
    """Move the clock on, then wait for the flush it started (a store thread)."""
    clock.advance(seconds)
    await reporter.idle()


@pytest_twisted.ensureDeferred
async def test_changes_within_the_debounce_make_one_snapshot(tmp_path: Path) -> None:
    async with on_clock(tmp_path) as (store, clock, reporter, link):
        await advance(clock, reporter, DEBOUNCE / 2)
        reporter.changed()
        reporter.changed()
        assert link.sent == [], "nothing is sent before the debounce has passed"
        # The debounce runs from the first change; later ones do not push it on.
        await advance(clock, reporter, DEBOUNCE / 2)
        [report] = link.sent
        assert isinstance(report, TaskReport)
        assert [e.gid for e in report.gallery_tasks] == [7]
        assert report.revision >= 1
        await advance(clock, reporter, DEBOUNCE * 10)
        assert len(link.sent) == 1, "one snapshot in flight; changes wait for its ACK"


@pytest_twisted.ensureDeferred
async def test_an_unacked_report_is_resent_unchanged_after_the_ack_timeout(
    tmp_path: Path,
) -> None:
    async with on_clock(tmp_path) as (store, clock, reporter, link):
        await advance(clock, reporter, DEBOUNCE)
        [first] = link.sent
        await advance(clock, reporter, ACK_TIMEOUT - 0.01)
        assert len(link.sent) == 1, "not resent before the timeout"
        await advance(clock, reporter, 0.01)
        assert link.sent == [first, first], "resent with the same reportId and revision"
        await advance(clock, reporter, ACK_TIMEOUT)
        assert len(link.sent) == 3, "and again while no ACK comes"

        assert isinstance(first, TaskReport)
        await reporter.ack_received(TaskReportAck(first.report_id, "APPLIED"))
        assert reporter.in_flight is None
        await advance(clock, reporter, ACK_TIMEOUT * 3)
        assert len(link.sent) == 3, "an ACKed report is not resent"


@pytest_twisted.ensureDeferred
async def test_a_change_during_the_in_flight_report_is_sent_after_its_ack(
    tmp_path: Path,
) -> None:
    async with on_clock(tmp_path) as (store, clock, reporter, link):
        await advance(clock, reporter, DEBOUNCE)
        [first] = link.sent
        assert isinstance(first, TaskReport)
        await store.set_progress(7, "op-7", 0.5, 100)
        reporter.changed()
        await advance(clock, reporter, DEBOUNCE)
        assert link.sent == [first], "the change waits for the ACK"
        await reporter.ack_received(TaskReportAck(first.report_id, "APPLIED"))
        await advance(clock, reporter, 0)
        [_, second] = link.sent
        assert isinstance(second, TaskReport)
        assert second.report_id != first.report_id
        assert second.revision > first.revision


@pytest_twisted.ensureDeferred
async def test_a_failed_flush_is_retried_after_the_error_delay(tmp_path: Path) -> None:
    async with on_clock(tmp_path, legacy=True, fail_sends=1) as (store, clock, reporter, link):
        await advance(clock, reporter, DEBOUNCE)
        assert link.sent == [] and link.fail_sends == 0, "the first send failed"
        await advance(clock, reporter, RETRY_AFTER_ERROR - 0.01)
        assert link.sent == [], "no retry before RETRY_AFTER_ERROR"
        await advance(clock, reporter, 0.01)
        [status] = link.sent
        assert isinstance(status, StatusReport)
        assert [t.gid for t in status.gallery_tasks] == [7]
