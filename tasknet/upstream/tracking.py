"""A wrapping factory that knows its open connections and can abort them all.

Stopping a listening port leaves accepted connections open; a mock that holds
requests forever (``timeout`` fault) or streams slowly must be able to drop
them all at shutdown so tests and the reactor end clean.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IProtocolFactory
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory


class ConnectionTracker(WrappingFactory):
    noisy = False  # no "Starting factory" line: the service logs where it listens

    def __init__(self, wrapped: IProtocolFactory) -> None:
        super().__init__(wrapped)
        self._idle_waiters: list[Deferred[None]] = []

    @property
    def open_connections(self) -> int:
        return len(self.protocols)

    def unregisterProtocol(self, p: ProtocolWrapper) -> None:
        super().unregisterProtocol(p)
        if not self.protocols:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                waiter.callback(None)

    def abort_all(self) -> Deferred[None]:
        """Abort every connection; fires once each has reported connectionLost."""
        if not self.protocols:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._idle_waiters.append(waiter)
        for protocol in list(self.protocols):
            protocol.transport.abortConnection()  # type: ignore[union-attr]
        return waiter
