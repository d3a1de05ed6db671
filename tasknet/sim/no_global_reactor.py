"""A process given over to simulated worlds has no Twisted reactor of its own.

Every role takes its reactor, clock, thread pools and entropy from its
composition root, so nothing in a simulation needs Twisted's global
reactor.  :func:`forbid` installs :class:`NoGlobalReactor` as that global
reactor, which fails whatever touches it: a use is a seam that bypasses a
root, and shows at once instead of leaking real time or real threads into
the world.  (klein imports the global reactor and never uses it.)  A
process setting, for ``tasknet-sim`` and a test's subprocess; it must run
before anything imports ``twisted.internet.reactor``.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["NoGlobalReactor", "forbid"]


class NoGlobalReactor:
    """Twisted's global reactor in a process given over to the world."""

    touched: ClassVar[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        NoGlobalReactor.touched.append(name)
        raise RuntimeError(f"the global reactor was used: .{name}")


def forbid() -> None:
    """Install :class:`NoGlobalReactor` (see the module doc); a no-op if
    it already is the global reactor."""
    import sys

    current = sys.modules.get("twisted.internet.reactor")
    if isinstance(current, NoGlobalReactor):
        return
    from twisted.internet.main import installReactor

    installReactor(NoGlobalReactor())  # type: ignore[arg-type]
