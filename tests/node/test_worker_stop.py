"""Stopping the worker while a download connects (issue 21, item 1): the
cancel is no failed attempt.  Twisted's ``HostnameEndpoint`` turned a
cancelled name lookup into ``DNS lookup failed: Couldn't find the hostname
'127.0.0.1'``; the worker logged it, retried, and kept downloading after
SIGTERM.  Now an IP literal is dialled without the resolver
(``tasknet.netclient``), and whatever a cancelled attempt fails with ends
the job."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.error import DNSLookupError
from twisted.logger import formatEvent, globalLogPublisher

from tests.eventually import eventually
from tests.node.test_worker import GID, node_worker, task_row


class _ConnectingForever:
    """An HTTP client whose GET never connects; cancelled, it fails with
    what a cancelled HostnameEndpoint resolution gave."""

    def __init__(self) -> None:
        self.gets = 0

    def get(self, url: str, **kwargs: Any) -> Deferred[Any]:
        self.gets += 1

        def cancel(d: Deferred[Any]) -> None:
            d.errback(DNSLookupError("Couldn't find the hostname '127.0.0.1'"))

        return Deferred(cancel)


@pytest_twisted.ensureDeferred
async def test_a_download_cancelled_while_connecting_is_not_retried(tmp_path) -> None:
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        async with node_worker(tmp_path) as (store, worker):
            client = _ConnectingForever()
            worker._client = client  # type: ignore[assignment]
            await store.accept_download(GID, "op-1", "n", "http://127.0.0.1:9/f.bin", 2)
            worker.run(GID, "op-1")
            await eventually(lambda: client.gets == 1, what="the GET to start")
            await worker.cancel(GID)
            assert worker.active() == {}
            assert client.gets == 1, "not retried"
            row = await task_row(store)
            assert row is not None and not row.error  # no "retrying in" detail either
    finally:
        globalLogPublisher.removeObserver(events.append)
    text = "\n".join(formatEvent(e) for e in events)
    assert "attempt failed" not in text and "DNS lookup failed" not in text


def test_ip_literals_are_dialled_without_the_resolver() -> None:
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ClientEndpoint
    from twisted.web.client import URI

    from tasknet.netclient import DirectEndpoints

    endpoint = DirectEndpoints(reactor).endpointForURI(URI.fromBytes(b"http://127.0.0.1:7200/f"))
    assert isinstance(endpoint, TCP4ClientEndpoint)
