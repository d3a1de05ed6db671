"""The fixtures of the connection tests: ``net``, sites and nodes in memory
on one clock (tests/protocol/memory.py), and ``harness``, the same over real
loopback TCP (tests/protocol/peers.py); and the real-site ``site`` fixture of
tests/site_protocol for test_bounds_site.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_twisted

from tests.protocol.memory import MemoryNet
from tests.protocol.peers import Harness
from tests.site_protocol.conftest import site  # noqa: F401 (a fixture, shared)


@pytest.fixture
def net() -> Iterator[MemoryNet]:
    n = MemoryNet()
    yield n
    n.close()


@pytest_twisted.async_yield_fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    yield h
    await h.close()
