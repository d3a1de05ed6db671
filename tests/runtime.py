"""What a composition root hands a site part, for the tests that build one
by hand (``open_pool``, ``take_lease``, ``build_node_side``): production's
(the global reactor, real threads, the OS's entropy, the monotonic clock),
as ``tasknet.site.root.makeService`` would."""

from __future__ import annotations

import time
from typing import Any

from tasknet.runtime import RealThreadPools, SystemEntropy


def site_runtime() -> dict[str, Any]:
    """``reactor``, ``threads``, ``entropy`` and ``monotonic`` keywords."""
    from twisted.internet import reactor

    return {
        "reactor": reactor,
        "threads": RealThreadPools(),
        "entropy": SystemEntropy(),
        "monotonic": time.monotonic,
    }
