"""Issue 38, Build 2: no unauthenticated peer can fill the site's disk
through its log.

The attack, as it was found: 1,000 connections to the site's node port, each
sending a ``Goodbye`` whose reason is 65,000 × "G" after the Hello; the
"{peer} says {message!r}" line carried every reason whole, 65.3 MB of log in
4.4 s (an ``Error`` frame did the same).  Now each line a peer can cause is
rate-limited per peer and the peer's text clipped to 200 characters and its
length: the same flood, to the real site's node listener over loopback TCP,
writes one line of a few hundred bytes."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import Logger, LogLevel, globalLogPublisher
from twisted.python.failure import Failure

from tasknet import logging as tlog
from tasknet.protocol.messages import Error, Goodbye, Message, ProtocolHello, encode
from tasknet.protocol.ratelog import RateLimitedLog, clip
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import running_site, site_options

CONNECTIONS = 1000
REASON = "G" * 65_000
#: Connections open at once (each is two descriptors in this process).
BATCH = 50


class _Flooder(Protocol):
    """Says Hello, then ``last`` (the flood frame); done when the site closes."""

    def __init__(self, last: Message, done: defer.Deferred[None]) -> None:
        self.last = last
        self.done = done

    def connectionMade(self) -> None:
        self.transport.write(encode(ProtocolHello()) + encode(self.last))  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = Failure(Exception())) -> None:
        self.done.callback(None)


class _Quiet(Factory):
    noisy = False  # no "Starting factory" line of the test's own per connection


async def _flood(port: int, last: Message, count: int) -> None:
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    for start in range(0, count, BATCH):
        closed = []
        for _ in range(min(BATCH, count - start)):
            done: defer.Deferred[None] = defer.Deferred()
            await endpoint.connect(_Quiet.forProtocol(lambda d=done: _Flooder(last, d)))
            closed.append(done)
        await defer.gatherResults(closed)


@contextmanager
def _site_log() -> Iterator[io.StringIO]:
    """What the site's log file would receive: tasknet's observer at info."""
    out = io.StringIO()
    observer = tlog.observer(out, level=LogLevel.info)
    globalLogPublisher.addObserver(observer)
    try:
        yield out
    finally:
        globalLogPublisher.removeObserver(observer)


@pytest_twisted.ensureDeferred
async def test_a_thousand_huge_goodbyes_and_errors_are_a_few_short_lines(tmp_path: Any) -> None:
    upstream = await start_upstream()
    try:
        options = site_options(str(tmp_path / "site.sqlite"), upstream.base_url)
        async with running_site(options) as site:
            port = site.service.nodes_port.getHost().port
            with _site_log() as log:
                before = len(log.getvalue())
                await _flood(port, Goodbye(REASON), CONNECTIONS)
                await _flood(port, Error("x", REASON), CONNECTIONS)
                written = log.getvalue()[before:]
    finally:
        await upstream.stop()
    # Before: 65 MB per flood.  After: one line for the one peer (its host),
    # clipped; the rest are counted into the next line a minute on.
    says = [line for line in written.splitlines() if " says " in line]
    assert len(says) == 1, says
    assert all("65,0" in line and "characters in all" in line for line in says), says
    assert len(written) < 10_000, written[:2000]


def test_clip_says_how_long_the_text_was() -> None:
    assert clip("short") == "short"
    clipped = clip("G" * 65_000)
    assert clipped.startswith("G" * 200) and clipped.endswith("… (65,000 characters in all)")
    assert len(clipped) < 250


def test_the_level_of_one_line_can_differ_from_the_instances() -> None:
    events: list[dict[str, Any]] = []
    clock = Clock()
    limited = RateLimitedLog(Logger(observer=events.append), clock, interval=60)  # type: ignore[arg-type]
    limited.emit("k", "first", level=LogLevel.info)
    limited.emit("k", "dropped", level=LogLevel.info)
    clock.advance(60)
    limited.emit("k", "again")
    assert [(e["log_format"], e["log_level"]) for e in events] == [
        ("first", LogLevel.info),
        ("again ({repeats} more since the last line)", LogLevel.warn),
    ]


def test_a_failed_handler_line_is_clipped_and_rate_limited() -> None:
    """A message our handler fails on: one critical line with the traceback,
    the message clipped, then counted (a bug a peer can trigger at will)."""
    from tasknet.protocol.connection import PeerFactory, PeerProtocol

    class Failing(PeerProtocol):
        def beforeLogin(self, message: Message) -> None:
            raise RuntimeError("a bug")

        def loggedInMessage(self, message: Message) -> None:
            raise AssertionError("not reached")

    clock = Clock()
    factory = PeerFactory(clock=clock)
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        for _ in range(3):
            peer = Failing(factory)
            peer.makeConnection(StringTransport())
            hello = ProtocolHello(features=("f" * 10_000,))
            peer.dataReceived(encode(hello))
            peer.connectionLost(None)
    finally:
        globalLogPublisher.removeObserver(events.append)
    failed = [e for e in events if e.get("log_format") == "handling {message} failed"]
    assert len(failed) == 1 and failed[0]["log_level"] == LogLevel.critical
    assert "characters in all" in failed[0]["message"] and len(failed[0]["message"]) < 300
    assert failed[0]["log_failure"].check(RuntimeError)
    errors = [e for e in events if e.get("log_format", "").startswith("protocol error")]
    assert len(errors) == 1  # "internal", once per peer and code
