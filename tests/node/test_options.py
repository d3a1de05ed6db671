"""``twistd tasknet-node`` options, as INTERFACES.md names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.python import usage

from tasknet.node.service import NodeService, Options, makeService
from tests.eventually import eventually
from tests.node.harness import logged_in_node, running


def parse(*argv: str) -> Options:
    options = Options()
    options.parseOptions(list(argv))
    return options


def test_defaults_follow_interfaces_md() -> None:
    options = parse("--secret", "x")
    assert options["connect"] == ("tcp:127.0.0.1:7100",)
    assert options["node-id"] == "node-1"
    assert options["data"] == "tasknet-node-data"
    assert (options["protocol"], options["downloads"], options["compressors"]) == (2, 4, 1)
    assert options["ack-timeout"] == 10.0


def test_make_service_takes_every_option(tmp_path: object) -> None:
    options = parse(
        "--secret",
        "x",
        "--connect",
        "tcp:127.0.0.1:9",
        "--node-id",
        "n.2",
        "--data",
        str(tmp_path),
        "--protocol",
        "1",
        "--downloads",
        "2",
        "--compressors",
        "3",
        "--ack-timeout",
        "0.5",
    )
    service = makeService(options)
    assert isinstance(service, NodeService)
    assert (service.connect, service.node_id, service.protocol) == (("tcp:127.0.0.1:9",), "n.2", 1)
    assert (service.downloads, service.compressors, service.ack_timeout) == (2, 3, 0.5)


@pytest.mark.parametrize(
    "argv, complaint",
    [
        ((), "--secret is required"),
        (("--secret", "x", "--protocol", "3"), "--protocol must be 2 or 1"),
        (("--secret", "x", "--downloads", "0"), "downloads"),
        (("--secret", "x", "--compressors", "-1"), "compressors"),
        (("--secret", "x", "--ack-timeout", "0"), "ack-timeout"),
        (("--secret", "x", "--node-id", "bad id"), "--node-id must match"),
        (("--secret", "x", "--node-id", "node-1\n"), "--node-id must match"),
        (("--secret", "x", "--node-id", "n" * 65), "--node-id must match"),
    ],
)
def test_bad_options_are_refused_clearly(argv: tuple[str, ...], complaint: str) -> None:
    with pytest.raises(usage.UsageError, match=complaint):
        parse(*argv)


@pytest_twisted.ensureDeferred
async def test_link_idle_timeout_is_45_s_and_download_stall_timeout_30_s(tmp_path: Path) -> None:
    async with running(tmp_path) as (site, _up):
        async with logged_in_node(site, tmp_path / "node") as node:
            link: Any = await eventually(lambda: node.link, what="link up")
            # PROTOCOL.md: Heartbeat every 15 s, a connection silent for 45 s is closed.
            assert (link.heartbeat_interval, link.idle_timeout) == (15.0, 45.0)
            assert node.worker is not None and node.worker.idle_timeout == 30.0


@pytest_twisted.ensureDeferred
async def test_a_silent_site_is_dropped_after_the_link_idle_timeout(tmp_path: Path) -> None:
    async with running(tmp_path) as (site, _up):  # the scripted site never heartbeats
        # Dropped for silence, redialled, logged in again.
        async with logged_in_node(site, tmp_path / "node", link_idle_timeout=0.2, logins=2):
            assert site.logins >= 2


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp:site.example:7100",
        "tcp:host=site.example:port=7100",
        "tcp:10.0.0.5:7100",
        "tcp:192.168.1.2:7100",
        "tcp6:host=2001\\:db8\\:\\:1:port=7100",
        "TCP:site.example:7100",
    ],
)
def test_plain_tcp_off_loopback_needs_plaintext(endpoint: str) -> None:
    with pytest.raises(usage.UsageError, match="not loopback.*tls:.*--plaintext"):
        parse("--secret", "x", "--connect", endpoint)
    assert parse("--secret", "x", "--plaintext", "--connect", endpoint)["connect"] == (endpoint,)


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp:127.0.0.1:7100",
        "tcp:host=127.0.0.2:port=7100",
        "tcp:localhost:7100",
        "tcp6:host=\\:\\:1:port=7100",
        "unix:path=/run/tasknet/site.sock",
        "tls:site.example:7143:trustRoots=/etc/tasknet/ca",
    ],
)
def test_loopback_unix_and_tls_need_no_plaintext(endpoint: str) -> None:
    assert parse("--secret", "x", "--connect", endpoint)["connect"] == (endpoint,)


def test_ssl_is_refused_for_connect_naming_tls() -> None:
    for argv in ((), ("--plaintext",)):
        with pytest.raises(usage.UsageError, match="ssl: does not verify.*use tls:"):
            parse("--secret", "x", *argv, "--connect", "ssl:site.example:7143")
        with pytest.raises(usage.UsageError, match="use tls:"):
            parse("--secret", "x", *argv, "--connect", "SSL:127.0.0.1:7143")


def test_trust_legacy_site_and_max_archive_bytes_reach_the_service(tmp_path: Path) -> None:
    options = parse("--secret", "x", "--data", str(tmp_path))
    service = makeService(options)
    assert isinstance(service, NodeService)
    assert (service.trust_legacy_site, service.max_archive_bytes) == (False, 8 * 1024**3)
    options = parse(
        "--secret",
        "x",
        "--data",
        str(tmp_path),
        "--trust-legacy-site",
        "--max-archive-bytes",
        "1000",
    )
    service = makeService(options)
    assert isinstance(service, NodeService)
    assert (service.trust_legacy_site, service.max_archive_bytes) == (True, 1000)
    with pytest.raises(usage.UsageError, match="max-archive-bytes"):
        parse("--secret", "x", "--max-archive-bytes", "0")
