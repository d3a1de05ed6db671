"""Outgoing HTTP connections of the site and the node, made the same way.

* **No resolver for an address.**  Twisted's ``Agent`` dials every URL with a
  ``HostnameEndpoint``, which hands even ``127.0.0.1`` to the reactor's
  resolver thread pool.  That costs a thread round trip per connection, and
  while the reactor shuts down (the pool stopped) or when a connect is
  cancelled, it fails with ``DNS lookup failed: Couldn't find the hostname
  '127.0.0.1'``.  :func:`tcp_endpoint` gives a plain TCP endpoint for an IP
  literal (IPv4 or IPv6) and a ``HostnameEndpoint`` only for a name;
  :class:`DirectEndpoints` is the ``Agent`` endpoint factory built on it
  (TLS-wrapped for ``https``), one endpoint per scheme, host and port.
* **Quiet pools.**  Every connection of a ``HTTPConnectionPool`` has a
  factory of its own that Twisted logs "Starting factory" and "Stopping
  factory" for, two info lines per request; :func:`quiet_pool` makes a pool
  whose factories say nothing.

Imports neither the site nor the node (both use it).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IReactorTCP
from twisted.web.client import (
    URI,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    _HTTP11ClientFactory,
)
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

__all__ = [
    "DirectEndpoints",
    "QuietHTTPConnectionPool",
    "is_ip_literal",
    "quiet_pool",
    "tcp_endpoint",
]

#: Seconds to wait for a TCP connect (Twisted's default for both endpoints).
CONNECT_TIMEOUT = 30.0


def is_ip_literal(host: str | bytes) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address (``[::1]`` too), not a name."""
    text = host.decode("ascii", "replace") if isinstance(host, bytes) else host
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def tcp_endpoint(
    reactor: IReactorTCP, host: str | bytes, port: int, timeout: float = CONNECT_TIMEOUT
) -> Any:
    """A TCP client endpoint for ``host:port``: connecting straight to an IP
    literal (``reactor.connectTCP`` takes IPv6 literals too), resolving a
    name with ``HostnameEndpoint`` (happy eyeballs)."""
    text = host.decode("ascii") if isinstance(host, bytes) else host
    if is_ip_literal(text):
        return TCP4ClientEndpoint(reactor, text.strip("[]"), port, timeout=timeout)
    return HostnameEndpoint(reactor, text, port, timeout=timeout)


@implementer(IAgentEndpointFactory)
class DirectEndpoints:
    """``Agent.usingEndpointFactory``'s factory: :func:`tcp_endpoint`,
    TLS-wrapped for ``https`` (the stock agent's browser-like policy), built
    once per scheme, host and port (the stock factory builds one, IDNA
    encoding the host, for every request)."""

    def __init__(self, reactor: IReactorTCP, timeout: float = CONNECT_TIMEOUT) -> None:
        self._reactor = reactor
        self._timeout = timeout
        self._tls = BrowserLikePolicyForHTTPS()
        self._endpoints: dict[tuple[bytes, bytes, int], Any] = {}

    def endpointForURI(self, uri: URI) -> Any:  # an IStreamClientEndpoint
        key = (uri.scheme, uri.host, uri.port)
        endpoint: Any = self._endpoints.get(key)
        if endpoint is None:
            if uri.scheme not in (b"http", b"https"):
                raise SchemeNotSupported(f"unsupported scheme: {uri.scheme!r}")
            tcp = tcp_endpoint(self._reactor, uri.host, uri.port, self._timeout)
            if uri.scheme == b"https":
                endpoint = wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), tcp)
            else:
                endpoint = tcp
            self._endpoints[key] = endpoint
        return endpoint


class _QuietHTTP11ClientFactory(_HTTP11ClientFactory):
    noisy = False


class QuietHTTPConnectionPool(HTTPConnectionPool):
    """``HTTPConnectionPool`` whose connections log no "Starting factory" /
    "Stopping factory" lines, and that caches nothing once closed."""

    _factory = _QuietHTTP11ClientFactory
    _closed = False

    def closeCachedConnections(self) -> Deferred[None]:
        self._closed = True
        closed: Deferred[None] = super().closeCachedConnections()
        return closed

    def _putConnection(self, key: object, connection: Any) -> None:
        # A request that was still out when its owner stopped and closed the
        # pool would otherwise be cached when it ends, with a 240 s timer
        # and an open connection that nobody will ever close.
        if self._closed:
            connection.transport.loseConnection()
            return
        super()._putConnection(key, connection)


def quiet_pool(reactor: IReactorTCP, persistent: bool = True) -> QuietHTTPConnectionPool:
    """A quiet pool on ``reactor``: what its connections are made on (through
    the agent's endpoints), and what times its cached ones out."""
    return QuietHTTPConnectionPool(reactor, persistent=persistent)
