"""Prometheus metrics of a storage node (``tasknet-node --metrics ENDPOINT``).

Each node has its own ``CollectorRegistry`` (several nodes in one test
process never collide); every value is read from the running worker and
reporter at scrape time, so nothing has to be kept in step:

``tasknet_node_bytes_downloaded_total``
    bytes received from the upstream since the node started.
``tasknet_node_active_downloads``
    downloads running now (holding one of the ``--downloads`` slots).
``tasknet_node_queue_length{stage}``
    jobs waiting for a slot: ``stage`` is ``download`` or ``compression``.
``tasknet_node_report_in_flight_age_seconds``
    how long the report in flight has waited for its ACK (0 when none is in
    flight): a site that stops ACKing shows as a growing age.
``tasknet_node_connected``
    1 while logged in to the site, else 0.
``tasknet_node_archives_held``, ``tasknet_node_archive_bytes``
    the archives the node holds, and their bytes (as of retention's last run).
``tasknet_node_disk_free_bytes``
    free bytes on the disk of ``--data`` (absent while unknown).
``tasknet_node_disk_budget_bytes``
    ``--disk-budget`` (absent when none is set).
``tasknet_node_min_free_bytes``
    ``--min-free``.
``tasknet_node_archives_released_total{reason}``
    archives retention removed since the start (``EXPIRED``, ``DISK_BUDGET``).

No ``_created`` series are exported.  The page is served at ``/metrics``
(and ``/``) of the endpoint, without authentication: ``tcp:PORT`` binds to
127.0.0.1 (``tcp6:PORT`` to ::1) unless an interface is named
(:func:`loopback_by_default`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site

from tasknet.weblog import QuietSite


def loopback_by_default(endpoint: str) -> str:
    """``endpoint`` bound to loopback when it is ``tcp:``/``tcp6:`` without an
    ``interface=`` (Twisted's default would be every interface); any other
    endpoint string is returned as it is."""
    from twisted.internet.endpoints import _parse

    kind, _, rest = endpoint.partition(":")
    loopback = {"tcp": "127.0.0.1", "tcp6": "\\:\\:1"}.get(kind.lower())
    if loopback is None:
        return endpoint
    try:
        args, kwargs = _parse(rest)
    except Exception:  # serverFromString will say what is wrong with it
        return endpoint
    # tcp:PORT:BACKLOG:INTERFACE is the positional form; interface= the keyword one.
    if "interface" in kwargs or len(args) >= 3:
        return endpoint
    return f"{endpoint}:interface={loopback}"


# Process-wide switch of prometheus-client (the site's metrics set it too).
disable_created_metrics()


class NodeCollector(Collector):
    """Reads the node's numbers at each scrape.  ``source()`` gives the
    current worker and reporter (``None`` before they exist, e.g. while the
    node is starting: then every value is 0)."""

    def __init__(
        self,
        source: Callable[[], tuple[Any, Any, bool]],
        clock: IReactorTime,
        retention: Callable[[], Any] = lambda: None,
    ) -> None:
        self._source = source
        self._clock = clock
        #: The node's Retention (None before it exists).
        self._retention = retention

    def collect(self) -> Iterator[Metric]:
        worker, reporter, connected = self._source()
        downloaded = worker.bytes_downloaded if worker is not None else 0
        active = worker.downloading() if worker is not None else 0
        waiting_download, waiting_compression = worker.queued() if worker is not None else (0, 0)
        since = reporter.in_flight_since if reporter is not None else None
        age = max(0.0, self._clock.seconds() - since) if since is not None else 0.0

        counter = CounterMetricFamily(
            "tasknet_node_bytes_downloaded", "Bytes received from the upstream since start."
        )
        counter.add_metric([], float(downloaded))
        yield counter
        yield GaugeMetricFamily(
            "tasknet_node_active_downloads", "Downloads running now.", value=float(active)
        )
        queue = GaugeMetricFamily(
            "tasknet_node_queue_length", "Jobs waiting for a slot, by stage.", labels=["stage"]
        )
        queue.add_metric(["download"], float(waiting_download))
        queue.add_metric(["compression"], float(waiting_compression))
        yield queue
        yield GaugeMetricFamily(
            "tasknet_node_report_in_flight_age_seconds",
            "Seconds the report in flight has waited for its ACK (0: none in flight).",
            value=age,
        )
        yield GaugeMetricFamily(
            "tasknet_node_connected", "1 while logged in to the site.", value=float(connected)
        )
        yield from self._disk()

    def _disk(self) -> Iterator[Metric]:
        retention = self._retention()
        figures = retention.figures() if retention is not None else None
        yield GaugeMetricFamily(
            "tasknet_node_archives_held",
            "Archives the node holds.",
            value=float(figures.archives if figures else 0),
        )
        yield GaugeMetricFamily(
            "tasknet_node_archive_bytes",
            "Bytes of the archives the node holds.",
            value=float(figures.archive_bytes if figures else 0),
        )
        if figures is not None and figures.free is not None:
            yield GaugeMetricFamily(
                "tasknet_node_disk_free_bytes",
                "Free bytes on the disk of the node's data directory.",
                value=float(figures.free),
            )
        if figures is not None and figures.budget is not None:
            yield GaugeMetricFamily(
                "tasknet_node_disk_budget_bytes",
                "The node's --disk-budget in bytes.",
                value=float(figures.budget),
            )
        if retention is not None:  # what the near-budget alert compares free space with
            yield GaugeMetricFamily(
                "tasknet_node_min_free_bytes",
                "The node's --min-free in bytes.",
                value=float(retention.min_free),
            )
        released = CounterMetricFamily(
            "tasknet_node_archives_released",
            "Archives retention removed since the start, by reason.",
            labels=["reason"],
        )
        counts = retention.released if retention is not None else {}
        for reason in ("EXPIRED", "DISK_BUDGET"):
            released.add_metric([reason], float(counts.get(reason, 0)))
        yield released


def node_registry(
    source: Callable[[], tuple[Any, Any, bool]],
    clock: IReactorTime,
    retention: Callable[[], Any] = lambda: None,
) -> CollectorRegistry:
    """A registry holding only the node's metrics (``retention()``: the
    node's Retention, for the disk figures)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(source, clock, retention))
    return registry


class _MetricsPage(Resource):
    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self._registry = registry

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode("ascii"))
        request.setHeader(b"Cache-Control", b"no-store")
        return generate_latest(self._registry)


def metrics_site(registry: CollectorRegistry, reactor: IReactorTime) -> Site:
    """The HTTP site serving ``registry`` at ``/metrics`` and ``/``, its
    timers (idle connections, the access log's date) on ``reactor``."""
    page = cast(IResource, _MetricsPage(registry))
    root = Resource()
    root.putChild(b"metrics", page)
    root.putChild(b"", page)
    # Scrapes every few seconds: their access lines are debug events.
    return QuietSite(cast(IResource, root), reactor=reactor)
