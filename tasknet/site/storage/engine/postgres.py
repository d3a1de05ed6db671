"""PostgreSQL behind the storage seam: a psycopg 3 connection that looks like
the part of ``sqlite3`` the storage code uses.

The storage code is written once (:mod:`tasknet.site.storage.engine.sql`):
each statement is an :class:`~tasknet.site.storage.engine.sql.Sql`
rendered for both engines when its module was imported, and this module
sends its PostgreSQL text as it is:

* :class:`PgConnection` wraps one synchronous psycopg connection in
  autocommit mode: only the statements the engine issues open and end
  transactions (their ``BEGIN``: :mod:`~tasknet.site.storage.engine.
  transactions`).  It has ``execute``, ``executemany``, ``cursor``,
  ``in_transaction``, ``commit``, ``rollback`` and ``close`` like a
  ``sqlite3.Connection``; :class:`PgCursor` has ``execute``,
  ``executemany``, ``fetchone``, ``fetchall``, ``fetchmany``, iteration,
  ``rowcount`` and ``description`` like a ``sqlite3.Cursor`` (a fetch after
  a statement without rows answers ``None``/``[]``, as sqlite3's does).
  There is no ``lastrowid``: write ``INSERT … RETURNING id``.
* A statement is its PostgreSQL text, its parameters picked in the order
  its placeholders want them (``?N``); a list parameter is an array
  (psycopg adapts it).  Plain text (a tool's, a test's) is rendered once
  by :func:`~tasknet.site.storage.engine.sql.rendered`, placeholders only.
* Rows are :class:`Row`: a tuple indexable by position and by column name
  (case-insensitive, like ``sqlite3.Row``), with ``keys()``.  ``numeric``
  results (``SUM`` of a ``BIGINT``) load as ``int`` when whole (as SQLite
  answers), else ``float``; a Python ``bool`` parameter is sent as 1/0 (the
  schemas store flags as integers).
* Session settings, made when a connection opens: ``application_name``
  (unless the URL names one), TCP keepalives and ``tcp_user_timeout`` (a
  server or network that vanished fails the connection within about 25 s,
  idle or not, instead of leaving a thread waiting for ever; the server's
  own ``tcp_keepalives_*`` settings are what end a dead *site's* sessions
  and leases, see docs/operations.md), ``connect_timeout``,
  ``synchronous_commit = on`` (an ACK follows a durable commit, as with
  SQLite's ``synchronous=FULL``), ``lock_timeout`` (the ``busy_timeout`` of
  the site: a statement waiting that long for a row or table lock fails
  with ``lock_not_available``, which is "busy", never a hang), and for a
  reader ``default_transaction_read_only``.
* The wall clock: a connection carries its :class:`~tasknet.site.storage.
  engine.sources.Sources` (:attr:`PgConnection.sources`, what a transaction
  function reads from its cursor).  Given a clock other than the system's
  (a simulation's), it sets the session's ``tasknet.now`` to it
  (``set_config``) right after each ``BEGIN`` and before each statement run
  outside a transaction, and ``{now}`` reads that in place of
  ``statement_timestamp()`` (:mod:`~tasknet.site.storage.engine.sql`):
  "now" is then constant within a transaction.  With the system's clock
  (production) nothing is set and no statement is added.
* A failed statement aborts a PostgreSQL transaction.  The connection keeps
  the error that did it (:attr:`PgConnection.failed_by`) until the
  transaction ends or is rolled back to a savepoint; a ``COMMIT`` of an
  aborted transaction (a function swallowed the error) rolls back and
  raises that error instead of reporting success, so a swallowed
  serialization failure is still retried by the engine.
* A connection found broken when a transaction begins is replaced by a new
  one (the failed transaction itself was already reported as failed), so a
  pool heals after a server restart or a network cut.

Error classes (:func:`is_busy`, :func:`is_connection_lost`,
:func:`is_integrity_error`): a lost connection is retried on a fresh one by
the engine; serialization failure (40001) and deadlock (40P01) are
*conflicts* (:data:`CONFLICTS`), retried as a whole transaction by
:mod:`tasknet.site.storage.engine.transactions`; those and
``lock_not_available`` (55P03), ``query_canceled`` (57014, a timeout) and
``too_many_connections`` (53300) are *busy*; everything else (a broken
connection, a constraint, a trigger's refusal, a read-only transaction
asked to write) is *failed*.

Twisted's adbapi loads this module as its DB-API module (``apilevel``,
``threadsafety``, :func:`connect`), so the pools of
:class:`~tasknet.site.storage.engine.database.Database` are ordinary ``ConnectionPool``
objects; one connection belongs to one thread at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from typing import Any, ClassVar, NotRequired, TypeAlias, TypedDict, TypeVar, Unpack

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.adapt import Dumper, Loader
from psycopg.pq import TransactionStatus

from tasknet.site.storage.engine.sources import SYSTEM, Sources
from tasknet.site.storage.engine.sql import Sql, SqlParameters, SqlValue, parameters, rendered, sql
from tasknet.site.storage.engine.timestamps import precise

# DB-API module attributes (adbapi checks them).
apilevel = "2.0"
threadsafety = 2
paramstyle = "qmark"
Error = psycopg.Error

#: SQLSTATEs retried as a whole transaction: serialization failure, deadlock.
CONFLICTS = frozenset({"40001", "40P01"})
#: SQLSTATEs that mean "busy, retry the transaction".
BUSY = CONFLICTS | {"55P03", "57014", "53300"}

_COMMIT = sql("COMMIT")
_ROLLBACK = sql("ROLLBACK")
# Session-level (false): it outlives the statement that sets it; set again
# at each BEGIN (a rolled-back transaction takes its setting back with it).
_SET_NOW = "SELECT set_config('tasknet.now', %s, false)"

DEFAULT_APPLICATION_NAME = "tasknet-site"
DEFAULT_LOCK_TIMEOUT_MS = 5000

# libpq options the site sets unless the URL sets them.  Keepalives: a
# server that vanished is noticed after idle + interval * count seconds on
# an idle connection; tcp_user_timeout bounds the wait for data sent.
# connect_timeout is per host: a multi-host URL's host that answers nothing
# (cut off) costs each attempt that long before the next host is tried.
#: libpq connection parameters (a conninfo's, as a dict).
ConnParams: TypeAlias = dict[str, str | int | None]

T = TypeVar("T")

#: A row as psycopg makes it (:func:`_row_factory`: a :class:`Row`, or a
#: plain tuple for a statement without columns).
PgRow: TypeAlias = tuple[SqlValue, ...]

_CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "25000",
}

# Multi-host targets asking for the writable server: the host and port the
# last session of this process opened on, by the target's host and port
# lists.  Tried first by the next connection (libpq, and psycopg, try the
# hosts in the order given): after a failover the old primary comes first
# in the URL, and a host that answers nothing (cut off: no RST) would cost
# every new connection its connect_timeout before the new primary is tried.
_WRITABLE_ATTRS = frozenset({"read-write", "primary"})
_last_writable: dict[tuple[str, str], tuple[str, str]] = {}


def listed_hosts(params: ConnParams) -> tuple[str, str] | None:
    """The target's host and port lists when it names several hosts and
    asks for the writable one (the key of what :func:`writable_first`
    remembers); else None."""
    if str(params.get("target_session_attrs", "")) not in _WRITABLE_ATTRS:
        return None
    if "," not in str(params.get("host") or "") or params.get("hostaddr"):
        return None
    return str(params["host"]), str(params.get("port") or "")


def writable_first(params: ConnParams, listed: tuple[str, str] | None) -> ConnParams:
    """``params`` with the host this process last found writable for
    ``listed`` first (the others after it, in their order); as given when
    there is none."""
    last = _last_writable.get(listed) if listed is not None else None
    if listed is None or last is None:
        return params
    hosts = listed[0].split(",")
    ports = listed[1].split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        return params
    pairs = list(zip(hosts, ports, strict=True))
    if last not in pairs or pairs[0] == last:
        return params
    pairs.remove(last)
    pairs.insert(0, last)
    return {**params, "host": ",".join(h for h, _ in pairs), "port": ",".join(p for _, p in pairs)}


#: SQLSTATEs of a session the server ended (admin_shutdown,
#: crash_shutdown, cannot_connect_now) and the connection exception class.
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03"})


def is_connection_lost(error: BaseException) -> bool:
    """The connection is gone or could not be made (the server ended the
    session, restarted, refused, the network failed): the transaction did
    not commit on it, unless it died during the ``COMMIT``."""
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in _SESSION_ENDED or sqlstate.startswith("08")
    # libpq reports a lost or refused connection without a SQLSTATE.
    return isinstance(error, psycopg.OperationalError)


def is_busy(error: BaseException) -> bool:
    """A conflict, a lock not granted in time, a timeout, no connection slot."""
    return getattr(error, "sqlstate", None) in BUSY


def is_integrity_error(error: BaseException) -> bool:
    """A unique, foreign key, check or trigger violation."""
    return isinstance(error, psycopg.IntegrityError)


# -- rows --------------------------------------------------------------------------------


class Row(tuple[Any, ...]):
    """A result row: a tuple, indexable by position and by column name
    (case-insensitive), with :meth:`keys` (like ``sqlite3.Row``).  One
    subclass per column list carries the names (:func:`_row_class`)."""

    __slots__ = ()
    _names: ClassVar[tuple[str, ...]] = ()
    _index: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            try:
                position = self._index[key]
            except KeyError:
                try:
                    position = self._index[key.lower()]
                except KeyError:
                    raise IndexError(f"no such column: {key}") from None
            return tuple.__getitem__(self, position)
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)

    def __repr__(self) -> str:
        return f"<Row {dict(zip(self._names, self, strict=False))!r}>"


_row_classes: dict[tuple[str, ...], type[Row]] = {}


def _row_class(names: tuple[str, ...]) -> type[Row]:
    found = _row_classes.get(names)
    if found is None:
        index: dict[str, int] = {}
        for position, name in enumerate(names):
            index.setdefault(name, position)  # the first of two equal names, as sqlite3
            index.setdefault(name.lower(), position)
        found = type("Row", (Row,), {"__slots__": (), "_names": names, "_index": index})
        _row_classes[names] = found
    return found


def _row_factory(cursor: psycopg.Cursor[PgRow]) -> Callable[[Sequence[SqlValue]], PgRow]:
    description = cursor.description
    if description is None:
        return tuple
    return _row_class(tuple(column.name for column in description))


class _NumericLoader(Loader):
    """``numeric`` as SQLite would answer it: ``int`` when whole, else ``float``."""

    def load(self, data: bytes | bytearray | memoryview) -> int | float:
        value = Decimal(bytes(data).decode("ascii"))
        if value == value.to_integral_value():
            return int(value)
        return float(value)


class _BoolDumper(Dumper):
    """A Python ``bool`` parameter as the integer SQLite would store."""

    oid = psycopg.adapters.types["int4"].oid

    def dump(self, obj: bool) -> bytes:
        return b"1" if obj else b"0"


# -- connection and cursor -------------------------------------------------------------


class ConnectOptions(TypedDict):
    """The keyword arguments of :class:`PgConnection` (and :func:`connect`)."""

    lock_timeout_ms: NotRequired[int]
    read_only: NotRequired[bool]
    application_name: NotRequired[str]
    sources: NotRequired[Sources]


class PgCursor:
    """A cursor of :class:`PgConnection` (the sqlite3 subset, see the module doc)."""

    arraysize = 1

    def __init__(self, connection: PgConnection) -> None:
        self.connection = connection
        # The psycopg cursor of the last statement (made when it ran: the
        # connection may have been replaced since this cursor was made).
        self._cursor: psycopg.Cursor[PgRow] | None = None

    def _fresh(self) -> psycopg.Cursor[PgRow]:
        self._cursor = self.connection.raw.cursor()
        return self._cursor

    @property
    def rowcount(self) -> int:
        return -1 if self._cursor is None else self._cursor.rowcount

    @property
    def description(self) -> Sequence[psycopg.Column] | None:
        return None if self._cursor is None else self._cursor.description

    @property
    def lastrowid(self) -> int:
        raise psycopg.NotSupportedError(
            "lastrowid is not available on PostgreSQL: use INSERT ... RETURNING id"
        )

    def execute(self, sql: str, parameters: SqlParameters | None = None) -> PgCursor:
        self.connection._execute(self, sql, parameters)
        return self

    def executemany(self, sql: str, seq_of_parameters: Iterable[SqlParameters]) -> PgCursor:
        statement = sql if type(sql) is Sql else rendered(sql)
        if statement.kind:
            raise psycopg.ProgrammingError(f"executemany of {sql!r}")
        self.connection._traced(statement)
        rows = [parameters(statement, p) for p in seq_of_parameters]
        if not rows:
            return self
        text = statement.postgres
        self.connection._ready()
        if self.connection._sets_now and not self.connection.in_transaction:
            self.connection._set_now()
        cursor = self._fresh()
        self.connection._run(lambda: cursor.executemany(text, rows))
        return self

    def _rows(self) -> psycopg.Cursor[PgRow] | None:
        """The psycopg cursor if its last statement gave rows."""
        cursor = self._cursor
        if cursor is None or cursor.closed or cursor.description is None:
            return None
        return cursor

    def fetchone(self) -> Any:
        cursor = self._rows()
        return None if cursor is None else cursor.fetchone()

    def fetchall(self) -> list[Any]:
        cursor = self._rows()
        return [] if cursor is None else cursor.fetchall()

    def fetchmany(self, size: int | None = None) -> list[Any]:
        cursor = self._rows()
        return [] if cursor is None else cursor.fetchmany(self.arraysize if size is None else size)

    def __iter__(self) -> Iterator[Any]:
        cursor = self._rows()
        return iter(()) if cursor is None else iter(cursor)

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()


class PgConnection:
    """One PostgreSQL session with the sqlite3 subset the storage code uses
    (see the module doc)."""

    def __init__(
        self,
        target: str,
        *,
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
        read_only: bool = False,
        application_name: str = DEFAULT_APPLICATION_NAME,
        sources: Sources = SYSTEM,
    ) -> None:
        if lock_timeout_ms < 0:
            raise ValueError(f"lock_timeout_ms must be >= 0, got {lock_timeout_ms}")
        self.target = target
        #: The wall clock and entropy of the transactions run on this
        #: connection (the module doc, "The wall clock").
        self.sources = sources
        self._sets_now = not sources.system_wall
        self._lock_timeout_ms = lock_timeout_ms
        self._read_only = read_only
        self._application_name = application_name
        self._failed_by: BaseException | None = None
        # A transaction this connection began has not ended (even if the
        # connection broke meanwhile): no silent reconnect under it.
        self._began = False
        self._trace: Callable[[str], object] | None = None
        self.raw = self._open()

    def _open(self) -> psycopg.Connection[PgRow]:
        params: ConnParams = dict(_CONNECTION_DEFAULTS)
        params["application_name"] = self._application_name
        params.update(pg_conninfo.conninfo_to_dict(self.target))
        listed = listed_hosts(params)
        params = writable_first(params, listed)
        # Any: psycopg.connect's keywords are typed one by one, libpq's as ConnParam.
        options: dict[str, Any] = params
        raw: psycopg.Connection[PgRow] = psycopg.connect(**options, autocommit=True)
        if listed is not None:
            _last_writable[listed] = (raw.info.host, str(raw.info.port))
        try:
            raw.adapters.register_loader("numeric", _NumericLoader)
            raw.adapters.register_dumper(bool, _BoolDumper)
            raw.row_factory = _row_factory
            # 0 would mean "wait for ever" to PostgreSQL, "do not wait" to SQLite.
            timeout = max(1, int(self._lock_timeout_ms))
            raw.execute(f"SET lock_timeout = {timeout}")
            raw.execute("SET synchronous_commit = on")
            if self._read_only:
                raw.execute("SET default_transaction_read_only = on")
        except BaseException:
            raw.close()
            raise
        return raw

    # The sqlite3 subset ------------------------------------------------------------

    @property
    def in_transaction(self) -> bool:
        status = self.raw.info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    @property
    def failed_by(self) -> BaseException | None:
        """The error that aborted the open transaction (``None`` when it is not aborted)."""
        if self.raw.info.transaction_status != TransactionStatus.INERROR:
            return None
        return self._failed_by

    def cursor(self) -> PgCursor:
        return PgCursor(self)

    def execute(self, sql: str, parameters: SqlParameters | None = None) -> PgCursor:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Iterable[SqlParameters]) -> PgCursor:
        return self.cursor().executemany(sql, seq_of_parameters)

    def commit(self) -> None:
        if self.in_transaction:
            self.execute(_COMMIT)

    def rollback(self) -> None:
        if self.in_transaction:
            self.execute(_ROLLBACK)

    def __enter__(self) -> PgConnection:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        """As sqlite3's connection: end an open transaction (commit, or roll
        back on an exception); the connection stays open."""
        if self.in_transaction:
            if exc_type is None:
                self.commit()
            else:
                self.rollback()

    def close(self) -> None:
        self.raw.close()

    def set_trace_callback(self, callback: Callable[[str], object] | None) -> None:
        """Call ``callback(sql)`` with every statement run, in its SQLite
        text (the one text both engines' traces show), like sqlite3's."""
        self._trace = callback

    def run_script(self, script: str) -> None:
        """Run a whole SQL script as it is (no parameters:
        several statements, PL/pgSQL bodies), inside the caller's transaction."""
        self._run(lambda: self.raw.execute(script.encode("utf-8")))

    # Inside ---------------------------------------------------------------------------

    @property
    def broken(self) -> bool:
        return self.raw.closed or self.raw.broken

    def _ready(self) -> None:
        """Before a statement outside ``BEGIN``: a broken connection on which
        no transaction of ours was open is replaced (nothing was in flight
        on it); under an open one the statement fails with the connection."""
        if not self._began and self.broken:
            self._reopen()

    def _reopen(self) -> None:
        try:
            self.raw.close()
        finally:
            self.raw = self._open()

    def _run(self, operation: Callable[[], T]) -> T:
        try:
            return operation()
        except psycopg.Error as error:
            if self.raw.info.transaction_status == TransactionStatus.INERROR:
                self._failed_by = error
            raise

    def _set_now(self) -> None:
        """The session's ``tasknet.now`` from the wall clock (only for a
        clock other than the system's: the module doc)."""
        if self._sets_now:
            text = precise(self.sources.wall())
            self._run(lambda: self.raw.execute(_SET_NOW, (text,)))

    def _traced(self, statement: Sql) -> None:
        if self._trace is not None:
            self._trace(str(statement))

    def _execute(self, cursor: PgCursor, text: str, given: SqlParameters | None) -> None:
        statement = text if type(text) is Sql else rendered(text)
        self._traced(statement)
        postgres = statement.postgres
        values = parameters(statement, given)
        if statement.kind == "begin":
            if self.in_transaction:
                raise psycopg.ProgrammingError("cannot start a transaction within a transaction")
            if self.broken:
                self._reopen()  # what was in flight on it has failed already
            self._failed_by = None
            raw = cursor._fresh()
            self._run(lambda: raw.execute(postgres, values))
            self._began = True
            self._set_now()
            return
        self._ready()
        if self._sets_now and not statement.kind and not self.in_transaction:
            self._set_now()
        raw = cursor._fresh()
        if statement.kind == "commit" and self.failed_by is not None:
            # PostgreSQL would answer COMMIT with a silent ROLLBACK.
            error = self._failed_by
            self._began = False
            self._run(lambda: raw.execute("ROLLBACK"))
            assert error is not None
            raise error
        if statement.kind == "rollback_to":
            self._failed_by = None
        elif statement.kind:
            self._began = False
        self._run(lambda: raw.execute(postgres, values))


def connect(target: str, **options: Unpack[ConnectOptions]) -> PgConnection:
    """A :class:`PgConnection` to ``target`` (a ``postgresql://`` URL or a
    libpq conninfo string); ``options``: its keyword arguments."""
    return PgConnection(target, **options)
