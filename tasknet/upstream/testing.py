"""Run a real mock upstream on loopback inside a test.

For pytest-twisted tests (either style)::

    from tasknet.upstream.testing import start_upstream, running_upstream

    @pytest_twisted.ensureDeferred
    async def test_something():
        up = await start_upstream()              # tcp:0:interface=127.0.0.1
        try:
            ...  # talk to up.base_url, e.g. "http://127.0.0.1:54321"
            up.set_faults([{"method": "POST", "path": "/api/galleries/*/archive",
                            "fault": "timeout"}])
            assert up.app.journal.posts[42] == 1  # or up.stats()["posts"]["42"]
        finally:
            await up.stop()                      # stops listening, aborts connections

    @pytest_twisted.ensureDeferred
    async def test_other():
        async with running_upstream(bandwidth=1_000_000) as up:
            ...

    @pytest_twisted.inlineCallbacks
    def test_legacy_style():
        up = yield start_upstream()
        ...
        yield up.stop()

``start_upstream`` returns a Deferred (awaitable). ``RunningUpstream`` gives
``base_url``, ``port`` (int), ``app`` (the ``UpstreamApp``: ``app.journal``
counters, ``app.faults`` rules), ``stats()`` / ``journal()`` (the same dicts as
``/_drill/stats`` and ``/_drill/journal``), ``set_faults(rules)``,
``clear_faults()``, ``reset()``, ``file_url(gid, n=1)`` and ``stop()``.
Expected archive contents: ``tasknet.upstream.catalog.archive_bytes(gid)`` and
``catalog.gallery(gid)`` (size, cost, title). Any ``/files/{gid}-{n}.bin`` with
n >= 1 is served, so a node test needs no POST first.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IReactorTCP, IReactorTime

from tasknet.upstream.app import UpstreamApp

LOOPBACK_ANY_PORT = "tcp:0:interface=127.0.0.1"


@dataclass
class RunningUpstream:
    app: UpstreamApp
    listening: IListeningPort
    port: int
    base_url: str

    def stats(self) -> dict[str, Any]:
        stats = self.app.journal.stats()
        stats["faultsFired"] = self.app.faults.fired_total
        return stats

    def journal(self) -> dict[str, Any]:
        return self.app.journal.to_json()

    def set_faults(self, rules: Sequence[dict[str, Any]]) -> None:
        """Replace the fault rules (same validation as ``PUT /_drill/faults``)."""
        self.app.set_faults({"rules": list(rules)})

    def clear_faults(self) -> None:
        self.app.clear_faults()

    def reset(self) -> None:
        self.app.reset()

    def file_url(self, gid: int, n: int = 1) -> str:
        return f"{self.base_url}/files/{gid}-{n}.bin"

    def stop(self) -> Deferred[None]:
        """Stop listening and abort every open connection; fires when all are closed."""
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        stopped = self.listening.stopListening()
        if stopped is not None:
            await stopped
        await self.app.close_connections()


def start_upstream(
    reactor: IReactorTCP | None = None,
    *,
    bandwidth: float | None = None,
    seed: int = 0,
    endpoint: str = LOOPBACK_ANY_PORT,
) -> Deferred[RunningUpstream]:
    """Listen on ``endpoint`` (default: a free loopback port) with a fresh app.

    A test's composition root, as ``service.makeService`` is twistd's: the
    reactor (default: the global one, resolved here, for the tests, benches,
    drills and demo that run on it) is the app's clock and the listener's,
    ``seed`` seeds the app's random source."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = IReactorTCP(global_reactor)
    return Deferred.fromCoroutine(_start(reactor, bandwidth, seed, endpoint))


async def _start(
    reactor: IReactorTCP, bandwidth: float | None, seed: int, endpoint: str
) -> RunningUpstream:
    app = UpstreamApp(bandwidth, clock=IReactorTime(reactor), rng=random.Random(seed))
    listening = await serverFromString(reactor, endpoint).listen(app.site())
    address = listening.getHost()
    base_url = f"http://{address.host}:{address.port}"  # type: ignore[attr-defined]
    return RunningUpstream(app, listening, address.port, base_url)  # type: ignore[attr-defined]


@asynccontextmanager
async def running_upstream(
    reactor: IReactorTCP | None = None, *, bandwidth: float | None = None, seed: int = 0
) -> AsyncIterator[RunningUpstream]:
    """``async with running_upstream() as up:`` — stopped (connections aborted) on exit."""
    upstream = await start_upstream(reactor, bandwidth=bandwidth, seed=seed)
    try:
        yield upstream
    finally:
        await upstream.stop()
