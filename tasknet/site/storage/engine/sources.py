"""Where a transaction's time and ids come from: the :class:`Sources` its
connection was given by the pool (:class:`~.database.Database`), which got
them from the composition root (``tasknet/site/root.py``: the reactor's
``seconds`` and the site's :class:`~tasknet.runtime.IEntropy`).

A transaction is one named function of a cursor (``fn(cursor, *args)``);
what it needs of the world beside the database it reads from that cursor:

* :func:`now_of`: the wall clock (Unix seconds), for what Python computes
  from "now" (a view's ``stalledSince``, a timestamp it stamps itself);
* :func:`entropy_of`: ids and secrets (an operationId, an API token).

The SQL side follows the same clock: ``{now}`` (:mod:`~.sql`) is the
``tasknet_now()`` function each SQLite connection is given
(:mod:`~.sqlite`), and on PostgreSQL the session's ``tasknet.now`` when the
clock is not the system's (:mod:`~.postgres`).

:data:`SYSTEM` (``time.time``, the OS's entropy) is what a tool's or a
test's plain connection gets (:func:`~.database.connect`); a site's
connections get the root's, never this default.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tasknet.runtime import IEntropy, SystemEntropy

#: A simulation's storage faults (production has none): called with the
#: point of a write transaction (``"begin"``: before its ``BEGIN``;
#: ``"commit"``: before its ``COMMIT``; ``"committed"``: after it), the
#: connection, and the names of the storage functions the transaction runs
#: (empty at ``"begin"``); it raises the driver's own error (busy, I/O, disk
#: full) to fail the transaction there, so that the storage layer classifies
#: it as it would a real one, or (``"committed"``) stops its process there.
StorageFaults = Callable[[str, object, tuple[str, ...]], None]


class OnConnection(Protocol):
    """A cursor of either backend, as far as this module reads it (the
    :data:`~.transactions.Cursor` alias lives above this module)."""

    @property
    def connection(self) -> object: ...


@dataclass(frozen=True)
class Sources:
    """The wall clock (``wall()``: Unix seconds) and the entropy of the
    transactions run on one connection, and the faults injected into them
    (a simulation's; None in production)."""

    wall: Callable[[], float]
    entropy: IEntropy
    faults: StorageFaults | None = None

    @property
    def system_wall(self) -> bool:
        """``wall`` is the system's clock (``time.time``, which a real
        reactor's ``seconds`` is), the very clock the database reads for
        its own "now": nothing needs telling the database."""
        return self.wall is time.time


#: A tool's or a test's (:func:`~.database.connect`): the system's clock and
#: the OS's entropy, as before there were sources.  Never a site's.
SYSTEM = Sources(time.time, SystemEntropy())


def sources_of(cursor: OnConnection) -> Sources:
    """The :class:`Sources` of the connection ``cursor`` belongs to; a
    connection the engine did not open (a bare ``sqlite3.connect``) has none:
    ``TypeError`` (its ``{now}`` would fail too: no ``tasknet_now()``)."""
    found = getattr(cursor.connection, "sources", None)
    if not isinstance(found, Sources):
        raise TypeError(
            "a storage function ran on a connection the engine did not open"
            " (use tasknet.site.storage.engine.database.connect or a Database pool)"
        )
    return found


def fault_point(connection: object, point: str, functions: tuple[str, ...] = ()) -> None:
    """Where a write transaction (running ``functions``) may be failed by
    its pool's :data:`StorageFaults` (see there); nothing without them."""
    sources = getattr(connection, "sources", None)
    if isinstance(sources, Sources) and sources.faults is not None:
        sources.faults(point, connection, functions)


def now_of(cursor: OnConnection) -> float:
    """The wall clock of ``cursor``'s connection, now (Unix seconds)."""
    return sources_of(cursor).wall()


def entropy_of(cursor: OnConnection) -> IEntropy:
    """The entropy of ``cursor``'s connection (ids, secrets)."""
    return sources_of(cursor).entropy


def token_urlsafe(entropy: IEntropy, nbytes: int) -> str:
    """``nbytes`` bytes of ``entropy`` as unpadded base64url text: the very
    format of ``secrets.token_urlsafe(nbytes)`` (which is this, with the OS's
    bytes)."""
    return base64.urlsafe_b64encode(entropy.token_bytes(nbytes)).rstrip(b"=").decode("ascii")
