"""The one place a component's clock or reactor defaults to the global reactor.

Every timed object takes its clock (``IReactorTime``) or reactor as a
parameter so that its tests can run on ``twisted.internet.task.Clock``; the
default, for production callers that pass nothing, is resolved here, the way
Twisted's ``_maybeGlobalReactor`` does it.  Importing the global reactor only
when needed keeps a test free to install another reactor first.
"""

from __future__ import annotations

from typing import Any


def default_reactor(reactor: Any = None) -> Any:
    """``reactor`` if given, else the global ``twisted.internet.reactor``.

    Typed ``Any``: the reactor's interfaces (IReactorTime, IReactorTCP, ...)
    are provided through zope, which callers use in combination.
    """
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        return global_reactor
    return reactor
