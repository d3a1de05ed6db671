"""A node whose login is refused backs off exponentially, and starts again
from the first delay after a successful login (issue 14).

The node's real link service dials the real site listener in memory
(``MemoryNet``, tests/protocol/memory.py: iosim and one clock for both
sides), so each retry delay is read off the clock exactly and every step is
seen when it happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.application.internet import backoffPolicy

from tasknet.node import link
from tasknet.node.link import SiteClientService, SiteLinkFactory
from tests.protocol.memory import MemoryNet
from tests.protocol.peers import SITE_KEYS, NodeRecorder, SiteRecorder


class Setup:
    def __init__(self) -> None:
        self.net = MemoryNet()
        self.clock = self.net.clock
        self.site_handler = SiteRecorder()
        self.site, self.port = self.net.site(self.site_handler)
        self.node = NodeRecorder()
        self.service: SiteClientService | None = None

    def start(self, secret: str, **kwargs: Any) -> SiteClientService:
        self.service = self.net.node(self.port, self.node, secret=secret, **kwargs)
        return self.service

    @property
    def factory(self) -> SiteLinkFactory:
        assert self.service is not None
        return self.service.link_factory

    def retry_delay(self) -> float:
        """The delay of the one retry now scheduled on the node's clock."""
        (call,) = self.clock.getDelayedCalls()
        return call.getTime() - self.clock.seconds()

    def refused(self, count: int) -> None:
        """The site has refused ``count`` connections in all, and one retry waits."""
        self.net.flush()
        assert self.factory.failed_logins == count
        assert len(self.clock.getDelayedCalls()) == 1


@pytest.fixture
def setup() -> Iterator[Setup]:
    s = Setup()
    yield s
    s.net.close()


def doubling() -> Any:
    # 1, 2, 4, 8 ... without jitter, so the delays can be compared exactly.
    return backoffPolicy(initialDelay=0.5, factor=2.0, maxDelay=60.0, jitter=lambda: 0.0)


def test_refused_logins_back_off_exponentially_then_reset_after_a_login(setup: Setup) -> None:
    setup.start("wrong secret", retry_policy=doubling())
    delays = []
    for refusals in range(1, 6):
        setup.refused(refusals)
        delays.append(setup.retry_delay())
        if refusals < 5:
            setup.clock.advance(delays[-1])  # the retry: a new connection, refused again
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert setup.node.kinds() == []

    # The operator fixes the key: the next attempt logs in and the count is forgotten.
    setup.site.node_keys["node-1"] = "wrong secret"
    setup.clock.advance(delays[-1])
    setup.net.flush()
    assert setup.node.kinds() == ["up"]
    assert setup.factory.failed_logins == 0

    # A drop after a good login retries after the first delay again, not 64 s.
    setup.site.nodes["node-1"].close("site restarting")
    setup.net.flush()
    assert setup.node.kinds() == ["up", "down"]
    assert len(setup.clock.getDelayedCalls()) == 1
    assert setup.retry_delay() == 1.0


def test_the_default_policy_reaches_its_ceiling_under_refusals(setup: Setup) -> None:
    setup.start("wrong secret", retry_policy=None)
    delays = []
    for refusals in range(1, 13):
        setup.refused(refusals)
        delays.append(setup.retry_delay())
        setup.clock.advance(delays[-1])
    # 0.5 s x 1.5^n plus up to 1 s of jitter: the ceiling is 5 s (+ jitter).
    ceiling = link.MAX_RECONNECT_DELAY
    assert delays[0] < 2.0
    assert all(ceiling <= d <= ceiling + 1.0 for d in delays[-6:]), delays
    assert len(setup.site_handler.events) == 0


def test_the_site_key_that_matches_logs_in_at_once(setup: Setup) -> None:
    # The control: with the right secret there is no refusal and no backoff.
    setup.start(SITE_KEYS["node-1"], retry_policy=doubling())
    assert setup.node.kinds() == ["up"]
    assert setup.factory.failed_logins == 0
