"""Suite-wide fixtures.

``reactor_is_clean`` (autouse) fails any test that leaves delayed calls or
open sockets on the global reactor: a test that leaks them would make a later
test flaky, and in production the same leak is a resource bug.

The database backends (INTERFACES.md, "Several sites on PostgreSQL"): a test
that takes ``db_target`` runs twice, on a fresh SQLite file and on a fresh
database of one throwaway PostgreSQL server per session (``pg_server``).
Without PostgreSQL installed the ``postgresql`` half is skipped, unless
``TASKNET_REQUIRE_POSTGRES=1`` (CI) makes that an error.

Speed (the suite's meaning unchanged): where the machine has a tmpfs
(``/dev/shm``), ``tmp_path`` (every test's SQLite files) and the PostgreSQL
cluster live there, and the throwaway cluster runs with ``fsync`` off (it
holds nothing that must survive a power cut).  Under pytest-xdist
(``scripts/test`` runs ``-n``) each worker is a session of its own, so it
has its own PostgreSQL server; the tests of a module marked ``one_worker``
(fixed ports) run on one worker together, those of a module with a
module-scoped fixture on one worker per backend; and the ``slow`` tests are
handed out first, so none is left for the end.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------ speed: tmpfs, workers

#: A RAM-backed file system, when the machine has one.
TMPFS = Path("/dev/shm")
#: pytest's own root for ``tmp_path`` (its numbered, locked, rotated directories).
_TEMPROOT = "PYTEST_DEBUG_TEMPROOT"


def tmpfs() -> Path | None:
    """``/dev/shm`` when it is there and ours to write, else None (disk)."""
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK | os.X_OK):
        return TMPFS
    return None


def pytest_configure(config: pytest.Config) -> None:
    # Only when nobody chose: an explicit --basetemp or temproot wins.
    where = tmpfs()
    if where is not None and config.option.basetemp is None and _TEMPROOT not in os.environ:
        os.environ[_TEMPROOT] = str(where)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its order is the schedule's
        # Stable: the slow tests first (the longest poles), the rest in their order.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


#: A test module's text that keeps its tests on one worker: the ``one_worker``
#: mark (fixed ports), or a fixture set up once per module (as a plain run
#: sets it up once; a module-scoped fixture per backend, once per backend).
_ONE_WORKER = re.compile(r"mark\.one_worker\b")
_MODULE_FIXTURE = re.compile(r"""scope=["']module["']""")
#: The backend in a test's name (``[sqlite]``, ``test_links_postgresql``).
_BACKEND = re.compile(r"[\[_-](sqlite|postgresql)\b")


@functools.cache
def _kept_together(path: Path) -> str | None:
    """``"module"`` (one worker), ``"backend"`` (one per backend) or None."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    if _ONE_WORKER.search(text):
        return "module"
    if _MODULE_FIXTURE.search(text):
        return "backend"
    return None


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist load`` (xdist's default under ``-n``), test by test, except
    that the tests of a module marked ``one_worker`` go to one worker
    together, and those of a module with a module-scoped fixture to one
    worker per backend.  (xdist's own ``loadgroup`` cannot be used: it
    renames node ids, which pytest 9 no longer lets it do.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class ModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module, _, name = nodeid.partition("::")
            together = _kept_together(root / module)
            if together is None:
                return nodeid
            backend = _BACKEND.search(name) if together == "backend" else None
            return f"{module}::{backend.group(1)}" if backend else module

    return ModulesTogether(config, log)


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
    # fsync off: a throwaway cluster of test data, gone when the run ends
    # (the drills and benchmarks start their own, with fsync on).
    where = tmpfs()
    with ThrowawayPostgres(
        base_dir=None if where is None else str(where), settings={"fsync": "off"}
    ) as server:
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
