"""Issue 38: node-secret guessing is slowed per client address.

Before: 3,000 node-secret guesses in 1.1 s, each looked up and verified, no
metric.  Now the site's node listener (the real ``NodeListenerFactory`` on a
loopback port, its defaults) lets an address fail
``DEFAULT_NODE_LOGIN_FAILURES`` Logins at once, then
``DEFAULT_NODE_LOGIN_FAILURE_RATE`` a second; past that a Login is refused
before any secret is looked up, with one log line a minute.  A right secret
from another address still logs in.  Scripted raw peers over real TCP.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher

from tasknet.protocol.messages import Identity, Login, LoginResult, Message, sign_login
from tasknet.site import metrics
from tasknet.site.node_listener import (
    DEFAULT_NODE_LOGIN_FAILURE_RATE,
    DEFAULT_NODE_LOGIN_FAILURES,
)
from tasknet.site.ratelimit import AuthFailureLimiter
from tests.eventually import eventually
from tests.protocol.peers import SITE_KEYS, Harness, RawPeer, login_raw

GUESSES = 3000
#: Guessing connections open at once.
BATCH = 50


class CountingKeys(dict[str, str]):
    """The listener's node keys, counting the lookups of a Login."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


class Guesser(RawPeer):
    """Logs in as ``node-1`` with a wrong signature as soon as Identity comes."""

    def frame_received(self, type_: int, message: Message | None) -> None:
        if isinstance(message, Identity):
            self.send(Login("node-1", sign_login("a guess", message.nonce, "node-1")))


async def guess(port: int, source: str) -> str:
    peer = Guesser()
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, bindAddress=(source, 0))
    await endpoint.connect(Factory.forProtocol(lambda: peer))  # type: ignore[arg-type, return-value]
    await peer.closed
    [result] = peer.of_type(LoginResult)
    assert not result.accepted
    return str(result.reason)


@contextmanager
def events() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(seen.append)
    try:
        yield seen
    finally:
        globalLogPublisher.removeObserver(seen.append)


def counted(counter: Any, kind: str) -> float:
    return float(counter.labels(kind=kind)._value.get())


@pytest_twisted.ensureDeferred
async def test_3000_node_secret_guesses_from_one_address_are_slowed() -> None:
    harness = Harness()
    try:
        factory, port = await harness.site()
        keys = CountingKeys(SITE_KEYS)
        factory.node_keys = keys
        failures = counted(metrics.AUTH_FAILURES, "node_secret")
        throttled = counted(metrics.AUTH_THROTTLED, "node_secret")
        reasons: list[str] = []
        started = time.monotonic()
        with events() as logged:
            for start in range(0, GUESSES, BATCH):
                reasons += await defer.gatherResults(
                    [
                        defer.Deferred.fromCoroutine(guess(port, "127.0.0.1"))
                        for _ in range(min(BATCH, GUESSES - start))
                    ]
                )
        elapsed = time.monotonic() - started
        judged = reasons.count("bad signature")
        slowed = [r for r in reasons if r.startswith("too many failed logins")]
        assert judged + len(slowed) == GUESSES
        # The burst, then one a second at most: most are refused unjudged.
        most = DEFAULT_NODE_LOGIN_FAILURES + DEFAULT_NODE_LOGIN_FAILURE_RATE * elapsed + 1
        assert DEFAULT_NODE_LOGIN_FAILURES <= judged <= most, (judged, elapsed)
        assert keys.lookups == judged  # a refused Login looked nothing up
        assert "retry in" in slowed[0]
        # Counted in the metrics, each kind once per Login.
        assert counted(metrics.AUTH_FAILURES, "node_secret") - failures == judged
        assert counted(metrics.AUTH_THROTTLED, "node_secret") - throttled == len(slowed)
        # A bounded number of lines: one per kind a minute (the refusal, the slowing).
        lines = [
            e
            for e in logged
            if str(e.get("log_format", "")).startswith(("login refused", "node logins from"))
        ]
        assert 1 <= len(lines) <= 4, [e.get("log_format") for e in lines]

        # A right secret from another address logs in at once.
        other = RawPeer()
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, bindAddress=("127.0.0.2", 0))
        await endpoint.connect(Factory.forProtocol(lambda: other))  # type: ignore[arg-type, return-value]
        harness.peers.append(other)
        await login_raw(other)
        # From the slowed address even a right secret waits (else a guess could pass).
        again = RawPeer()
        await TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(
            Factory.forProtocol(lambda: again)  # type: ignore[arg-type, return-value]
        )
        harness.peers.append(again)
        await eventually(lambda: again.of_type(Identity))
        nonce = again.of_type(Identity)[0].nonce
        again.send(Login("node-1", sign_login(SITE_KEYS["node-1"], nonce, "node-1")))
        await again.closed
        [refused] = again.of_type(LoginResult)
        assert not refused.accepted and refused.reason.startswith("too many failed logins")
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_right_secret_gives_its_attempt_back() -> None:
    harness = Harness()
    clock = Clock()
    try:
        factory, port = await harness.site(
            login_guesses=AuthFailureLimiter(clock, threshold=2, rate=0.5)
        )
        for _ in range(5):  # right logins never empty the bucket
            peer = await harness.raw(port)
            await login_raw(peer)
            peer.transport.abortConnection()  # type: ignore[union-attr]
            await peer.closed
        assert await guess(port, "127.0.0.1") == "bad signature"
        assert await guess(port, "127.0.0.1") == "bad signature"
        assert (await guess(port, "127.0.0.1")).startswith("too many failed logins")
        clock.advance(2)  # one attempt back
        assert await guess(port, "127.0.0.1") == "bad signature"
        assert factory.login_guesses.threshold == 2
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_storm_of_right_logins_from_one_address_is_not_slowed() -> None:
    # A NAT's nodes after a site restart: more right Logins at once than a
    # turn admits (they wait their turn) and than the limit; none refused.
    harness = Harness()
    try:
        factory, port = await harness.site(
            login_guesses=AuthFailureLimiter(reactor, threshold=5, rate=0.01)
        )
        count = 80
        factory.node_keys = {f"storm-{n}": f"secret-{n}" for n in range(count)}
        peers = [await harness.raw(port) for _ in range(count)]
        await eventually(lambda: all(p.of_type(Identity) for p in peers), what="identities")
        for n, peer in enumerate(peers):
            nonce = peer.of_type(Identity)[0].nonce
            peer.send(Login(f"storm-{n}", sign_login(f"secret-{n}", nonce, f"storm-{n}")))
        await eventually(lambda: all(p.of_type(LoginResult) for p in peers), what="answers")
        assert {p.of_type(LoginResult)[0] for p in peers} == {LoginResult(True, "")}
    finally:
        await harness.close()
