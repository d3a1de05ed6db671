"""Deferred helpers shared by the site and the node (imports neither)."""

from __future__ import annotations

from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

__all__ = ["shield"]

log = Logger()

T = TypeVar("T")


def shield(d: Deferred[T], *, expected: tuple[type[BaseException], ...] = ()) -> Deferred[T]:
    """A Deferred with ``d``'s result whose cancellation does not reach ``d``.

    For work that must run to its end even when whoever waits on it goes away:
    a create whose client hung up (cancelling the POST half-way would turn a
    clean outcome into an ambiguous one), a compression thread (nothing can
    stop a thread from outside; its owner waits on ``d`` itself).

    ``d`` is consumed: once it fires, its own result is ``None``.  A failure
    that arrives after the follower was cancelled has nobody to go to, so it
    is logged, unless it is one of the ``expected`` exception types (e.g. the
    abort a cancelled owner asked for).
    """
    follower: Deferred[T] = Deferred()

    def relay(result: Any) -> None:
        if not follower.called:
            if isinstance(result, Failure):
                follower.errback(result)
            else:
                follower.callback(result)
        elif isinstance(result, Failure) and not result.check(*expected):
            log.failure("a shielded operation failed after its caller left", result)

    d.addBoth(relay)
    return follower
