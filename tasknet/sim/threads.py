"""Threads, simulated: each job runs inline on the world's one thread.

:class:`SimThreadPool` has the interface of ``twisted.python.threadpool.ThreadPool``
that Twisted's own callers use (``start``, ``stop``, ``callInThread``,
``callInThreadWithCallback``, ``adjustPoolsize``, ``min``, ``max``), so
``deferToThreadPool``, ``deferToThread`` (through the reactor's pool) and
``adbapi.ConnectionPool`` run on it unchanged.  A pool of N threads runs at
most N jobs at a time, first come first served (a one-thread pool keeps
its jobs in order, as a real one does); a job takes a duration drawn from
the seed (``World.thread_time``) and its body runs, whole, at the end of
it, on the world's thread, so that what it does (a transaction's commit)
happens at one simulated instant.  Its result goes back as Twisted's pool
sends it: ``onResult(success, result)``, which ``deferToThreadPool`` hands
to ``reactor.callFromThread``.

Not simulated: two jobs' bodies interleaving (each runs whole); a job
that blocks on the reactor (``blockingCallFromThread`` would wait
forever: the reactor is the thread it would wait in).

:class:`SimConnectionPool` is Twisted's ``adbapi.ConnectionPool`` on a
simulated reactor and pool: real DB-API connections (sqlite3's, psycopg's),
real transactions, each run inline at a simulated duration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.enterprise import adbapi
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.sim.trace import label

if TYPE_CHECKING:
    from tasknet.sim.reactor import SimReactor
    from tasknet.sim.world import _Event

__all__ = ["SimConnectionPool", "SimThreadPool"]

log = Logger()

_Job = tuple[
    Callable[[bool, Any], object] | None, Callable[..., Any], tuple[Any, ...], dict[str, Any]
]


def _job_label(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    # adbapi hands the pool its own _runInteraction: name the interaction too.
    if args and callable(args[0]):
        return f"{label(fn)}({label(args[0])})"
    return label(fn)


class SimThreadPool:
    """A thread pool of a simulated process (see the module doc)."""

    def __init__(
        self,
        reactor: SimReactor,
        minthreads: int = 5,
        maxthreads: int = 20,
        name: str | None = None,
    ) -> None:
        assert minthreads >= 0, "minimum is negative"
        assert minthreads <= maxthreads, "minimum is greater than maximum"
        self.reactor = reactor
        self.min = minthreads
        self.max = maxthreads
        self.name = name
        self.started = False
        self.joined = False
        self.threads: list[object] = []  # no real thread, ever
        self._queue: deque[_Job] = deque()
        self._running: dict[_Event, _Job] = {}
        self.jobs_run = 0
        reactor._register_pool(self)

    def __repr__(self) -> str:
        return f"<SimThreadPool {self.name or '-'} {self.reactor.name} max={self.max}>"

    # -- ThreadPool's interface -------------------------------------------------------

    def start(self) -> None:
        self.joined = False
        self.started = True
        self._dispatch()

    def stop(self) -> None:
        """As a real pool's ``stop`` (which joins its threads): the jobs
        queued and running finish now, in order."""
        self.joined = True
        self.started = False
        running = list(self._running.items())
        self._running.clear()
        for event, job in running:
            event.cancel()
            self._finish(job)
        while self._queue:
            self._finish(self._queue.popleft())

    def callInThread(self, func: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.callInThreadWithCallback(None, func, *args, **kw)

    def callInThreadWithCallback(
        self,
        onResult: Callable[[bool, Any], object] | None,
        func: Callable[..., Any],
        *args: Any,
        **kw: Any,
    ) -> None:
        if self.joined:
            return
        if not self.reactor.world.in_world_thread():
            self.reactor.world.foreign_thread(f"callInThread({label(func)}) on {self!r}")
            return
        self._queue.append((onResult, func, args, kw))
        self._dispatch()

    def adjustPoolsize(self, minthreads: int | None = None, maxthreads: int | None = None) -> None:
        if minthreads is None:
            minthreads = self.min
        if maxthreads is None:
            maxthreads = self.max
        assert minthreads >= 0, "minimum is negative"
        assert minthreads <= maxthreads, "minimum is greater than maximum"
        self.min, self.max = minthreads, maxthreads
        self._dispatch()

    def dumpStats(self) -> None:
        log.info(
            "{pool}: {queued} queued, {running} running",
            pool=repr(self),
            queued=len(self._queue),
            running=len(self._running),
        )

    # -- internals ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        world = self.reactor.world
        while self.started and self._queue and len(self._running) < max(self.max, 1):
            job = self._queue.popleft()
            duration = world.draw(*world.thread_time)
            event = world.call_later(
                duration,
                self._run,
                None,
                owner=self.reactor,
                what=f"thread {_job_label(job[1], job[2])}",
            )
            event.args = (event,)
            self._running[event] = job

    def _run(self, event: _Event) -> None:
        job = self._running.pop(event, None)
        if job is None:
            return
        self._finish(job)
        self._dispatch()

    def _finish(self, job: _Job) -> None:
        on_result, func, args, kw = job
        self.jobs_run += 1
        try:
            result = func(*args, **kw)
            success = True
        except BaseException:
            result = Failure()
            success = False
        if on_result is None:
            if not success:
                log.failure("Unhandled error in a simulated thread", result)
            return
        try:
            on_result(success, result)
        except BaseException:
            log.failure("Unhandled error in a simulated thread's onResult", Failure())

    def _die(self) -> None:
        """The process died: its jobs, queued or running, never finish."""
        for event in self._running:
            event.cancel()
        self._running.clear()
        self._queue.clear()
        self.started = False
        self.joined = True


class SimConnectionPool(adbapi.ConnectionPool):
    """``adbapi.ConnectionPool`` on a simulated reactor (``cp_reactor``) and
    a :class:`SimThreadPool` of its ``cp_min``/``cp_max`` threads in place of
    the real pool it makes (never started).  Everything else is Twisted's:
    the connections, ``runInteraction``'s commit and rollback, reconnects."""

    def __init__(self, reactor: SimReactor, dbapiName: str, *connargs: Any, **connkw: Any) -> None:
        connkw["cp_reactor"] = reactor
        self._sim_reactor = reactor
        super().__init__(dbapiName, *connargs, **connkw)
        self._use_simulated_threads()
        reactor.at_death(self._process_died)

    def _process_died(self) -> None:
        """The kernel closes a dead process's connections: what was not
        committed is gone, its locks are freed."""
        connections, self.connections = list(self.connections.values()), {}
        for connection in connections:
            try:
                connection.close()
            except Exception:
                log.failure("closing a dead process's connection", Failure())

    def _use_simulated_threads(self) -> None:
        if not isinstance(self.threadpool, SimThreadPool):
            self.threadpool = SimThreadPool(  # type: ignore[assignment]
                self._sim_reactor, self.min, self.max, name=f"adbapi-{self.dbapiName}"
            )

    def start(self) -> None:
        # Called by the reactor's startup (callWhenRunning), possibly from
        # within ConnectionPool.__init__ when the reactor already runs.
        self._use_simulated_threads()
        super().start()
