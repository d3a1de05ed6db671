"""Real roles' parts on a simulated world, for the tests of tests/sim/."""

from __future__ import annotations

import warnings
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool, readBody

from tasknet.sim import SimReactor, World
from tasknet.upstream.app import UpstreamApp
from tasknet.upstream.service import Options, UpstreamService, makeService

UPSTREAM_PORT = 7200


def start_upstream_service(
    reactor: SimReactor, *, port: int = UPSTREAM_PORT, seed: int = 0
) -> UpstreamService:
    """The real mock upstream built by its composition root (``makeService``,
    as ``twistd -n tasknet-upstream --http ... --seed ...``) on ``reactor``,
    started, and stopped when that reactor shuts down, as twistd does."""
    options = Options()
    options.parseOptions(["--http", f"tcp:{port}:interface=127.0.0.1", "--seed", str(seed)])
    service = makeService(options, reactor=reactor)
    service.privilegedStartService()
    service.startService()
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    return service


def serve_upstream(
    world: World, name: str = "upstream", *, port: int = UPSTREAM_PORT, seed: int = 0
) -> tuple[UpstreamApp, SimReactor]:
    """The real mock upstream (:func:`start_upstream_service`) listening on
    ``127.0.0.1:port`` of a new process ``name``."""
    reactor = world.add_process(name)
    service = start_upstream_service(reactor, port=port, seed=seed)
    reactor.startRunning()
    return service.app, reactor


def client(world: World, name: str = "client") -> SimReactor:
    reactor = world.processes.get(name)
    if reactor is None or not reactor.alive:
        reactor = world.add_process(name)
        reactor.startRunning()
    return reactor


async def _fetch(
    agent: Any, method: bytes, url: str, headers: Any, timeout: float | None, clock: Any
) -> tuple[int, bytes]:
    requested = agent.request(method, url.encode(), headers)
    if timeout is not None:
        requested.addTimeout(timeout, clock)
    response = await requested
    with warnings.catch_warnings():
        # Twisted's own: its response transport has no abortConnection, so
        # cancelling readBody cannot abort: never cancel the body's Deferred.
        warnings.simplefilter("ignore", DeprecationWarning)
        body = readBody(response)
    return response.code, await body


def fetch(
    agent: Any,
    url: str,
    method: bytes = b"GET",
    headers: Any = None,
    *,
    timeout: float | None = None,
    clock: Any = None,
) -> Deferred[Any]:
    """``(status, body)`` of one request through ``agent``; ``timeout``
    (on ``clock``) bounds the wait for the response's head."""
    return Deferred.fromCoroutine(_fetch(agent, method, url, headers, timeout, clock))


def agent(reactor: SimReactor, *, persistent: bool = False) -> Agent:
    return Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=persistent))
