"""Run the Twisted reactor in a background thread for blocking drill code.

The drill orchestration is plain sequential code; only the fault proxies need
a reactor.  This runs the global reactor in a daemon thread and offers
:func:`call` to run a function there and wait for its result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet import reactor as _reactor
from twisted.internet.threads import blockingCallFromThread

T = TypeVar("T")

reactor: Any = _reactor  # Any: it provides many reactor interfaces at once
_thread: threading.Thread | None = None


def start(netns: str | None = None) -> None:
    """Start the reactor thread (once per process), inside network namespace
    ``netns`` when given (the reactor's sockets are then created there)."""
    global _thread
    if _thread is not None:
        return

    def run() -> None:
        if netns is not None:
            from tasknet.drill.netns import enter

            enter(netns)
        reactor.run(installSignalHandlers=False)

    _thread = threading.Thread(target=run, daemon=True)
    _thread.start()
    # The reactor is running once it executes a call for us.
    call(lambda: None)


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` in the reactor thread; return its (Deferred's) result."""
    if _thread is None:
        raise RuntimeError("reactor thread not started")
    return blockingCallFromThread(reactor, fn, *args, **kwargs)  # type: ignore[no-any-return]


def stop() -> None:
    """Stop the reactor thread (the process can then exit)."""
    global _thread
    if _thread is None:
        return
    reactor.callFromThread(reactor.stop)
    _thread.join(10)
    _thread = None
