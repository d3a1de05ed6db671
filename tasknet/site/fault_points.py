"""Fault points for drills: places in the real code where a drill can make
the site stop at the worst instant (FoundationDB's ``BUGGIFY``, in spirit).
Each is inactive unless the environment of the site process names it, and
nothing else reads these variables.

* ``TASKNET_FAULT_PAUSE_BEFORE_POST=PATH``: the first time a POST's
  upstream connection is up, before the POST gate's check and before its
  first byte, the site writes its pid to ``PATH`` and stops itself
  (``SIGSTOP``), as a stop signal, a long GC or a VM migration would stop
  it there (DRILLS.md S23).  A ``SIGCONT`` resumes it right into the check.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

PAUSE_BEFORE_POST = "TASKNET_FAULT_PAUSE_BEFORE_POST"


def pause_before_post(environ: Mapping[str, str]) -> Callable[[], None] | None:
    """The hook the lifecycle calls just before its POST gate, or ``None``."""
    marker = environ.get(PAUSE_BEFORE_POST)
    if not marker:
        return None
    path = Path(marker)

    def pause() -> None:
        if path.exists():
            return  # once: the drill armed it for one POST
        path.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)

    return pause
