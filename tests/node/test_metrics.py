"""``tasknet-node --metrics ENDPOINT``: a real node, a scripted site over TCP,
the mock upstream with a slow body, scraped over real loopback HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.task import Clock, deferLater
from twisted.python import usage
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Site

from tasknet.node.metrics import loopback_by_default, node_registry
from tasknet.node.paths import DataDir
from tasknet.node.reporter import Reporter
from tasknet.node.service import Options
from tasknet.node.store import NodeStore
from tasknet.protocol.messages import TaskReportAck
from tasknet.runtime import RealThreadPools, SeededEntropy
from tasknet.upstream import catalog
from tests.eventually import eventually
from tests.node.harness import SECRET, file_fault, logged_in_node, running, start_node

GID, OTHER = 5150, 5151


async def scrape(node: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        url = f"http://127.0.0.1:{node.metrics_port.getHost().port}/metrics"
        response = await treq.get(url, pool=pool)
        assert response.code == 200
        assert response.headers.getRawHeaders("content-type")[0].startswith("text/plain")
        body = await response.text()
    finally:
        await pool.closeCachedConnections()
    assert "_created" not in body
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def scrape_until(node: Any, check: Any, what: str, timeout: float = 20.0) -> dict:
    """Scrape every 20 ms until ``check(samples)``; fail after ``timeout``."""
    waited = 0.0
    while True:
        samples = await scrape(node)
        if check(samples):
            return samples
        if waited >= timeout:
            raise AssertionError(f"timed out waiting for {what}: {samples}")
        await deferLater(reactor, 0.02, lambda: None)
        waited += 0.02


@pytest_twisted.ensureDeferred
async def test_metrics_follow_downloads_queue_and_the_report_in_flight(tmp_path: Path) -> None:
    async with running(tmp_path, auto_ack=False) as (site, up):
        size = catalog.gallery(GID).size
        # About 2 s for the first download: long enough to see it running
        # with the other queued (--downloads 1).
        up.set_faults(file_fault("slow_body", times=1, bytes_per_s=size / 2))
        options = {"downloads": 1, "metrics": "tcp:0:interface=127.0.0.1", "ack_timeout": 30.0}
        async with logged_in_node(site, tmp_path / "node", **options) as node:
            samples = await scrape(node)
            assert value(samples, "tasknet_node_connected") == 1
            assert value(samples, "tasknet_node_active_downloads") == 0
            assert value(samples, "tasknet_node_bytes_downloaded_total") == 0
            site.download("op-1", GID, up.file_url(GID))
            site.download("op-2", OTHER, up.file_url(OTHER))
            samples = await scrape_until(
                node,
                lambda s: (
                    value(s, "tasknet_node_active_downloads") == 1
                    and value(s, "tasknet_node_queue_length", stage="download") == 1
                ),
                "one download running and one queued",
            )
            assert value(samples, "tasknet_node_queue_length", stage="compression") == 0
            # Nothing is ACKed: the first report stays in flight and ages.
            await eventually(lambda: site.reports(), what="a report")
            await scrape_until(
                node,
                lambda s: value(s, "tasknet_node_report_in_flight_age_seconds") > 0,
                "the report in flight to age",
            )
            site.ack(site.reports()[-1].report_id)
            total = size + catalog.gallery(OTHER).size
            samples = await scrape_until(
                node,
                lambda s: value(s, "tasknet_node_bytes_downloaded_total") >= total,
                "both downloads",
            )
            # Every byte counted once.
            assert value(samples, "tasknet_node_bytes_downloaded_total") == total
            await eventually(
                lambda: node.worker is not None and node.worker.downloading() == 0, what="idle"
            )
            samples = await scrape(node)
            assert value(samples, "tasknet_node_active_downloads") == 0


@pytest_twisted.ensureDeferred
async def test_a_taken_metrics_port_fails_the_start(tmp_path: Path) -> None:
    taken = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Site(Resource()))
    try:
        async with running(tmp_path) as (site, _up):
            endpoint = f"tcp:{taken.getHost().port}:interface=127.0.0.1"
            with pytest.raises(Exception, match="Address already in use|Couldn't listen"):
                await start_node(site, tmp_path / "node", metrics=endpoint)
    finally:
        await taken.stopListening()


def test_metrics_option_is_parsed() -> None:
    options = Options()
    options.parseOptions(["--secret", SECRET, "--metrics", "tcp:9101:interface=127.0.0.1"])
    assert options["metrics"] == "tcp:9101:interface=127.0.0.1"
    options = Options()
    options.parseOptions(["--secret", SECRET])
    assert options["metrics"] is None
    with pytest.raises(usage.UsageError):
        Options().parseOptions(["--secret", SECRET, "--metrics"])


@pytest_twisted.ensureDeferred
async def test_in_flight_age_is_measured_on_the_node_clock(tmp_path: Path) -> None:
    """A report left in flight by the previous run ages from the start, on
    the reporter's clock; no report in flight reads 0."""
    store = NodeStore(
        DataDir(tmp_path / "node"), reactor=reactor, clock=reactor, threads=RealThreadPools()
    )
    try:
        await store.create_schema()
        clock = Clock()
        empty = Reporter(store, legacy_node=False, clock=clock, entropy=SeededEntropy(0))
        await empty.load()
        registry = node_registry(lambda: (None, empty, False), clock)

        def age() -> float:
            body = generate_latest(registry).decode()
            [family] = [
                f
                for f in text_string_to_metric_families(body)
                if f.name == "tasknet_node_report_in_flight_age_seconds"
            ]
            return float(family.samples[0].value)

        assert age() == 0.0
        await store.accept_download(7, "op-7", "", "http://upstream.test/files/7-1.bin", 2)
        assert await store.create_report("r-1", 1000) is not None
        reporter = Reporter(store, legacy_node=False, clock=clock, entropy=SeededEntropy(0))
        clock.advance(100)  # the node started a while ago; the age counts from the load
        await reporter.load()
        registry = node_registry(lambda: (None, reporter, False), clock)
        assert age() == 0.0
        clock.advance(12.5)
        assert age() == 12.5
        await reporter.ack_received(TaskReportAck("r-1", "APPLIED"))
        assert age() == 0.0
        reporter.stop()
        empty.stop()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("endpoint", "bound"),
    [
        ("tcp:9101", "tcp:9101:interface=127.0.0.1"),
        ("tcp:port=9101", "tcp:port=9101:interface=127.0.0.1"),
        ("tcp6:9101", "tcp6:9101:interface=\\:\\:1"),
        ("tcp:9101:interface=0.0.0.0", "tcp:9101:interface=0.0.0.0"),  # named: as given
        ("tcp:9101:50:10.0.0.1", "tcp:9101:50:10.0.0.1"),  # the positional interface
        ("unix:/run/tasknet/metrics", "unix:/run/tasknet/metrics"),
    ],
)
def test_a_metrics_endpoint_without_an_interface_is_loopback(endpoint: str, bound: str) -> None:
    assert loopback_by_default(endpoint) == bound


@pytest_twisted.ensureDeferred
async def test_metrics_on_tcp_port_bind_to_loopback_only(tmp_path: Path) -> None:
    async with running(tmp_path) as (site, _up):
        async with logged_in_node(site, tmp_path / "node", metrics="tcp:0") as node:
            assert node.metrics_port.getHost().host == "127.0.0.1"
            samples = await scrape(node)
            assert value(samples, "tasknet_node_connected") == 1
