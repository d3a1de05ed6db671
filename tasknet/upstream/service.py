"""``twistd -n tasknet-upstream``: the mock upstream as a twistd service.

:func:`makeService` is the composition root: it is given the reactor (twistd
gives none, and the global reactor is resolved there, once) and hands it to
everything below it, the app's clock and the listening endpoint alike; the
app's random source is seeded there from ``--seed``. The simulator builds
the upstream the same way on its own reactor::

    service = makeService(options, reactor=sim_reactor)
    service.startService()
"""

from __future__ import annotations

import random

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService, Service
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads, IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.python import usage

from tasknet.logging import LogOptions, rotate_on, use_for_twistd
from tasknet.upstream.app import UpstreamApp
from tasknet.version import version_option

log = Logger()

DEFAULT_HTTP = "tcp:7200:interface=127.0.0.1"


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {text}")
    return value


class Options(LogOptions, usage.Options):
    synopsis = "[--http ENDPOINT] [--bandwidth BYTES_PER_S] [--seed N]"
    longdesc = "Mock non-idempotent archive upstream with fault injection (/_drill/*)."
    optParameters = [
        ["http", None, DEFAULT_HTTP, "HTTP endpoint (strports description)"],
        ["bandwidth", None, None, "per-response file body limit, bytes/s (default unlimited)"],
        ["seed", None, 0, "seed of the fault-probability random source", int],
    ]

    opt_version = version_option("tasknet-upstream")

    def postOptions(self) -> None:
        use_for_twistd(self)  # --log-format, --log-level (tasknet/logging.py)
        if self["bandwidth"] is not None:
            try:
                self["bandwidth"] = _positive_float(self["bandwidth"])
            except ValueError as e:
                raise usage.UsageError(f"--bandwidth: {e}") from None


class _AbortConnectionsOnStop(Service):
    """Stopping the port leaves accepted connections; drop them (hung ones too)."""

    def __init__(self, app: UpstreamApp) -> None:
        self._app = app

    def stopService(self) -> Deferred[None]:
        super().stopService()
        return self._app.close_connections()


class UpstreamService(MultiService):
    """The upstream's service: its ``app``, listening on ``endpoint``."""

    def __init__(self, app: UpstreamApp, endpoint: str) -> None:
        super().__init__()
        self.app = app
        self.endpoint = endpoint

    def startService(self) -> None:
        log.info(
            "tasknet-upstream listening on {endpoint} (bandwidth: {bandwidth})",
            endpoint=self.endpoint,
            bandwidth=self.app.bandwidth or "unlimited",
        )
        super().startService()


def makeService(options: Options, reactor: IReactorTCP | None = None) -> UpstreamService:
    """The upstream from its options, on ``reactor`` (an ``IReactorTCP`` that
    is an ``IReactorTime`` too, as every Twisted reactor is).  Its root:
    twistd's call gives no reactor, and the global one is resolved here."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = IReactorTCP(global_reactor)
    tcp: IReactorTCP = reactor
    rotate_on(IReactorFromThreads(tcp, None))  # twistd's log file, on SIGUSR1
    app = UpstreamApp(
        options["bandwidth"],
        clock=IReactorTime(tcp),
        rng=random.Random(options["seed"]),
    )
    service = UpstreamService(app, options["http"])
    # MultiService stops children in reverse order: the port stops first.
    _AbortConnectionsOnStop(app).setServiceParent(service)
    listening = StreamServerEndpointService(
        endpoints.serverFromString(tcp, options["http"]), app.site()
    )
    # As strports.service: a port that cannot be bound fails the start at once.
    listening._raiseSynchronously = True
    listening.setServiceParent(service)
    return service
