"""The ``harness`` fixture of the connection tests (tests/protocol/peers.py),
and the real-site ``site`` fixture of tests/site_protocol for test_bounds_site.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_twisted

from tests.protocol.peers import Harness
from tests.site_protocol.conftest import site  # noqa: F401 (a fixture, shared)


@pytest_twisted.async_yield_fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    yield h
    await h.close()
