"""PostgreSQL for the benchmarks: one throwaway server per run, fresh
databases on it, raw connections for the baselines, and the server's CPU.

The server is :class:`tasknet.drill.pgserver.ThrowawayPostgres` (``fsync``
and ``synchronous_commit`` on, as in production), started the first time a
benchmark asks for a database and stopped when the run ends.  Every
benchmark gets databases of its own (``b1_site_3``): nothing measured reads
another's rows.

The baselines connect with the site's own ``storage.db.connect`` (psycopg 3
underneath, the site's statements translated the same way) and run the
site's own transaction functions with ``storage.db.run_write``: one
``BEGIN ISOLATION LEVEL SERIALIZABLE … COMMIT`` per report or create, i.e.
one synchronous commit (a WAL flush) each.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path
from typing import Any

from bench.machine import filesystem_of
from bench.procs import CLOCK_TICKS, BenchError

#: What BENCH.md asks of the server for B1/B2/B7.
REQUIRED_SETTINGS = {"synchronous_commit": "on", "fsync": "on"}


def installed() -> bool:
    from tasknet.drill.pgserver import installed as pg_installed

    return pg_installed()


def server_version() -> str | None:
    """``postgres --version`` of the binaries the bench would start (None
    when PostgreSQL is not installed), without starting a server."""
    from tasknet.drill.pgserver import PostgresNotInstalled, find_bindir

    try:
        bindir = find_bindir()
    except PostgresNotInstalled:
        return None
    try:
        done = subprocess.run(
            [str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\d+(\.\d+)*", done.stdout)
    return match.group(0) if match else done.stdout.strip() or None


class BenchPostgres:
    """The run's throwaway PostgreSQL server, started on first use.

    ``standby``: a failover cluster instead
    (:class:`tasknet.drill.pgcluster.PgCluster`: pg_auto_failover's monitor,
    a primary and a synchronous standby on loopback, the same settings):
    every commit waits for the standby's flush too.  The databases are made
    on the primary, owned by the cluster's ``tasknet`` role, and reached by
    the multi-host URL the sites would use; the CPU counted is the
    primary's."""

    def __init__(self, *, standby: bool = False) -> None:
        self.server: Any = None
        self.standby = standby
        self._numbers = itertools.count(1)
        self.settings: dict[str, str] = {}

    def database(self, name: str) -> str:
        """A fresh empty database ``<name>_<n>`` (the site or
        ``prepare_database`` creates the schema); its URL."""
        if self.server is None:
            self._start()
        dbname = f"{name}_{next(self._numbers)}"
        if self.standby:
            from tasknet.drill.databases import with_database
            from tasknet.drill.pgcluster import ROLE

            self.server.psql(f'CREATE DATABASE "{dbname}" OWNER "{ROLE}"', dbname="postgres")
            return with_database(self.server.uri, dbname)
        return str(self.server.create_database(dbname))

    def _start_cluster(self) -> None:
        from tasknet.drill.pgcluster import INSTALL_HINT, PgCluster
        from tasknet.drill.pgcluster import installed as cluster_installed

        if not cluster_installed():
            raise BenchError(f"pg_auto_failover is not installed: {INSTALL_HINT}")
        cluster = PgCluster()
        cluster.start()
        self.server = cluster
        self.settings = read_settings(cluster.uri)
        from tasknet.site.storage.engine.database import connect

        connection = connect(cluster.uri)
        try:
            names = connection.execute("SHOW synchronous_standby_names").fetchone()[0]
        finally:
            connection.close()
        if not names:
            raise BenchError("the cluster's primary has no synchronous standby")
        self.settings["synchronous_standby_names"] = str(names)

    def _start(self) -> None:
        from tasknet.drill.pgserver import ThrowawayPostgres

        if self.standby:
            self._start_cluster()
            return
        if not installed():
            raise BenchError(
                "PostgreSQL is not installed (apt-get install postgresql); "
                "--db sqlite skips the PostgreSQL rows"
            )
        server = ThrowawayPostgres()
        server.start()
        self.server = server
        self.settings = read_settings(server.url())
        wrong = {k: v for k, v in REQUIRED_SETTINGS.items() if self.settings.get(k) != v}
        if wrong:
            raise BenchError(f"the throwaway server runs with {self.settings}, wanted {wrong}")

    def facts(self) -> dict[str, Any]:
        """The server's settings and file system, for the results file."""
        if self.server is None:
            return {}
        return {
            **self.settings,
            "data_filesystem": filesystem_of(self._data_dir()),
        }

    def _data_dir(self) -> Path:
        """The (primary) server's data directory."""
        if self.standby:
            primary = self.server.primary() or "node1"
            return Path(self.server.directory) / primary
        return Path(self.server.data_dir)

    @property
    def postmaster_pid(self) -> int:
        """The (primary) server's main process (line 1 of ``postmaster.pid``)."""
        if self.server is None:
            raise BenchError("the PostgreSQL server is not running")
        text = (self._data_dir() / "postmaster.pid").read_text()
        return int(text.splitlines()[0])

    def cpu_seconds(self) -> dict[int, float]:
        """CPU seconds so far of the postmaster and each of its children
        (one backend per connection, the WAL writer, the checkpointer...).
        Subtract two readings per pid (:func:`cpu_delta`): a backend that
        exits between them takes its time with it."""
        root = self.postmaster_pid
        seconds = {root: _cpu_of(root)}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                stat = _stat_fields(int(entry.name))
                if stat is not None and int(stat[1]) == root:
                    seconds[int(entry.name)] = (int(stat[11]) + int(stat[12])) / CLOCK_TICKS
        return seconds

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """Seconds of CPU between two :meth:`BenchPostgres.cpu_seconds` readings
    (processes started in between count from zero)."""
    return sum(now - before.get(pid, 0.0) for pid, now in after.items())


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _cpu_of(pid: int) -> float:
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def read_settings(url: str) -> dict[str, str]:
    """What the server really runs with (``SHOW``, not assumed)."""
    from tasknet.site.storage.engine.database import connect

    connection = connect(url)
    try:
        return {
            name: str(connection.execute(f"SHOW {name}").fetchone()[0])
            for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
        }
    finally:
        connection.close()


def synchronous_commit_of(connection: Any) -> str:
    return str(connection.execute("SHOW synchronous_commit").fetchone()[0])


__all__ = [
    "BenchPostgres",
    "cpu_delta",
    "installed",
    "read_settings",
    "server_version",
    "synchronous_commit_of",
]
