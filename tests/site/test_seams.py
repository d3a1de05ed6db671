"""The site's storage reads the wall clock, ids and secrets only through what
its root hands it (issue 20): a pool given a wall clock writes that time
into rows through ``{now}`` and into Python's own timestamps (both
backends), a pool given a seeded entropy makes the same ids and tokens
every run, and the root hands the pool, the lease and the demo setup its
reactor's clock and its entropy.  Production's (the system's clock, the
OS's bytes) issue no extra statement and keep every format."""

from __future__ import annotations

import base64
import re
import secrets
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor as global_reactor
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads, IReactorTCP
from twisted.internet.task import Clock
from zope.interface import implementer

from tasknet.runtime import IEntropy, SeededEntropy, SystemEntropy
from tasknet.site.root import build_site
from tasknet.site.storage import create, sessions, usage, users, views
from tasknet.site.storage.engine import timestamps
from tasknet.site.storage.engine.database import (
    Database,
    connect,
    is_postgres,
    open_pool,
    run_read,
    run_write,
)
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.sources import SYSTEM, Sources, now_of, sources_of
from tasknet.site.storage.engine.sql import offset, sql
from tests.runtime import site_runtime
from tests.site.helpers import site_options

#: A wall clock far from the real one, with milliseconds (and digits past them).
T = 2_000_000_000.1239
STAMP = "2033-05-18T03:33:20.123Z"

_NOW = sql("SELECT {now}, {now_offset}")
_CREATED = sql('SELECT created_at FROM "user" WHERE name = ?')
_TASK_TIMES = sql("SELECT created_at, updated_at FROM gallery WHERE gid = ?")
_OP = sql("SELECT operation_id, created_at FROM task_operation WHERE gid = ?")
_STAMP_ALL = sql("UPDATE t SET at = {now}")
_DISTINCT = sql("SELECT COUNT(DISTINCT at), MIN(at) FROM t")
_NOW_SETTING = sql("SELECT current_setting('tasknet.now', true)")


def _pool(target: str, *, wall: Callable[[], float], entropy: IEntropy) -> Database:
    prepare_database(target)
    return open_pool(target, **(site_runtime() | {"wall": wall, "entropy": entropy}))


def _user_and_now(cursor: Any) -> tuple[str, str, str, float]:
    users.create_user(cursor, "alice", quota=10)
    created = cursor.execute(_CREATED, ("alice",)).fetchone()[0]
    now, earlier = cursor.execute(_NOW, (offset(-1.5),)).fetchone()
    return created, now, earlier, now_of(cursor)


def test_the_stamp_of_t_is_the_python_side_s() -> None:
    assert timestamps.iso(T) == STAMP
    assert timestamps.truncated(T) == pytest.approx(2_000_000_000.123, abs=1e-6)


@pytest_twisted.ensureDeferred
async def test_a_pool_stamps_rows_on_its_wall_clock(db_target: str) -> None:
    db = _pool(db_target, wall=lambda: T, entropy=SystemEntropy())
    try:
        created, now, earlier, python = await db.write(_user_and_now)
        assert (created, now, earlier, python) == (STAMP, STAMP, "2033-05-18T03:33:18.623Z", T)
        # The readers' connections carry the same clock.
        read = await db.read(lambda cursor: list(cursor.execute(_NOW, (offset(60),)).fetchone()))
        assert read == [STAMP, "2033-05-18T03:34:20.123Z"]
        # A create's rows (INSERTs that named no time: the schema's DEFAULT
        # was the database's clock) and its week are the pool's too.
        user = await db.read(lambda cursor: users.get_user(cursor, "alice"))
        assert user is not None
        week = usage.iso_week(datetime.fromtimestamp(T, UTC))
        await db.write(create.reserve, 7, user.id, "seven", "tok", week)
        assert await db.read(lambda c: list(c.execute(_TASK_TIMES, (7,)).fetchone())) == [
            STAMP,
            STAMP,
        ]
        assert (await db.read(lambda c: c.execute(_OP, (7,)).fetchone()))[1] == STAMP
        assert await db.read(lambda c: usage.usage(c, user.id)["week"]) == "2033-W20"
    finally:
        db.close()


@pytest_twisted.ensureDeferred
async def test_a_statement_reads_the_wall_clock_once(db_target: str) -> None:
    ticks = iter(range(1_000))

    def wall() -> float:  # a clock that moves a second each time it is read
        return T + next(ticks)

    db = _pool(db_target, wall=wall, entropy=SystemEntropy())
    try:

        def stamp_all(cursor: Any) -> list[Any]:
            cursor.execute("CREATE TABLE t (n INTEGER, at TEXT)")
            cursor.executemany("INSERT INTO t (n) VALUES (?)", [(n,) for n in range(50)])
            cursor.execute(_STAMP_ALL)
            return list(cursor.execute(_DISTINCT).fetchone())

        count, _ = await db.write(stamp_all)
        assert count == 1  # one "now" for the 50 rows of one statement
    finally:
        db.close()


def test_a_plain_connection_reads_the_clock_it_was_given(db_target: str) -> None:
    prepare_database(db_target)
    given = connect(db_target, Sources(lambda: T, SystemEntropy()))
    system = connect(db_target)
    try:
        assert sources_of(given.cursor()).wall() == T
        assert sources_of(system.cursor()) is SYSTEM
        assert given.execute(_NOW, (offset(0),)).fetchone()[0] == STAMP  # outside a transaction
        assert run_write(given, lambda c: c.execute(_NOW, (offset(0),)).fetchone()[0]) == STAMP
        assert run_read(given, lambda c: c.execute(_NOW, (offset(0),)).fetchone()[0]) == STAMP
        real = system.execute(_NOW, (offset(0),)).fetchone()[0]
        assert abs(timestamps.parse(real).timestamp() - datetime.now(UTC).timestamp()) < 60
        if is_postgres(db_target):
            # Production's clock sets nothing: {now} is statement_timestamp().
            assert system.execute(_NOW_SETTING).fetchone()[0] in (None, "")
            assert given.execute(_NOW_SETTING).fetchone()[0] is not None
    finally:
        given.close()
        system.close()


def test_a_bare_sqlite_connection_is_refused_by_name(tmp_path: Any) -> None:
    import sqlite3

    bare = sqlite3.connect(str(tmp_path / "bare.sqlite"))
    try:
        with pytest.raises(TypeError, match="did not open"):
            now_of(bare.cursor())
    finally:
        bare.close()


# -- ids and secrets ---------------------------------------------------------------------


def _ids(target: str, seed: int) -> tuple[str, str, str]:
    """A user's token, a reservation's operationId and a node secret made on
    a connection whose entropy is ``SeededEntropy(seed)``."""
    prepare_database(target)
    connection = connect(target, Sources(lambda: T, SeededEntropy(seed)))
    try:
        user, token = run_write(connection, lambda c: users.create_user(c, "bob"))
        operation_id = run_write(connection, create.reserve, 9, user.id, "nine", "t", "2033-W20")
        secret = run_write(connection, users.add_node_key, "node-1")
    finally:
        connection.close()
    return token, operation_id, secret


def test_ids_and_secrets_come_from_the_connection_s_entropy(new_db_target: Any) -> None:
    first = _ids(new_db_target("a"), 42)
    again = _ids(new_db_target("b"), 42)
    other = _ids(new_db_target("c"), 43)
    assert first == again and first != other
    token, operation_id, secret = first
    expected = SeededEntropy(42)
    assert token == base64.urlsafe_b64encode(expected.token_bytes(24)).rstrip(b"=").decode()
    assert operation_id == expected.uuid4().hex
    assert secret == expected.token_hex(16)
    assert uuid.UUID(hex=operation_id).version == 4
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", token) and re.fullmatch(r"[0-9a-f]{32}", secret)


@implementer(IEntropy)
class _Bytes:
    """The OS's entropy with known bytes (what ``secrets`` would read)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def token_bytes(self, nbytes: int) -> bytes:
        return self.data[:nbytes]

    def token_hex(self, nbytes: int) -> str:
        return self.data[:nbytes].hex()

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.data[:16], version=4)

    def random(self) -> Any:
        raise NotImplementedError


def test_the_formats_are_those_of_secrets_and_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(200, 232))
    # secrets.token_urlsafe(n) is urlsafe_b64encode(token_bytes(n)) unpadded.
    monkeypatch.setattr(secrets, "token_bytes", lambda n: data[:n])
    assert users.new_token(_Bytes(data)) == secrets.token_urlsafe(24)
    assert sessions.new_session_id(_Bytes(data)) == secrets.token_urlsafe(32)
    assert sessions.well_formed(sessions.new_session_id(_Bytes(data)))
    assert sessions.well_formed(sessions.new_session_id())  # a tool's: the OS's
    # uuid.uuid4() is UUID(bytes=os.urandom(16), version=4).
    monkeypatch.setattr("os.urandom", lambda n: data[:n])
    assert SystemEntropy().uuid4().hex == uuid.uuid4().hex


def test_a_session_id_comes_from_the_given_entropy() -> None:
    first = sessions.new_session_id(SeededEntropy(5))
    assert (
        first
        == sessions.new_session_id(SeededEntropy(5))
        != sessions.new_session_id(SeededEntropy(6))
    )
    assert len(first) == 43 and sessions.well_formed(first)


# -- the root ------------------------------------------------------------------------------


@implementer(IReactorCore, IReactorFromThreads, IReactorTCP)
class _Clock(Clock):
    """The site's clock, a ``task.Clock``; the rest the global reactor's
    (as in test_root.py)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(global_reactor, name)


_INSTANCE = sql("SELECT started_at, heartbeat_at FROM site_instance WHERE id = ?")


@pytest_twisted.ensureDeferred
async def test_the_root_hands_its_clock_and_entropy_to_storage(db_target: str) -> None:
    clock = _Clock()
    clock.advance(T)
    entropy = SeededEntropy(11)
    options = site_options(db_target, "http://127.0.0.1:9", "--demo")
    site = build_site(options, clock, entropy=entropy)
    try:
        parts = site.parts
        assert parts.db.sources == Sources(clock.seconds, entropy)
        assert parts.web.auth.entropy is entropy
        # The lease registered the instance, and the demo setup its user, on
        # the site's clock (before the pools opened).
        instance = parts.instance.lease.instance_id
        started = await parts.db.read(lambda c: list(c.execute(_INSTANCE, (instance,)).fetchone()))
        assert started == [STAMP, STAMP]
        assert await parts.db.read(lambda c: c.execute(_CREATED, ("demo",)).fetchone()[0]) == (
            STAMP
        )
        # A view is judged at the site's now.
        assert await parts.db.read(now_of) == T
        assert await parts.db.read(views.task_view, 1) is None
    finally:
        await site.stopService()


# -- the schemas' time defaults ----------------------------------------------------------

_INSERT = re.compile(r'INSERT INTO\s+"?(\w+)"?\s*\(([^)]*)\)')


def test_every_site_insert_stamps_its_time_columns_itself(tmp_path: Any) -> None:
    """A column whose DEFAULT is the database's clock is given ``{now}`` by
    every INSERT of the site's storage (else a simulated site's rows would
    carry real time); ``schema_version`` is the schema scripts' own."""
    import importlib
    import pkgutil

    import tasknet.site.storage as storage
    from tasknet.site.storage.engine import sql as sql_module

    for module in pkgutil.walk_packages(storage.__path__, "tasknet.site.storage."):
        importlib.import_module(module.name)
    path = str(tmp_path / "schema.sqlite")
    prepare_database(path)
    connection = connect(path)
    try:
        tables = [
            r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        stamped = {
            table: {
                r[1]
                for r in connection.execute(f'PRAGMA table_info("{table}")')
                if "now" in str(r[4])
            }
            for table in tables
        }
    finally:
        connection.close()
    assert stamped["site_instance"] == {"started_at", "heartbeat_at"}  # the check sees them
    missing = []
    for defined in sql_module.defined():
        found = _INSERT.search(str(defined.statement))
        if not defined.module.startswith("tasknet.site."):
            continue  # a test's own statement
        if found is None or found.group(1) == "schema_version":
            continue
        named = {column.strip() for column in found.group(2).split(",")}
        if stamped.get(found.group(1), set()) - named:
            missing.append((defined.module, str(defined.statement)[:80]))
    assert missing == []
