"""The simulated world: one seed, one clock, one queue of events, one thread.

A :class:`World` holds the simulated time, the one ``random.Random(seed)``
every choice is drawn from (latencies, thread run times, the order of
events due at the same instant), the queue of events, the network
(:mod:`tasknet.sim.network`) and the processes: one
:class:`~tasknet.sim.reactor.SimReactor` each, the reactor a role's
composition root is given.  :meth:`World.step` runs the next event;
:meth:`World.run_until` runs events until a predicate holds or a time is
reached.  Every event run adds a line to :attr:`World.trace`.

Events due at the same instant run in an order drawn from the seed (each
gets a random tie-break key when it is scheduled), not in the order they
were scheduled: a real reactor promises no order among timers due
together, and code that leans on one is a finding.  What must stay ordered
stays ordered by construction: the bytes of one direction of a connection
(one pump per direction), the calls handed to ``callFromThread`` (one
queue per reactor, run first-in first-out, as Twisted's), the jobs of a
one-thread pool.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet.base import DelayedCall
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.sim.trace import Trace, failure_name, label

if TYPE_CHECKING:
    from tasknet.sim.network import LinkProfile, Network
    from tasknet.sim.reactor import SimReactor

__all__ = ["EPOCH", "SimulationError", "World"]

log = Logger()

T = TypeVar("T")

#: Where simulated time starts (Unix seconds): 2026-01-01T00:00:00Z.
EPOCH = 1_767_225_600.0

#: The first pid the world hands out (then counting up, never reused).
FIRST_PID = 1000

#: A process that goes on after a pause runs what was due while it was
#: stopped at this fraction of the time it waited (a backlog, run quickly).
PAUSE_BACKLOG = 0.001


class SimulationError(Exception):
    """The simulation itself was misused (not a fault of the code under test)."""


class _Event:
    """One internal event (a segment's delivery, a thread's job, a fault).

    ``owner``: the process it belongs to, or None (the world's own); an
    event of a dead process is dropped.  ``label``: its trace text, or None
    when ``fn`` writes its own line (the network's pumps)."""

    __slots__ = ("args", "cancelled", "fn", "label", "owner")

    def __init__(
        self, owner: SimReactor | None, fn: Callable[..., Any], args: tuple[Any, ...], label: str
    ) -> None:
        self.owner = owner
        self.fn = fn
        self.args = args
        self.label: str | None = label
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class World:
    """One simulated run (see the module doc).

    ``same_instant``: ``"shuffle"`` (the default) orders the events due at
    the same instant by the seed; ``"fifo"`` in the order they were
    scheduled.  ``thread_time``: the (low, high) seconds a job handed to a
    thread takes, drawn uniformly.  ``keep_trace``: how many trace lines to
    keep for reading (0: none, None: all); the digest covers all of them.
    """

    def __init__(
        self,
        seed: int,
        *,
        epoch: float = EPOCH,
        same_instant: str = "shuffle",
        link: LinkProfile | None = None,
        thread_time: tuple[float, float] = (0.0002, 0.002),
        keep_trace: int | None = 0,
    ) -> None:
        from tasknet.sim.network import LinkProfile, Network

        if same_instant not in ("shuffle", "fifo"):
            raise ValueError(f"same_instant must be 'shuffle' or 'fifo', got {same_instant!r}")
        self.seed = seed
        self.rng = random.Random(seed)
        self.epoch = epoch
        self._now = epoch
        self._shuffle = same_instant == "shuffle"
        self.thread_time = thread_time
        self._heap: list[tuple[float, float, int, Any]] = []
        self._seq = itertools.count()
        self.events = 0
        self.trace = Trace(keep_trace)
        self.errors: list[Failure] = []
        #: Faults injected, by kind (``partition``, ``heal``, ``reset``, ``stall`` …).
        self.faults: dict[str, int] = {}
        #: Calls that reached the world from a real thread (a seam missing).
        self.foreign: list[str] = []
        self.processes: dict[str, SimReactor] = {}
        #: Called after every event (the simulator's cheap invariants).
        self.after_event: list[Callable[[], None]] = []
        self._incarnations: dict[str, int] = {}
        self._ips = itertools.count(2)
        # Each process name is a machine of its own (its own address, kept
        # across restarts), booted again after it lost power; pids are the
        # world's, never reused (a real kernel's are, rarely: a reaper then
        # takes the pid for alive and waits, which is safe).
        self._boots: dict[str, int] = {}
        self._pids = itertools.count(FIRST_PID)
        self._by_pid: dict[int, SimReactor] = {}
        self.thread_id = threading.get_ident()
        self.network: Network = Network(self, link or LinkProfile())

    # -- time ---------------------------------------------------------------------

    @property
    def now(self) -> float:
        """Simulated Unix seconds."""
        return self._now

    def elapsed(self) -> float:
        """Simulated seconds since the world began (a monotonic clock)."""
        return self._now - self.epoch

    def _micros(self) -> int:
        return round((self._now - self.epoch) * 1_000_000)

    # -- processes ----------------------------------------------------------------

    def add_process(self, name: str, *, ip: str | None = None) -> SimReactor:
        """A new process ``name`` and its reactor (not yet running: call its
        ``startRunning()`` once its composition root has built it, as twistd
        runs the reactor after building the application).  A name whose
        process died may be used again: the restart, a new incarnation on
        the same address."""
        from tasknet.sim.reactor import SimReactor

        old = self.processes.get(name)
        if old is not None and old.alive:
            raise SimulationError(f"process {name!r} is alive")
        if ip is None:
            ip = old.ip if old is not None else f"10.0.0.{next(self._ips)}"
        incarnation = self._incarnations.get(name, 0) + 1
        self._incarnations[name] = incarnation
        pid = next(self._pids)
        boot = self._boots.setdefault(name, 1)
        reactor = SimReactor(self, name, ip, incarnation, pid=pid, space=f"{name} boot {boot}")
        self.processes[name] = reactor
        self._by_pid[pid] = reactor
        self.note("world", f"process {name} {ip} #{incarnation} pid {pid}")
        return reactor

    def lost_power(self, name: str) -> None:
        """The machine of process ``name`` lost power: it boots again (a new
        kernel, so a process space of its own) when the process restarts."""
        self._boots[name] = self._boots.get(name, 1) + 1

    def pid_alive(self, pid: int) -> bool:
        """Whether the world's process ``pid`` runs (a paused one does)."""
        process = self._by_pid.get(pid)
        return process is not None and process.alive

    def crash(self, name: str, *, how: str = "kill") -> None:
        """End process ``name`` at once, keeping nothing of it but its files
        (see :meth:`SimReactor.die`)."""
        self.processes[name].die(how)

    # -- scheduling -----------------------------------------------------------------

    def _key(self) -> float:
        return self.rng.random() if self._shuffle else 0.0

    def _push_call(self, call: DelayedCall) -> None:
        seq = next(self._seq)
        call._sim_seq = seq  # type: ignore[attr-defined]
        # A call's time is on its process's wall clock; the queue is in world time.
        when = call.time - call._sim_owner.clock_offset  # type: ignore[attr-defined]
        heapq.heappush(self._heap, (max(when, self._now), self._key(), seq, call))

    def _push(self, when: float, event: _Event) -> _Event:
        heapq.heappush(self._heap, (when, self._key(), next(self._seq), event))
        return event

    def call_later(
        self,
        delay: float,
        fn: Callable[..., Any],
        *args: Any,
        owner: SimReactor | None = None,
        what: str | None = None,
    ) -> _Event:
        """Run ``fn(*args)`` ``delay`` simulated seconds from now, as an
        event of ``owner`` (dropped if that process is dead by then) or of
        the world.  ``what``: its trace text (default: ``fn``'s name)."""
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay!r}")
        return self._push(self._now + delay, _Event(owner, fn, args, what or label(fn)))

    def call_at(
        self, when: float, fn: Callable[..., Any], *args: Any, what: str | None = None
    ) -> _Event:
        """Run ``fn(*args)`` at simulated Unix time ``when`` (not before now)."""
        return self._push(max(when, self._now), _Event(None, fn, args, what or label(fn)))

    def _silent(
        self, when: float, owner: SimReactor | None, fn: Callable[..., Any], *args: Any
    ) -> _Event:
        """An event that writes its own trace line (or none, when it finds
        nothing to do)."""
        event = _Event(owner, fn, args, "")
        event.label = None
        return self._push(max(when, self._now), event)

    def draw(self, low: float, high: float) -> float:
        """A duration drawn from the seed, uniform in [low, high]."""
        if high <= low:
            return low
        return self.rng.uniform(low, high)

    def note(self, who: str, what: str) -> None:
        """Add a trace line for something that is not an event (a fault, a
        delivery) at the current instant."""
        self.trace.record(self._micros(), who, what)
        if who == "fault":
            kind = what.split(" ", 1)[0]
            self.faults[kind] = self.faults.get(kind, 0) + 1

    # -- threads --------------------------------------------------------------------

    def in_world_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def foreign_thread(self, what: str) -> None:
        """A real thread reached the world (list.append is atomic): kept in
        :attr:`foreign`, never run (the world is one thread)."""
        self.foreign.append(what)

    def assert_clean(self) -> None:
        """:class:`SimulationError` if an event raised or a real thread
        reached the world."""
        if self.errors or self.foreign:
            kinds = [f"{failure_name(f)}: {f.getErrorMessage()}" for f in self.errors]
            raise SimulationError(f"errors {kinds}, real threads {self.foreign}")

    # -- running --------------------------------------------------------------------

    def pending(self) -> int:
        """Entries in the queue (cancelled ones included until they surface)."""
        return len(self._heap)

    def next_time(self) -> float | None:
        """When the next live event is due (None: nothing is scheduled).
        Drops dead entries from the head of the queue, and queues again a
        call that was moved later, so that the head is the next event."""
        heap = self._heap
        while heap:
            when, key, seq, item = heap[0]
            owner = item.owner if isinstance(item, _Event) else item._sim_owner
            if owner is not None and owner.paused_until is not None and when < owner.paused_until:
                # A stopped process runs nothing: its events wait for it to
                # go on, then run in their order, one after the other.
                heapq.heappop(heap)
                later = owner.paused_until + (when - owner.paused_at) * PAUSE_BACKLOG
                heapq.heappush(heap, (later, key, seq, item))
                continue
            if isinstance(item, _Event):
                if not item.cancelled and (item.owner is None or item.owner.alive):
                    return when
            elif item.active() and item._sim_seq == seq:
                if item.delayed_time <= 0:
                    return when
                heapq.heappop(heap)
                item.activate_delay()
                self._push_call(item)
                continue
            heapq.heappop(heap)
        return None

    def step(self) -> bool:
        """Run the next event; False when there is none."""
        if self.next_time() is None:
            return False
        when, _, _, item = heapq.heappop(self._heap)
        self._now = when
        self.events += 1
        if isinstance(item, _Event):
            if item.label is not None:
                owner = item.owner
                self.trace.record(self._micros(), owner.name if owner else "world", item.label)
            self._run(item.fn, item.args, {})
            for check in self.after_event:
                check()
            return True
        call: DelayedCall = item
        owner = call._sim_owner  # type: ignore[attr-defined]
        owner._forget(call)
        call.called = 1
        func, args, kw = call.func, call.args, call.kw
        self.trace.record(self._micros(), owner.name, label(func))
        self._run(func, args, kw)
        for check in self.after_event:
            check()
        return True

    def _run(self, fn: Callable[..., Any], args: Any, kw: dict[str, Any]) -> None:
        try:
            fn(*args, **kw)
        except Exception:
            failure = Failure()
            self.errors.append(failure)
            self.note("error", failure_name(failure))
            log.failure("Unhandled error in a simulated event", failure)

    def run_until(
        self,
        predicate: Callable[[], object] | None = None,
        *,
        until: float | None = None,
        within: float | None = None,
        max_events: int | None = None,
    ) -> bool:
        """Run events until ``predicate()`` is true (checked before the
        first event and after each), until simulated time ``until`` (Unix
        seconds) or ``within`` seconds from now, until ``max_events`` more
        events ran, or until nothing is left to run.  True when the
        predicate holds at the end (or, with no predicate, when the time
        was reached or the queue ran dry).  Reaching a time sets the clock
        to it even if no event falls there."""
        if within is not None:
            until = self._now + within if until is None else min(until, self._now + within)
        budget = max_events
        while True:
            if predicate is not None and predicate():
                return True
            if budget is not None:
                if budget <= 0:
                    return False
                budget -= 1
            due = self.next_time()
            if due is None or (until is not None and due > until):
                if until is not None and until > self._now:
                    self._now = until
                return predicate is None or bool(predicate())
            self.step()

    def run_for(self, seconds: float) -> None:
        """Run every event of the next ``seconds`` simulated seconds."""
        self.run_until(within=seconds)

    def wait(self, d: Deferred[T], *, within: float = 3600.0) -> T:
        """Run until ``d`` fires; its result, or its failure raised.
        :class:`SimulationError` if it has not fired ``within`` simulated
        seconds (or nothing is left that could fire it)."""
        outcome: list[Any] = []
        d.addBoth(outcome.append)
        self.run_until(lambda: outcome, within=within)
        if not outcome:
            raise SimulationError(
                f"Deferred still waiting after {within} simulated seconds "
                f"(now {self.elapsed():.6f} s, {self.events} events)"
            )
        result = outcome[0]
        if isinstance(result, Failure):
            result.raiseException()
        return result  # type: ignore[no-any-return]
