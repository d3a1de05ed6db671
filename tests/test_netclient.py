"""The quiet pool (tasknet.netclient): a request still out when its owner
closes the pool (a site stopping while a call is under way) leaves neither a
cached connection nor its 240 s timer behind when it ends."""

from __future__ import annotations

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from tasknet.netclient import quiet_pool


class Held(Resource):
    """Answers each GET once the test lets it."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[Request] = []
        self.arrived: Deferred[None] = Deferred()

    def render_GET(self, request: Request) -> object:
        self.waiting.append(request)
        self.arrived.callback(None)
        return NOT_DONE_YET


@pytest_twisted.ensureDeferred
async def test_a_request_ending_after_the_pool_closed_is_not_cached() -> None:
    held = Held()
    port = reactor.listenTCP(0, Site(held), interface="127.0.0.1")
    pool = quiet_pool(reactor, persistent=True)
    try:
        url = f"http://127.0.0.1:{port.getHost().port}/"
        answer = treq.get(url, pool=pool)
        await held.arrived
        await pool.closeCachedConnections()
        request = held.waiting[0]
        request.write(b"late")
        request.finish()
        response = await answer
        assert await treq.content(response) == b"late"
        assert pool._connections == {} and pool._timeouts == {}
        far = [c for c in reactor.getDelayedCalls() if c.getTime() - reactor.seconds() > 200]
        assert far == [], far
    finally:
        await pool.closeCachedConnections()
        await port.stopListening()
