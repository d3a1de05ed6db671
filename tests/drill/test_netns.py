"""--netns plumbing: two namespaces of our own joined by veth, partition, heal.

Runs only where network namespaces can be made (root with CAP_NET_ADMIN);
elsewhere it is skipped with the reason.  Only the test's own namespaces and
their private /30 are ever addressed.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tasknet.drill.netns import NODE_ADDR, SITE_ADDR, Netns, NetnsError, available, enter

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = Netns(tag=f"tndt{threading.get_native_id()}")
    try:
        ns.create()
    except NetnsError as err:
        ns.destroy()
        pytest.skip(f"cannot create network namespaces here: {err}")
    try:
        yield ns
    finally:
        ns.destroy()


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind((SITE_ADDR, 0))
    sock.listen(1)
    return sock


def _dial_from_nodes(ns: Netns, port: int, timeout: float) -> str:
    result: list[str] = []

    def run() -> None:
        enter(ns.nodes)
        try:
            with socket.create_connection((SITE_ADDR, port), timeout=timeout) as s:
                result.append(f"connected from {s.getsockname()[0]}")
        except OSError as err:
            result.append(type(err).__name__)

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout + 5)
    return result[0]


def test_nodes_reach_the_site_over_veth_until_partitioned(netns: Netns) -> None:
    listener = netns.in_site(_listener)
    try:
        port = listener.getsockname()[1]
        assert _dial_from_nodes(netns, port, 5) == f"connected from {NODE_ADDR}"
        netns.partition()
        assert _dial_from_nodes(netns, port, 1) in ("TimeoutError", "OSError")
        netns.heal()
        assert _dial_from_nodes(netns, port, 5) == f"connected from {NODE_ADDR}"
    finally:
        listener.close()
    # The root namespace never got the private address.
    assert SITE_ADDR not in subprocess.run(["ip", "addr"], capture_output=True, text=True).stdout


def test_destroy_removes_both_namespaces(netns: Netns) -> None:
    netns.destroy()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert netns.site not in listed and netns.nodes not in listed
