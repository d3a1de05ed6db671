"""The lease of a site instance: how the database judges whether a site
process is alive (SCALE.md 2), and the once-only lock of periodic work
(SCALE.md 7).

* PostgreSQL (:class:`PostgresLease`): a connection of its own, never one of
  the pool's, holds the session-level advisory lock ``(LEASE_CLASS,
  instance id)`` for the instance's whole life.  The server lets that lock
  go only when the session ends: the process died (its socket closed), its
  host or network went away (the server-side TCP keepalives and user
  timeout set below end such a session within about 15 s), or an operator
  terminated it.  So another instance that *can* take the lock
  (:meth:`PostgresLease.judge`) knows its holder is gone: that is the only
  evidence of death that reaping accepts.  The instance registers its
  ``site_instance`` row and takes its lock in one transaction on that
  connection, so the row is never visible without the lock held; ids are
  never reused, so a key once judged gone stays gone.  The site checks its
  own lease every few seconds (:meth:`PostgresLease.check`: the same
  session still holds the lock); once that fails the lease is lost for
  good: the connection is not reopened (a new session would not hold the
  lock), and the site must stop writing (fencing,
  :mod:`tasknet.site.instance_service`).
* SQLite (:class:`SqliteLease`): the flock on ``<database>.lock``
  (:mod:`tasknet.site.storage.engine.file_lock`) is the lease.  Only one site can hold
  it, so every other instance in the table is gone, and the lease cannot be
  lost while the process lives.

Freshness (SCALE.md "Fencing" 1 and 3).  A lease ends in the database
before its holder learns it (a paused process learns nothing).  So a site
also judges its lease on its own monotonic clock: it is *fresh* while its
last confirmation (the start of the last check that found the lock held)
is less than :data:`LEASE_TIMEOUT` old.  A site whose lease is not fresh
starts no write transaction (:meth:`Lease.refuse_if_stale`, the database
layer's write fence) and sends no POST; the site that reaps it waits that
long, plus the upstream timeout, before it lets anyone say "not submitted".
Each site names its database sessions after its instance
(:func:`application_name`), so a reaper can end every session of the
instance it reaps (:meth:`Lease.end_sessions_of`) and no transaction left
open by a paused site can hold the reap up.

Replication (SCALE.md "Database failover" 2).  At start and at every
lease check the lease session asks its server whether commits wait for a
standby (:func:`replication_state`): ``sync`` (``synchronous_standby_names``
set, this session's ``synchronous_commit`` ``on`` or ``remote_apply``, and a
standby in ``pg_stat_replication`` with ``sync_state`` ``sync`` or
``quorum``), ``async`` (a standby is configured, by that setting, a
replication slot or a connected standby, but none is in sync: a failover
now can lose the last commits), ``none`` (no standby at all) or ``unknown``
(the site's role may not read ``pg_stat_replication``'s states: grant it
``pg_monitor``).  The lease keeps the answer and since when (on the site's
wall clock) it has not been ``sync`` (:attr:`Lease.replication`,
:attr:`Lease.replication_since`); on SQLite it is ``n/a``.  The answer is
taken *before* the check's confirmation is written.  That confirmation
alone commits with ``synchronous_commit = local``: while the manager has not
yet noticed that the standby is gone (pg_auto_failover: about 20 s) every
commit that waits for it hangs, and a lease check that hung would fence every
site; a confirmation lost in a failover costs nothing (every lease session
ends with its primary, and a reaper's waits count from its own reap).

The lease connection is used from one thread of its own (psycopg is
blocking; one connection, one thread at a time); its methods answer
Deferreds on the reactor.

:func:`once` is the other advisory lock: in a write transaction, whether
this site is the one doing a periodic job right now
(``pg_try_advisory_xact_lock``, let go at the end of the transaction; always
true on SQLite).  A job that loses the race skips that round: the site that
won does it, and the work is harmless if done twice anyway.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.runtime import IEntropy, IProcesses, IThreadPools, ProcessIdentity
from tasknet.site.storage import instances
from tasknet.site.storage.engine.database import IWriteFence, connect, run_write
from tasknet.site.storage.engine.file_lock import InstanceLock
from tasknet.site.storage.engine.sources import Sources
from tasknet.site.storage.engine.sql import postgres_only
from tasknet.site.storage.engine.targets import redact
from tasknet.site.storage.engine.transactions import READ_COMMITTED, Cursor, write_once
from tasknet.site.storage.instances import LeaseLost, LeaseStale

if TYPE_CHECKING:
    from tasknet.site.storage.engine import postgres

log = Logger()

T = TypeVar("T")

#: The first key of every instance's lease lock (the second is its id).
LEASE_CLASS = 0x7453
#: The first key of the once-only locks of periodic work (the second: a job below).
ONCE_CLASS = 0x7454

#: Seconds between two lease checks of a running site.
CHECK_INTERVAL = 3.0
#: A lease check not answered within this many seconds counts as a lost
#: lease (a black-holed network answers nothing at all).
CHECK_TIMEOUT = 5.0
#: The lease timeout (SCALE.md "Fencing" 1): the longest a live site can go
#: without confirming its lease.  Past it the site itself writes nothing and
#: POSTs nothing, and a reaped site's "not submitted" verdict waits this
#: long (plus the upstream timeout) after its reap.
LEASE_TIMEOUT = CHECK_INTERVAL + CHECK_TIMEOUT

#: The answers of the replication check (:func:`replication_state`).
REPLICATION_SYNC = "sync"
REPLICATION_ASYNC = "async"
REPLICATION_NONE = "none"
REPLICATION_UNKNOWN = "unknown"
REPLICATION_NOT_APPLICABLE = "n/a"
#: The ``synchronous_commit`` values under which a commit waits for the
#: standby to have it (``remote_write`` and ``local`` do not wait for its disk).
SYNCHRONOUS_COMMITS = frozenset({"on", "remote_apply"})

#: Periodic jobs that must run at one site at a time (:func:`once`).
PRUNE_JOB = 1
OUTBOX_PRUNE_JOB = 2

# The lease session's server-side TCP settings: a vanished client host is
# noticed after idle + interval * count seconds of silence (the site talks
# on it every few seconds), unacknowledged data after the user timeout.
# Client-side, the same keepalives notice a vanished server.
_LEASE_SESSION = {
    "tcp_keepalives_idle": 5,
    "tcp_keepalives_interval": 2,
    "tcp_keepalives_count": 3,
    "tcp_user_timeout": 10000,
}
#: Within this many seconds of its client's machine going silent (a power
#: loss: no FIN, no RST) the server ends the lease session: the keepalives'
#: idle time and their unanswered probes (the user timeout is shorter for
#: data the site had sent).
SILENT_CLIENT_NOTICED_WITHIN = (
    _LEASE_SESSION["tcp_keepalives_idle"]
    + _LEASE_SESSION["tcp_keepalives_interval"] * _LEASE_SESSION["tcp_keepalives_count"]
)
#: How long a reaper waits for each session of the instance it reaps to end.
SESSION_END_TIMEOUT_MS = 5000

_LEASE_CLIENT = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10000,
    "connect_timeout": 10,
}


# Always granted on SQLite: one site per file.
_ONCE_SQL = postgres_only(f"SELECT pg_try_advisory_xact_lock({ONCE_CLASS}, ?)", sqlite_answer="1")


def once(cursor: Cursor, job: int) -> bool:
    """In a write transaction: ``True`` if this site may do periodic
    ``job`` in it, ``False`` if another site is doing it right now (skip
    it).  The lock ends with the transaction."""
    row = cursor.execute(_ONCE_SQL, (job,)).fetchone()
    return bool(row[0])


# One read, on the session being judged (its own synchronous_commit): the
# settings, the standbys in sync, the standbys there are (connected or
# not: a slot outlives a standby that stopped; pg_auto_failover empties
# synchronous_standby_names while its primary waits alone), and the rows
# whose state this role may not see (NULL without pg_read_all_stats).
_REPLICATION_SQL = postgres_only(
    "SELECT current_setting('synchronous_standby_names') AS names,"
    " current_setting('synchronous_commit') AS commit,"
    " (SELECT count(*) FROM pg_stat_replication"
    "  WHERE sync_state IN ('sync', 'quorum')) AS in_sync,"
    " (SELECT count(*) FROM pg_stat_replication) AS connected,"
    " (SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'physical') AS slots,"
    " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS hidden"
)


def judge_replication(
    names: str, commit: str, in_sync: int, connected: int, slots: int, hidden: int = 0
) -> str:
    """The replication check's answer from what the server said (see the
    module doc): ``sync``, ``async``, ``none`` or ``unknown``."""
    configured = bool(names.strip()) or connected > 0 or slots > 0
    if not configured:
        return REPLICATION_NONE
    if names.strip() and commit in SYNCHRONOUS_COMMITS and in_sync > 0:
        return REPLICATION_SYNC
    if hidden > 0:
        return REPLICATION_UNKNOWN
    return REPLICATION_ASYNC


def replication_state(cursor: Cursor) -> str:
    """Whether commits on ``cursor``'s session wait for a standby: ``sync``,
    ``async``, ``none`` or ``unknown`` (PostgreSQL; see the module doc)."""
    row = cursor.execute(_REPLICATION_SQL).fetchone()
    return judge_replication(
        str(row["names"] or ""),
        str(row["commit"] or ""),
        int(row["in_sync"]),
        int(row["connected"]),
        int(row["slots"]),
        int(row["hidden"]),
    )


def dead_here(gone: instances.Instance, processes: IProcesses) -> bool:
    """Whether gone instance ``gone`` certainly ran no longer, as
    ``processes`` (the site's, from its composition root) can tell: it ran
    in this process's kernel and pid namespace and its pid is gone.  (A pid
    reused since is taken for alive: the reaper then waits, which is safe.)
    A paused process keeps its pid, so it is never taken for dead."""
    return processes.gone(gone.pid, gone.process_space)


def application_name(instance_id: int, role: str) -> str:
    """The PostgreSQL ``application_name`` of a session of instance
    ``instance_id`` (``role``: writer, reader, lease, listen): what a reaper
    looks for to end them all (:meth:`PostgresLease.end_sessions_of`)."""
    return f"{_SESSION_PREFIX}{instance_id} {role}"


_SESSION_PREFIX = "tasknet-site#"


@implementer(IWriteFence)
class Lease(ABC):
    """The lease of instance :attr:`instance_id` (named :attr:`name`).

    ``shared``: other instances may run beside this one (PostgreSQL), so
    the lease must be checked and gone instances reaped while running."""

    shared = False

    def __init__(
        self,
        instance_id: int,
        name: str,
        *,
        processes: IProcesses,
        timeout: float = LEASE_TIMEOUT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instance_id = instance_id
        self.name = name
        #: This process's identity (recorded at registration) and the probe
        #: of a gone instance's process (:func:`dead_here`).
        self.processes = processes
        #: The lease timeout (seconds, :data:`LEASE_TIMEOUT` by default).
        self.timeout = timeout
        self._monotonic = monotonic
        self._lost: str | None = None
        #: When (``monotonic``) the lease was last confirmed: taken, or the
        #: start of the last check that found it held.
        self.confirmed_at = monotonic()
        #: The last answer of the replication check (the module doc).
        self.replication = REPLICATION_NOT_APPLICABLE
        #: Since when (the site's wall clock, Unix seconds) the answer has
        #: been something other than ``sync`` while a standby is configured
        #: (``async`` or ``unknown``); ``None`` otherwise.
        self.replication_since: float | None = None

    def now(self) -> float:
        """This instance's monotonic clock (the one freshness is judged on)."""
        return self._monotonic()

    def stale_for(self) -> float | None:
        """``None`` while the lease is fresh, else how many seconds ago it
        was last confirmed (a lost lease is never fresh)."""
        age = self._monotonic() - self.confirmed_at
        if self._lost is None and age < self.timeout:
            return None
        return age

    def refuse_if_stale(self) -> None:
        """Raise :class:`LeaseLost` once the lease is lost, and
        :class:`LeaseStale` while it is not fresh (SCALE.md "Fencing" 3:
        checked before every write transaction and before a POST)."""
        self.refuse_if_lost()
        age = self.stale_for()
        if age is not None:
            raise LeaseStale(
                f"site instance {self.instance_id} last confirmed its lease {age:.1f} s ago "
                f"(lease timeout {self.timeout:g} s); nothing was written"
            )

    def before_transaction(self) -> None:
        """The write fence before a ``BEGIN`` (:class:`~tasknet.site.storage.
        engine.transactions.IWriteFence`)."""
        self.refuse_if_stale()

    def in_transaction(self, cursor: Cursor) -> None:
        """The write fence inside a transaction: nothing to check where the
        lease cannot be lost to another site (SQLite)."""
        return None  # noqa: B027 -- a real default, not an abstract stub

    def confirmed(self, since: float) -> None:
        """A check that started at ``since`` found the lease held."""
        if since > self.confirmed_at:
            self.confirmed_at = since

    def note_replication(self, state: str, wall: float) -> None:
        """Record a replication check's answer, found at ``wall`` (the
        site's wall clock): the first answer of a run of ``async`` /
        ``unknown`` starts :attr:`replication_since`."""
        if state in (REPLICATION_ASYNC, REPLICATION_UNKNOWN):
            if self.replication_since is None or self.replication not in (
                REPLICATION_ASYNC,
                REPLICATION_UNKNOWN,
            ):
                self.replication_since = wall
                log.warn(
                    "replication: {state}: no standby is in sync with the primary; a failover "
                    "now can lose the last commits (docs/operations.md, TasknetReplicationAsync)",
                    state=state,
                )
        else:
            if self.replication_since is not None:
                log.info("replication: {state} again", state=state)
            self.replication_since = None
        self.replication = state

    @property
    def lost(self) -> str | None:
        """Why the lease is lost (``None`` while it holds)."""
        return self._lost

    def lose(self, reason: str) -> None:
        """Note that the lease is lost (the first reason stays)."""
        if self._lost is None:
            self._lost = reason

    def refuse_if_lost(self) -> None:
        """Raise :class:`LeaseLost` once the lease is lost."""
        if self._lost is not None:
            raise LeaseLost(
                f"site instance {self.instance_id} lost its lease ({self._lost}); "
                "nothing was written"
            )

    @abstractmethod
    def check(self) -> Deferred[None]:
        """Fires if the lease still holds; fails with :class:`LeaseLost`."""

    @abstractmethod
    def judge(self, other: int) -> Deferred[bool]:
        """Whether instance ``other`` is gone (its lease can be taken).
        When ``True`` this lease holds ``other``'s key until :meth:`forget`,
        so nobody else reaps it meanwhile."""

    @abstractmethod
    def forget(self, other: int) -> Deferred[None]:
        """Let go the key of ``other`` taken by :meth:`judge`."""

    @abstractmethod
    def release(self) -> None:
        """The clean end: mark the instance ended (its last write, while the
        lease still holds) and let the lease go.  Idempotent."""

    @abstractmethod
    def drop(self) -> None:
        """What the kernel does when this process dies: the lease's file or
        database session closes, and the lock goes with it; nothing is
        written (a simulated crash: the process's objects are never called
        again)."""

    def end_sessions_of(self, other: int) -> Deferred[int]:
        """End every database session of instance ``other`` (judged gone,
        its key held by :meth:`judge`), so that no transaction it left open
        holds up its reap; fires with how many were ended.  Nothing to end
        on SQLite (one process per file)."""
        return succeed(0)


class SqliteLease(Lease):
    """The flock of one SQLite database as the lease of its one instance."""

    def __init__(
        self,
        flock: InstanceLock,
        target: str,
        instance_id: int,
        name: str,
        *,
        sources: Sources,
        processes: IProcesses,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(instance_id, name, processes=processes, monotonic=monotonic)
        self._flock = flock
        self._target = target
        self._sources = sources

    @classmethod
    def take(
        cls,
        flock: InstanceLock,
        target: str,
        name: str,
        *,
        sources: Sources,
        processes: IProcesses,
        upstream_timeout: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> SqliteLease:
        """Register the instance of the site holding ``flock`` (on the
        prepared database ``target``) as the process ``processes`` says this
        one is, its rows stamped on the wall clock of ``sources``."""
        me = processes.this()
        connection = connect(target, sources)
        try:
            instance_id = run_write(
                connection,
                lambda cursor: instances.register(
                    cursor,
                    name,
                    me.host,
                    me.pid,
                    None,
                    lease_timeout=LEASE_TIMEOUT,
                    upstream_timeout=upstream_timeout,
                    process_space=me.space,
                ),
            )
        finally:
            connection.close()
        return cls(
            flock,
            target,
            instance_id,
            name,
            sources=sources,
            processes=processes,
            monotonic=monotonic,
        )

    def stale_for(self) -> float | None:
        # The flock cannot be lost while the process lives (a paused site
        # keeps it, so nothing can be reaped meanwhile): always fresh.
        return None if self._lost is None else 0.0

    def check(self) -> Deferred[None]:
        if self._lost is not None:
            return fail(LeaseLost(self._lost))
        return succeed(None)

    def judge(self, other: int) -> Deferred[bool]:
        # We hold the flock: whoever else is in the table is gone.
        return succeed(other != self.instance_id)

    def forget(self, other: int) -> Deferred[None]:
        return succeed(None)

    def drop(self) -> None:
        self._flock.drop()

    def release(self) -> None:
        if not self._flock.held:
            return
        try:
            connection = connect(self._target, self._sources)
            try:
                run_write(connection, instances.end, self.instance_id)
            finally:
                connection.close()
        except Exception:
            # A crash would leave the row open too; the next start reaps it.
            log.failure("could not mark site instance {id} ended", id=self.instance_id)
        finally:
            self._flock.release()


def _lease_target(target: str) -> str:
    """``target`` with the lease session's keepalive settings (the URL's own
    ``options`` kept, ours appended)."""
    # Imported here: a site on SQLite never loads the PostgreSQL driver.
    from psycopg import conninfo as pg_conninfo

    given = pg_conninfo.conninfo_to_dict(target)
    session = " ".join(f"-c {name}={value}" for name, value in _LEASE_SESSION.items())
    options = f"{given['options']} {session}" if given.get("options") else session
    client = {name: value for name, value in _LEASE_CLIENT.items() if name not in given}
    return pg_conninfo.make_conninfo(target, options=options, **client)


# The lease session's statements (PostgreSQL's only: on SQLite the flock is the lease).
_BACKEND_PID_SQL = postgres_only("SELECT pg_backend_pid()")
_TAKE_LEASE_SQL = postgres_only(f"SELECT pg_advisory_lock({LEASE_CLASS}, ?)")
_NAME_SESSION_SQL = postgres_only("SELECT set_config('application_name', ?, false)")
# One statement: the lock still held by this very session, and then (only
# then) the confirmation's time written, by the database's clock, for a
# reaper to wait on.
_CHECK_SQL = postgres_only(
    "INSERT INTO instance_lease (instance_id, confirmed_at) "  # noqa: S608
    "SELECT ?, {now} WHERE EXISTS (SELECT 1 FROM pg_locks "
    f"WHERE locktype = 'advisory' AND classid = {LEASE_CLASS} AND objid = ? AND objsubid = 2 "
    "AND pid = pg_backend_pid() AND granted) "
    "ON CONFLICT (instance_id) DO UPDATE SET confirmed_at = excluded.confirmed_at "
    "RETURNING pg_backend_pid() AS pid"
)
# The confirmation does not wait for a standby: it is the one commit of a
# site whose loss in a failover costs nothing (every lease session ends with
# its primary, and a reaper on the new one counts from its own reap), and
# waiting would fence every site while the manager takes the time to notice
# that the standby is gone (the primary's commits wait until it does).
_CONFIRM_LOCALLY_SQL = postgres_only("SET LOCAL synchronous_commit = local")
_JUDGE_SQL = postgres_only(f"SELECT pg_try_advisory_lock({LEASE_CLASS}, ?)")
_FORGET_SQL = postgres_only(f"SELECT pg_advisory_unlock({LEASE_CLASS}, ?)")
# pg_terminate_backend(pid, timeout) waits until the session is gone (its
# transaction rolled back, its locks let go).  Only this database's: another
# deployment on the same server numbers its instances too (found by the
# simulator, whose workers share one server).
_TERMINATE_SQL = postgres_only(
    "SELECT pid, pg_terminate_backend(pid, ?) AS ended FROM pg_stat_activity "
    "WHERE application_name LIKE ? AND datname = current_database()"
    " AND pid <> pg_backend_pid()"
)


def _register_locked(
    cursor: Cursor, name: str, me: ProcessIdentity, upstream_timeout: float | None
) -> tuple[int, int]:
    """The registration of a PostgreSQL instance: its row and its lock in one
    transaction (a session-level lock outlives the transaction that took
    it; the row is seen by others only once the lock is held), and the
    session named after it.  Returns (instance id, the lease session's
    server pid)."""
    lease_pid = int(cursor.execute(_BACKEND_PID_SQL).fetchone()[0])
    instance_id = instances.register(
        cursor,
        name,
        me.host,
        me.pid,
        lease_pid,
        lease_timeout=LEASE_TIMEOUT,
        upstream_timeout=upstream_timeout,
        process_space=me.space,
    )
    cursor.execute(_TAKE_LEASE_SQL, (instance_id,))
    instances.lease_confirmed(cursor, instance_id)
    cursor.execute(_NAME_SESSION_SQL, (application_name(instance_id, "lease"),))
    return instance_id, lease_pid


def _confirm(cursor: Cursor, instance_id: int) -> int | None:
    """The lease check's write (see ``_CHECK_SQL``): the server pid of the
    session that holds the lock, or None if this one does not."""
    cursor.execute(_CONFIRM_LOCALLY_SQL)
    row = cursor.execute(_CHECK_SQL, (instance_id, instance_id)).fetchone()
    return None if row is None else int(row["pid"])


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    return threading.Thread(*args, daemon=True, **kwargs)


class PostgresLease(Lease):
    """The advisory lock of one instance on its own PostgreSQL session."""

    shared = True

    def __init__(
        self,
        connection: postgres.PgConnection,
        instance_id: int,
        lease_pid: int,
        name: str,
        *,
        reactor: IReactorFromThreads,
        threads: IThreadPools,
        entropy: IEntropy,
        processes: IProcesses,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(instance_id, name, processes=processes, monotonic=monotonic)
        self._connection = connection
        #: The server pid of the lease session (``pg_terminate_backend`` ends it).
        self.lease_pid = lease_pid
        self._reactor = reactor
        self._jitter = entropy.random()
        self._thread = threads.thread_pool(1, 1, f"lease-{instance_id}")
        # A daemon thread: a process that exits without release() (a crash
        # in its stop) must not wait for it; its exit ends the session.
        self._thread.threadFactory = _daemon_thread  # type: ignore[assignment]
        self._thread.start()
        self._released = False

    @classmethod
    def take(
        cls,
        target: str,
        name: str,
        *,
        reactor: IReactorFromThreads,
        threads: IThreadPools,
        entropy: IEntropy,
        wall: Callable[[], float],
        processes: IProcesses,
        upstream_timeout: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> PostgresLease:
        """Open the lease session on ``target`` (a prepared database),
        register the instance (as the process ``processes`` says this one
        is) and take its lock (blocking: at build time); its checks run on a
        pool from ``threads``, delivered to ``reactor``; its confirmations
        are stamped on ``wall``."""
        from tasknet.site.storage.engine import postgres  # the driver only when PostgreSQL is used

        connection = postgres.connect(
            _lease_target(target),
            application_name="tasknet-site lease",
            sources=Sources(wall, entropy),
        )
        try:
            instance_id, lease_pid = run_write(
                connection,
                _register_locked,
                name,
                processes.this(),
                upstream_timeout,
                jitter=entropy.random(),
            )
            # The start's replication check (SCALE.md "Database failover" 2).
            replication = replication_state(connection.cursor())  # type: ignore[arg-type]
        except BaseException:
            connection.close()
            raise
        log.info(
            "site instance {id} ({name}) holds its lease (PostgreSQL session pid {pid})",
            id=instance_id,
            name=name,
            pid=lease_pid,
        )
        lease = cls(
            connection,
            instance_id,
            lease_pid,
            name,
            reactor=reactor,
            threads=threads,
            entropy=entropy,
            processes=processes,
            monotonic=monotonic,
        )
        lease.note_replication(replication, wall())
        return lease

    def _in_thread(self, fn: Callable[[], T]) -> Deferred[T]:
        def guarded() -> T:
            if self._lost is not None:
                raise LeaseLost(self._lost)
            # A broken connection is never reopened: a new session would
            # not hold the lock.
            if self._connection.broken:
                raise LeaseLost("the lease connection is closed")
            try:
                return fn()
            except LeaseLost:
                raise
            except Exception as e:
                raise LeaseLost(f"the lease connection failed: {type(e).__name__}: {e}") from e

        d = deferToThreadPool(self._reactor, self._thread, guarded)
        return d.addErrback(self._lost_on_failure)

    def _lost_on_failure(self, failure: Failure) -> Failure:
        if failure.check(LeaseLost):
            self.lose(failure.getErrorMessage())
        return failure

    def check(self) -> Deferred[None]:
        since = self._monotonic()

        def held() -> None:
            # Replication first: it is known even if the confirmation below
            # fails or waits.
            state = replication_state(self._connection.cursor())  # type: ignore[arg-type]
            wall = self._connection.sources.wall()
            self._reactor.callFromThread(self.note_replication, state, wall)
            # The confirmation's time is never earlier than ``since``.  One
            # transaction, never retried on another session (which would
            # not hold the lock): any failure loses the lease.
            pid = write_once(
                self._connection,  # type: ignore[arg-type]
                _confirm,
                self.instance_id,
                isolation=READ_COMMITTED,
            )
            if pid != self.lease_pid:
                raise LeaseLost("the lease session no longer holds the instance's lock")

        return self._in_thread(held).addCallback(lambda _: self.confirmed(since))

    def judge(self, other: int) -> Deferred[bool]:
        if other == self.instance_id:
            return succeed(False)  # the lock is re-entrant: never judge ourselves

        def gone() -> bool:
            row = self._connection.execute(_JUDGE_SQL, (other,)).fetchone()
            return bool(row[0])

        return self._in_thread(gone)

    def forget(self, other: int) -> Deferred[None]:
        def unlock() -> None:
            self._connection.execute(_FORGET_SQL, (other,))

        return self._in_thread(unlock)

    def in_transaction(self, cursor: Cursor) -> None:
        # Read FOR SHARE: a reaper's UPDATE of the row waits for us.
        instances.require_open_locked(cursor, self.instance_id)  # type: ignore[arg-type]

    def end_sessions_of(self, other: int) -> Deferred[int]:
        if other == self.instance_id:
            return fail(ValueError("an instance never ends its own sessions"))

        def terminate() -> int:
            rows = self._connection.execute(
                _TERMINATE_SQL, (SESSION_END_TIMEOUT_MS, f"{_SESSION_PREFIX}{other} %")
            ).fetchall()
            return sum(1 for row in rows if row["ended"])

        return self._in_thread(terminate)

    def drop(self) -> None:
        # The server sees the socket close and ends the session: its lock
        # goes, and another instance may judge this one gone.
        self._released = True
        self._connection.close()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._thread.stop()  # after what it was doing
        try:
            if self._lost is None and not self._connection.broken:
                run_write(self._connection, instances.end, self.instance_id, jitter=self._jitter)
        except Exception:
            log.failure("could not mark site instance {id} ended", id=self.instance_id)
        finally:
            self._connection.close()  # the session, and its lock, end


#: How long a starting site (under twistd, its ``--db`` naming several hosts:
#: a failover deployment) waits for a writable PostgreSQL primary before it
#: gives up and exits 1: longer than a failover takes
#: (SCALE.md "Database failover" 3: 45 s), so that a site fenced by one is
#: back as soon as the new primary is, instead of failing its starts until
#: then (its supervisor's pause each time: systemd's RestartSec=5s, and its
#: start limit: 10 in 5 minutes).
PRIMARY_WAIT = 60.0
#: Seconds between two attempts while waiting.
PRIMARY_WAIT_PAUSE = 0.5
# Connection failures that waiting does not cure (libpq reports them with no
# SQLSTATE): said at once.
_NOT_TRANSIENT = ("password authentication failed", "does not exist", "no pg_hba.conf entry")


def wait_for_primary(
    target: str,
    timeout: float = PRIMARY_WAIT,
    *,
    pause: float = PRIMARY_WAIT_PAUSE,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> float:
    """Block until a session on the PostgreSQL database ``target`` opens
    (with ``target_session_attrs=read-write`` in a multi-host URL: on the
    writable primary), trying every ``pause`` seconds for up to ``timeout``;
    the seconds waited.  Raises the last error once ``timeout`` has passed,
    and at once one that waiting does not cure (a wrong password, no such
    database or role).  For the site's start under twistd (blocking: nothing
    else runs yet)."""
    from tasknet.site.storage.engine import postgres  # the driver only when PostgreSQL is used

    began = monotonic()
    said = began
    while True:
        try:
            postgres.connect(target, application_name="tasknet-site start").close()
        except Exception as e:
            text = str(e)
            if not postgres.is_connection_lost(e) or any(m in text for m in _NOT_TRANSIENT):
                raise
            now = monotonic()
            if now - began >= timeout:
                raise
            if now - said >= 5 or said == began:
                said = now
                log.warn(
                    "no writable PostgreSQL primary yet ({e}); waiting up to {left:.0f} s more",
                    e=redact(text.splitlines()[0], target) if text else type(e).__name__,
                    left=timeout - (now - began),
                )
            sleep(pause)
            continue
        return monotonic() - began


def take_lease(
    target: str,
    name: str,
    *,
    flock: InstanceLock | None,
    reactor: IReactorFromThreads,
    threads: IThreadPools,
    entropy: IEntropy,
    wall: Callable[[], float],
    processes: IProcesses,
    upstream_timeout: float | None = None,
    monotonic: Callable[[], float],
) -> Lease:
    """The lease of a new instance named ``name`` on the prepared database
    ``target``: on SQLite the site's held ``flock``, on PostgreSQL a lease
    session of its own, its thread from ``threads``, its results delivered
    to ``reactor`` (and its conflict reruns' jitter from ``entropy``).
    Its rows (registration, confirmations, the end) are stamped on
    ``wall``; ``processes`` says who this process is (recorded) and probes
    a gone instance's; ``upstream_timeout`` is recorded for a reaper;
    ``monotonic`` is the clock freshness is judged on."""
    if flock is not None:
        return SqliteLease.take(
            flock,
            target,
            name,
            sources=Sources(wall, entropy),
            processes=processes,
            upstream_timeout=upstream_timeout,
            monotonic=monotonic,
        )
    return PostgresLease.take(
        target,
        name,
        reactor=reactor,
        threads=threads,
        entropy=entropy,
        wall=wall,
        processes=processes,
        upstream_timeout=upstream_timeout,
        monotonic=monotonic,
    )
