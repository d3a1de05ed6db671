"""Exit non-zero when a twistd service fails to start (site and node; imports neither).

twistd has no way for a service to set the process's exit status (Twisted
issues #4762 and #11335): a service whose asynchronous start-up fails can
only stop the reactor, and twistd then exits 0.  :func:`exit_after_stop`
stops the reactor and, once twistd has finished its own shutdown (the
services stopped, the log written, the pid file removed) and the interpreter
is exiting, ends the process with the given status.  Only the twistd entry
points (``makeService``) ask for this; a service started in-process (tests)
just fails its ``ready`` Deferred.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

__all__ = ["exit_after_stop"]

_exit_status: int | None = None


def _exit_with_status() -> None:
    if _exit_status is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or redirected away
            pass
    # sys.exit in an atexit handler is ignored; os._exit is the only way left.
    os._exit(_exit_status)


def exit_after_stop(reactor: Any, status: int = 1) -> None:
    """Stop ``reactor`` (now, or as soon as it runs) and make the process
    exit with ``status`` when the interpreter exits."""
    global _exit_status
    if _exit_status is None:
        atexit.register(_exit_with_status)
    _exit_status = status
    if reactor.running:
        reactor.stop()
    else:
        reactor.callWhenRunning(reactor.stop)
