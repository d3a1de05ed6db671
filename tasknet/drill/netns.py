"""``--netns``: the site and the nodes in two network namespaces of our own.

Layout (root only; nothing is ever added to the root namespace):

    namespace <tag>s  (upstream, site)            namespace <tag>n  (nodes, fault proxies)
      lo 127.0.0.1: site HTTP                       lo 127.0.0.1: fault proxies
      vs 10.231.0.1/30: upstream, node listener ── vn 10.231.0.2/30

The /30 exists only inside these two namespaces.  Processes run under
``ip netns exec`` (which execs, so the pid we signal is twistd's own).  The
drill's own sockets enter a namespace per thread (``setns`` on the calling
thread): the reactor thread (fault proxies) lives in the nodes' namespace,
and a pool of worker threads in the site's namespace makes the drill's HTTP
calls and serves its webhook receiver.  A partition is ``ip link set vn down``.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

CLONE_NEWNET = 0x40000000
SITE_ADDR = "10.231.0.1"
NODE_ADDR = "10.231.0.2"
PREFIX = 30

T = TypeVar("T")


class NetnsError(Exception):
    pass


def available() -> str | None:
    """None when --netns can run here, else why not."""
    if os.geteuid() != 0:
        return "--netns needs root (network namespaces and veth pairs)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "--netns needs the `ip` tool with netns support"
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def enter(name: str) -> None:
    """Move the calling thread into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


class Netns:
    """Two namespaces joined by a veth pair; created, partitioned, removed."""

    def __init__(self, tag: str | None = None) -> None:
        tag = tag or f"tnd{os.getpid()}"
        self.site = f"{tag}s"
        self.nodes = f"{tag}n"
        self.created = False
        self._pool: ThreadPoolExecutor | None = None

    def create(self) -> None:
        _ip("netns", "add", self.site)
        self.created = True
        _ip("netns", "add", self.nodes)
        for ns in (self.site, self.nodes):
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.site, "link", "add", "vs", "type", "veth", "peer", "name", "vn",
            "netns", self.nodes)  # fmt: skip
        _ip("-n", self.site, "addr", "add", f"{SITE_ADDR}/{PREFIX}", "dev", "vs")
        _ip("-n", self.nodes, "addr", "add", f"{NODE_ADDR}/{PREFIX}", "dev", "vn")
        _ip("-n", self.site, "link", "set", "vs", "up")
        _ip("-n", self.nodes, "link", "set", "vn", "up")

    def destroy(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if not self.created:
            return
        for ns in (self.nodes, self.site):  # the veth pair goes with its namespaces
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = False

    def partition(self) -> None:
        """Take the link between site and nodes down (TCP sees silence, not a reset)."""
        _ip("-n", self.nodes, "link", "set", "vn", "down")

    def heal(self) -> None:
        _ip("-n", self.nodes, "link", "set", "vn", "up")

    def exec_prefix(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    def in_site(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on a worker thread inside the site's namespace."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                16, thread_name_prefix="netns-site", initializer=enter, initargs=(self.site,)
            )
        return self._pool.submit(fn, *args, **kwargs).result()


#: ``--db postgres-ha --netns``: the primary's host in a namespace of its own
#: (S24's "host cut off" run).  A /30 of its own, apart from the site/nodes one.
HOST_ROOT_ADDR = "10.232.0.1"
HOST_ADDR = "10.232.0.2"
HOST_NETWORK = "10.232.0.0/30"
#: A locally administered MAC no interface has: frames sent to it are
#: dropped by the receiving end as another host's.
NOWHERE_MAC = "02:00:00:00:00:01"

_hosts_made = 0


class HostNetns:
    """One database host in a network namespace of its own, joined to the
    root namespace by a veth pair (root side :data:`HOST_ROOT_ADDR`, the
    host :data:`HOST_ADDR`, a /30).  :meth:`cut_off` makes every packet
    between the two ends vanish on the far side, both ways, the links up:
    each end's neighbour entry for the other is pinned to a MAC nobody has,
    so the frames arrive for another host and are dropped without an
    answer.  Senders see silence (no RST, no ICMP, no local error), as when
    a machine's network fails past its switch; TCP retransmits and gives up
    by its own timers (a link taken down instead would fail the sends
    locally, and Linux then retries them for ever, ``tcp_user_timeout`` or
    not).  The root side's address stays a local one: what listens on it
    (the monitor, the standby) stays reachable from the root namespace.
    :meth:`destroy` removes the namespace and the pair."""

    def __init__(self, tag: str | None = None) -> None:
        global _hosts_made
        _hosts_made += 1
        tag = tag or f"tpg{os.getpid()}x{_hosts_made}"
        self.name = tag
        self.root_link = f"{tag}r"
        self.link = "vh"
        self.created = False

    def create(self) -> None:
        _ip("netns", "add", self.name)
        self.created = True
        _ip("-n", self.name, "link", "set", "lo", "up")
        _ip("link", "add", self.root_link, "type", "veth", "peer", "name", self.link,
            "netns", self.name)  # fmt: skip
        _ip("addr", "add", f"{HOST_ROOT_ADDR}/{PREFIX}", "dev", self.root_link)
        _ip("-n", self.name, "addr", "add", f"{HOST_ADDR}/{PREFIX}", "dev", self.link)
        _ip("link", "set", self.root_link, "up")
        _ip("-n", self.name, "link", "set", self.link, "up")

    def cut_off(self) -> None:
        """The host's network fails: nothing passes either way, silently."""
        _ip("neigh", "replace", HOST_ADDR, "lladdr", NOWHERE_MAC, "dev", self.root_link,
            "nud", "permanent")  # fmt: skip
        _ip("-n", self.name, "neigh", "replace", HOST_ROOT_ADDR, "lladdr", NOWHERE_MAC,
            "dev", self.link, "nud", "permanent")  # fmt: skip

    def reconnect(self) -> None:
        """The host's network is back (the neighbours are learnt again)."""
        _ip("neigh", "del", HOST_ADDR, "dev", self.root_link)
        _ip("-n", self.name, "neigh", "del", HOST_ROOT_ADDR, "dev", self.link)

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def destroy(self) -> None:
        """Remove the namespace and the veth pair.  Idempotent."""
        if not self.created:
            return
        subprocess.run(["ip", "link", "del", self.root_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        self.created = False
