"""What a composition root hands a site part, for the tests that build one
by hand (``open_pool``, ``take_lease``, ``build_node_side``): production's
(the global reactor, real threads, the OS's entropy, the system's wall clock
-- the global reactor's ``seconds`` -- the monotonic clock and, for a lease,
the kernel's processes), as ``tasknet.site.root.makeService`` would."""

from __future__ import annotations

import time
from typing import Any

from tasknet.runtime import OSProcesses, RealThreadPools, SystemEntropy


def site_runtime() -> dict[str, Any]:
    """``reactor``, ``threads``, ``entropy``, ``wall`` and ``monotonic`` keywords."""
    from twisted.internet import reactor

    return {
        "reactor": reactor,
        "threads": RealThreadPools(),
        "entropy": SystemEntropy(),
        "wall": reactor.seconds,
        "monotonic": time.monotonic,
    }


def lease_runtime() -> dict[str, Any]:
    """:func:`site_runtime` and ``processes`` (what ``take_lease`` needs)."""
    return site_runtime() | {"processes": OSProcesses()}
