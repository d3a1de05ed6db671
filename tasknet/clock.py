"""The one place a component's clock or reactor defaults to the global reactor.

Every timed object takes its clock (``IReactorTime``) or reactor as a
parameter so that its tests can run on ``twisted.internet.task.Clock``, and
a composition root hands it the process's (``tasknet.node.service.NodeService``,
``tasknet.site.root.build_site``, ``tasknet.upstream.service.makeService``):
the roots resolve Twisted's global reactor themselves, at the entry point.

Not for new code.  What still calls this is a seam of issue 20: a component
whose callers do not all pass the reactor yet (``NodeStore``, for
``bench/nodeworker.py``; ``PeerFactory``, for ``NodeListenerFactory``), or
an entry point that resolves its own (the drill's proxy), so that nothing a
root builds depends on it, but a part built outside a root may still reach
the global reactor.  (The site's storage, dispatcher and ``NodeOwnership``
take theirs from ``tasknet.site.root``; ``tasknet-admin`` resolves the real
one itself.)  Importing the global reactor only when needed keeps a
test free to install another reactor first.
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
