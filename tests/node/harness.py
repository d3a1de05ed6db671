"""Start and stop a real NodeService against a scripted site and the mock upstream."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tasknet.node.service import NodeService
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.node.site_peer import ScriptedSite

SECRET = "s3cret"


def quick_retry(attempt: int) -> float:
    return 0.05


async def start_node(site: ScriptedSite, data: Path, **options: Any) -> NodeService:
    options.setdefault("debounce", 0.05)
    node = NodeService(
        connect=site.endpoint,
        node_id="node-t",
        secret=SECRET,
        data=str(data),
        retry_policy=quick_retry,
        **options,
    )
    node.startService()
    await node.ready
    return node


@asynccontextmanager
async def running(
    tmp_path: Path, *, legacy_site: bool = False, auto_ack: bool = True, **options: Any
) -> AsyncIterator[tuple[ScriptedSite, RunningUpstream]]:
    """A scripted site and an upstream, both stopped on exit."""
    site = ScriptedSite(SECRET, legacy=legacy_site, auto_ack=auto_ack)
    await site.listen()
    up = await start_upstream()
    try:
        yield site, up
    finally:
        await site.stop()
        await up.stop()


def node_rows(data: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the node database from outside, as drills do."""
    with sqlite3.connect(data / "node.sqlite") as db:
        return db.execute(sql, params).fetchall()
