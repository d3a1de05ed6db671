"""A throwaway PostgreSQL server for the test suite, the drills, the demo and
the benchmarks.

Debian's ``postgresql`` package provides the binaries; nothing is installed
or configured system-wide.  :class:`ThrowawayPostgres` runs ``initdb`` into a
temporary directory and then the ``postgres`` server itself, in the
foreground, as a :class:`~tasknet.process.Child` of ours (not daemonised by
``pg_ctl``): a process that dies without calling :meth:`stop` takes its
server with it (parent-death signal), so no server outlives the run that
started it.

* When we are root the server runs as the ``postgres`` user (PostgreSQL
  refuses to run as root): the directory is given to that user and the
  commands run under ``setpriv`` (``runuser`` for ``initdb``/``psql``).
  Otherwise everything runs as we are.
* It listens on 127.0.0.1 only (TCP, a port found free or the one given) and
  on a unix socket in its own directory; authentication is ``trust``: only
  this machine can reach it, and it holds test data only.
* ``fsync`` and ``synchronous_commit`` are on, as in production (BENCH.md
  measures the site on it); ``settings`` adds or overrides any setting.
* Databases are created and dropped with ``psql`` (this module needs only
  subprocess; clients use psycopg).

* ``directory=``: a directory of its own that outlives the server (the
  demo's ``--data DIR``): a cluster already in it is started again as it is
  (no ``initdb``), :meth:`stop` leaves it, and :meth:`ensure_database`
  creates a database only if it is not there yet.

Use it as a context manager or call :meth:`start` / :meth:`stop`::

    with ThrowawayPostgres() as server:
        url = server.create_database("site")   # postgresql://postgres@127.0.0.1:PORT/site
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tasknet.process import LOOPBACK, Child, free_port

SUPERUSER = "postgres"
#: The system user the server runs as when we are root.
SYSTEM_USER = "postgres"
INSTALL_HINT = "install Debian's postgresql package (apt-get install postgresql)"

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
COMMAND_TIMEOUT = 120.0
START_ATTEMPTS = 3

#: Settings every throwaway server starts with (``settings`` may override).
#: ``max_connections``: tests and drills run several sites, each with a pool.
DEFAULT_SETTINGS: Mapping[str, str] = {
    "fsync": "on",
    "synchronous_commit": "on",
    "max_connections": "200",
}

# A database name we create: plain lower-case identifiers only, so no quoting
# question ever reaches psql (63 bytes is PostgreSQL's identifier limit).
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# The start of our settings in postgresql.conf (see _write_settings).
_SETTINGS_MARK = "\n# tasknet.drill.pgserver\n"

# The server's own tools (Debian: /usr/lib/postgresql/<major>/bin).
_TOOLS = ("initdb", "postgres", "psql")


class PostgresNotInstalled(RuntimeError):
    """The PostgreSQL server binaries are not on this machine."""


class PostgresFailed(RuntimeError):
    """initdb, the server or a command failed; the message has its output."""


def _has_tools(bindir: Path) -> bool:
    return all((bindir / tool).is_file() and os.access(bindir / tool, os.X_OK) for tool in _TOOLS)


def _major(path: str) -> tuple[int, ...]:
    match = re.search(r"/postgresql/([0-9.]+)/bin$", path)
    return tuple(int(p) for p in match.group(1).split(".") if p) if match else ()


def find_bindir() -> Path:
    """The directory of ``initdb``, ``postgres`` and ``psql``: Debian's
    newest ``/usr/lib/postgresql/*/bin``, else ``pg_config --bindir``, else
    the directory of ``initdb`` on PATH.  Raises :class:`PostgresNotInstalled`
    saying what to install."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major, reverse=True):
        if _has_tools(Path(candidate)):
            return Path(candidate)
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        try:
            answer = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            answer = None
        if answer is not None and answer.returncode == 0:
            bindir = Path(answer.stdout.strip())
            if _has_tools(bindir):
                return bindir
    initdb = shutil.which("initdb")
    if initdb is not None:
        bindir = Path(os.path.realpath(initdb)).parent
        if _has_tools(bindir):
            return bindir
    raise PostgresNotInstalled(
        "PostgreSQL is not installed (no initdb, postgres and psql in /usr/lib/postgresql/*/bin,"
        f" pg_config --bindir or PATH): {INSTALL_HINT}"
    )


def installed() -> bool:
    """Whether a throwaway server can be started here (the binaries exist)."""
    try:
        find_bindir()
    except PostgresNotInstalled:
        return False
    return True


def _quote_setting(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


class ThrowawayPostgres:
    """One PostgreSQL server in a directory of its own, for as long as the
    object is started.

    ``base_dir``: where the server's directory is created (a fresh temporary
    directory when None; when root, the ``postgres`` user must be able to
    reach it, so a directory under /tmp).  ``port``: its TCP port on
    127.0.0.1 (found free when None, retried if taken before the server binds
    it).  ``settings``: extra ``postgresql.conf`` settings (name -> value).
    ``directory``: use this directory (created if missing) instead of a new
    temporary one, reuse the cluster in it, and keep it at :meth:`stop`.

    Call :meth:`start` from a thread that lives as long as the server: the
    server is stopped when the thread that started it ends."""

    def __init__(
        self,
        base_dir: str | None = None,
        port: int | None = None,
        *,
        settings: Mapping[str, object] | None = None,
        directory: str | None = None,
    ) -> None:
        self.base_dir = base_dir
        #: The directory given to keep (None: a temporary one, removed at stop).
        self.kept_directory = None if directory is None else Path(directory).absolute()
        self.requested_port = port
        self.settings = {**DEFAULT_SETTINGS, **{k: str(v) for k, v in (settings or {}).items()}}
        self.port: int | None = None
        self.directory: Path | None = None
        self.bindir: Path | None = None
        self._child: Child | None = None
        self._as_system_user = os.geteuid() == 0
        #: Whether the last start found a cluster in the kept directory.
        self.reused = False

    # ------------------------------------------------------------ paths

    @property
    def data_dir(self) -> Path:
        return self._require_directory() / "data"

    @property
    def socket_dir(self) -> Path:
        """The unix socket's directory (libpq ``host=`` for it)."""
        return self._require_directory()

    @property
    def log_path(self) -> Path:
        return self._require_directory() / "server.log"

    def _require_directory(self) -> Path:
        if self.directory is None:
            raise PostgresFailed("the throwaway PostgreSQL server was never started")
        return self.directory

    # ------------------------------------------------------------ URLs

    def url(self, dbname: str = "postgres") -> str:
        """The libpq URL of ``dbname`` over loopback TCP."""
        if self.port is None:
            raise PostgresFailed("the throwaway PostgreSQL server is not running")
        return f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.port}/{dbname}"

    def socket_url(self, dbname: str = "postgres") -> str:
        """The libpq URL of ``dbname`` over the unix socket (reachable from
        another network namespace of this machine, which loopback is not)."""
        if self.port is None:
            raise PostgresFailed("the throwaway PostgreSQL server is not running")
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.socket_dir}&port={self.port}"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (the last one started, alive or not)."""
        return None if self._child is None else self._child.pid

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.alive

    # ------------------------------------------------------------ start and stop

    def start(self) -> ThrowawayPostgres:
        """initdb a fresh cluster and start the server; returns when it
        accepts connections.  Raises :class:`PostgresNotInstalled` or
        :class:`PostgresFailed` (with the log's tail), leaving nothing
        running."""
        if self._child is not None:
            raise PostgresFailed("the throwaway PostgreSQL server is already started")
        self.bindir = find_bindir()
        self.directory = self._make_directory()
        try:
            self.reused = (
                self.kept_directory is not None and (self.data_dir / "PG_VERSION").is_file()
            )
            if not self.reused:
                self._initdb()
            self._serve()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown: sessions are ended, nothing is
        waited for; immediate, then SIGKILL if it will not go) and remove its
        directory, unless it was given to keep.  Idempotent."""
        child, self._child = self._child, None
        if child is not None:
            _shut_down(child)
        self.port = None
        directory, self.directory = self.directory, None
        if directory is not None and self.kept_directory is None:
            shutil.rmtree(directory, ignore_errors=True)

    def restart(self) -> None:
        """Start the server again, on the same port and cluster, after it
        exited (the demo's ``--restart-children``).  Raises
        :class:`PostgresFailed` if it does not come back."""
        if self.directory is None or self.port is None:
            raise PostgresFailed("the throwaway PostgreSQL server was never started")
        child, self._child = self._child, None
        if child is not None:
            _shut_down(child)
        port, self.port = self.port, None
        requested, self.requested_port = self.requested_port, port
        try:
            self._serve()
        finally:
            self.requested_port = requested

    def __enter__(self) -> ThrowawayPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ databases

    def create_database(
        self, name: str, template: str | None = None, *, file_copy: bool = False
    ) -> str:
        """Create database ``name`` (empty, or a copy of ``template``, which
        must have no open connection); its URL.  ``file_copy``: copy the
        template's files rather than log every page (faster for a small
        template on a quiet server; it costs a checkpoint)."""
        _check_name(name)
        statement = f'CREATE DATABASE "{name}"'
        if template is not None:
            _check_name(template)
            statement += f' TEMPLATE "{template}"'
        if file_copy:
            statement += " STRATEGY FILE_COPY"
        self.psql(statement)
        return self.url(name)

    def ensure_database(self, name: str) -> str:
        """Database ``name``'s URL, creating it (empty) unless it exists."""
        _check_name(name)
        # The name passed _check_name: plain lower-case letters, digits and _.
        query = f"SELECT 1 FROM pg_database WHERE datname = '{name}'"  # noqa: S608
        found = self.psql(query).strip()
        if found != "1":
            self.create_database(name)
        return self.url(name)

    def reset_database(self, name: str) -> None:
        """Make database ``name`` empty again, as a new one is: end its other
        sessions (waiting for them to go, so no lock of theirs outlives
        this), drop every schema and create ``public`` as ``initdb`` does.
        Much cheaper than dropping it and creating another (no copy of the
        template, no checkpoint): a test suite reuses its databases so."""
        _check_name(name)
        self.psql(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid();"
            " DO $reset$ DECLARE s name; BEGIN"
            "   FOR s IN SELECT nspname FROM pg_namespace"
            "     WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' LOOP"
            "     EXECUTE format('DROP SCHEMA %I CASCADE', s);"
            "   END LOOP;"
            " END $reset$;"
            " CREATE SCHEMA public AUTHORIZATION pg_database_owner;"
            " GRANT USAGE ON SCHEMA public TO PUBLIC;",
            dbname=name,
        )

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, ending its open sessions."""
        _check_name(name)
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` with psql as the superuser over the unix socket; its
        output (unaligned, tuples only).  Raises :class:`PostgresFailed`."""
        if not self.running:
            raise PostgresFailed("the throwaway PostgreSQL server is not running")
        assert self.bindir is not None and self.port is not None
        argv = [
            str(self.bindir / "psql"),
            "--no-psqlrc",
            "--quiet",
            "--tuples-only",
            "--no-align",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            str(self.socket_dir),
            "-p",
            str(self.port),
            "-U",
            SUPERUSER,
            "-d",
            dbname,
            "-c",
            sql,
        ]
        return self._run(argv, what=f"psql {sql!r}")

    # ------------------------------------------------------------ internals

    def _make_directory(self) -> Path:
        if self.kept_directory is not None:
            directory = self.kept_directory
            directory.mkdir(parents=True, exist_ok=True)
        else:
            if self.base_dir is not None:
                Path(self.base_dir).mkdir(parents=True, exist_ok=True)
            directory = Path(tempfile.mkdtemp(prefix="tasknet-pg-", dir=self.base_dir))
        if self._as_system_user:
            try:
                shutil.chown(directory, user=SYSTEM_USER, group=SYSTEM_USER)
            except LookupError as e:
                self._discard(directory)
                raise PostgresNotInstalled(
                    f"no {SYSTEM_USER!r} system user to run the server as: {INSTALL_HINT}"
                ) from e
            # The server's user must reach the directory through its parents.
            reach = subprocess.run(
                self._as_user(["test", "-w", str(directory)]), capture_output=True, timeout=30
            )
            if reach.returncode != 0:
                self._discard(directory)
                where = "a directory" if self.kept_directory is not None else "a base_dir"
                raise PostgresFailed(
                    f"the {SYSTEM_USER!r} user cannot reach {directory} (a parent directory is"
                    f" not searchable by it): give {where} that user can reach, e.g. under /tmp"
                )
        return directory

    def _discard(self, directory: Path) -> None:
        """Remove a directory this object made (never a kept one)."""
        if self.kept_directory is None:
            shutil.rmtree(directory, ignore_errors=True)

    def _as_user(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as the server's user (unchanged when not root)."""
        if not self._as_system_user:
            return list(argv)
        return ["runuser", "-u", SYSTEM_USER, "--", *argv]

    def _run(self, argv: Sequence[str], *, what: str) -> str:
        try:
            result = subprocess.run(
                self._as_user(argv),
                capture_output=True,
                text=True,
                cwd=self._require_directory(),
                timeout=COMMAND_TIMEOUT,
            )
        except subprocess.TimeoutExpired as e:
            raise PostgresFailed(f"{what} did not finish within {COMMAND_TIMEOUT:.0f} s") from e
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip()
            raise PostgresFailed(f"{what} failed (exit {result.returncode}): {output}")
        return result.stdout

    def _initdb(self) -> None:
        assert self.bindir is not None
        # --no-sync: a throwaway cluster need not survive a power cut while
        # it is being created.  Locale C: byte-order collation, as SQLite's.
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            what="initdb",
        )

    def _write_settings(self, port: int) -> None:
        settings = {
            **self.settings,
            "listen_addresses": LOOPBACK,
            "port": str(port),
            "unix_socket_directories": str(self.socket_dir),
        }
        lines = [f"{name} = {_quote_setting(value)}" for name, value in settings.items()]
        # Appended: a later line wins over initdb's own.  A reused cluster
        # (or a retry on another port) has our block already: replaced.
        conf = self.data_dir / "postgresql.conf"
        text = conf.read_text(encoding="utf-8")
        text = text.split(_SETTINGS_MARK, 1)[0].rstrip("\n") + "\n"
        conf.write_text(text + _SETTINGS_MARK + "\n".join(lines) + "\n", encoding="utf-8")

    def _serve(self) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            port = self.requested_port or free_port()
            self._write_settings(port)
            child = self._server_child()
            child.start(banner=f"--- postgres on {LOOPBACK}:{port} (attempt {attempt})\n")
            self._child = child
            if self._wait_ready(child):
                self.port = port
                return
            taken = "Address already in use" in child.log_text()
            self._child = None
            _shut_down(child)
            if not taken or self.requested_port is not None or attempt == START_ATTEMPTS:
                raise PostgresFailed(
                    f"PostgreSQL did not start on {LOOPBACK}:{port}; {self.log_path}:\n"
                    + child.log_tail()
                )

    def _server_child(self) -> Child:
        assert self.bindir is not None
        # setpriv execs (the pid we signal is the postmaster's) and sets the
        # parent-death signal after any change of user (a change of user
        # clears one set before it): SIGQUIT, immediate shutdown, if we die.
        argv = ["setpriv", "--pdeathsig=SIGQUIT"]
        if self._as_system_user:
            argv += [f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups"]
        argv += ["--", str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        return Child(
            "postgres", argv, self.log_path, cwd=self._require_directory(), env=_server_env()
        )

    def _wait_ready(self, child: Child) -> bool:
        """True once the postmaster says it accepts connections (the status
        line of postmaster.pid, as ``pg_ctl -w`` reads it); False if it
        exits or does not get there in time."""
        pid_file = self.data_dir / "postmaster.pid"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not child.alive:
                return False
            try:
                lines = pid_file.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                lines = []
            # The file must be this postmaster's: one that was killed leaves
            # its own behind ("ready" too) until the new one takes it over.
            if len(lines) >= 8 and lines[0].strip() == str(child.pid):
                if lines[7].strip() == "ready":
                    return True
            time.sleep(0.02)
        return False


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"database name {name!r}: use lower-case letters, digits and _ (at most 63),"
            " starting with a letter or _"
        )


def _server_env() -> dict[str, str]:
    # The server inherits no libpq or locale settings of the caller.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_"))}
    env["LANG"] = "C"
    return env


def _shut_down(child: Child) -> None:
    """Fast shutdown (SIGINT), then immediate (SIGQUIT), then SIGKILL."""
    for sig, timeout in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 10.0)):
        child.signal(sig)
        try:
            child.wait(timeout)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        try:
            child.kill()
        except subprocess.TimeoutExpired:  # pragma: no cover -- SIGKILL always ends it
            pass
    child.stop()  # closes our ends (the process is gone)


__all__ = [
    "DEFAULT_SETTINGS",
    "PostgresFailed",
    "PostgresNotInstalled",
    "ThrowawayPostgres",
    "find_bindir",
    "installed",
]
