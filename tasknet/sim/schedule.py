"""The workload and the faults of one seed (SIMULATION.md "Workload and faults").

:func:`generate` draws a :class:`Schedule` from a seed: a list of
:class:`Step`, each a user's action (create, the same create from two
clients at once, delete, re-create, a reconcile verdict, right or wrong)
or a fault (a crash and the restart after it, a partition and its heal, a
reset, a slow link, a connection stalled mid-frame, an upstream fault, a
database fault, a wall-clock jump; a node restored from a backup, a node
gone for good), at a simulated time.  Every fault is healed by
:attr:`Schedule.healed_at` (but a node gone for good: it never returns);
the workload steps after that still run, and then the run only waits for
the tasks to settle (liveness).

A schedule is data: :mod:`tasknet.sim.shrink` removes steps from it, and
:meth:`Schedule.describe` prints it for a person.  The same seed always
gives the same schedule (``random.Random(seed)``, and one generator of
their own for the custody faults; nothing else).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "BASE_FAULT_KINDS",
    "CUSTODY_FAULT_KINDS",
    "FETCH_KIND",
    "FAULT_KINDS",
    "TRUTH_FAULT_KINDS",
    "WORKLOAD_KINDS",
    "Schedule",
    "Step",
    "fetch_steps",
    "generate",
]

#: A user's fetch of a finished task's archive (tasknet.sim.fetch runs it).
FETCH_KIND = "fetch_archive"
#: Fetches a seed draws while the faults run (uniform, both ends).
FETCHES = (1, 4)

#: The user's actions.
WORKLOAD_KINDS = ("create", "create_twice", "delete", "recreate", "resolve", FETCH_KIND)

#: The faults drawn from the seed's own generator (their draws, and so every
#: schedule made of them, are those of the seeds that found the defects in
#: tests/sim/test_world.py).
BASE_FAULT_KINDS = (
    "crash_site",
    "crash_node",
    "crash_upstream",
    "wipe_node",
    "partition",
    "reset",
    "slow_link",
    "stall",
    "upstream_timeout",
    "upstream_commit_then_drop",
    "upstream_5xx",
    "upstream_slow",
    "db_busy",
    "db_commit_fails",
    "disk_full",
    "clock_jump",
    "pause_site",
    "pause_node",
    "pause_at_submitting",
    "crash_at_commit",
)

#: The faults of what a node holds (issue 34), drawn from a generator of
#: their own so that adding them changed none of the draws above: a node's
#: data directory restored from a backup taken earlier in the run, and a
#: node that never comes back (its unfinished tasks moved by the site's
#: ``--reassign-after``).
CUSTODY_FAULT_KINDS = ("restore_node_backup", "node_gone_for_good")

#: The faults that make the checks against the world's truth reachable
#: (issue 39), drawn from a generator of their own too: a site crash
#: between its SUBMITTING commit and the upstream's answer or between the
#: answer and its persist, upstream 5xx with and without a charge and an
#: error body, an archive body cut short after its promised length, and a
#: node that lies within its rights (a node kind, from the step's instant on).
TRUTH_FAULT_KINDS = ("crash_in_flight", "upstream_error", "short_body", "liar_node")

#: Every fault kind, as ``--faults`` names them and the last line counts them.
FAULT_KINDS = BASE_FAULT_KINDS + CUSTODY_FAULT_KINDS + TRUTH_FAULT_KINDS

#: Faults that need several sites on one PostgreSQL (``--db postgres``),
#: drawn from a generator of their own (no other draw moves), each for a
#: reaper edit the other faults never reach (docs/simulation.md):
#: ``reap_in_flight``: a site dies, and as its lease goes stale the other
#: site creates a task whose POST answer the upstream holds (within its
#: upstream timeout), so a reap runs while a live site has a SUBMITTING in
#: flight; ``cut_off_early``: a site paused whose host loses
#: its network at once (the server ends its sessions, its lease lock with
#: them, within its lease timeout), so its lock is free while its lease is
#: fresh.
POSTGRES_FAULT_KINDS: tuple[str, ...] = ("reap_in_flight", "cut_off_early")
#: How often a seed of several sites draws each of them.
REAP_IN_FLIGHT_CHANCE = 0.5
CUT_OFF_EARLY_CHANCE = 0.5

#: Faults drawn apart from the base kinds (their own generators).
APART_FAULT_KINDS = CUSTODY_FAULT_KINDS + TRUTH_FAULT_KINDS + POSTGRES_FAULT_KINDS

#: In a schedule of every kind, how often a seed draws a custody fault.
RESTORE_CHANCE = 0.25
GONE_CHANCE = 0.2
#: How often a node gone for good goes at its next DOWNLOAD rather than at once.
GONE_AT_DOWNLOAD = 0.75
#: In a schedule of every kind, how often a seed draws each truth fault.
IN_FLIGHT_CHANCE = 0.5
UPSTREAM_ERROR_CHANCE = 0.35
SHORT_BODY_CHANCE = 0.35
#: How often a seed has a node that lies within its rights (tasknet.sim.liar).
LIAR_CHANCE = 0.5
#: Where a crash in flight strikes: right after SUBMITTING commits (before
#: the POST), as the upstream answers an applied POST (the site never hears
#: it), or once the answer arrived (before the persist commits).
IN_FLIGHT_POINTS = ("submitting", "post", "answer")

#: With several sites, how often the pause at SUBMITTING is a short one, and
#: its length: past the sites' upstream timeout (5 s), within their lease
#: timeout (8 s).
SHORT_PAUSE_CHANCE = 0.5
SHORT_PAUSE = (5.0, 8.0)

#: The gids a run draws from (the mock upstream's catalog has them all).
GIDS = range(101, 131)


@dataclass(frozen=True)
class Step:
    """One thing that happens at simulated second ``at`` of the run:
    ``kind`` (a workload kind or a fault kind), on ``target`` (a gid, a
    process name), with ``params``; ``lasts`` seconds for a fault that is
    healed (a partition, a stall, a crash until its restart)."""

    at: float
    kind: str
    target: str
    lasts: float = 0.0
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    @property
    def is_fault(self) -> bool:
        return self.kind not in WORKLOAD_KINDS

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.params)
        lasting = f" for {self.lasts:.3f}s" if self.lasts else ""
        return f"t={self.at:8.3f}s {self.kind} {self.target}{extra}{lasting}"


@dataclass(frozen=True)
class Schedule:
    """The steps of one run, in time order, and the world it runs in."""

    seed: int
    steps: tuple[Step, ...]
    nodes: tuple[tuple[str, int], ...]  # (node id, protocol)
    sites: tuple[str, ...] = ("site",)
    quota: int = 200
    healed_at: float = 0.0
    #: Simulated seconds after the last heal within which every task must settle.
    settle_within: float = 240.0
    extra: dict[str, Any] = field(default_factory=dict)

    def without(self, indexes: set[int]) -> Schedule:
        """This schedule less the steps at ``indexes`` (shrinking)."""
        kept = tuple(s for i, s in enumerate(self.steps) if i not in indexes)
        return replace(self, steps=kept, healed_at=_healed_at(kept))

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: sites {', '.join(self.sites)}; nodes "
            + ", ".join(f"{n} (v{p})" for n, p in self.nodes)
            + f"; quota {self.quota}"
        ]
        lines += [f"  {step.describe()}" for step in self.steps]
        return "\n".join(lines)


def _healed_at(steps: tuple[Step, ...]) -> float:
    return max((s.at + s.lasts for s in steps if s.is_fault), default=0.0)


def generate(
    seed: int,
    *,
    faults: tuple[str, ...] = FAULT_KINDS,
    sites: int = 1,
    duration: float = 60.0,
    steps: int = 24,
) -> Schedule:
    """The schedule of ``seed``: two to four nodes (at least one v2 and,
    from three up, one legacy), ``steps`` workload steps over ``duration``
    simulated seconds, three to eight faults among the base kinds of
    ``faults`` and, drawn apart, the custody kinds among them (sometimes; each
    one asked for always when no base kind is)."""
    rng = random.Random(seed)
    node_count = rng.randint(2, 4)
    nodes = tuple(
        (f"n{i + 1}", 1 if i == node_count - 1 and node_count >= 3 else 2)
        for i in range(node_count)
    )
    site_names = tuple("site" if i == 0 else f"site{i + 1}" for i in range(sites))
    gids = list(GIDS)
    rng.shuffle(gids)
    pool = gids[: rng.randint(6, 14)]
    created: list[int] = []
    plan: list[Step] = []
    for _ in range(steps):
        at = round(rng.uniform(0.5, duration), 3)
        site = rng.choice(site_names)
        roll = rng.random()
        if roll < 0.45 or not created:
            gid = rng.choice(pool)
            kind = "create_twice" if rng.random() < 0.15 else "create"
            created.append(gid)
            plan.append(Step(at, kind, str(gid), params=(("site", site),)))
        elif roll < 0.65:
            plan.append(Step(at, "delete", str(rng.choice(created)), params=(("site", site),)))
        elif roll < 0.8:
            plan.append(Step(at, "recreate", str(rng.choice(created)), params=(("site", site),)))
        else:
            # The verdict the evidence supports, or (one in five) the wrong one.
            honest = rng.random() >= 0.2
            plan.append(
                Step(
                    at,
                    "resolve",
                    str(rng.choice(created)),
                    params=(("honest", honest), ("site", site)),
                )
            )
    processes = [n for n, _ in nodes] + list(site_names) + ["upstream"]
    base = tuple(k for k in faults if k not in APART_FAULT_KINDS)
    for _ in range(rng.randint(3, 8)) if base else ():
        kind = rng.choice(base)
        at = round(rng.uniform(0.5, duration), 3)
        plan.append(_fault(rng, kind, at, nodes, site_names, processes))
    if len(site_names) > 1 and "pause_at_submitting" in faults:
        # Several sites: every seed has the SCALE.md "Fencing" case, a site
        # stopped between SUBMITTING and its POST past its lease, which the
        # other reaps before it wakes.
        at = round(rng.uniform(0.5, duration / 2), 3)
        target, lasts = rng.choice(site_names), round(rng.uniform(12, 40), 3)
        # Half of them (drawn apart, so no other draw moves) shorter than
        # the lease timeout and longer than the upstream timeout: there the
        # POST gate's time check, not its lease check, stops the POST.
        if random.Random(f"pause {seed}").random() < SHORT_PAUSE_CHANCE:
            lasts = round(random.Random(f"pause length {seed}").uniform(*SHORT_PAUSE), 3)
        plan.append(Step(at, "pause_at_submitting", target, lasts))
    plan += _custody_faults(seed, faults, nodes, duration, only=not base)
    plan += _truth_faults(seed, faults, site_names, nodes, duration, only=not base)
    plan += _reap_faults(seed, faults, site_names, duration, only=not base)
    if base:
        plan += fetch_steps(seed, site_names, duration)
    plan.sort(key=lambda s: (s.at, s.kind, s.target))
    ordered = tuple(plan)
    return Schedule(
        seed=seed,
        steps=ordered,
        nodes=nodes,
        sites=site_names,
        quota=rng.choice((60, 200, 5000)),
        healed_at=_healed_at(ordered),
    )


def _custody_faults(
    seed: int,
    faults: tuple[str, ...],
    nodes: tuple[tuple[str, int], ...],
    duration: float,
    *,
    only: bool,
) -> list[Step]:
    """The custody faults of ``seed``, from a generator of their own (a
    string seed: the same in every process and under any hash seed).
    ``only``: no other kind was asked for, so each kind asked for fires."""
    rng = random.Random(f"custody {seed}")
    steps: list[Step] = []
    if "restore_node_backup" in faults:
        count = rng.randint(1, 2) if only else int(rng.random() < RESTORE_CHANCE)
        for _ in range(count):
            # The backup is taken at ``at``; ``restore_after`` seconds later the
            # node is killed, its data directory replaced by the backup, and it
            # starts again on it ``lasts - restore_after`` seconds after that.
            at = round(rng.uniform(0.5, duration * 0.7), 3)
            later = round(rng.uniform(2, 30), 3)
            down = round(rng.uniform(0.05, 5), 3)
            steps.append(
                Step(
                    at,
                    "restore_node_backup",
                    rng.choice(nodes)[0],
                    round(later + down, 3),
                    (("restore_after", later),),
                )
            )
    if "node_gone_for_good" in faults and (only or rng.random() < GONE_CHANCE):
        # One a seed: every seed has two nodes or more, so one is left.  Most
        # go right after the site sends them a DOWNLOAD (a uniform instant
        # almost never finds a node with unfinished work: the simulated
        # downloads are short), so that the site has a task to move.
        at = round(rng.uniform(0.5, duration), 3)
        when = "download" if rng.random() < GONE_AT_DOWNLOAD else "now"
        steps.append(Step(at, "node_gone_for_good", rng.choice(nodes)[0], params=(("at", when),)))
    return steps


def _truth_faults(
    seed: int,
    faults: tuple[str, ...],
    sites: tuple[str, ...],
    nodes: tuple[tuple[str, int], ...],
    duration: float,
    *,
    only: bool,
) -> list[Step]:
    """The truth faults of ``seed`` (issue 39), from a generator of their
    own (as the custody faults': no other draw moves).  ``only``: no base
    kind was asked for, so each kind asked for fires."""
    rng = random.Random(f"truth {seed}")
    steps: list[Step] = []
    if "crash_in_flight" in faults and (only or rng.random() < IN_FLIGHT_CHANCE):
        at = round(rng.uniform(0.5, duration * 0.8), 3)
        point = rng.choice(IN_FLIGHT_POINTS)
        how = rng.choice(("kill", "kill", "power"))
        steps.append(
            Step(
                at,
                "crash_in_flight",
                rng.choice(sites),
                round(rng.uniform(0.05, 8), 3),
                (("at", point), ("how", how), ("posts", rng.randint(1, 3))),
            )
        )
    if "upstream_error" in faults and (only or rng.random() < UPSTREAM_ERROR_CHANCE):
        at = round(rng.uniform(0.5, duration), 3)
        params: tuple[tuple[str, Any], ...] = (
            ("status", rng.choice((500, 502, 503, 504))),
            ("charged", rng.random() < 0.5),
            ("body", rng.random() < 0.5),
            ("times", rng.randint(1, 3)),
        )
        steps.append(Step(at, "upstream_error", "upstream", params=params))
    if "short_body" in faults and (only or rng.random() < SHORT_BODY_CHANCE):
        # The archive's Content-Length promised, the connection cut after
        # ``after`` bytes of it (the smallest archive has 64 KiB).
        at = round(rng.uniform(0.5, duration), 3)
        cut: tuple[tuple[str, Any], ...] = (
            ("after", rng.randint(0, 60000)),
            ("times", rng.randint(1, 3)),
        )
        steps.append(Step(at, "short_body", "upstream", params=cut))
    if "liar_node" in faults and (only or rng.random() < LIAR_CHANCE):
        # A v2 node that, from ``at`` on, also sends what the protocol lets a
        # node send and the site must drop (tasknet.sim.liar).
        at = round(rng.uniform(0.5, duration / 2), 3)
        v2 = [n for n, protocol in nodes if protocol == 2]
        steps.append(Step(at, "liar_node", rng.choice(v2)))
    return steps


def _reap_faults(
    seed: int, faults: tuple[str, ...], sites: tuple[str, ...], duration: float, *, only: bool
) -> list[Step]:
    """The reaper faults of ``seed`` (several sites only), from a generator
    of their own.  ``only``: no base kind was asked for, so each kind asked
    for fires."""
    if len(sites) < 2:
        return []
    rng = random.Random(f"reap {seed}")
    steps: list[Step] = []
    if "reap_in_flight" in faults and (only or rng.random() < REAP_IN_FLIGHT_CHANCE):
        # At ``at`` the other site is killed, restarting ``lasts`` seconds
        # later (past its lease timeout, 8 s, and the reap); the target's
        # POST just before that lease goes stale is held ``ms`` (the sites'
        # upstream timeout is 5 s; the reaper looks every 3 s).
        at = round(rng.uniform(0.5, duration * 0.6), 3)
        held = (("ms", 4500),)
        steps.append(
            Step(at, "reap_in_flight", rng.choice(sites), round(rng.uniform(15, 30), 3), held)
        )
    if "cut_off_early" in faults and (only or rng.random() < CUT_OFF_EARLY_CHANCE):
        # Paused ``lasts`` seconds, past its lease timeout (8 s); its host cut
        # off ``after`` seconds in, well within it.
        at = round(rng.uniform(0.5, duration * 0.6), 3)
        cut = (("after", round(rng.uniform(0.1, 3), 3)),)
        steps.append(
            Step(at, "cut_off_early", rng.choice(sites), round(rng.uniform(12, 30), 3), cut)
        )
    return steps


def _fault(
    rng: random.Random,
    kind: str,
    at: float,
    nodes: tuple[tuple[str, int], ...],
    sites: tuple[str, ...],
    processes: list[str],
) -> Step:
    node = rng.choice(nodes)[0]
    site = rng.choice(sites)
    if kind == "crash_site":
        how = rng.choice(("kill", "kill", "power"))
        return Step(at, kind, site, round(rng.uniform(0.05, 8), 3), (("how", how),))
    if kind == "crash_node":
        return Step(at, kind, node, round(rng.uniform(0.05, 8), 3), (("how", "kill"),))
    if kind == "wipe_node":
        return Step(at, kind, node, round(rng.uniform(0.05, 5), 3))
    if kind == "crash_upstream":
        return Step(at, kind, "upstream", round(rng.uniform(0.05, 6), 3))
    if kind == "partition":
        return Step(at, kind, node, round(rng.uniform(0.5, 20), 3), (("from", site),))
    if kind == "reset":
        return Step(at, kind, node, params=(("from", site),))
    if kind == "slow_link":
        a, b = rng.sample(processes, 2)
        ms = rng.choice((50, 200, 1000))
        return Step(at, kind, a, round(rng.uniform(1, 15), 3), (("to", b), ("ms", ms)))
    if kind == "stall":
        direction = rng.choice(("node", "site"))
        return Step(
            at,
            kind,
            node,
            round(rng.uniform(0.5, 20), 3),
            (("from", site), ("sender", direction), ("after", rng.randint(0, 8))),
        )
    if kind.startswith("upstream_"):
        times = rng.randint(1, 3)
        return Step(at, kind, "upstream", params=(("times", times),))
    if kind in ("db_busy", "db_commit_fails", "disk_full"):
        return Step(at, kind, site, params=(("times", rng.randint(1, 4)),))
    if kind == "clock_jump":
        seconds = rng.choice((-30.0, -5.0, 30.0, 7200.0))
        return Step(at, kind, rng.choice(processes[:-1]), params=(("seconds", seconds),))
    if kind == "pause_site":
        return Step(at, kind, site, round(rng.uniform(0.5, 40), 3))
    if kind == "pause_at_submitting":
        # Past the lease timeout (8 s) as often as not: another site reaps it.
        return Step(at, kind, site, round(rng.uniform(0.5, 40), 3))
    if kind == "crash_at_commit":
        how = rng.choice(("kill", "kill", "power"))
        commits = rng.randint(1, 6)
        # Half of them after a node report's transaction: what a report
        # changed and announced must land together, or neither.
        of = rng.choice(("any", "apply_reports"))
        return Step(
            at,
            kind,
            site,
            round(rng.uniform(0.05, 8), 3),
            (("how", how), ("commits", commits), ("of", of)),
        )
    if kind == "pause_node":
        return Step(at, kind, node, round(rng.uniform(0.5, 30), 3))
    raise ValueError(f"unknown fault kind {kind!r}")


def fetch_steps(seed: int, sites: tuple[str, ...], duration: float) -> list[Step]:
    """The fetches of ``seed`` while the faults run, from a generator of
    their own (a string seed: the same in every process and hash seed).
    Each picks, when it runs, one of the tasks then ``COMPLETED`` (``pick``)."""
    rng = random.Random(f"fetch {seed}")
    steps = []
    for _ in range(rng.randint(*FETCHES)):
        at = round(rng.uniform(duration / 4, duration), 3)
        params = (("pick", round(rng.random(), 6)),)
        steps.append(Step(at, FETCH_KIND, rng.choice(sites), params=params))
    return steps
