"""A process's reactor in the simulated world.

:class:`SimReactor` is what a role's composition root is given in the
simulation: Twisted's reactor interfaces on the :class:`~tasknet.sim.world.World`
it belongs to.

* ``IReactorTime``: ``callLater`` returns Twisted's own ``DelayedCall``
  (``cancel``, ``reset``, ``delay``, ``active``) on simulated time;
  ``seconds()`` is simulated Unix time.
* ``IReactorTCP``: ``listenTCP`` / ``connectTCP`` on the world's in-memory
  network (:mod:`tasknet.sim.network`), so the endpoints built on them
  (``TCP4ServerEndpoint``, ``TCP4ClientEndpoint``, ``serverFromString`` /
  ``clientFromString`` ``tcp:``) work unchanged, and
  ``IReactorPluggableNameResolver`` a resolver of the world's host names,
  so ``HostnameEndpoint`` (and ``Agent``) does too.
* ``IReactorThreads``: ``callInThread`` / ``getThreadPool`` (and so
  ``deferToThreadPool(reactor, reactor.getThreadPool(), f)``) on a
  :class:`~tasknet.sim.threads.SimThreadPool`: each job runs inline on the
  one thread, at a simulated duration drawn from the seed;
  ``callFromThread`` queues first-in first-out, as Twisted's.
  ``deferToThread(f)`` itself takes Twisted's *global* reactor, which a
  simulation forbids (:mod:`tasknet.sim.no_global_reactor`).
* ``tasknet.runtime.IThreadPools``: ``thread_pool`` makes the pools a
  role's root asks for (the node's compression pool, its store's
  ``adbapi`` pool through ``ThreadedConnectionPool``) simulated ones.
* ``tasknet.runtime.IProcesses``: the process's own pid (the world's, one
  per incarnation: every simulated process shares the one real pid), its
  host (each process name is a machine of its own) and process space (that
  machine's boot), and ``gone(pid, space)`` as that kernel would answer
  ``kill(pid, 0)``: what a site's lease records of it and how a reaper
  probes a gone instance.
* ``IReactorCore``: system event triggers (``startup``, ``shutdown`` with
  their ``before`` / ``during`` / ``after`` phases, Deferreds waited for),
  ``callWhenRunning``, ``stop`` (shut down, then the process exits), ``run``.

A process *dies* (:meth:`SimReactor.die`) when it crashes or, after
``stop``, exits: every delayed call, queued thread job and pending event of
it is dropped, its ports close and its connections end as the kernel would
end them; its objects are never called again.  What it wrote to files
stays.  A restart is a new process (``World.add_process`` with the same
name) built again by its composition root.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.internet.error import ReactorNotRunning
from twisted.internet.interfaces import (
    IConnector,
    IDelayedCall,
    IHostnameResolver,
    IListeningPort,
    IReactorCore,
    IReactorPluggableNameResolver,
    IReactorTCP,
    IReactorThreads,
    IReactorTime,
)
from twisted.internet.protocol import ClientFactory, ServerFactory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.runtime import IProcesses, IThreadPools, ProcessIdentity
from tasknet.sim.trace import label

if TYPE_CHECKING:
    from twisted.internet.protocol import P

    from tasknet.sim.network import SimConnector, SimPort, SimTransport
    from tasknet.sim.threads import SimThreadPool
    from tasknet.sim.world import World

__all__ = ["SimReactor"]

log = Logger()

_PHASES = ("before", "during", "after")

#: Twisted's reactor thread pool: at most this many threads.
REACTOR_POOL_THREADS = 10


@implementer(
    IReactorTime,
    IReactorCore,
    IReactorTCP,
    IReactorThreads,
    IReactorPluggableNameResolver,
    IThreadPools,
    IProcesses,
)
class SimReactor:
    """One simulated process's reactor (see the module doc)."""

    def __init__(
        self,
        world: World,
        name: str,
        ip: str,
        incarnation: int = 1,
        *,
        pid: int = 0,
        space: str | None = None,
    ) -> None:
        from tasknet.sim.network import SimNameResolver

        self.world = world
        self.name = name
        self.ip = ip
        self.incarnation = incarnation
        #: The process id the world gave this incarnation (never reused).
        self.pid = pid
        #: The kernel and pid namespace it runs in: its machine's boot.
        self.space = space if space is not None else f"{name} boot 1"
        #: How it died (``die``'s ``how``), once it has.
        self.death: str | None = None
        self.alive = True
        self.running = False
        #: Seconds this process's wall clock is ahead of the world's.
        self.clock_offset = 0.0
        #: While stopped (:meth:`pause`): since when, and until when.
        self.paused_at = 0.0
        self.paused_until: float | None = None
        self._stopping = False
        self._calls: dict[DelayedCall, None] = {}
        self._triggers: dict[str, dict[str, list[tuple[int, Callable[..., Any], Any, Any]]]] = {}
        self._trigger_ids = 0
        self._from_threads: deque[tuple[Callable[..., Any], Any, Any]] = deque()
        self._draining = False
        self._pool: SimThreadPool | None = None
        self._pools: list[SimThreadPool] = []
        self._at_death: list[Callable[[], None]] = []
        self.ports: list[SimPort] = []
        self.transports: dict[SimTransport, None] = {}
        self.connectors: dict[SimConnector, None] = {}
        self._resolver: IHostnameResolver = SimNameResolver(world.network, self)

    def __repr__(self) -> str:
        state = "alive" if self.alive else "dead"
        return f"<SimReactor {self.name}#{self.incarnation} {self.ip} {state}>"

    # -- IReactorTime ---------------------------------------------------------------

    def seconds(self) -> float:
        """The process's wall clock: the world's time, moved by the clock
        jumps it was dealt (:meth:`jump_clock`)."""
        return self.world.now + self.clock_offset

    def pause(self, seconds: float) -> None:
        """The process is stopped (``SIGSTOP``, a long GC, a VM migration)
        for ``seconds``: it runs nothing, its threads included, and its
        peers hear nothing; its sockets stay open and what reaches them
        waits.  Then it goes on where it was, its clock showing the
        time that passed."""
        self.world.note("fault", f"pause {self.name} {seconds:.3f}")
        self.paused_at = self.world.now
        self.paused_until = self.world.now + seconds

    def jump_clock(self, seconds: float) -> None:
        """The wall clock of this process jumps by ``seconds`` (an operator,
        NTP).  As with Twisted's reactor, whose timers are on the wall
        clock, a delayed call is due when ``seconds()`` reaches its time:
        a forward jump brings every pending call nearer, a backward one
        puts it off.  The monotonic clock (the world's) never jumps."""
        self.world.note("fault", f"clock_jump {self.name} {seconds:+.3f}")
        self.clock_offset += seconds
        for call in list(self._calls):
            self.world._push_call(call)

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: object, **kwargs: object
    ) -> IDelayedCall:
        assert builtins_callable(callable), f"{callable!r} is not callable"
        assert delay >= 0, f"{delay} is not greater than or equal to 0 seconds"
        call = DelayedCall(
            self.seconds() + delay,
            callable,
            args,
            kwargs,
            self._cancelled,
            self._moved_sooner,
            seconds=self.seconds,
        )
        if self.alive:
            call._sim_owner = self  # type: ignore[attr-defined]
            self._calls[call] = None
            self.world._push_call(call)
        return call

    def getDelayedCalls(self) -> Sequence[IDelayedCall]:
        return list(self._calls)

    def _cancelled(self, call: DelayedCall) -> None:
        self._calls.pop(call, None)

    def _moved_sooner(self, call: DelayedCall) -> None:
        if call in self._calls:
            self.world._push_call(call)

    def _forget(self, call: DelayedCall) -> None:
        self._calls.pop(call, None)

    # -- IProcesses -------------------------------------------------------------------

    def this(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.name, self.space)

    def gone(self, pid: int, space: str | None) -> bool:
        # Only a process of this very kernel can be looked up (kill(pid, 0)).
        return space == self.space and not self.world.pid_alive(pid)

    # -- IReactorThreads --------------------------------------------------------------

    def getThreadPool(self) -> Any:  # a SimThreadPool, typed as Twisted's ThreadPool
        if self._pool is None:
            from tasknet.sim.threads import SimThreadPool

            self._pool = SimThreadPool(self, 0, REACTOR_POOL_THREADS, name=f"{self.name}-reactor")
            self._pool.start()
        return self._pool

    def thread_pool(self, minthreads: int, maxthreads: int, name: str) -> Any:
        """``IThreadPools``: a :class:`~tasknet.sim.threads.SimThreadPool`
        of this process (a role's own pools: compression, ``adbapi``)."""
        from tasknet.sim.threads import SimThreadPool

        return SimThreadPool(self, minthreads, maxthreads, name=name)

    def suggestThreadPoolSize(self, size: int) -> None:
        self.getThreadPool().adjustPoolsize(maxthreads=size)

    def callInThread(self, callable: Callable[..., Any], *args: object, **kwargs: object) -> None:
        self.getThreadPool().callInThread(callable, *args, **kwargs)

    def callFromThread(self, callable: Callable[..., Any], *args: object, **kwargs: object) -> None:
        if not self.world.in_world_thread():
            self.world.foreign_thread(f"callFromThread({label(callable)}) on {self.name}")
            return
        if not self.alive:
            return
        self._from_threads.append((callable, args, kwargs))
        if not self._draining:
            self._draining = True
            self.world._silent(self.world.now, self, self._drain_from_threads)

    def _drain_from_threads(self) -> None:
        """Run the calls queued so far, first in first out (as Twisted's
        ``runUntilCurrent`` runs its ``threadCallQueue``)."""
        queue = self._from_threads
        for _ in range(len(queue)):
            if not self.alive:
                return
            fn, args, kw = queue.popleft()
            self.world.note(self.name, f"fromThread {label(fn)}")
            self.world._run(fn, args, kw)
        if queue and self.alive:
            self.world._silent(self.world.now, self, self._drain_from_threads)
        else:
            self._draining = False

    def _register_pool(self, pool: SimThreadPool) -> None:
        self._pools.append(pool)

    def at_death(self, release: Callable[[], None]) -> None:
        """Call ``release()`` when this process dies: what the kernel frees
        at a process's end (its file descriptors: a database connection, with
        its uncommitted transaction and its locks)."""
        self._at_death.append(release)

    # -- IReactorTCP ------------------------------------------------------------------

    def listenTCP(
        self, port: int, factory: ServerFactory, backlog: int = 50, interface: str = ""
    ) -> IListeningPort:
        return self.world.network.listen(self, port, factory, backlog, interface)

    def connectTCP(
        self,
        host: str,
        port: int,
        factory: ClientFactory[P],
        timeout: float = 30.0,
        bindAddress: tuple[str, int] | None = None,
    ) -> IConnector:
        from tasknet.sim.network import SimConnector

        connector = SimConnector(self, host, port, factory, timeout, bindAddress)
        connector.connect()
        return connector

    # -- IReactorPluggableNameResolver ------------------------------------------------

    @property
    def nameResolver(self) -> IHostnameResolver:
        return self._resolver

    def installNameResolver(self, resolver: IHostnameResolver) -> IHostnameResolver:
        old, self._resolver = self._resolver, resolver
        return old

    # -- IReactorCore -----------------------------------------------------------------

    def resolve(self, name: str, timeout: Sequence[int] = (1, 3, 11, 45)) -> defer.Deferred[str]:
        return self.world.network.resolve(self, name)

    def startRunning(self) -> None:
        """The reactor starts running (twistd's ``reactor.run()``): the
        ``startup`` triggers fire, ``callWhenRunning`` calls run."""
        if self.running or not self.alive:
            return
        self.running = True
        self.fireSystemEvent("startup")

    def run(self) -> None:
        """Run the world until this process stops."""
        self.startRunning()
        self.world.run_until(lambda: not self.alive)

    def stop(self) -> None:
        """Shut down as Twisted does (the ``shutdown`` triggers, in their
        phases, on the next turn), then the process exits."""
        if not self.running or self._stopping:
            raise ReactorNotRunning("Can't stop reactor that isn't running.")
        self._stopping = True
        self.world.call_later(0, self._shutdown, owner=self, what="shutdown")

    def _shutdown(self) -> None:
        done = self._fire("shutdown")
        done.addBoth(lambda _: self.die("exit"))

    def crash(self) -> None:
        """Stop at once, without the shutdown triggers: the process is killed."""
        self.die("kill")

    def iterate(self, delay: float = 0) -> None:
        self.world.step()

    def fireSystemEvent(self, eventType: str) -> None:
        self._fire(eventType)

    def _fire(self, eventType: str) -> defer.Deferred[None]:
        """Run the ``before`` triggers, wait for the Deferreds they return,
        then ``during`` and ``after`` (Twisted's ``_ThreePhaseEvent``)."""
        phases = self._triggers.pop(eventType, {})
        done: defer.Deferred[None] = defer.Deferred()

        def run(phase: str) -> list[defer.Deferred[Any]]:
            waits = []
            for _, fn, args, kw in phases.get(phase, []):
                try:
                    result = fn(*args, **kw)
                except Exception:
                    log.failure("system event trigger {fn} failed", Failure(), fn=label(fn))
                    continue
                if isinstance(result, defer.Deferred):
                    waits.append(result)
            return waits

        def rest(_: object) -> None:
            run("during")
            run("after")
            done.callback(None)

        waits = run("before")
        if waits:
            defer.DeferredList(waits, consumeErrors=True).addCallback(rest)
        else:
            rest(None)
        return done

    def addSystemEventTrigger(
        self,
        phase: str,
        eventType: str,
        callable: Callable[..., Any],
        *args: object,
        **kwargs: object,
    ) -> Any:
        if phase not in _PHASES:
            raise KeyError(f"invalid phase {phase!r}")
        self._trigger_ids += 1
        trigger = (self._trigger_ids, callable, args, kwargs)
        self._triggers.setdefault(eventType, {}).setdefault(phase, []).append(trigger)
        return (eventType, phase, self._trigger_ids)

    def removeSystemEventTrigger(self, triggerID: Any) -> None:
        eventType, phase, number = triggerID
        triggers = self._triggers.get(eventType, {}).get(phase, [])
        for i, trigger in enumerate(triggers):
            if trigger[0] == number:
                del triggers[i]
                return
        raise ValueError(f"no such trigger {triggerID!r}")

    def callWhenRunning(
        self, callable: Callable[..., Any], *args: object, **kwargs: object
    ) -> Any | None:
        if self.running:
            callable(*args, **kwargs)
            return None
        return self.addSystemEventTrigger("after", "startup", callable, *args, **kwargs)

    # -- death --------------------------------------------------------------------------

    def die(self, how: str = "kill") -> None:
        """The process ends now.  ``how``: ``"kill"`` (or ``"exit"``, after
        ``stop``): the kernel closes its sockets, so each peer sees the
        connection end; ``"power"``: the machine stops, its peers hear
        nothing and their later segments are lost.  Every delayed call,
        thread job and event of the process is dropped; none of its objects
        is called again."""
        if not self.alive:
            return
        if how not in ("kill", "exit", "power"):
            raise ValueError(f"how must be 'kill', 'exit' or 'power', got {how!r}")
        self.world.note(self.name, f"die {how}")
        self.alive = False
        self.death = how
        if how == "power":
            self.world.lost_power(self.name)
        self.running = False
        for call in list(self._calls):
            call.cancel()
        self._calls.clear()
        self._from_threads.clear()
        self._triggers.clear()
        for pool in self._pools:
            pool._die()
        self.world.network.process_died(self, how)
        releases, self._at_death = self._at_death, []
        for release in releases:
            self.world._run(release, (), {})


def builtins_callable(obj: object) -> bool:
    return callable(obj)
