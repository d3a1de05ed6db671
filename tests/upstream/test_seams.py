"""The upstream runs on the reactor and the random source its root gives it.

No global reactor here: ``makeService`` on a ``MemoryReactorClock`` and
HTTP bytes fed to the protocol it built (SIMULATION.md, "Every source of
nondeterminism from the seed")."""

from __future__ import annotations

import json
import random
from typing import Any

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.web.http import datetimeToString

from tasknet.upstream import catalog
from tasknet.upstream.app import UpstreamApp
from tasknet.upstream.faults import FaultTable, parse_rules
from tasknet.upstream.service import Options, makeService

START = 1_767_225_600.0


def options(*args: str) -> Options:
    parsed = Options()
    parsed.parseOptions(["--http", "tcp:7201:interface=127.0.0.1", *args])
    return parsed


def exchange(reactor: MemoryReactorClock, factory: Any, request: bytes) -> StringTransport:
    """Send ``request`` on a new in-memory connection; run what is due now
    (the body is streamed from a timer)."""
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(request)
    reactor.advance(0)
    return transport


def response(transport: StringTransport) -> tuple[dict[str, str], Any]:
    head, _, body = transport.value().partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return headers, json.loads(body)


def test_make_service_builds_everything_on_the_reactor_it_is_given() -> None:
    reactor = MemoryReactorClock()
    reactor.advance(START)
    service: Any = makeService(options("--seed", "5"), reactor=reactor)
    service.startService()
    try:
        [(port, factory, _, interface)] = reactor.tcpServers
        assert (port, interface) == (7201, "127.0.0.1")
        app: UpstreamApp = service.app
        assert factory is app.site() and app.clock is reactor
        assert app.site().wrappedFactory.reactor is reactor  # the HTTP channels' timers
        factory.doStart()  # as the port does: no once-a-second log-date timer (QuietSite)
        assert reactor.getDelayedCalls() == []
        reactor.advance(2.5)
        request = (
            b"POST /api/galleries/42/archive HTTP/1.1\r\nHost: up\r\nContent-Length: 0\r\n\r\n"
        )
        transport = exchange(reactor, factory, request)
        headers, body = response(transport)
        assert body == {"archiveUrl": "http://up/files/42-1.bin", "cost": catalog.gallery(42).cost}
        assert headers["Date"] == datetimeToString(START + 2.5).decode()
        [entry] = app.journal.to_json()["entries"]
        assert entry["at"] == START + 2.5
        assert app.journal.to_json()["requests"][0]["at"] == START + 2.5
        # The channel's idle timeout runs on this reactor too: it closes the connection.
        reactor.advance(24 * 3600)
        assert transport.disconnecting
        reactor.advance(15)  # and its abort of a client that does not close
    finally:
        service.stopService()
        factory.doStop()
    assert not reactor.getDelayedCalls()


def test_latency_waits_on_the_given_clock() -> None:
    reactor = MemoryReactorClock()
    service: Any = makeService(options(), reactor=reactor)
    app: UpstreamApp = service.app
    app.set_faults({"rules": [{"path": "/api/*", "fault": "latency", "params": {"ms": 1500}}]})
    get = b"GET /api/galleries/3 HTTP/1.1\r\nHost: up\r\n\r\n"
    transport = exchange(reactor, app.site(), get)
    reactor.advance(1.4)
    assert transport.value() == b""
    reactor.advance(0.2)
    reactor.advance(0)
    assert response(transport)[1]["gid"] == 3


def draws(table: FaultTable, n: int = 40) -> list[bool]:
    return [table.take("POST", "/x") is not None for _ in range(n)]


def test_fault_draws_come_from_the_given_random_and_rewind_on_reset() -> None:
    rules = {"rules": [{"path": "/x", "fault": "reject", "probability": 0.5}]}
    before = random.getstate()
    one, two = FaultTable(random.Random(9)), FaultTable(random.Random(9))
    for table in (one, two):
        table.replace(parse_rules(rules))
    first = draws(one)
    assert first == draws(two) and 5 < sum(first) < 35
    one.reset()
    one.replace(parse_rules(rules))
    assert draws(one) == first  # rewound: a drill replays the same draws
    other = FaultTable(random.Random(10))
    other.replace(parse_rules(rules))
    assert draws(other) != first
    assert random.getstate() == before  # the module's random source is never touched


def test_the_seed_option_seeds_the_fault_draws() -> None:
    rules = {"rules": [{"path": "/x", "fault": "reject", "probability": 0.5}]}

    def run(seed: str) -> list[bool]:
        app: UpstreamApp = makeService(options("--seed", seed), reactor=MemoryReactorClock()).app
        app.set_faults(rules)
        return draws(app.faults)

    assert run("3") == run("3") != run("4")


class _Transport:
    def __init__(self, name: int, aborted: list[int]) -> None:
        self.name, self.aborted = name, aborted

    def abortConnection(self) -> None:
        self.aborted.append(self.name)


class _Finish:
    def addBoth(self, callback: Any) -> None:
        pass


class _Request:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport

    def notifyFinish(self) -> _Finish:
        return _Finish()


def test_hung_requests_are_dropped_in_the_order_they_hung() -> None:
    app = UpstreamApp(None, clock=MemoryReactorClock(), rng=random.Random(0))
    aborted: list[int] = []
    for name in range(64):
        app._hang(_Request(_Transport(name, aborted)))  # type: ignore[arg-type]
    assert app.drop_hung() == 64
    assert aborted == list(range(64))  # not the order of their addresses
