"""What a composition root hands its components beside the reactor.

A role reads time, randomness, ids and I/O only through what its root gives
it (ARCHITECTURE.md, SIMULATION.md), so that the simulator can give it
other ones.  Time and I/O are the reactor (``IReactorTime``,
``IReactorTCP``, ...).  The rest is declared here, once, for the site and
the node alike (neither imports the other; both may import this):

:class:`IEntropy`
    nonces, ids and the seeds of the components' ``random.Random``:
    :class:`SystemEntropy` (the OS's) in production, :class:`SeededEntropy`
    (one ``random.Random``) in a simulation or a test.
:class:`IProcesses`
    who this process is (pid, host, kernel and pid namespace: what a lease
    records of its holder) and whether another process certainly runs no
    longer (a reaper's liveness probe): :class:`OSProcesses` (the
    kernel's) in production; the simulated reactor provides it in a
    simulation, where every process shares the one real pid.
:class:`IThreadPools`
    the thread pools a component runs blocking work on (a compression, a
    database's ``adbapi`` pool): :class:`RealThreadPools` in production; the
    simulated reactor provides it too (its jobs run inline).

:class:`ThreadedConnectionPool` is Twisted's ``adbapi.ConnectionPool`` on a
given reactor (``cp_reactor``) and a pool from a given :class:`IThreadPools`,
in place of the ``ThreadPool`` it would make itself.

The only defaults are at the entry points (``makeService``): twistd's
global reactor, the OS's entropy and processes, real threads; and there,
for a process of its own, :func:`freeze_startup_heap`.
"""

from __future__ import annotations

import gc
import os
import random
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorCore
from twisted.python.threadpool import ThreadPool
from zope.interface import Interface, implementer

__all__ = [
    "IEntropy",
    "IProcesses",
    "IThreadPools",
    "OSProcesses",
    "ProcessIdentity",
    "RealThreadPools",
    "SeededEntropy",
    "SystemEntropy",
    "ThreadedConnectionPool",
    "freeze_startup_heap",
]


class IEntropy(Interface):
    """The one source of a process's unpredictable bytes."""

    def token_bytes(nbytes: int) -> bytes:
        """``nbytes`` bytes (a nonce, a key)."""

    def token_hex(nbytes: int) -> str:
        """``nbytes`` bytes as ``2 * nbytes`` lowercase hex digits."""

    def uuid4() -> uuid.UUID:
        """A random (version 4) UUID."""

    def random() -> random.Random:
        """A new generator for the choices that need not be secret (jitter,
        a shuffle), seeded from this source."""


@implementer(IEntropy)
class SystemEntropy:
    """The operating system's entropy (``os.urandom``): production's."""

    def token_bytes(self, nbytes: int) -> bytes:
        return os.urandom(nbytes)

    def token_hex(self, nbytes: int) -> str:
        return os.urandom(nbytes).hex()

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(bytes=os.urandom(16), version=4)

    def random(self) -> random.Random:
        return random.Random(int.from_bytes(os.urandom(16), "big"))


@implementer(IEntropy)
class SeededEntropy:
    """Every byte drawn from one ``random.Random``: the same seed, the same
    nonces, ids and jitter (a simulation, a test).  Never for production:
    nothing it gives is secret."""

    def __init__(self, rng: random.Random | int) -> None:
        self._rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    def token_bytes(self, nbytes: int) -> bytes:
        return self._rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big") if nbytes else b""

    def token_hex(self, nbytes: int) -> str:
        return self.token_bytes(nbytes).hex()

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.token_bytes(16), version=4)

    def random(self) -> random.Random:
        return random.Random(self._rng.getrandbits(64))


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a process is, as another process can look it up."""

    pid: int
    host: str
    #: The kernel and pid namespace it runs in, or ``None`` where that
    #: cannot be told: two processes of one space see each other's pids.
    space: str | None


class IProcesses(Interface):
    """This process's identity, and the probe of another's liveness."""

    def this() -> ProcessIdentity:
        """Who this process is now."""

    def gone(pid: int, space: str | None) -> bool:
        """Whether process ``pid`` of process space ``space`` certainly runs
        no longer: ``space`` is this process's own and no process there has
        that pid.  Never for a paused process (it keeps its pid), nor for
        one of another (or an unknown) space: a caller must then wait."""


@implementer(IProcesses)
class OSProcesses:
    """The kernel's answers (production): ``os.getpid``, the host name, the
    boot id and pid namespace (Linux), and ``kill(pid, 0)``."""

    def this(self) -> ProcessIdentity:
        # Asked each time, never kept: a daemon may fork after it is built.
        return ProcessIdentity(os.getpid(), socket.gethostname(), _process_space())

    def gone(self, pid: int, space: str | None) -> bool:
        here = _process_space()
        if here is None or space != here:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False  # it exists (another user's, perhaps)
        return False


def _process_space() -> str | None:
    """The kernel and pid namespace this process runs in (Linux: the boot
    id and the pid namespace's inode), or ``None`` where that cannot be
    told."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            boot_id = boot.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot_id} {namespace}"


class IThreadPools(Interface):
    """Where a component gets a thread pool of its own."""

    def thread_pool(minthreads: int, maxthreads: int, name: str) -> ThreadPool:
        """A new, not yet started, pool of ``minthreads``..``maxthreads``
        threads (``start``, ``stop``, ``callInThreadWithCallback``, as
        Twisted's ``ThreadPool``)."""


@implementer(IThreadPools)
class RealThreadPools:
    """Twisted's ``ThreadPool``: real threads (production)."""

    def thread_pool(self, minthreads: int, maxthreads: int, name: str) -> ThreadPool:
        return ThreadPool(minthreads=minthreads, maxthreads=maxthreads, name=name)


class ThreadedConnectionPool(adbapi.ConnectionPool):
    """``adbapi.ConnectionPool`` on ``reactor`` (never Twisted's global one)
    running its interactions on a pool from ``threads`` (named ``name``).
    Everything else is Twisted's: connections, commit and rollback."""

    def __init__(
        self,
        reactor: IReactorCore,
        threads: IThreadPools,
        name: str,
        dbapiName: str,
        *connargs: Any,
        **connkw: Any,
    ) -> None:
        self._threads = threads
        self._pool_name = name
        self._given_pool: ThreadPool | None = None
        connkw["cp_reactor"] = reactor
        # adbapi makes its own ThreadPool (never started: replaced below, or
        # in start() when the reactor already runs and starts us at once).
        super().__init__(dbapiName, *connargs, **connkw)
        self._use_given_pool()

    def _use_given_pool(self) -> None:
        if self._given_pool is None:
            self._given_pool = self._threads.thread_pool(self.min, self.max, self._pool_name)
            self.threadpool = self._given_pool

    def start(self) -> None:
        self._use_given_pool()
        super().start()


def freeze_startup_heap(ready: Deferred[Any]) -> None:
    """When ``ready`` fires (the role has started), move every object alive
    then (modules, the reactor, the schema, caches) out of the cyclic
    garbage collector's sight (``gc.freeze``).  A full collection then walks
    only what was allocated since, where before it paused the whole process
    (reactor and database threads) for every object of the program: 27 ms
    every 4 s under B2's create load, most of its p99 (bench/README.md).
    Only for a process of its own (twistd's): frozen objects are never
    collected, which is right for what lives as long as the process, and
    wrong for a test or a simulation that builds many roles in one."""

    def freeze(result: Any) -> Any:
        gc.collect()  # what start-up left behind goes now, not frozen forever
        gc.freeze()
        return result

    ready.addCallback(freeze)
