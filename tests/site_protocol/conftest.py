from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_twisted

from tests.site_protocol.harness import Site


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    s = await Site(tmp_path / "site.sqlite").start()
    try:
        yield s
    finally:
        await s.stop()
