"""Group commit, the one implementation of it: the writes queued while the
writer is busy run together as one transaction.

With ``synchronous=FULL`` every ``COMMIT`` is an fsync, and the fsync, not
the statements, is what a write costs.  So the writes the pool
(:class:`~tasknet.site.storage.engine.database.Database`) queued while its
writer thread was busy are run together as one write transaction (at most
``max_batch`` of them), by :func:`run_batch` in the writer thread.  The
writes of a transaction form *units*: a plain write is a unit of its own;
the coalesced items of one batch function (the items of a joined write,
``Database.write_joined``) are one unit, run where its first item was
queued (writes queued together have not been answered yet, so no caller
can have ordered a plain write against another function's items; each
function's own items keep their order).  Each unit runs inside its own
``SAVEPOINT``:

* a unit that raises is rolled back to its savepoint alone; a plain write's
  Deferred fails with its own exception, a coalesced unit of several items
  is run again item by item, a savepoint each, so only the failing item
  fails; the others of the transaction commit;
* every write's Deferred fires only after the ``COMMIT`` that carried it
  (an answer or an ACK never precedes the commit; the pool fires them), and
  if ``BEGIN`` or ``COMMIT`` fails, nothing of the transaction is committed
  and every write that had not failed on its own fails with that error;
* should a unit end the transaction itself (SQLite rolls it back on a full
  disk or an I/O error), the units before it fail with
  :class:`TransactionLost`, the failing plain write with its own error, and
  the rest (a coalesced unit item by item) get a transaction of their own;
* a write's ``fn`` sees the uncommitted changes of the units before it in
  the transaction, exactly as if they had committed just before it;
* the transaction runs at the strictest isolation its writes declared
  (:mod:`~tasknet.site.storage.engine.transactions`, "Isolation").

A transaction with one plain write (or one item) is exactly a plain
:func:`~tasknet.site.storage.engine.transactions.run_write` (no savepoint).
A group-committed transaction that lost a serialization conflict
(PostgreSQL) or met a dead connection is run again write by write (each
item of a coalesced unit alone), each in a transaction of its own with its
own reruns: one conflicting write must not take the other writes of its
batch down with it, nor make them conflict again together.  None of their
first results is kept.  :attr:`Transactions.conflicts` counts the
transactions that lost.  :func:`run_coalesced` runs the same code
synchronously (tools, tests).  Nothing here touches a Deferred: the writer
thread fills each :class:`Write`, the pool fires them on the reactor.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from tasknet.site.storage.engine import transactions as engine_transactions
from tasknet.site.storage.engine.errors import TransactionLost
from tasknet.site.storage.engine.sources import fault_point
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import (
    COMMIT,
    ROLLBACK,
    Conflict,
    Connection,
    Cursor,
    IWriteFence,
    Reconnect,
    begin,
    classified_failure,
    commit_unknown,
    conflict_pause,
    conflicts_exhausted,
    connection_lost,
    is_conflict,
    isolation_of,
    reconnect_pause,
    refuse_if_fenced,
    strictest,
    unavailable,
    write_once,
)

I = TypeVar("I")  # noqa: E741 -- an item of a coalesced write
R = TypeVar("R")

# Distinct from any savepoint name a write function uses for itself.
_SAVEPOINT = sql("SAVEPOINT database_write")
_ROLLBACK_TO_SAVEPOINT = sql("ROLLBACK TO SAVEPOINT database_write")
_RELEASE_SAVEPOINT = sql("RELEASE SAVEPOINT database_write")


@dataclass(frozen=True)
class Committed(Generic[R]):
    """A coalesced item's answer: its result, and the transaction that
    committed it (numbered from 1 per :class:`Database`; items with the same
    number shared one commit) with that transaction's duration."""

    value: R
    transaction: int
    seconds: float


_PLAIN: Any = object()  # the item of a plain (not coalesced) write


@dataclass(eq=False)
class Write:
    """One queued write: ``fn(cursor, *args)``, or item ``item`` of the batch
    function ``fn``.  ``result``/``failure``/``transaction``/``seconds`` are
    set in the writer thread; ``done`` is fired on the reactor after the
    transaction ended."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    item: Any = _PLAIN
    done: Deferred[Any] = field(default_factory=Deferred)
    result: Any = None
    failure: Failure | None = None
    transaction: int = 0
    seconds: float = 0.0
    #: The isolation its function declared (:func:`isolation_of`).
    isolation: str = ""

    def __post_init__(self) -> None:
        if not self.isolation:
            self.isolation = isolation_of(self.fn)

    @property
    def coalesced(self) -> bool:
        return self.item is not _PLAIN


_Unit = list[Write]


class Transactions:
    """Numbers committed transactions and counts the transactions that lost
    a serialization conflict or met a dead connection (touched by one
    thread at a time); holds the write fence they all pass."""

    def __init__(
        self,
        fence: IWriteFence | None = None,
        *,
        jitter: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.count = 0
        self.conflicts = 0
        self.reconnects = 0
        self.fence = fence
        #: The jitter of the conflict reruns' pauses (the site's: seeded
        #: from its root's entropy; None, a tool's: the process's).
        self.jitter = jitter
        #: The clock a transaction's duration is measured on.
        self.monotonic = monotonic

    def committed(self, writes: Sequence[Write], started: float) -> None:
        self.count += 1
        seconds = self.monotonic() - started
        for write in writes:
            if write.failure is None:
                write.transaction, write.seconds = self.count, seconds


def _units(writes: Sequence[Write]) -> list[_Unit]:
    """Plain writes alone; the coalesced items of each function together, at
    the place of its first item."""
    units: list[_Unit] = []
    by_fn: dict[Callable[..., object], _Unit] = {}
    for write in writes:
        if not write.coalesced:
            units.append([write])
        elif write.fn in by_fn:
            by_fn[write.fn].append(write)
        else:
            by_fn[write.fn] = unit = [write]
            units.append(unit)
    return units


def _call(cursor: Cursor, unit: _Unit) -> None:
    """Run ``unit``'s function, setting each write's result; raises whatever
    it raises (the caller rolls back)."""
    first = unit[0]
    if not first.coalesced:
        first.result = first.fn(cursor, *first.args)
        return
    results = list(first.fn(cursor, [w.item for w in unit]))
    if len(results) != len(unit):
        raise RuntimeError(
            f"{getattr(first.fn, '__name__', first.fn)} answered {len(results)} results"
            f" for {len(unit)} items"
        )
    for write, result in zip(unit, results, strict=True):
        write.result = result


def _fail(writes: Sequence[Write], failure: Failure) -> None:
    for write in writes:
        if write.failure is None:
            write.failure = failure


def _run_alone(connection: Connection, unit: _Unit, transactions: Transactions) -> None:
    """A lone write or item: exactly :func:`run_write` (its conflicts raised
    as :class:`Conflict`, for :func:`_run_retrying` to run it again)."""
    started = transactions.monotonic()
    try:
        write_once(
            connection,
            lambda cursor: _call(cursor, unit),
            isolation=_isolation_of(unit),
            fence=transactions.fence,
            functions=_names(unit),
        )
    except (Conflict, Reconnect):
        raise
    except Exception:
        _fail(unit, classified_failure())
        return
    transactions.committed(unit, started)


def _isolation_of(unit: Sequence[Write]) -> str:
    return strictest(w.isolation for w in unit)


def _run_retrying(connection: Connection, unit: _Unit, transactions: Transactions) -> None:
    """:func:`_run_alone`, run again after each serialization conflict (at
    most :data:`CONFLICT_RETRIES` times, then :class:`DatabaseBusy`) and
    after each dead connection (at most :data:`RECONNECT_RETRIES` times,
    then :class:`DatabaseUnavailable`)."""
    conflicts = reconnects = 0
    while True:
        try:
            _run_alone(connection, unit, transactions)
            return
        except Reconnect as reconnect:
            for write in unit:
                write.result, write.failure = None, None
            transactions.reconnects += 1
            reconnects += 1
            if reconnects > engine_transactions.RECONNECT_RETRIES:
                _fail(unit, Failure(unavailable(reconnect.error)))
                return
            reconnect_pause(reconnects)
        except Conflict as conflict:
            for write in unit:
                write.result, write.failure = None, None
            transactions.conflicts += 1
            conflicts += 1
            if conflicts > engine_transactions.CONFLICT_RETRIES:
                _fail(unit, Failure(conflicts_exhausted(conflict.error)))
                return
            conflict_pause(conflicts, transactions.jitter)


def _abandon(connection: Connection, error: Exception) -> Conflict:
    """Roll back a transaction that lost a serialization conflict."""
    if connection.in_transaction:
        connection.execute(ROLLBACK)
    return Conflict(error)


def _run_together(
    connection: Connection, units: list[_Unit], transactions: Transactions
) -> list[_Unit]:
    """Run ``units`` as one transaction, a savepoint each (a failed coalesced
    unit again item by item).  Returns the units not run because the
    transaction ended early (they get a transaction of their own next).
    A serialization conflict rolls it all back and raises :class:`Conflict`."""
    cursor = connection.cursor()
    todo = deque(units)
    ran: list[Write] = []
    started = transactions.monotonic()
    committing = False
    try:
        try:
            refuse_if_fenced(transactions.fence)
        except Exception:
            _fail([w for unit in units for w in unit], classified_failure())
            return []
        try:
            begin(
                connection,
                cursor,
                _isolation_of([w for unit in units for w in unit]),
                transactions.fence,
            )
        except Exception as e:
            if connection_lost(e, connection):
                raise Reconnect(e) from e
            _fail([w for unit in units for w in unit], classified_failure())
            return []
        try:
            while todo:
                unit = todo.popleft()
                cursor.execute(_SAVEPOINT)
                try:
                    _call(cursor, unit)
                except Exception as e:
                    if connection_lost(e, connection):
                        raise Reconnect(e) from e
                    if is_conflict(e, connection):
                        raise _abandon(connection, e) from e
                    failure = classified_failure()
                    singles = [[w] for w in unit] if len(unit) > 1 else []
                    if not connection.in_transaction:
                        _fail(ran, Failure(TransactionLost(_lost_because(e))))
                        if not singles:
                            _fail(unit, failure)
                        return singles + list(todo)
                    cursor.execute(_ROLLBACK_TO_SAVEPOINT)
                    cursor.execute(_RELEASE_SAVEPOINT)
                    if singles:
                        todo.extendleft(reversed(singles))
                    else:
                        _fail(unit, failure)
                        ran.extend(unit)
                    continue
                cursor.execute(_RELEASE_SAVEPOINT)
                ran.extend(unit)
            functions = _names(ran)
            fault_point(connection, "commit", functions)
            committing = True
            cursor.execute(COMMIT)
        except (Conflict, Reconnect):
            raise
        except Exception as e:
            # COMMIT failed (e.g. a deferred constraint, a serialization
            # conflict), or a savepoint statement did: nothing of the
            # transaction is committed -- unless the connection died during
            # the COMMIT, when nobody knows.
            if connection_lost(e, connection):
                if committing:
                    _fail(ran + [w for unit in todo for w in unit], Failure(commit_unknown(e)))
                    return []
                raise Reconnect(e) from e
            if is_conflict(e, connection):
                raise _abandon(connection, e) from e
            failure = classified_failure()
            if connection.in_transaction:
                connection.execute(ROLLBACK)
            _fail(ran + [w for unit in todo for w in unit], failure)
            return []
        transactions.committed(ran, started)
        fault_point(connection, "committed", functions)
        return []
    finally:
        cursor.close()


def _names(writes: Sequence[Write]) -> tuple[str, ...]:
    """The storage functions ``writes`` run, once each (fault points)."""
    return tuple(dict.fromkeys(str(getattr(w.fn, "__name__", w.fn)) for w in writes))


def _lost_because(error: Exception) -> str:
    return (
        "rolled back with the rest of its group-committed transaction after another "
        f"write failed: {type(error).__name__}: {error}"
    )


def run_batch(connection: Connection, writes: Sequence[Write], transactions: Transactions) -> None:
    """The writer's work for what it took from the queue: one transaction
    (or more, should one end early).  A transaction of several writes that
    lost a serialization conflict is run again write by write (an item of a
    coalesced unit alone), each its own transaction with its own reruns, its
    writes' results and failures forgotten (see the module doc).  Touches
    no Deferred."""
    units = _units(writes)
    while units:
        if len(units) == 1 and len(units[0]) == 1:
            _run_retrying(connection, units[0], transactions)
            return
        try:
            units = _run_together(connection, units, transactions)
        except (Conflict, Reconnect) as lost:
            if isinstance(lost, Conflict):
                transactions.conflicts += 1
                conflict_pause(1, transactions.jitter)
            else:
                transactions.reconnects += 1
            again = [w for unit in units for w in unit]
            for write in again:
                write.result, write.failure = None, None
            for write in again:
                _run_retrying(connection, [write], transactions)
            return


def run_coalesced(
    connection: Connection,
    fn: Callable[[Cursor, list[I]], Sequence[R]],
    items: Sequence[I],
) -> list[R | Failure]:
    """Run ``items`` of the batch function ``fn`` exactly as the writer runs
    them when they are queued together: per item its result, or the
    (classified) :class:`Failure` it failed with.  For tools and tests."""
    writes = [Write(fn, item=item) for item in items]
    run_batch(connection, writes, Transactions())
    return [w.failure if w.failure is not None else w.result for w in writes]
