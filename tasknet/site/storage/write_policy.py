"""How the lifecycle runs a write transaction, declared once beside the
transaction function (:func:`write_policy`), never chosen at each call site.

A :class:`WritePolicy` says whether the commit may have enqueued
notifications (the outbox is woken after it), whether the write settles an
outcome a client waits for (retried while the database is busy, for the
lifecycle's ``record_retry_for``) and whether it then keeps trying in the
background on the site's clock until it lands, and whether it is a step of a
create's chain (refused once the site has answered its creates early).  The
lifecycle's one write path (:meth:`tasknet.site.lifecycle.Lifecycle._run`)
reads it; callers that run the same function otherwise (the reaper, tools,
tests) ignore it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_POLICY = "__tasknet_write_policy__"


@dataclass(frozen=True)
class WritePolicy:
    """The policy of one write function (see the module doc)."""

    #: Its commit may have enqueued notifications: the outbox is woken after it.
    wakes_outbox: bool = False
    #: The outcome it settles, named for the log (``"UNKNOWN"``), or None.
    #: Such a write is retried with backoff while the database is busy, for
    #: the lifecycle's ``record_retry_for``, then fails ``Unrecorded``; its
    #: function acts only on the expected generation in the expected state,
    #: so a repeat is a no-op (and takes the gid first, for the log).
    settles: str | None = None
    #: A settling write not recorded in its window (or failed) goes on being
    #: retried in the background every ``settle_interval`` until it lands:
    #: the outcome must land while the site lives, not at its next start.
    keeps_trying: bool = False
    #: A step of a create's chain: refused (``Closed``) once the site is
    #: fenced or stops, for its create may have been answered already.
    create_step: bool = False

    def __post_init__(self) -> None:
        if self.keeps_trying and self.settles is None:
            raise ValueError("only a write that settles an outcome keeps trying")


def write_policy(
    *,
    wakes_outbox: bool = False,
    settles: str | None = None,
    keeps_trying: bool = False,
    create_step: bool = False,
) -> Callable[[F], F]:
    """Declare the :class:`WritePolicy` of the write function it decorates."""
    policy = WritePolicy(wakes_outbox, settles, keeps_trying, create_step)

    def declare(fn: F) -> F:
        setattr(fn, _POLICY, policy)
        return fn

    return declare


def policy_of(fn: Callable[..., Any]) -> WritePolicy:
    """The policy ``fn`` declared; a ``TypeError`` if it declared none (a
    write the lifecycle runs must say how, beside its definition)."""
    policy = getattr(fn, _POLICY, None)
    if not isinstance(policy, WritePolicy):
        name = getattr(fn, "__qualname__", fn)
        raise TypeError(f"{name} declares no write policy (@write_policy)")
    return policy
