"""Suite-wide fixtures.

``reactor_is_clean`` (autouse) fails any test that leaves delayed calls or
open sockets on the global reactor: a test that leaks them would make a later
test flaky, and in production the same leak is a resource bug.

The database backends (INTERFACES.md, "Several sites on PostgreSQL"): a test
that takes ``db_target`` runs twice, on a fresh SQLite file and on a fresh
database of one throwaway PostgreSQL server per session (``pg_server``).
Without PostgreSQL installed the ``postgresql`` half is skipped, unless
``TASKNET_REQUIRE_POSTGRES=1`` (CI) makes that an error.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor, tcp
from twisted.internet.task import deferLater

from tasknet.drill.pgserver import INSTALL_HINT, ThrowawayPostgres, installed
from tests.backends import BACKENDS, DatabasePool, NewTarget

try:  # unix sockets are optional on some platforms
    from twisted.internet import unix

    _SOCKET_TYPES: tuple[type, ...] = (
        tcp.Port,
        tcp.Connection,
        unix.Port,
        unix.Server,
        unix.Client,
    )
except ImportError:  # pragma: no cover
    _SOCKET_TYPES = (tcp.Port, tcp.Connection)


def _leftovers() -> tuple[list, list]:
    calls = [c for c in reactor.getDelayedCalls() if c.active()]
    sockets = [
        s
        for s in set(reactor.getReaders()) | set(reactor.getWriters())
        if isinstance(s, _SOCKET_TYPES)
    ]
    return calls, sockets


@pytest.fixture(autouse=True)
def reactor_is_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.node.get_closest_marker("allow_leftovers"):
        return
    # Give closing transports a few turns of the reactor to finish.
    for _ in range(20):
        calls, sockets = _leftovers()
        if not calls and not sockets:
            return
        pytest_twisted.blockon(deferLater(reactor, 0.01, lambda: None))
    calls, sockets = _leftovers()
    if calls or sockets:
        for c in calls:
            c.cancel()
        for s in sockets:
            s.loseConnection() if hasattr(s, "loseConnection") else s.stopListening()
        pytest.fail(f"test left the reactor dirty: delayed calls={calls!r} sockets={sockets!r}")


# ------------------------------------------------------------------ database backends

REQUIRE_POSTGRES = "TASKNET_REQUIRE_POSTGRES"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[ThrowawayPostgres]:
    """One throwaway PostgreSQL server for the whole session, started the
    first time a test needs it."""
    if not installed():
        if os.environ.get(REQUIRE_POSTGRES) == "1":
            pytest.fail(f"{REQUIRE_POSTGRES}=1 but PostgreSQL is not installed: {INSTALL_HINT}")
        pytest.skip(f"PostgreSQL is not installed ({INSTALL_HINT})")
    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: ThrowawayPostgres) -> Iterator[str]:
    """A fresh PostgreSQL database with the site's schema, dropped after the
    test (for the tests that are about PostgreSQL only)."""
    from tasknet.site.storage.engine.schema import prepare_database

    name = f"pg_{uuid.uuid4().hex[:12]}"
    url = pg_server.create_database(name)
    prepare_database(url)
    try:
        yield url
    finally:
        pg_server.drop_database(name)


@pytest.fixture(scope="session")
def pg_pool(pg_server: ThrowawayPostgres) -> DatabasePool:
    """The session's empty PostgreSQL databases, reused from test to test."""
    return DatabasePool(pg_server)


@pytest.fixture(params=BACKENDS)
def db_backend(request: pytest.FixtureRequest) -> str:
    """``sqlite`` or ``postgresql``: the backend this run of the test uses."""
    return str(request.param)


@pytest.fixture
def new_db_target(
    db_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[NewTarget]:
    """Make fresh empty databases of the test's backend: ``new_db_target()``
    or ``new_db_target("b")`` (a name, for tests with several): a SQLite
    file in ``tmp_path``, or a PostgreSQL database (emptied after the test
    for the next one)."""
    pool: DatabasePool | None = (
        request.getfixturevalue("pg_pool") if db_backend == "postgresql" else None
    )
    taken: list[str] = []

    def make(name: str = "site") -> str:
        if pool is None:
            return str(tmp_path / f"{name}.sqlite")
        taken.append(pool.take())
        return pool.server.url(taken[-1])

    yield make
    for database in taken:
        pool.give_back(database)  # type: ignore[union-attr]


@pytest.fixture
def db_target(new_db_target: NewTarget) -> str:
    """A fresh empty database (the code under test creates the schema, as
    the site does): a SQLite file path, or a PostgreSQL URL."""
    return new_db_target()
