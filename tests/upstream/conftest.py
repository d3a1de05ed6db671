"""Fixtures: a real upstream on a loopback port and a non-persistent treq client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IResponse

from tasknet.upstream.testing import RunningUpstream, start_upstream


class Client:
    """treq over a non-persistent pool, so no idle socket outlives a test."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.agent: Any = Agent(reactor, pool=pool)  # IAgent
        self.http = HTTPClient(cast(IAgent, self.agent))

    def url(self, path: str) -> str:
        return path if path.startswith("http") else self.base_url + path

    def request(self, method: str, path: str, **kwargs: Any) -> Deferred[Any]:
        """Starts at once (a Deferred, not a coroutine), so a test can leave it pending."""
        return self.http.request(method, self.url(path), **kwargs)

    async def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        response = await self.request(method, path, **kwargs)
        body = await response.content()
        return response.code, json.loads(body)

    async def put_faults(self, rules: list[dict[str, Any]]) -> tuple[int, Any]:
        return await self.json("PUT", "/_drill/faults", data=json.dumps({"rules": rules}).encode())

    async def raw(
        self, method: str, path: str, headers: dict[str, str] | None = None
    ) -> tuple[IResponse, bytes, Failure | None]:
        """A request through the bare Agent (treq rewrites Content-Length): the
        response, the body bytes received, and why the body ended if not cleanly."""
        raw_headers = Headers({k: [v] for k, v in (headers or {}).items()})
        response = await self.agent.request(method.encode(), self.url(path).encode(), raw_headers)
        body, failure = await collect(response)
        return response, body, failure

    async def stats(self) -> dict[str, Any]:
        code, body = await self.json("GET", "/_drill/stats")
        assert code == 200
        return body

    async def journal(self) -> dict[str, Any]:
        code, body = await self.json("GET", "/_drill/journal")
        assert code == 200
        return body


class _Collector(Protocol):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done: Deferred[tuple[Failure | None]] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)

    def connectionLost(self, reason: Failure = ResponseDone) -> None:  # type: ignore[assignment]
        # wrapped in a tuple: a bare Failure would turn callback into errback
        self.done.callback((None if reason.check(ResponseDone) else reason,))


async def collect(response: Any) -> tuple[bytes, Failure | None]:
    """The body bytes that arrived, and the failure that ended the body (None if complete)."""
    collector = _Collector()
    response.deliverBody(collector)
    (failure,) = await collector.done
    return b"".join(collector.chunks), failure


@pytest_twisted.async_yield_fixture
async def upstream() -> AsyncIterator[RunningUpstream]:
    up = await start_upstream()
    yield up
    await up.stop()


@pytest_twisted.async_yield_fixture
async def slow_upstream() -> AsyncIterator[RunningUpstream]:
    up = await start_upstream(bandwidth=400_000)
    yield up
    await up.stop()


@pytest_twisted.async_fixture
async def client(upstream: RunningUpstream) -> Client:
    return Client(upstream.base_url)
