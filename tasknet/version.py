"""``--version`` of every tasknet program: the twistd plugins' options and
the console tools print ``PROGRAM VERSION`` (:data:`tasknet.__version__`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tasknet import __version__

__all__ = ["version_line", "version_option"]


def version_line(program: str) -> str:
    """What ``PROGRAM --version`` prints, e.g. ``tasknet-site 0.1.0``."""
    return f"{program} {__version__}"


def version_option(program: str) -> Callable[[Any], None]:
    """An ``opt_version`` for a twistd plugin's ``usage.Options`` (it
    replaces usage.Options' own, which prints Twisted's version)."""

    def opt_version(self: Any) -> None:
        """Print this program's version (tasknet's) and exit."""
        print(version_line(program))
        sys.exit(0)

    return opt_version
