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
    """The run's throwaway PostgreSQL server, started on first use."""

    def __init__(self) -> None:
        self.server: Any = None
        self._numbers = itertools.count(1)
        self.settings: dict[str, str] = {}

    def database(self, name: str) -> str:
        """A fresh empty database ``<name>_<n>`` (the site or
        ``prepare_database`` creates the schema); its URL."""
        if self.server is None:
            self._start()
        return str(self.server.create_database(f"{name}_{next(self._numbers)}"))

    def _start(self) -> None:
        from tasknet.drill.pgserver import ThrowawayPostgres

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
        from bench.harness import filesystem_of

        return {
            **self.settings,
            "data_filesystem": filesystem_of(self.server.data_dir),
        }

    @property
    def postmaster_pid(self) -> int:
        """The server's main process (line 1 of ``postmaster.pid``)."""
        if self.server is None:
            raise BenchError("the PostgreSQL server is not running")
        text = (Path(self.server.data_dir) / "postmaster.pid").read_text()
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
