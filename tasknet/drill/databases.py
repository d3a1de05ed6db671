"""Where a drill run's sites keep their state: ``tasknet-drill --db``.

* ``sqlite`` (the default): a fresh SQLite file in the run's directory.
* ``postgres``: one throwaway PostgreSQL server for the whole session
  (:class:`~tasknet.drill.pgserver.ThrowawayPostgres`), and a fresh
  database on it per run, owned by a role of its own that is not a
  superuser (so that S15 can take its privileges away), dropped when the run
  passed.
* ``postgres-ha``: a failover cluster per run
  (:class:`~tasknet.drill.pgcluster.PgCluster`: pg_auto_failover's monitor,
  a primary and a synchronous standby on loopback); the sites' ``--db`` is
  its multi-host URL, and the scenarios (S24–S26) break the cluster itself.
  A cluster that lived through a failover is not reused: each run starts
  from a healthy primary + standby.
* ``postgresql://…`` (or ``postgres://…``): an existing server; each run
  gets a fresh database of its own on it (the URL's user needs
  ``CREATEDB``; the URL's database is only where ``CREATE DATABASE`` is
  issued), dropped when the run passed.

Runs stay independent: no run sees another's rows, instances or nodes.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from tasknet.drill.cluster import SiteDatabase
from tasknet.drill.pgserver import ThrowawayPostgres
from tasknet.site.storage.engine.database import POSTGRESQL, SQLITE, is_postgres

#: The ``--db`` words (a URL is the third form).
SQLITE_CHOICE = "sqlite"
POSTGRES_CHOICE = "postgres"
#: A pg_auto_failover cluster per run (S24–S26).
POSTGRES_HA_CHOICE = "postgres-ha"

#: The role the sites of a throwaway server connect as.
SITE_ROLE = "tasknet_drill"

_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class DatabaseChoiceError(ValueError):
    """A ``--db`` value that is none of the accepted forms."""


def parse_db_option(value: str) -> str:
    """``sqlite``, ``postgres`` or a PostgreSQL URL, normalised
    (``postgresql`` is ``postgres``); anything else raises
    :class:`DatabaseChoiceError` saying what is accepted."""
    word = value.strip()
    if word.lower() == SQLITE_CHOICE:
        return SQLITE_CHOICE
    if word.lower() in (POSTGRES_CHOICE, POSTGRESQL):
        return POSTGRES_CHOICE
    if word.lower() == POSTGRES_HA_CHOICE:
        return POSTGRES_HA_CHOICE
    if is_postgres(word):
        parts = urlsplit(word)
        if not parts.hostname and "host=" not in parts.query:
            raise DatabaseChoiceError(f"--db {value}: the URL names no server (host)")
        return word
    raise DatabaseChoiceError(
        f"--db {value!r}: use sqlite (the default), postgres (a throwaway PostgreSQL"
        " server), postgres-ha (a throwaway failover cluster: a primary and a synchronous"
        " standby under pg_auto_failover) or a postgresql:// URL of an existing server"
    )


def run_database_name(scenario: str, run: int) -> str:
    """A fresh database name for one run (lower-case, unique per session)."""
    name = f"drill_{scenario.lower()}_{run}_{secrets.token_hex(4)}"
    if not _DATABASE_NAME.fullmatch(name):
        raise ValueError(f"not a database name: {name}")
    return name


def with_database(url: str, dbname: str) -> str:
    """``url`` naming database ``dbname`` instead (user, host, port and
    parameters kept)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", parts.query, parts.fragment))


class Databases(Protocol):
    """Fresh site databases, one per run."""

    backend: str

    def start(self) -> None: ...

    def new(self, name: str, directory: Path) -> SiteDatabase: ...

    def release(self, database: SiteDatabase, *, keep: bool) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class SqliteFiles:
    """A SQLite file in each run's directory (removed with the directory)."""

    backend = SQLITE

    def start(self) -> None:
        pass

    def new(self, name: str, directory: Path) -> SiteDatabase:
        return SiteDatabase(str(directory / "site" / "site.sqlite"))

    def release(self, database: SiteDatabase, *, keep: bool) -> None:
        pass

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "SQLite (a file per run)"


class ThrowawayServer:
    """One throwaway PostgreSQL server for the session, a database per run.

    ``socket``: the sites reach it over its unix socket (``--netns``: the
    sites live in another network namespace, where the server's loopback
    address is not reachable)."""

    backend = POSTGRESQL

    def __init__(self, base_dir: str | None = None, *, socket: bool = False) -> None:
        self.server = ThrowawayPostgres(base_dir)
        self.socket = socket

    def start(self) -> None:
        self.server.start()
        self.server.psql(f'CREATE ROLE "{SITE_ROLE}" LOGIN NOSUPERUSER')

    def new(self, name: str, directory: Path) -> SiteDatabase:
        self.server.psql(f'CREATE DATABASE "{name}" OWNER "{SITE_ROLE}"')
        if self.socket:
            url = self.server.socket_url(name)
        else:
            url = self.server.url(name)
        url = url.replace("postgresql://postgres@", f"postgresql://{SITE_ROLE}@", 1)

        def admin(statement: str) -> None:
            self.server.psql(statement, dbname=name)

        return SiteDatabase(url, admin=admin, role=SITE_ROLE)

    def release(self, database: SiteDatabase, *, keep: bool) -> None:
        if keep or not self.server.running:
            return
        self.server.drop_database(_dbname(database.target))

    def close(self) -> None:
        self.server.stop()

    def describe(self) -> str:
        if not self.server.running:
            return "a throwaway PostgreSQL server"
        return (
            f"a throwaway PostgreSQL server on {self.server.url()} ({self.server.directory}),"
            f" a database per run, sites as role {SITE_ROLE}"
        )


class ExistingServer:
    """An existing PostgreSQL server (``--db postgresql://…``): a database
    per run, created and dropped through the URL's own database."""

    backend = POSTGRESQL

    def __init__(self, url: str) -> None:
        self.url = url

    def _run(self, statement: Any, dbname: str | None = None) -> None:
        import psycopg

        target = self.url if dbname is None else with_database(self.url, dbname)
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(statement)

    def start(self) -> None:
        self._run("SELECT 1")  # reachable, or a clear error before any run

    def new(self, name: str, directory: Path) -> SiteDatabase:
        from psycopg import sql

        self._run(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

        def admin(statement: str) -> None:
            self._run(statement, dbname=name)

        return SiteDatabase(with_database(self.url, name), admin=admin, role=_user(self.url))

    def release(self, database: SiteDatabase, *, keep: bool) -> None:
        if keep:
            return
        from psycopg import sql

        self._run(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(_dbname(database.target))
            )
        )

    def close(self) -> None:
        pass

    def describe(self) -> str:
        # netloc, not hostname/port: a multi-host URL (h1:p1,h2:p2) has no one port
        hosts = urlsplit(self.url).netloc.rpartition("@")[2]
        return f"PostgreSQL at {hosts}, a database per run"


class FailoverClusters:
    """A pg_auto_failover cluster per run (``--db postgres-ha``): the sites
    use its database through the multi-host URL as its ``tasknet`` role (not
    a superuser), the scenario breaks the cluster
    (:attr:`SiteDatabase.failover`), and the cluster is stopped and removed
    when the run ends (kept, with its logs, when the run is kept).

    ``monitor_settings``: the monitor's timings (pg_auto_failover's defaults
    when None).  ``primary_netns`` (``--netns``, root only): the primary's
    host in a network namespace of its own, so that S24 cuts it off the
    network instead of killing it."""

    backend = POSTGRESQL

    def __init__(
        self,
        base_dir: str | None = None,
        *,
        monitor_settings: dict[str, object] | None = None,
        primary_netns: bool = False,
    ) -> None:
        self.base_dir = base_dir
        self.monitor_settings = monitor_settings
        self.primary_netns = primary_netns
        self.started_seconds: list[float] = []

    def start(self) -> None:
        from tasknet.drill.pgcluster import INSTALL_HINT, AutoFailoverNotInstalled, installed

        if not installed():
            raise AutoFailoverNotInstalled(f"pg_auto_failover is not installed: {INSTALL_HINT}")

    def new(self, name: str, directory: Path) -> SiteDatabase:
        from tasknet.drill.pgcluster import ROLE, PgCluster

        cluster = PgCluster(
            self.base_dir,
            monitor_settings=self.monitor_settings,
            primary_netns=self.primary_netns,
        )
        cluster.start()
        if cluster.start_seconds is not None:
            self.started_seconds.append(cluster.start_seconds)

        def admin(statement: str) -> None:
            cluster.psql(statement)

        return SiteDatabase(cluster.uri, admin=admin, role=ROLE, failover=cluster)

    def release(self, database: SiteDatabase, *, keep: bool) -> None:
        cluster = database.failover
        if cluster is None:
            return
        if keep and cluster.directory is not None:
            # The logs and data directories outlive the run for a post-mortem.
            cluster.directory = None
        cluster.stop()

    def close(self) -> None:
        pass

    def describe(self) -> str:
        if self.primary_netns:
            return (
                "a pg_auto_failover cluster per run (monitor, synchronous standby on the root"
                " side of a veth, the primary's host in a network namespace of its own), the"
                " sites on its multi-host URL"
            )
        return (
            "a pg_auto_failover cluster per run (monitor, primary, synchronous standby on"
            " loopback), the sites on its multi-host URL"
        )


def _dbname(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _user(url: str) -> str | None:
    return urlsplit(url).username


def databases_for(
    choice: str,
    *,
    base_dir: str | None = None,
    socket: bool = False,
    primary_netns: bool = False,
) -> Databases:
    """The :class:`Databases` of a parsed ``--db`` value (not started yet);
    ``primary_netns``: ``postgres-ha`` with the primary's host in a network
    namespace (``--netns``)."""
    if choice == SQLITE_CHOICE:
        return SqliteFiles()
    if choice == POSTGRES_CHOICE:
        return ThrowawayServer(base_dir, socket=socket)
    if choice == POSTGRES_HA_CHOICE:
        return FailoverClusters(base_dir, primary_netns=primary_netns)
    return ExistingServer(choice)
