from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_twisted

from tests.site_protocol.harness import Site


@pytest_twisted.async_yield_fixture
async def site(db_target: str) -> AsyncIterator[Site]:
    s = await Site(db_target).start()
    try:
        yield s
    finally:
        await s.stop()
