"""Deterministic simulation (SIMULATION.md): the real roles in one simulated world.

One process, one thread, one seed.  :class:`World` holds the simulated
clock, the queue of events, the network and the processes; each process
has a :class:`SimReactor` (time, TCP, threads, system events), the reactor
its composition root is given.  Every choice (latencies, thread run times,
the order of events due at the same instant) is drawn from the world's one
``random.Random(seed)``; every event run adds a line to the world's trace,
whose sha256 is the same for the same seed in any process and under any
``PYTHONHASHSEED``.

    world = World(seed=7)
    up = world.add_process("upstream")
    ...build the role on `up`, then up.startRunning()...
    world.run_until(lambda: done, within=60)
    world.trace.hexdigest()

Modules: :mod:`~tasknet.sim.world` (the world and its event loop),
:mod:`~tasknet.sim.reactor` (a process's reactor),
:mod:`~tasknet.sim.network` (TCP as in-memory connections, faults),
:mod:`~tasknet.sim.threads` (thread pools run inline; ``adbapi`` on them),
:mod:`~tasknet.sim.trace` (the trace and its digest),
:mod:`~tasknet.sim.cluster` (the real roles built by their roots on it),
:mod:`~tasknet.sim.schedule` (a seed's workload and faults),
:mod:`~tasknet.sim.run` (one run and its checks),
:mod:`~tasknet.sim.checks` (the invariants checked at every event),
:mod:`~tasknet.sim.custody` (the checks of what each node holds),
:mod:`~tasknet.sim.shrink` (the smallest failing schedule),
:mod:`~tasknet.sim.no_global_reactor` (Twisted's global reactor forbidden).

Not simulated yet: TLS, IPv6, UNIX sockets, UDP; wall-clock jumps (a
process's ``seconds()`` is the world's time); storage faults (busy, a
failed commit, disk full); the kernel's TCP beyond what
:mod:`~tasknet.sim.network` says; two threads' jobs interleaving; what the
roles still read past their composition root (the real clock in
``time.time()`` and in SQL's ``'now'``, ``random``, ``uuid4()``,
``secrets``): the simulation is deterministic where they only change bytes,
not lengths or decisions, and the seams of issue 20 remove them.  The node
has none left: built by its root on a :class:`SimReactor` (its reactor,
clock and ``IThreadPools``) and a ``tasknet.runtime.SeededEntropy``, every
byte it sends follows from the seed.

Nothing of the roles imports this package (``lint-imports``).
"""

from tasknet.sim.network import LinkProfile, Network, SimConnection
from tasknet.sim.reactor import SimReactor
from tasknet.sim.threads import SimConnectionPool, SimThreadPool
from tasknet.sim.world import EPOCH, SimulationError, World

__all__ = [
    "EPOCH",
    "LinkProfile",
    "Network",
    "SimConnection",
    "SimConnectionPool",
    "SimReactor",
    "SimThreadPool",
    "SimulationError",
    "World",
]
