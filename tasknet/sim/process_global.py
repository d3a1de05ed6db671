"""A stopgap for code that still reaches past its composition root.

Some of the roles' code does not take all it needs from its root yet (the
seams of issue 20): an ``adbapi.ConnectionPool`` built without
``cp_reactor`` runs on Twisted's global reactor, and a
``twisted.python.threadpool.ThreadPool`` made by the code itself runs real
threads.  Until those seams exist, a process given over to one simulated
world can make the world the process's Twisted: :func:`install` makes a
:class:`~tasknet.sim.reactor.SimReactor` the global reactor (Twisted's own
``installReactor``, so it must come before anything imports
``twisted.internet.reactor``) and Twisted's ``ThreadPool`` a
:class:`~tasknet.sim.threads.SimThreadPool` on it (so it must come before
a module that binds ``ThreadPool`` by name is imported).

The node and the mock upstream no longer need it: their roots take the
reactor, the thread pools (``tasknet.runtime.IThreadPools``, which
:class:`~tasknet.sim.reactor.SimReactor` provides) and the entropy
(``tasknet.runtime.IEntropy``) and hand them down (tests/sim/node_world.py
runs the node with Twisted's global reactor forbidden).  What is left is the
site's storage (its ``adbapi`` pools and the lease's ``ThreadPool``), until
those take theirs from the site's root too.

It replaces Twisted's, not ours: the roles run unchanged.  It is a process
setting, for ``tasknet-sim`` and a test's subprocess, never for a test
process whose reactor is already Twisted's; and only one process of the
world can be the global one, which is why the seams are still wanted.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.python import threadpool

from tasknet.sim.reactor import SimReactor
from tasknet.sim.threads import SimThreadPool

__all__ = ["install", "installed"]

_installed: SimReactor | None = None


def installed() -> SimReactor | None:
    """The reactor :func:`install` made global in this process, if any."""
    return _installed


def _thread_pool(minthreads: int = 5, maxthreads: int = 20, name: str | None = None) -> Any:
    if _installed is None:  # pragma: no cover - install() sets it first
        raise RuntimeError("tasknet.sim.process_global.install() was not called")
    return SimThreadPool(_installed, minthreads, maxthreads, name=name)


def install(reactor: SimReactor) -> None:
    """Make ``reactor`` this process's Twisted reactor, and its thread
    pools simulated (see the module doc)."""
    global _installed
    if "twisted.internet.reactor" in sys.modules:
        from twisted.internet.error import ReactorAlreadyInstalledError

        raise ReactorAlreadyInstalledError(
            "tasknet.sim.process_global.install() must run before anything imports "
            "twisted.internet.reactor"
        )
    from twisted.internet.main import installReactor

    installReactor(reactor)  # type: ignore[arg-type]
    _installed = reactor
    threadpool.ThreadPool = _thread_pool  # type: ignore[assignment,misc]
