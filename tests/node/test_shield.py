"""``tasknet.deferreds.shield``: the worker waits on compression threads through it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import LogEvent, globalLogPublisher

from tasknet.deferreds import shield
from tasknet.node.compress import CompressionAborted


@pytest.fixture
def logged_failures() -> Iterator[list[LogEvent]]:
    events: list[LogEvent] = []

    def record(event: LogEvent) -> None:
        if "log_failure" in event:
            events.append(event)

    observer: Any = record  # Any: a plain callable provides ILogObserver
    globalLogPublisher.addObserver(observer)
    yield events
    globalLogPublisher.removeObserver(observer)


def outcome(d: Deferred[Any]) -> list[Any]:
    seen: list[Any] = []
    d.addBoth(seen.append)
    return seen


def test_the_result_and_the_failure_pass_through() -> None:
    ok: Deferred[int] = Deferred()
    bad: Deferred[int] = Deferred()
    got_ok, got_bad = outcome(shield(ok)), outcome(shield(bad))
    ok.callback(7)
    bad.errback(OSError("disk full"))
    assert got_ok == [7]
    assert got_bad[0].check(OSError)


def test_cancelling_the_follower_leaves_the_source_running() -> None:
    source: Deferred[int] = Deferred()
    follower = shield(source)
    got = outcome(follower)
    follower.cancel()
    assert got[0].check(CancelledError)
    assert not source.called  # still running: its owner decides when it ends
    source.callback(1)
    assert outcome(source) == [None]  # consumed: nothing unhandled is left on it


def test_a_late_failure_is_logged_unless_expected(logged_failures: list[LogEvent]) -> None:
    unexpected: Deferred[int] = Deferred()
    expected: Deferred[int] = Deferred()
    for source in (unexpected, expected):
        follower = shield(source, expected=(CompressionAborted,))
        outcome(follower)
        follower.cancel()
    unexpected.errback(OSError("disk full"))
    expected.errback(CompressionAborted("archive"))
    assert [e["log_failure"].type for e in logged_failures] == [OSError]
    assert outcome(unexpected) == [None] and outcome(expected) == [None]
