"""A node whose login is refused backs off exponentially, and starts again
from the first delay after a successful login (issue 14).

The node's ClientService and link run their timers on a ``task.Clock`` while
the connections are real loopback TCP to the real site listener, so each
retry delay is read off the clock exactly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
from twisted.application.internet import backoffPolicy
from twisted.internet.task import Clock

from tasknet.node.link import SiteClientService, SiteLinkFactory, site_client_service
from tests.protocol.peers import SITE_KEYS, Listener, NodeRecorder, SiteRecorder, eventually
from tests.protocol.peers import site_factory as protocol_site_factory


class Setup:
    def __init__(self) -> None:
        self.clock = Clock()
        self.site_handler = SiteRecorder()
        self.listener = Listener(protocol_site_factory(self.site_handler))
        self.node = NodeRecorder()
        self.service: SiteClientService | None = None
        self.port = 0

    async def start(self, secret: str, **kwargs: Any) -> SiteClientService:
        self.port = await self.listener.start()
        self.service = site_client_service(
            f"tcp:host=127.0.0.1:port={self.port}",
            "node-1",
            secret,
            self.node,
            clock=self.clock,
            **kwargs,
        )
        self.service.startService()
        return self.service

    @property
    def factory(self) -> SiteLinkFactory:
        assert self.service is not None
        return self.service.link_factory

    def retry_delay(self) -> float:
        """The delay of the one retry now scheduled on the node's clock."""
        (call,) = self.clock.getDelayedCalls()
        return call.getTime() - self.clock.seconds()

    async def refused(self, count: int) -> None:
        """Wait until the site has refused ``count`` connections in all."""
        await eventually(lambda: self.factory.failed_logins == count)
        await eventually(lambda: len(self.clock.getDelayedCalls()) == 1)


@pytest_twisted.async_yield_fixture
async def setup() -> AsyncIterator[Setup]:
    s = Setup()
    yield s
    if s.service is not None and s.service.running:
        await s.service.stopService()
    await s.listener.stop()


def doubling() -> Any:
    # 1, 2, 4, 8 ... without jitter, so the delays can be compared exactly.
    return backoffPolicy(initialDelay=0.5, factor=2.0, maxDelay=60.0, jitter=lambda: 0.0)


@pytest_twisted.ensureDeferred
async def test_refused_logins_back_off_exponentially_then_reset_after_a_login(
    setup: Setup,
) -> None:
    await setup.start("wrong secret", retry_policy=doubling())
    delays = []
    for refusals in range(1, 6):
        await setup.refused(refusals)
        delays.append(setup.retry_delay())
        if refusals < 5:
            setup.clock.advance(delays[-1])  # the retry: a new connection, refused again
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert setup.node.kinds() == []

    # The operator fixes the key: the next attempt logs in and the count is forgotten.
    setup.listener.factory.node_keys["node-1"] = "wrong secret"
    setup.clock.advance(delays[-1])
    await eventually(lambda: setup.node.kinds() == ["up"])
    assert setup.factory.failed_logins == 0

    # A drop after a good login retries after the first delay again, not 64 s.
    setup.listener.factory.nodes["node-1"].close("site restarting")
    await eventually(lambda: setup.node.kinds() == ["up", "down"])
    await eventually(lambda: len(setup.clock.getDelayedCalls()) == 1)
    assert setup.retry_delay() == 1.0


@pytest_twisted.ensureDeferred
async def test_the_default_policy_reaches_its_30_s_ceiling_under_refusals(setup: Setup) -> None:
    await setup.start("wrong secret")
    delays = []
    for refusals in range(1, 13):
        await setup.refused(refusals)
        delays.append(setup.retry_delay())
        setup.clock.advance(delays[-1])
    # 0.5 s x 1.5^n plus up to 1 s of jitter: the ceiling is 30 s (+ jitter).
    assert delays[0] < 2.0
    assert all(30.0 <= d <= 31.0 for d in delays[-2:]), delays
    assert len(setup.site_handler.events) == 0


@pytest_twisted.ensureDeferred
async def test_the_site_key_that_matches_logs_in_at_once(setup: Setup) -> None:
    # The control: with the right secret there is no refusal and no backoff.
    await setup.start(SITE_KEYS["node-1"], retry_policy=doubling())
    await eventually(lambda: setup.node.kinds() == ["up"])
    assert setup.factory.failed_logins == 0
