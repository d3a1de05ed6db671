"""tasknet.startup: the exit status of a twistd process, and a stop that
cannot hold up an exit that has a deadline (a fenced site's)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from twisted.internet.testing import MemoryReactor

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


def test_a_fenced_site_exits_within_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCALE.md "Database failover" 3: a site fenced by a primary that is
    cut off (its sessions hang, no RST) exits within seconds, its stop
    done or not, so that its supervisor restarts it well within 45 s."""
    asked: list[tuple[int, float | None]] = []
    answered: list[str] = []
    monkeypatch.setattr(
        service,
        "exit_after_stop",
        lambda reactor, status, deadline=None: asked.append((status, deadline)),
    )
    site = SimpleNamespace(
        parts=SimpleNamespace(lifecycle=SimpleNamespace(answer_in_flight=answered.append)),
        exit_on_failure=True,
        _reactor=MemoryReactor(),
    )
    service.SiteService._fenced(site, "the lease check did not answer")  # type: ignore[arg-type]
    assert answered == ["this site lost its lease (the lease check did not answer)"]
    assert asked == [(1, service.FENCED_EXIT_DEADLINE)]
    assert 0 < service.FENCED_EXIT_DEADLINE <= 10
