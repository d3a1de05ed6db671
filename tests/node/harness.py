"""Start and stop a real NodeService against a scripted site and the mock upstream."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from twisted.internet import reactor

from tasknet.node.service import NodeService
from tasknet.runtime import RealThreadPools, SystemEntropy
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.node.site_peer import ScriptedSite

SECRET = "s3cret"


def quick_retry(attempt: int) -> float:
    return 0.05


async def start_node(
    site: ScriptedSite | str, data: Path, *, secret: str = SECRET, **options: Any
) -> NodeService:
    """Node ``node-t`` on ``data``, dialling ``site`` (or that endpoint string)."""
    options.setdefault("debounce", 0.05)
    # Not the free space of whatever disk the test runs on (a small /dev/shm
    # would make every download wait): the retention tests set their own.
    options.setdefault("min_free", 0)
    options.setdefault("reactor", reactor)
    options.setdefault("threads", RealThreadPools())
    options.setdefault("entropy", SystemEntropy())
    node = NodeService(
        connect=site if isinstance(site, str) else site.endpoint,
        node_id="node-t",
        secret=secret,
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


@asynccontextmanager
async def logged_in_node(
    site: ScriptedSite, data: Path, *, logins: int = 1, **options: Any
) -> AsyncIterator[NodeService]:
    """A node started on ``data`` that has logged in ``logins`` times so far;
    stopped on exit."""
    node = await start_node(site, data, **options)
    try:
        await site.logged_in(logins)
        yield node
    finally:
        await node.stopService()


def file_fault(fault: str, *, times: int | None = 1, **params: Any) -> list[dict[str, Any]]:
    """A mock-upstream fault document for ``GET /files/*`` (``times=None``: always)."""
    return [{"method": "GET", "path": "/files/*", "fault": fault, "params": params, "times": times}]
