"""RateLimitedLog on a task.Clock: one line per key per interval, counts, bounded keys."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, formatEvent

from tasknet.protocol.ratelog import OVERFLOW_KEY, RateLimitedLog


class Lines:
    """A Logger observer that keeps the events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def texts(self) -> list[str]:
        return [formatEvent(e) for e in self.events]


def rate_log(interval: float = 60.0, max_keys: int = 1000) -> tuple[RateLimitedLog, Clock, Lines]:
    lines, clock = Lines(), Clock()
    log = RateLimitedLog(
        Logger(namespace="test", observer=lines), clock, interval=interval, max_keys=max_keys
    )
    return log, clock, lines


def test_a_steady_flood_is_one_line_per_interval_with_the_count() -> None:
    log, clock, lines = rate_log()
    for _ in range(180):  # one a second for three minutes
        log.emit("k", "refused {who}", who="node-1")
        clock.advance(1)
    assert lines.texts() == [
        "refused node-1",
        "refused node-1 (59 more since the last line)",
        "refused node-1 (59 more since the last line)",
    ]
    assert [e["repeats"] for e in lines.events] == [0, 59, 59]
    assert {e["log_level"] for e in lines.events} == {LogLevel.warn}


def test_keys_are_limited_separately_and_a_quiet_key_logs_at_once() -> None:
    log, clock, lines = rate_log(interval=10)
    log.emit(("a", "host"), "a")
    log.emit(("b", "host"), "b")
    log.emit(("a", "host"), "a")
    clock.advance(10)
    log.emit(("b", "host"), "b")  # its interval is over, and it dropped nothing
    assert lines.texts() == ["a", "b", "b"]
    assert lines.events[-1]["repeats"] == 0


def test_distinct_keys_beyond_the_bound_share_one_overflow_key() -> None:
    log, clock, lines = rate_log(interval=10, max_keys=2)
    for n in range(100):  # a flood of distinct keys (node ids, hosts)
        log.emit(n, "event {n}", n=n)
    assert lines.texts() == ["event 0", "event 1", "event 2"]  # 2: the overflow key's first
    assert set(log._windows) == {0, 1, OVERFLOW_KEY}
    clock.advance(10)
    log.emit(500, "event {n}", n=500)  # expired keys are forgotten before overflowing
    assert lines.texts()[-1] == "event 500"
    assert set(log._windows) == {500}
