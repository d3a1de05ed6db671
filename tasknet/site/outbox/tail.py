"""The outbox's WebSocket tail: how far this site pushed, and its marks.

Delivery semantics: at-least-once to the WebSocket clients connected when
the row is drained; the row is then marked (``ws_delivered_at``; shared:
this site's read position).  A client that connects later does not get old
rows replayed: it loads the current state (``GET /api/tasks``) and follows
the pushes from then on.  A crash after the push and before the mark
pushes the row again after the restart.  The marks are written lazily, a
few times a second at most (:mod:`tasknet.site.outbox.marks`): each is a
write transaction on the one writer the reports need, and the in-memory
position (:attr:`Tail.after`) already keeps this run from repeating a row.

Two tails, chosen once by the composition root (``tasknet.site.root``):

* :class:`LocalTail`, one site alone on its database: the rows not yet
  fanned out, marked ``ws_delivered_at`` by id range;
* :class:`SharedTail`, several sites on one PostgreSQL database (*shared*:
  ``db.capabilities.shared_by_sites`` and an ``instance_id``; SCALE.md 6,
  ``storage/outbox.py``): every site tails every row for its own WebSocket
  clients, from the newest row at its start, by id (the outbox lock makes
  ids visible in id order, so the tail never passes a row that may still
  commit); its marks record how far it read (``outbox_reader``), and a row
  is marked (or, without a webhook, deleted) only once every open instance
  has read it.  It registers (``join_readers``) as its site starts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from twisted.internet.defer import DeferredLock
from twisted.logger import Logger

from tasknet.site.storage import outbox as outbox_rows
from tasknet.site.storage.engine.database import Database

log = Logger()


class Publisher(Protocol):
    """Where WebSocket pushes go (``tasknet.site.web.events.EventHub``)."""

    def publish(self, user_id: int | None, payload: str) -> int: ...

    def listening(self) -> bool: ...


class Tail(ABC):
    """This site's position in the outbox: rows up to :attr:`after` are
    pushed to its WebSocket clients, rows up to :attr:`marked` are marked
    in the database.  The executor reads pages (:meth:`rows`), moves
    :attr:`after` as it pushes them, and writes the marks (:meth:`mark`)."""

    #: Several sites share the database and this tail is one of their readers.
    shared = False

    def __init__(self, db: Database) -> None:
        self._db = db
        #: Rows up to this id are pushed to the WebSocket clients.
        self.after = 0
        #: Rows up to this id are marked in the database.
        self.marked = 0
        #: Registered as a reader (shared); a local tail never needs to.
        self.joined = False

    @abstractmethod
    async def join(self) -> None:
        """Register as a reader, if this tail needs to (shared)."""

    @abstractmethod
    async def leave(self) -> None:
        """A clean stop: stop holding the others' marks back (shared)."""

    @abstractmethod
    async def rows(self, page_size: int) -> list[outbox_rows.OutboxRow]:
        """The next committed rows after :attr:`after`, at most ``page_size``."""

    @abstractmethod
    async def _mark(self, lo: int, hi: int, *, skip_webhook: bool) -> None:
        """One write: the rows ``lo + 1 .. hi`` are read by this site."""

    async def mark(self, *, skip_webhook: bool) -> bool:
        """Mark the rows up to :attr:`after`; ``False`` (logged) if a write
        failed (left unmarked: pushed again after a restart)."""
        while self.after > self.marked:
            lo, hi = self.marked, self.after
            try:
                await self._mark(lo, hi, skip_webhook=skip_webhook)
            except Exception:
                log.failure("marking outbox rows {lo}..{hi} failed", lo=lo + 1, hi=hi)
                return False
            self.marked = hi
        return True


class LocalTail(Tail):
    """One site alone on its database (the module doc)."""

    async def join(self) -> None:
        """Nothing to register: no other site's marks wait for this one."""

    async def leave(self) -> None:
        """Nothing to leave."""

    async def rows(self, page_size: int) -> list[outbox_rows.OutboxRow]:
        rows: list[outbox_rows.OutboxRow] = await self._db.read(
            outbox_rows.fanout_rows, self.after, page_size
        )
        return rows

    async def _mark(self, lo: int, hi: int, *, skip_webhook: bool) -> None:
        await self._db.write(outbox_rows.mark_range_fanned_out, lo, hi, skip_webhook=skip_webhook)


class SharedTail(Tail):
    """One of several sites' tails on one database, as ``instance_id``
    (the module doc)."""

    shared = True

    def __init__(self, db: Database, instance_id: int) -> None:
        super().__init__(db)
        self._instance_id = instance_id
        self._joining = DeferredLock()

    async def join(self) -> None:
        """Register this instance's tail, from the newest row.

        Done as the service starts, before this site's clients connect: a
        tail registered later (at its first drain) would start past the
        rows committed between a client's connect and that drain, and the
        client would never get them.  One join at a time (a second would
        start further on); a failed one is tried again by the next drain
        or marking."""
        if self.joined:
            return
        async with self._joining:
            if self.joined:
                return
            start = await self._db.write(outbox_rows.join_readers, self._instance_id)
            self.after = self.marked = max(self.after, start)
            self.joined = True

    async def leave(self) -> None:
        await self._db.write(outbox_rows.leave_readers, self._instance_id)

    async def rows(self, page_size: int) -> list[outbox_rows.OutboxRow]:
        rows: list[outbox_rows.OutboxRow] = await self._db.read(
            outbox_rows.rows_after, self.after, page_size
        )
        return rows

    async def _mark(self, lo: int, hi: int, *, skip_webhook: bool) -> None:
        await self._db.write(
            outbox_rows.mark_read, self._instance_id, hi, skip_webhook=skip_webhook
        )
