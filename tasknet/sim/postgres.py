"""The real, throwaway PostgreSQL of ``tasknet-sim --db postgres``.

One server (the drills' :class:`~tasknet.drill.pgserver.ThrowawayPostgres`:
``initdb`` and ``pg_ctl`` in a temp directory, loopback, as the
``postgres`` user when run as root) for a whole ``run``; each worker
process has a database of its own on it, emptied before every seed (its
schemas dropped, as a new database is: far cheaper than creating one).
The sites' statements run on it for real, one at a time, in the world's
order (their pools' threads are the world's inline ones).
"""

from __future__ import annotations

import os

import psycopg

from tasknet.drill.pgserver import ThrowawayPostgres

__all__ = ["SimPostgres"]

_RESET = (
    "DO $reset$ DECLARE s name; BEGIN"
    "   FOR s IN SELECT nspname FROM pg_namespace"
    "     WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' LOOP"
    "     EXECUTE format('DROP SCHEMA %I CASCADE', s);"
    "   END LOOP;"
    " END $reset$;"
    " CREATE SCHEMA public AUTHORIZATION pg_database_owner;"
    " GRANT USAGE ON SCHEMA public TO PUBLIC;"
)


class SimPostgres:
    """A server's admin URL and this process's database on it."""

    def __init__(self, admin_url: str, server: ThrowawayPostgres | None = None) -> None:
        self.admin_url = admin_url
        self.server = server
        self._database: str | None = None

    @classmethod
    def start(cls) -> SimPostgres:
        server = ThrowawayPostgres(settings={"fsync": "off", "max_connections": 200})
        server.start()
        return cls(server.url(), server)

    def fresh_database(self) -> str:
        """The URL of this process's database, empty (created on first use)."""
        if self._database is None:
            name = f"sim_{os.getpid()}"
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{name}"')
            self._database = name
        url = _with_database(self.admin_url, self._database)
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (self._database,),
            )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_RESET)
        return url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"
