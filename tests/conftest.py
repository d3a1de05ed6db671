"""Suite-wide fixtures.

``reactor_is_clean`` (autouse) fails any test that leaves delayed calls or
open sockets on the global reactor: a test that leaks them would make a later
test flaky, and in production the same leak is a resource bug.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.internet import reactor, tcp
from twisted.internet.task import deferLater

try:  # unix sockets are optional on some platforms
    from twisted.internet import unix

    _SOCKET_TYPES: tuple[type, ...] = (
        tcp.Port,
        tcp.Connection,
        unix.Port,
        unix.Server,
        unix.Client,
    )
except ImportError:  # pragma: no cover
    _SOCKET_TYPES = (tcp.Port, tcp.Connection)


def _leftovers() -> tuple[list, list]:
    calls = [c for c in reactor.getDelayedCalls() if c.active()]
    sockets = [
        s
        for s in set(reactor.getReaders()) | set(reactor.getWriters())
        if isinstance(s, _SOCKET_TYPES)
    ]
    return calls, sockets


@pytest.fixture(autouse=True)
def reactor_is_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.node.get_closest_marker("allow_leftovers"):
        return
    # Give closing transports a few turns of the reactor to finish.
    for _ in range(20):
        calls, sockets = _leftovers()
        if not calls and not sockets:
            return
        pytest_twisted.blockon(deferLater(reactor, 0.01, lambda: None))
    calls, sockets = _leftovers()
    if calls or sockets:
        for c in calls:
            c.cancel()
        for s in sockets:
            s.loseConnection() if hasattr(s, "loseConnection") else s.stopListening()
        pytest.fail(f"test left the reactor dirty: delayed calls={calls!r} sockets={sockets!r}")
