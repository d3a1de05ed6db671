"""One seeded run: the schedule carried out on the real roles, then the checks.

:func:`run_schedule` builds a :class:`~tasknet.sim.world.World` from the
schedule's seed and a :class:`~tasknet.sim.cluster.SimCluster` in a fresh
directory, starts the upstream, the site(s) and the nodes, carries out
every :class:`~tasknet.sim.schedule.Step` at its simulated time (a user's
request through the HTTP API, a fault through the world), heals
whatever is left after the last fault, and waits for the tasks to settle.
Then it checks: the cheap invariants seen along the way
(:mod:`tasknet.sim.checks`), liveness (everything settled within the
schedule's bound), and D1–D10 by the drill checkers over the run's files,
journal and frames.  An :class:`Outcome` says what held and what did not.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tasknet.drill.invariants import FAIL, Verdict, check_all
from tasknet.drill.snapshot import SiteSnapshot, read_site
from tasknet.sim.checks import CheapChecks
from tasknet.sim.cluster import METERED_SQL, NO_ANSWER, SITE_UPSTREAM_TIMEOUT, SimCluster, headers
from tasknet.sim.custody import (
    InventoryWatch,
    excuse_restored,
    left_behind,
    node_holdings,
    unheld_completions,
    wiped_not_gone,
)
from tasknet.sim.fetch import FETCH_TIMEOUT, Fetcher, public_nodes
from tasknet.sim.liar import MARK, LyingNodes
from tasknet.sim.network import SimConnection, SimTransport
from tasknet.sim.schedule import GIDS, Schedule, Step
from tasknet.sim.trace import failure_name
from tasknet.sim.truth import (
    ARCHIVE_POST,
    archive_mismatches,
    reap_of_live,
    unaccounted_charges,
)
from tasknet.sim.world import World
from tasknet.site.storage.lease import SILENT_CLIENT_NOTICED_WITHIN

__all__ = ["Outcome", "run_schedule"]

#: How often (simulated seconds) the run looks whether everything settled.
SETTLE_POLL = 1.0
#: A legacy DownloadPost (PROTOCOL.md).
TYPE_DOWNLOAD_POST = 4
#: Operation states that need nothing more from anyone.
SETTLED_STATES = ("DELETED", "UNKNOWN")
#: The tasks a node completed, by generation, the archive not known gone.
COMPLETED_SQL = (
    "SELECT o.gid, o.operation_id FROM task_operation o JOIN gallery g ON g.gid = o.gid"
    " WHERE g.node_id = ? AND o.state = 'SUBMITTED' AND g.status = 4"
    " AND g.archive_gone_reason IS NULL ORDER BY o.gid"
)
#: The unfinished tasks of a node, by generation (the checker's own read).
UNFINISHED_SQL = (
    "SELECT o.gid, o.operation_id FROM task_operation o JOIN gallery g ON g.gid = o.gid"
    " WHERE g.node_id = ? AND o.state = 'SUBMITTED' AND COALESCE(g.status, 0) <> 4"
    " ORDER BY o.gid"
)


@dataclass
class Outcome:
    seed: int
    failures: list[tuple[str, str]] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    events: int = 0
    simulated: float = 0.0
    wall: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    digest: str = ""
    trace: list[str] = field(default_factory=list)
    #: (node, gid, operation id) of the tasks a node gone for good had
    #: unfinished when it went (another node finishes them: ``reassign``).
    left_on_gone: list[tuple[str, int, str]] = field(default_factory=list)
    #: (node, gid, operation id) of the tasks the site showed COMPLETED on a
    #: node when it was wiped (ARCHIVE_GONE, MISSING, due: ``custody``).
    wiped_completions: list[tuple[str, int, str]] = field(default_factory=list)
    #: The archive fetches by path and outcome (``node resume served``: tasknet.sim.fetch).
    fetches: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def first_failure(self) -> str:
        check, detail = self.failures[0]
        more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        return f"{check} FAIL {detail}{more}"

    def failed_checks(self) -> set[str]:
        return {check for check, _ in self.failures}


def run_schedule(
    schedule: Schedule,
    *,
    db: str = "sqlite",
    workdir: Path | None = None,
    keep_trace: int | None = 0,
    postgres: Callable[[], str] | None = None,
    before_checks: Callable[[str], None] | None = None,
) -> Outcome:
    """Run ``schedule`` (see the module doc); ``workdir``: where its files
    go (default: a temp directory, on tmpfs where there is one, removed
    after); ``postgres``: gives a fresh database URL (``db="postgres"``);
    ``before_checks``: called with the site database once the run settled,
    before the checks read it (a test plants there what a check must find)."""
    started = time.perf_counter()
    # No collection at an instant of the run's choosing: the finalizers of
    # an earlier run's garbage (a Deferred's, a generator's, a connection's)
    # would run inside this one, at a point that depends on what ran before
    # in the process (seed 848 failed only after seeds 780..847).
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    own = workdir is None
    root = workdir or Path(tempfile.mkdtemp(prefix="tasknet-sim-", dir=_tmpfs()))
    root.mkdir(parents=True, exist_ok=True)
    try:
        run = _Run(schedule, root, db, keep_trace, postgres)
        run.before_checks = before_checks
        return run.run(started)
    finally:
        if collecting:
            gc.enable()
        if own:
            shutil.rmtree(root, ignore_errors=True)


def _tmpfs() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


class _Run:
    def __init__(
        self,
        schedule: Schedule,
        root: Path,
        db: str,
        keep_trace: int | None,
        postgres: Callable[[], str] | None,
    ) -> None:
        self.schedule = schedule
        self.world = World(schedule.seed, keep_trace=keep_trace)
        if db == "postgres":
            if postgres is None:
                raise ValueError("--db postgres needs a PostgreSQL server")
            target = postgres()
        else:
            target = str(root / "site.db")
        self.cluster = SimCluster(self.world, root, target)
        self.cluster.quota = schedule.quota
        self.checks = CheapChecks(
            self.world,
            target,
            lambda: self.cluster.journal,
            self.cluster.ledger.generations,
            lambda: {s.nodes_port for s in self.cluster.sites.values()},
            self.cluster.instance_of,
            upstream_timeout=SITE_UPSTREAM_TIMEOUT,
        )
        self.inventories = InventoryWatch(lambda: self.world.network.connections)
        self.cluster.on_frame.append(self.inventories.frame)
        #: Nodes gone for good: never started again.
        self._gone: set[str] = set()
        #: Nodes whose data directory was restored from a backup.
        self._restored: set[str] = set()
        #: (node, gid, operation id) of the unfinished tasks a node had when
        #: it went for good: another node finishes them, same generation.
        self._stranded_tasks: list[tuple[str, int, str]] = []
        #: Nodes that go for good at their next DOWNLOAD.
        self._gone_armed: set[str] = set()
        self.cluster.on_frame.append(self._gone_at_download)
        #: (node, gid, operation id) of the tasks the site showed COMPLETED on
        #: a node when its data directory was wiped: ARCHIVE_GONE (MISSING) due.
        self._wiped_completions: list[tuple[str, int, str]] = []
        self.cluster.on_committed.append(self._committed)
        #: The instances seen reaped (each judged once, at its reap's commit).
        self._reaped_seen: set[int] = set()
        #: The generations seen settled by a reap (operation ids).
        self._settled_seen: set[str] = set()
        #: Crashes in flight armed: [site, "post" or "answer", POSTs still to let by, step].
        self._in_flight: list[list[Any]] = []
        #: Connection id -> the site that wrote an archive POST on it.
        self._posting: dict[int, str] = {}
        self.lies = LyingNodes(
            self.world,
            schedule.seed,
            lambda sql, params: next(iter(self.checks.rows(sql, params)), None),
            self.checks.fail,
            self._fired,
        )
        self.cluster.on_frame.append(self.lies.frame)
        liars = {step.target for step in schedule.steps if step.kind == "liar_node"}
        for node in sorted(liars):
            self.lies.arm(node, self.cluster.node_link)
        if liars:
            self.world.network.rewrites.append(self.lies.rewrite)
        self.world.network.send_taps.append(self._in_flight_sent)
        self.world.network.taps.append(self._in_flight_received)
        #: gid -> journal POSTs for it when its latest create was sent (resolve's evidence).
        self._posts_at_create: dict[int, int] = {}
        self._seen_deleted: set[int] = set()
        #: gid -> creates sent and not answered (one left unanswered may still land).
        self._creates_open: dict[int, int] = {}
        self.fired: dict[str, int] = {}
        self.before_checks: Callable[[str], None] | None = None
        #: Users' requests sent and not answered yet.
        self._open_requests = 0
        #: The user's archive fetches and their check (tasknet.sim.fetch).
        self.fetcher = Fetcher(self.cluster, headers, schedule.seed)

    # -- the run ---------------------------------------------------------------------------

    def run(self, started: float) -> Outcome:
        world, cluster, schedule = self.world, self.cluster, self.schedule
        for site in schedule.sites:
            cluster.add_site(site)
        public = public_nodes(schedule.seed, schedule.nodes)
        for node_id, protocol in schedule.nodes:
            cluster.add_node(node_id, protocol, public=node_id in public)
        cluster.start_upstream()
        for site in schedule.sites:
            cluster.start_site(site)
        for node_id, _ in schedule.nodes:
            cluster.start_node(node_id)
        begin = world.now
        for step in schedule.steps:
            world.call_at(begin + step.at, self._do, step, what=f"step {step.kind} {step.target}")
        healed = begin + schedule.healed_at
        world.run_until(until=healed)
        self._heal_all()
        # The workload goes on after the last fault healed: its last steps
        # run before the run waits for everything to settle.
        last_step = begin + max((step.at for step in schedule.steps), default=0.0)
        if last_step > world.now:
            world.run_until(until=last_step)
        # A crash or pause armed for a commit that has not come by now never
        # strikes; a node armed to go at its next DOWNLOAD goes now.
        self.cluster.forget_after_commit()
        self._in_flight.clear()
        for node_id in sorted(self._gone_armed):
            self._go_for_good(node_id)
        self._gone_armed.clear()
        settled = self._wait_settled(schedule.settle_within)
        if self.before_checks is not None:
            self.before_checks(self.cluster.db)
        if settled:
            # Every COMPLETED task fetched once, through the first site.
            self.fetcher.fetch_all(schedule.sites[0])
        world.run_until(lambda: not self.fetcher.open, within=10 * FETCH_TIMEOUT)
        if settled:
            # The fetches took simulated time, in which a fault's aftermath
            # may have come (a link a last clock jump aborted): settle again.
            settled = self._wait_settled(schedule.settle_within)
        outcome = Outcome(seed=schedule.seed)
        if not settled:
            outcome.failures.append(("liveness", self._unsettled_detail()))
        evidence = cluster.observe()
        if settled:
            snap = evidence.site
            holdings = {n.node_id: node_holdings(n.data) for n in cluster.nodes.values()}
            judged = {n for n in self.inventories.judged() if cluster.nodes[n].alive}
            outcome.failures += [
                ("custody", f) for f in self._unheld_completions(snap, holdings, judged)
            ]
            outcome.failures += [
                ("custody", f)
                for f in wiped_not_gone(
                    self._wiped_completions, snap.operations, snap.galleries, holdings, judged
                )
            ]
            outcome.failures += [("reassign", f) for f in self._left_behind(snap)]
            outcome.failures += self._truth_once_settled()
        outcome.failures += self.fetcher.failures
        self._finish_ledger(evidence)
        evidence.ledger.unkept_reports = set(self.lies.report_ids)
        self.checks.states_in_table(evidence.site.operations)
        # The checker's failures are copied only now: those of the checks
        # run after the run (the states read last) count too, and come first.
        outcome.failures[:0] = self.checks.failures
        outcome.verdicts = excuse_restored(
            check_all(evidence), self._restored, self.inventories.announced()
        )
        outcome.failures += [(v.invariant, v.detail) for v in outcome.verdicts if v.status == FAIL]
        outcome.failures += [
            ("errors", f"{failure_name(f)}: {f.getErrorMessage()}") for f in world.errors
        ]
        if world.foreign:
            outcome.failures.append(("seams", f"real threads reached the world: {world.foreign}"))
        self.checks.close()
        cluster.stop_all()
        outcome.events = world.events
        outcome.simulated = world.elapsed()
        outcome.wall = time.perf_counter() - started
        outcome.faults = dict(sorted(self.fired.items()))
        outcome.digest = world.trace.hexdigest()
        outcome.trace = list(world.trace.lines)
        outcome.left_on_gone = list(self._stranded_tasks)
        outcome.wiped_completions = list(self._wiped_completions)
        outcome.fetches = dict(sorted(self.fetcher.counts.items()))
        return outcome

    def _committed(self, site: str, functions: tuple[str, ...]) -> None:
        """Right after a write of ``site`` commits, before the site hears of it."""
        self.checks.not_reaped(site, f"committed a write ({', '.join(functions)})")
        if "begin_submit" in functions:
            self.checks.submitting_committed()
        if "reap" in functions:
            self._reaps_committed()

    def _reaps_committed(self) -> None:
        """No instance reaped while its process is alive and its lease
        fresh on its own clock (:func:`~tasknet.sim.truth.reap_of_live`)."""
        rows = self.checks.rows("SELECT id FROM site_instance WHERE reaped_at IS NOT NULL")
        for (instance,) in sorted(rows):
            if instance in self._reaped_seen:
                continue
            self._reaped_seen.add(instance)
            self._judge_reaped(int(instance))
        # The generations a reap made UNKNOWN keep their owner's instance.
        for gid, operation_id, owner in self.checks.rows(
            "SELECT gid, operation_id, instance_id FROM task_operation WHERE state = 'UNKNOWN'"
            " AND step = 'recovery' AND instance_id IS NOT NULL ORDER BY gid"
        ):
            if operation_id in self._settled_seen:
                continue
            self._settled_seen.add(str(operation_id))
            self._judge_reaped(
                int(owner), settled=f"gid {gid}'s SUBMITTING (operation {operation_id})"
            )

    def _judge_reaped(self, instance: int, settled: str | None = None) -> None:
        """Instance ``instance`` was reaped now (or ``settled``, a generation
        of it, by a reap): not while it lives with a fresh lease."""
        name = next(
            (n for n in sorted(self.cluster.sites) if self.cluster.instance_of(n) == instance),
            None,
        )
        site = self.cluster.sites[name] if name is not None else None
        if site is None or site.reactor is None or not site.alive:
            return
        reactor, now = site.reactor, self.world.now
        paused = reactor.paused_until is not None and reactor.paused_until > now
        failure = reap_of_live(
            instance,
            name,
            alive=True,
            stale_for=site.service.parts.instance.lease.stale_for(),
            paused_for=now - reactor.paused_at if paused else None,
            cut_off=bool(site.runs) and site.runs[-1].get("fenced") is not None,
            settled=settled,
        )
        if failure is not None:
            self.checks.fail("reap-of-live", failure)

    def _truth_once_settled(self) -> list[tuple[str, str]]:
        """The end-of-seed checks against the world's truth
        (:mod:`tasknet.sim.truth`): every charge accounted, every archive
        held the upstream's bytes."""
        failures: list[tuple[str, str]] = []
        journal = self.cluster.journal
        if journal is not None:
            rows = self.checks.rows
            failures += [
                ("charges", f)
                for f in unaccounted_charges(
                    dict(journal.posts),
                    [(int(g), str(o)) for g, o, _ in rows(METERED_SQL)],
                    [
                        (int(g), str(o))
                        for g, o in rows(
                            "SELECT gid, operation_id FROM task_operation WHERE state = 'UNKNOWN'"
                        )
                    ],
                    [
                        (int(g), str(o))
                        for g, o in rows("SELECT gid, operation_id FROM reconciliation_audit")
                    ],
                )
            ]
        for node_id, node in sorted(self.cluster.nodes.items()):
            failures += [("archive-bytes", f) for f in archive_mismatches(node_id, node.data)]
        if self.lies.liars:
            for gid, detail in self.checks.rows(
                "SELECT gid, detail FROM gallery WHERE detail LIKE ? ORDER BY gid", (MARK + "%",)
            ):
                failures.append(("lie-applied", f"gid {gid} shows a lie's {detail!r}"))
        return failures

    def _wait_settled(self, within: float) -> bool:
        deadline = self.world.now + within
        while self.world.now < deadline:
            if self._settled_now():
                return True
            self.world.run_until(within=SETTLE_POLL)
        return self._settled_now()

    # -- the workload ----------------------------------------------------------------------

    def _do(self, step: Step) -> None:
        handler = getattr(self, f"_do_{step.kind}")
        handler(step)

    def _create(self, gid: int, site: str) -> None:
        ledger = self.cluster.ledger
        self._seen_deleted.discard(gid)
        self._creates_open[gid] = self._creates_open.get(gid, 0) + 1
        journal = self.cluster.journal
        self._posts_at_create[gid] = journal.posts.get(gid, 0) if journal is not None else 0
        # Counted now: a create whose answer is lost may still have reserved.
        ledger.generations[gid] += 1
        answer = self._ask("POST", "/api/tasks", {"gid": gid, "token": "sim"}, site=site)
        answer.addCallback(self._created, gid)

    def _created(self, result: tuple[int, Any], gid: int) -> None:
        status, document = result
        if status != NO_ANSWER:
            self._creates_open[gid] -= 1
        if status == 409 and _already_exists(document):
            # The task exists: no generation was started.  (A create refused
            # later, for quota or by the upstream, may have reserved a
            # generation and released it: it stays counted.)
            self.cluster.ledger.generations[gid] -= 1

    def _ask(self, method: str, path: str, body: Any = None, *, site: str) -> Any:
        """A user's request; the run does not settle while one is unanswered
        (its last steps' requests reach the site before the run ends)."""
        self._open_requests += 1
        answer = self.cluster.api(method, path, body, site=site)

        def answered(result: Any) -> Any:
            self._open_requests -= 1
            return result

        return answer.addBoth(answered)

    def _do_fetch_archive(self, step: Step) -> None:
        self.fetcher.fetch_one(step.target, step.param("pick", 0.0))

    def _do_create(self, step: Step) -> None:
        self._create(int(step.target), step.param("site", "site"))

    def _do_recreate(self, step: Step) -> None:
        self._create(int(step.target), step.param("site", "site"))

    def _do_create_twice(self, step: Step) -> None:
        sites = self.schedule.sites
        self._create(int(step.target), step.param("site", "site"))
        self._create(int(step.target), sites[-1])

    def _do_delete(self, step: Step) -> None:
        gid = int(step.target)
        answer = self._ask("DELETE", f"/api/tasks/{gid}", site=step.param("site", "site"))

        def answered(result: tuple[int, Any]) -> None:
            if 200 <= result[0] < 300:
                self.cluster.ledger.delete_answered_at.setdefault(gid, self.world.now)

        answer.addCallback(answered)

    def _do_resolve(self, step: Step) -> None:
        gid = int(step.target)
        journal = self.cluster.journal
        posts = journal.posts.get(gid, 0) if journal is not None else 0
        submitted = posts > self._posts_at_create.get(gid, 0)
        if not step.param("honest", True):
            submitted = not submitted
        verdict = "submitted" if submitted else "not_submitted"
        self._ask(
            "POST",
            f"/api/admin/tasks/{gid}/resolve",
            {"verdict": verdict},
            site=step.param("site", "site"),
        )

    # -- the faults -----------------------------------------------------------------------

    def _fired(self, kind: str) -> None:
        self.fired[kind] = self.fired.get(kind, 0) + 1

    def _later(self, delay: float, fn: Callable[..., None], *args: Any, what: str) -> None:
        self.world.call_later(delay, fn, *args, what=what)

    def _do_crash_site(self, step: Step) -> None:
        if self.cluster.sites[step.target].alive:
            self._fired(step.kind)
            self.cluster.crash(step.target, step.param("how", "kill"))
            self._later(step.lasts, self._restart_site, step.target, what=f"restart {step.target}")

    def _restart_site(self, name: str) -> None:
        if not self.cluster.sites[name].alive:
            self.cluster.start_site(name)

    def _do_crash_node(self, step: Step, *, wiped: bool = False) -> None:
        if self.cluster.nodes[step.target].alive:
            self._fired(step.kind)
            self.cluster.crash(step.target, step.param("how", "kill"))
            self._later(
                step.lasts, self._restart_node, step.target, wiped, what=f"restart {step.target}"
            )

    def _do_wipe_node(self, step: Step) -> None:
        self._do_crash_node(step, wiped=True)

    def _restart_node(self, node_id: str, wiped: bool) -> None:
        if not self.cluster.nodes[node_id].alive and node_id not in self._gone:
            if wiped:
                for gid, operation_id in self.checks.rows(COMPLETED_SQL, (node_id,)):
                    self._wiped_completions.append((node_id, int(gid), str(operation_id)))
            self.cluster.start_node(node_id, wiped=wiped)

    def _do_restore_node_backup(self, step: Step) -> None:
        """A backup of the node's data directory now; ``restore_after``
        seconds later the node is killed, the backup put in place of its
        directory, and it starts on it after the rest of ``lasts``."""
        node_id = step.target
        if node_id in self._gone:
            return
        backup = self.cluster.back_up(node_id)
        later = float(step.param("restore_after", 0.0))
        down = max(step.lasts - later, 0.0)
        self._later(
            later, self._restore, node_id, backup, down, what=f"restore {node_id} from a backup"
        )

    def _restore(self, node_id: str, backup: Any, down: float) -> None:
        if node_id in self._gone:
            return
        self._fired("restore_node_backup")
        self._restored.add(node_id)
        self.cluster.crash(node_id, "kill")
        self.cluster.restore(node_id, backup)
        self._later(down, self._restart_node, node_id, False, what=f"restart {node_id}")

    def _do_node_gone_for_good(self, step: Step) -> None:
        """The node is killed and never starts again (its machine is gone),
        at once or (``at=download``) right after the site's next DOWNLOAD
        reaches it: the site moves its unfinished tasks
        (``--reassign-after``)."""
        if step.param("at") == "download":
            self._gone_armed.add(step.target)
        else:
            self._go_for_good(step.target)

    def _gone_at_download(self, record: dict[str, Any]) -> None:
        node_id = record["node"]
        if node_id not in self._gone_armed or record["direction"] != "to_client":
            return
        payload = record["payload"] if isinstance(record["payload"], dict) else {}
        if record["type"] == TYPE_DOWNLOAD_POST or payload.get("action") == "DOWNLOAD":
            self._gone_armed.discard(node_id)
            self._later(0.0, self._go_for_good, node_id, what=f"{node_id} goes for good")

    def _go_for_good(self, node_id: str) -> None:
        if node_id in self._gone:
            return
        self._fired("node_gone_for_good")
        self._gone.add(node_id)
        self.cluster.crash(node_id, "kill")
        # For D6 as a wipe: a report it sent before it went and the site
        # commits after (seed 62: the site was paused) is ACKed to no one,
        # and no one waits for that ACK any more.
        self.cluster.ledger.wiped_at.setdefault(node_id, []).append(self.world.now)
        for gid, operation_id in self.checks.rows(UNFINISHED_SQL, (node_id,)):
            self._stranded_tasks.append((node_id, int(gid), str(operation_id)))

    def _do_crash_upstream(self, step: Step) -> None:
        if self.cluster.upstream_alive:
            self._fired(step.kind)
            self.cluster.crash("upstream")
            self._later(step.lasts, self._restart_upstream, what="restart upstream")

    def _restart_upstream(self) -> None:
        if not self.cluster.upstream_alive:
            self.cluster.start_upstream()

    def _do_partition(self, step: Step) -> None:
        self._fired(step.kind)
        site = step.param("from", "site")
        self.world.network.partition(step.target, site)
        self._later(step.lasts, self.world.network.heal, step.target, site, what="heal")

    def _do_reset(self, step: Step) -> None:
        connections = self.world.network.between(step.target, step.param("from", "site"))
        if connections:
            self._fired(step.kind)
        for connection in connections:
            connection.reset()

    def _do_slow_link(self, step: Step) -> None:
        self._fired(step.kind)
        seconds = step.param("ms", 200) / 1000
        network = self.world.network
        network.set_link(step.target, step.param("to"), latency=(seconds / 2, seconds))
        self._later(
            step.lasts, network.reset_link, step.target, step.param("to"), what="link mended"
        )

    def _do_stall(self, step: Step) -> None:
        site = step.param("from", "site")
        connections = self.world.network.between(step.target, site)
        if not connections:
            return
        self._fired(step.kind)
        connection = connections[-1]
        sender = step.target if step.param("sender") == "node" else site
        connection.stall(sender, step.param("after", 0))
        self._later(step.lasts, connection.unstall, what="unstall")

    def _upstream_rule(self, step: Step, rule: dict[str, Any]) -> None:
        app = self.cluster.upstream_app
        if app is None or not self.cluster.upstream_alive:
            return
        self._fired(step.kind)
        rule = {"method": "POST", "path": "/api/galleries/*/archive", **rule}
        rule["times"] = step.param("times", 1)
        app.set_faults({"rules": [rule]})

    def _do_upstream_timeout(self, step: Step) -> None:
        fault = "timeout" if step.param("times", 1) % 2 else "drop_before"
        self._upstream_rule(step, {"fault": fault})

    def _do_upstream_commit_then_drop(self, step: Step) -> None:
        self._upstream_rule(step, {"fault": "commit_then_drop"})

    def _do_upstream_5xx(self, step: Step) -> None:
        charged = step.param("times", 1) >= 2
        self._upstream_rule(step, {"fault": "error", "params": {"status": 503, "charged": charged}})

    def _do_upstream_slow(self, step: Step) -> None:
        self._upstream_rule(step, {"fault": "latency", "params": {"ms": 3000}})

    def _do_db_busy(self, step: Step) -> None:
        self._storage_fault(step, "busy")

    def _do_db_commit_fails(self, step: Step) -> None:
        self._storage_fault(step, "commit")

    def _do_disk_full(self, step: Step) -> None:
        self._storage_fault(step, "full")

    def _storage_fault(self, step: Step, kind: str) -> None:
        site = self.cluster.sites[step.target]
        if site.alive and self.cluster.inject_storage_fault(
            step.target, kind, step.param("times", 1)
        ):
            self._fired(step.kind)

    def _do_pause_at_submitting(self, step: Step) -> None:
        """The site stops right after its next SUBMITTING commits, before
        its POST (SCALE.md "Fencing": with several sites, long enough to be
        reaped by another)."""
        if not self.cluster.sites[step.target].alive:
            return

        def pause() -> None:
            process = self.world.processes.get(step.target)
            if process is not None and process.alive:
                self._fired(step.kind)
                process.pause(step.lasts)
                if step.lasts > SILENT_CLIENT_NOTICED_WITHIN:
                    # Long enough for a VM migration: the host's network is
                    # gone meanwhile and the server ends the site's sessions,
                    # so the other site can reap it before it resumes.
                    self._later(
                        SILENT_CLIENT_NOTICED_WITHIN,
                        self.cluster.cut_off,
                        step.target,
                        process.incarnation,
                        what=f"cut off {step.target}",
                    )

        self.cluster.after_commit(step.target, lambda functions: "begin_submit" in functions, pause)

    def _do_crash_at_commit(self, step: Step) -> None:
        """The site dies right after one of its next write transactions
        (of those running ``of``, a storage function, unless ``any``)
        commits, before its answer, ACK or notification goes anywhere."""
        if not self.cluster.sites[step.target].alive:
            return
        left = [int(step.param("commits", 1))]
        of = step.param("of", "any")

        def nth(functions: tuple[str, ...]) -> bool:
            if of != "any" and of not in functions:
                return False
            left[0] -= 1
            return left[0] <= 0

        def crash() -> None:
            if self.cluster.sites[step.target].alive:
                self._fired(step.kind)
                self.cluster.crash(step.target, step.param("how", "kill"))
                self._later(
                    step.lasts, self._restart_site, step.target, what=f"restart {step.target}"
                )

        self.cluster.after_commit(step.target, nth, crash)

    def _do_crash_in_flight(self, step: Step) -> None:
        """The site dies with a POST in flight: right after the
        ``posts``-th next SUBMITTING commits (``at=submitting``), as the
        upstream answers that POST (``post``: it was applied, the site never
        hears), or once its answer arrived, before the persist commits
        (``answer``); it restarts ``lasts`` seconds later."""
        if not self.cluster.sites[step.target].alive:
            return
        point, posts = step.param("at", "post"), int(step.param("posts", 1))
        if point != "submitting":
            self._in_flight.append([step.target, point, posts, step])
            return
        left = [posts]

        def nth(functions: tuple[str, ...]) -> bool:
            if "begin_submit" not in functions:
                return False
            left[0] -= 1
            return left[0] <= 0

        self.cluster.after_commit(step.target, nth, lambda: self._crash_in_flight(step))

    def _crash_in_flight(self, step: Step) -> None:
        if self.cluster.sites[step.target].alive:
            self._fired(step.kind)
            self.cluster.crash(step.target, step.param("how", "kill"))
            self._later(step.lasts, self._restart_site, step.target, what=f"restart {step.target}")

    def _in_flight_sent(self, connection: SimConnection, sender: SimTransport, data: bytes) -> None:
        if not self._in_flight:
            return
        server = connection.server.reactor.name
        if sender is connection.client and server == "upstream" and ARCHIVE_POST.match(data):
            self._posting[connection.id] = sender.reactor.name
        elif sender is connection.server and connection.id in self._posting:
            self._strike(self._posting[connection.id], "post")

    def _in_flight_received(
        self, connection: SimConnection, receiver: SimTransport, data: bytes
    ) -> None:
        if self._in_flight and receiver is connection.client and connection.id in self._posting:
            site = self._posting.pop(connection.id)
            self._strike(site, "answer")

    def _strike(self, site: str, point: str) -> None:
        """An archive POST of ``site`` reached ``point``: the crash armed there, if its turn."""
        for armed in self._in_flight:
            if armed[0] != site or armed[1] != point:
                continue
            armed[2] -= 1
            if armed[2] <= 0:
                self._in_flight.remove(armed)
                # After this event: the answer's bytes are handed to the site
                # (or left on the wire) first.
                self._later(0.0, self._crash_in_flight, armed[3], what=f"crash {site} in flight")
            return

    def _do_liar_node(self, step: Step) -> None:
        """From now on ``step.target`` also tells lies (:mod:`tasknet.sim.liar`)."""
        if step.target not in self._gone:
            self.lies.make_liar(step.target)

    def _do_upstream_error(self, step: Step) -> None:
        params = {k: step.param(k) for k in ("status", "charged", "body")}
        self._upstream_rule(step, {"fault": "error", "params": params})

    def _do_short_body(self, step: Step) -> None:
        self._upstream_rule(
            step,
            {
                "method": "GET",
                "path": "/files/*",
                "fault": "reset_mid_body",
                "params": {"after_bytes": int(step.param("after", 0))},
            },
        )

    def _do_reap_in_flight(self, step: Step) -> None:
        """The other site is killed now (restarting ``lasts`` seconds later);
        a second before its lease must be stale (``instances.surely_stale``:
        a dead host's instance is reaped only then), ``step.target`` creates a
        gid never created yet and the upstream holds the answer to the POST
        that follows ``ms``, within the upstream timeout: the target reaps
        the dead site while its own SUBMITTING is in flight, and that one is
        not the reap's to settle (SCALE.md 2: a live instance's generations
        are never touched)."""
        other = next(n for n in self.schedule.sites if n != step.target)
        site, dead = self.cluster.sites[step.target], self.cluster.sites[other]
        if not (site.alive and dead.alive) or dead.service is None:
            return
        lease = dead.service.parts.instance.lease
        stale_in = lease.confirmed_at + lease.timeout - lease.now()
        self.cluster.crash(other, "kill")
        self._later(step.lasts, self._restart_site, other, what=f"restart {other}")
        self._later(max(stale_in - 1.0, 0.0), self._submit_held, step, other, what="held POST")

    def _submit_held(self, step: Step, dead: str) -> None:
        if not self.cluster.sites[step.target].alive or self.cluster.sites[dead].alive:
            return
        if self.cluster.upstream_app is None or not self.cluster.upstream_alive:
            return
        fresh = [gid for gid in GIDS if gid not in self._posts_at_create]
        if not fresh:
            return
        self._upstream_rule(step, {"fault": "latency", "params": {"ms": step.param("ms")}})
        self._create(fresh[0], step.target)

    def _do_cut_off_early(self, step: Step) -> None:
        """``step.target`` is paused ``lasts`` seconds and its host loses
        its network ``after`` seconds in: the server ends its sessions, its
        lease lock with them, while its lease is still fresh on its own
        clock.  Only once that clock must call it stale may it be reaped
        (``instances.surely_stale``)."""
        process = self.world.processes.get(step.target)
        idle = process is not None and (process.paused_until or 0) <= self.world.now
        if process is None or not process.alive or not idle:
            return
        self._fired(step.kind)
        process.pause(step.lasts)
        self._later(
            float(step.param("after", 0.0)),
            self.cluster.cut_off,
            step.target,
            process.incarnation,
            what=f"cut off {step.target}",
        )

    def _do_clock_jump(self, step: Step) -> None:
        process = self.world.processes.get(step.target)
        if process is not None and process.alive:
            self._fired(step.kind)
            process.jump_clock(step.param("seconds", 30.0))

    def _do_pause_site(self, step: Step) -> None:
        self._pause(step)

    def _do_pause_node(self, step: Step) -> None:
        self._pause(step)

    def _pause(self, step: Step) -> None:
        process = self.world.processes.get(step.target)
        idle = process is not None and (process.paused_until or 0) <= self.world.now
        if process is not None and process.alive and idle:
            self._fired(step.kind)
            process.pause(step.lasts)

    def _heal_all(self) -> None:
        """After the last fault: every link mended, every process up."""
        network = self.world.network
        network.heal()
        for connection in list(network.connections.values()):
            connection.unstall()
        if self.cluster.upstream_app is not None:
            self.cluster.upstream_app.clear_faults()
        if not self.cluster.upstream_alive:
            self.cluster.start_upstream()
        for name, site in self.cluster.sites.items():
            if not site.alive:
                self.cluster.start_site(name)
        for node_id, node in self.cluster.nodes.items():
            if not node.alive and node_id not in self._gone:
                self.cluster.start_node(node_id)

    # -- settling and the ledger ------------------------------------------------------------

    def _unsettled(self) -> list[str]:
        snap = read_site(self.cluster.db)
        waiting = []
        for gid, op in sorted(snap.operations.items()):
            self._note_deleted(gid, op)
            if op["state"] in SETTLED_STATES:
                continue
            gallery = snap.galleries.get(gid) or {}
            if op["state"] == "SUBMITTED" and gallery.get("status") == 4:
                continue
            if self._stranded(op, gallery):
                continue
            if op["state"] == "SUBMITTED" and not op.get("archive_url") and not op.get("legacy"):
                # Resolved "submitted" with no archive URL known: metered,
                # never dispatchable, shown with a warning for an operator.
                continue
            waiting.append(f"gid {gid} {op['state']} status {gallery.get('status')}")
        pending = [r for r in snap.outbox if r.get("webhook_state") == "pending"]
        if pending:
            waiting.append(f"{len(pending)} notification(s) undelivered")
        live = self.cluster.live_instances()
        for node in self.cluster.nodes.values():
            if not node.alive:
                continue
            session = snap.node_sessions.get(node.node_id) or {}
            if not session.get("connected_at") or session.get("instance_id") not in live:
                waiting.append(f"{node.node_id}: not logged in at a live site")
            elif _has_unacked(node):
                waiting.append(f"{node.node_id}: a report unacknowledged")
        waiting += [f"{n}: an inventory not acknowledged whole" for n in self.inventories.waiting()]
        return waiting

    def _stranded(self, op: dict[str, Any], gallery: dict[str, Any]) -> bool:
        """A task a node gone for good leaves waiting, as it would in
        production until an operator retires the node: its delete (only the
        node that holds the files confirms one), and, on a site that cannot
        move tasks (no ``--reassign-after``: what issue 34 builds), any."""
        if gallery.get("node_id") not in self._gone:
            return False
        return op["state"] == "DELETE_PENDING" or not self.cluster.site_reassigns

    def _left_behind(self, snap: SiteSnapshot) -> list[str]:
        """:func:`~tasknet.sim.custody.left_behind`, on a site that moves tasks."""
        if not self.cluster.site_reassigns:
            return []
        return left_behind(self._stranded_tasks, snap.operations, snap.galleries)

    def _unheld_completions(
        self, snap: SiteSnapshot, holdings: dict[str, set[tuple[int, str]]], judged: set[str]
    ) -> list[str]:
        """D3's archive clause, once settled (:mod:`tasknet.sim.custody`)."""
        notes = {}
        for node_id, times in self.cluster.ledger.wiped_at.items():
            at = ", ".join(f"{t - self.world.epoch:.1f} s" for t in times)
            notes[node_id] = f"{node_id} wiped or restored from a backup at {at}"
        # A liar's claim stands until its next connection's inventory (tasknet.sim.liar).
        excused = self.lies.excused(self.world.network.connections)
        return unheld_completions(
            snap.operations, snap.galleries, holdings, judged, notes, excused=excused
        )

    def _settled_now(self) -> bool:
        return not self._open_requests and not self._unsettled()

    def _unsettled_detail(self) -> str:
        waiting = self._unsettled()
        if self._open_requests:
            waiting.insert(0, f"{self._open_requests} request(s) unanswered")
        return (
            f"not settled {self.schedule.settle_within:.0f} s after the last heal: "
            + "; ".join(waiting[:4])
            + (f" (+{len(waiting) - 4} more)" if len(waiting) > 4 else "")
        )

    def _finish_ledger(self, evidence: Any) -> None:
        ledger = self.cluster.ledger
        ops = evidence.site.operations
        # Every generation ever metered (the cluster's witness): one no
        # longer current was replaced by a re-create and carried its cost
        # into weekly_usage (D2).
        for gid, operation_id, cost in sorted(self.checks.rows(METERED_SQL)):
            current = ops.get(gid)
            if current is None or current["operation_id"] != operation_id:
                ledger.carried_cost += int(cost or 0)
        for gid, op in ops.items():
            self._note_deleted(gid, op)
        ledger.deleted = set(self._seen_deleted)
        # A node gone for good waits for no ACK any more: the report it had
        # in flight when it went is not "unacknowledged after settling" (D6).
        for node_id in sorted(self._gone):
            if node_id in evidence.nodes:
                evidence.nodes[node_id] = replace(evidence.nodes[node_id], in_flight=None)

    def _note_deleted(self, gid: int, op: dict[str, Any]) -> None:
        """A gid seen DELETED must stay so (D4), unless a create sent before
        that sight may still land: one not answered yet, or never (a
        timed-out request may still be carried out by the site)."""
        if op["state"] == "DELETED" and not self._creates_open.get(gid):
            self._seen_deleted.add(gid)


def _already_exists(document: Any) -> bool:
    """A 409 that refused the create because the gid has a task: no
    generation started.  (A create whose own generation was changed by
    another request before it answered, "changed while it was being
    created", did start one: an operator's verdict may have released it
    after its POST; seed 34.)"""
    error = document.get("error") if isinstance(document, dict) else None
    message = error.get("message", "") if isinstance(error, dict) else ""
    return "already has a task" in str(message)


def _has_unacked(node: Any) -> bool:
    from tasknet.drill.snapshot import read_node

    return read_node(node.node_id, node.data).in_flight is not None
