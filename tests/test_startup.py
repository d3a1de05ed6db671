"""tasknet.startup: the exit status of a twistd process, and a stop that
cannot hold up an exit that has a deadline (a fenced site's)."""

from __future__ import annotations

import threading

import pytest

from tasknet import startup
from tasknet.site import service


class FakeReactor:
    running = True

    def __init__(self) -> None:
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1

    def callWhenRunning(self, fn: object) -> None:  # noqa: N802 - Twisted's name
        raise AssertionError("the reactor runs")


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """os._exit calls recorded instead of made; nothing left registered."""
    calls: list[int] = []
    monkeypatch.setattr(startup, "_exit_status", None)
    monkeypatch.setattr(startup.atexit, "register", lambda fn: fn)
    monkeypatch.setattr(startup.os, "_exit", calls.append)
    return calls


def test_a_stop_held_up_past_the_deadline_still_ends_the_process(exits: list[int]) -> None:
    reactor = FakeReactor()
    timer = startup.exit_after_stop(reactor, 1, deadline=0.05)  # type: ignore[arg-type]
    assert reactor.stopped == 1 and timer is not None and timer.daemon
    timer.join(5)
    assert exits == [1]


def test_without_a_deadline_only_the_stop_ends_it(exits: list[int]) -> None:
    reactor = FakeReactor()
    assert startup.exit_after_stop(reactor, 1) is None  # type: ignore[arg-type]
    assert reactor.stopped == 1 and exits == []
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


def test_a_fenced_site_has_a_deadline_of_seconds() -> None:
    # SCALE.md "Database failover" 3: restarted well within 45 s, after the
    # lease check that noticed (tasknet-drill --db postgres-ha --netns S24
    # measures the whole: a site fenced by a primary cut off exits in time).
    assert 0 < service.FENCED_EXIT_DEADLINE <= 10
