"""One site per SQLite database (INTERFACES.md, "Bounds, failures and secrets").

A site holds an exclusive ``flock`` on the sidecar file ``<database>.lock``
for its whole life.  The lock is the kernel's: it goes with the process, so a
SIGKILLed site never leaves a stale lock behind, and the file itself (kept,
never unlinked: unlinking would let two processes lock two different inodes)
only names the holder (pid, host, since when) for the refusal message.

The lock is advisory: ``tasknet-admin`` does not take it (it works beside a
running site, through SQLite's own locking); ``tasknet-site`` and
``tasknet-migrate`` do, so neither starts on a database a site is using.
The sidecar is named after the database's real path, so two spellings of one
file (relative, absolute, a symlink) share one lock.

On PostgreSQL there is no file and no such lock: several sites share one
database by design (SCALE.md), and each site instance holds a lease the
database judges (:mod:`tasknet.site.storage.lease`).  :func:`acquire`
then returns a lock that holds nothing, so callers need not tell the
backends apart.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass

from tasknet.runtime import OSProcesses, ProcessIdentity
from tasknet.site.storage.engine.schema import SchemaError
from tasknet.site.storage.engine.targets import is_postgres
from tasknet.site.storage.engine.timestamps import iso

LOCK_SUFFIX = ".lock"


def lock_path(database: str) -> str:
    """The sidecar lock file of ``database``."""
    return os.path.realpath(database) + LOCK_SUFFIX


@dataclass(frozen=True)
class Holder:
    """Who holds a database, as its lock file says (fields may be missing
    when the holder has not written them yet)."""

    pid: int | None
    host: str | None
    since: str | None
    role: str | None

    def describe(self) -> str:
        return (
            f"{self.role or 'a process'} pid {self.pid if self.pid is not None else '?'} "
            f"on host {self.host or '?'} since {self.since or '?'}"
        )


class DatabaseInUse(SchemaError):
    """Another process holds the database's lock; nothing was changed."""

    def __init__(self, database: str, holder: Holder) -> None:
        super().__init__(
            f"database {database!r} is in use by {holder.describe()} "
            f"(lock file {lock_path(database)}); nothing was changed. Stop that "
            "process first: one site per SQLite database."
        )
        self.database = database
        self.holder = holder


def _read_holder(fd: int) -> Holder:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        document = {}
    if not isinstance(document, dict):
        document = {}
    pid = document.get("pid")
    return Holder(
        pid=pid if isinstance(pid, int) else None,
        host=str(document["host"]) if "host" in document else None,
        since=str(document["since"]) if "since" in document else None,
        role=str(document["role"]) if "role" in document else None,
    )


class InstanceLock:
    """The held lock of one database; :meth:`release` (idempotent) lets it
    go.  ``fd`` None: a PostgreSQL database, nothing is locked (the module doc)."""

    def __init__(self, database: str, fd: int | None, holder: Holder) -> None:
        self.database = database
        self.path = None if fd is None else lock_path(database)
        self.holder = holder
        self._fd: int | None = fd
        self._held = True
        #: :func:`acquire` made the lock file (there was none before it).
        self.created = False

    @property
    def held(self) -> bool:
        return self._held

    def drop(self) -> None:
        """What the kernel does when the holding process dies: the
        descriptor closes and the flock goes; the file still names the
        holder (a simulated crash)."""
        self._held = False
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def release_refused(self) -> None:
        """:meth:`release` after a tool refused to act: the lock file goes
        too when :meth:`acquire` made it, so a refusal leaves the directory
        as it found it.  Unlinked while the flock is still held: a process
        that opens the path after this makes a new file and locks that."""
        if self.created and self.path is not None and self._fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self.release()

    def release(self) -> None:
        self._held = False
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # the holder named in it is gone
        finally:
            os.close(fd)  # closing the last descriptor drops the flock


def _this_process(role: str, process: ProcessIdentity | None) -> Holder:
    # A tool (tasknet-migrate) is the OS's process; a site names itself as
    # its composition root says it is.
    me = process if process is not None else OSProcesses().this()
    return Holder(
        pid=me.pid,
        host=me.host,
        # The operator's real time, on purpose: the lock file tells a person
        # since when a process holds it; nothing is decided from it.
        since=iso(time.time()),
        role=role,
    )


def acquire(
    database: str, role: str = "tasknet-site", *, process: ProcessIdentity | None = None
) -> InstanceLock:
    """Take the exclusive lock of ``database`` without waiting; raise
    :class:`DatabaseInUse` naming the holder if another process has it.
    The lock file names this process (``process``: who a site's root says
    it is; by default the OS's).
    A PostgreSQL database is shared: nothing to take (the module doc)."""
    if is_postgres(database):
        return InstanceLock(database, None, _this_process(role, process))
    path = lock_path(database)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        created = True
    except FileExistsError:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        created = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise DatabaseInUse(database, holder) from None
    except BaseException:
        os.close(fd)
        raise
    holder = _this_process(role, process)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder.__dict__).encode("utf-8") + b"\n", 0)
    held = InstanceLock(database, fd, holder)
    held.created = created
    return held
