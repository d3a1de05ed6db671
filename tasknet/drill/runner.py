"""Run scenarios: fresh cluster (and site database) per run, fault, settle,
evidence, verdicts."""

from __future__ import annotations

import random
import shutil
import time
import traceback
from pathlib import Path

from tasknet.drill import reactor_thread
from tasknet.drill.cluster import Cluster
from tasknet.drill.databases import Databases, SqliteFiles, run_database_name
from tasknet.drill.expect import Expect
from tasknet.drill.invariants import FAIL, INVARIANTS, Verdict, check_all
from tasknet.drill.netns import Netns
from tasknet.drill.procs import DrillError, wait_for
from tasknet.drill.report import Progress, RunResult
from tasknet.drill.scenarios import Scenario
from tasknet.drill.snapshot import read_node, read_site

COMPLETED_CODE = 4


def _settled(cluster: Cluster, pending: list[str]) -> bool:
    """The system has converged: nothing unacknowledged, completions shown, outbox drained."""
    pending.clear()
    site_alive = bool(cluster.live_sites())
    if site_alive:
        connected = cluster.connected_nodes()
        for node in cluster.nodes.values():
            if node.proc.alive and node.id not in connected:
                pending.append(f"{node.id} not connected")
    site = read_site(cluster.db) if cluster.db_exists() else None
    for node in cluster.nodes.values():
        if not node.proc.alive:
            continue
        links = node.open_links()
        if site_alive and sum(links.values()) > 1:
            pending.append(f"{node.id} has connections open to several sites {links}")
        snap = read_node(node.id, node.data)
        if snap.in_flight is not None:
            pending.append(f"{node.id} report {snap.in_flight['report_id']} unacknowledged")
        if site is None:
            continue
        for gid, task in snap.tasks.items():
            op = site.operations.get(gid) or {}
            shown = (site.galleries.get(gid) or {}).get("status")
            if (
                task["status"] == COMPLETED_CODE
                and op.get("state") == "SUBMITTED"
                and op.get("operation_id") == task["operation_id"]
                and shown != COMPLETED_CODE
            ):
                pending.append(f"gid {gid} complete on {node.id}, not yet at the site")
    if site is not None and site_alive and cluster.webhook is not None:
        waiting = [r["id"] for r in site.outbox if r.get("webhook_state") == "pending"]
        if waiting:
            pending.append(f"{len(waiting)} notification(s) not yet delivered")
    return not pending


def settle(cluster: Cluster, timeout: float, x: Expect) -> None:
    pending: list[str] = []
    x.step("settling")
    try:
        wait_for(lambda: _settled(cluster, pending), timeout, "the system to settle")
    except DrillError as err:
        x.that(False, f"did not settle in {timeout:.0f}s: {'; '.join(pending) or err}")


def run_one(
    scenario: Scenario,
    run: int,
    root: Path,
    *,
    keep: bool,
    progress: Progress,
    seed: int,
    netns: Netns | None = None,
    databases: Databases | None = None,
) -> RunResult:
    directory = root / f"{scenario.id}-{run}"
    databases = databases or SqliteFiles()
    x = Expect(progress.update)
    progress.begin(f"{scenario.id}#{run}")
    started = time.monotonic()
    try:
        database = databases.new(run_database_name(scenario.id, run), directory)
    except Exception as err:  # noqa: BLE001 - this run fails, the session goes on
        x.crashed(DrillError(f"could not create the run's site database: {err}"))
        missing = [Verdict(d, FAIL, "not run: no site database") for d in INVARIANTS]
        result = RunResult(
            scenario.id, scenario.title, run, [x.verdict(), *missing], time.monotonic() - started
        )
        progress.end(result)
        return result
    cluster = Cluster(directory, netns, database)
    rng = random.Random(f"{seed}:{scenario.id}:{run}")
    verdicts: list[Verdict] = []
    proxies: dict[str, object] = {}
    try:
        try:
            scenario.run(cluster, x, rng)
        except Exception as err:  # noqa: BLE001 - any error is a failed run, reported
            x.crashed(err)
            if not isinstance(err, DrillError):
                x.failures[-1]["traceback"] = traceback.format_exc()
        if cluster.sites:
            settle(cluster, scenario.settle, x)
        x.step("checking invariants")
        try:
            world = cluster.observe()
            verdicts = check_all(world)
        except Exception as err:  # noqa: BLE001
            verdicts = [
                Verdict(d, FAIL, f"could not gather evidence: {type(err).__name__}: {err}")
                for d in INVARIANTS
            ]
        try:
            proxies = cluster.proxy_stats()
        except Exception:  # noqa: BLE001 - evidence only
            proxies = {}
    finally:
        cluster.shutdown()
    result = RunResult(
        scenario=scenario.id,
        title=scenario.title,
        run=run,
        verdicts=[x.verdict(), *verdicts],
        seconds=time.monotonic() - started,
        logs=cluster.logs(),
        proxies=proxies,
        ledger=cluster.ledger.to_json(),
    )
    # Keep what a post-mortem needs: everything with --keep, failed runs always.
    kept = keep or result.failed
    try:
        databases.release(database, keep=kept)
    except Exception as err:  # noqa: BLE001 - cleanup only; the verdicts stand
        progress.update(f"could not drop the run's database: {err}")
    if kept:
        result.directory = str(directory)
        result.database = database.target
    else:
        shutil.rmtree(directory, ignore_errors=True)
        result.logs = {}
    progress.end(result)
    return result


def run_all(
    scenarios: list[Scenario],
    repeat: int,
    root: Path,
    *,
    keep: bool,
    progress: Progress,
    seed: int,
    netns: Netns | None = None,
    databases: Databases | None = None,
) -> list[RunResult]:
    # The reactor thread enters the nodes' namespace once: the namespaces
    # (created by the caller) must live for the whole session.
    reactor_thread.start(netns.nodes if netns is not None else None)
    results: list[RunResult] = []
    for run in range(1, repeat + 1):
        for scenario in scenarios:
            results.append(
                run_one(
                    scenario,
                    run,
                    root,
                    keep=keep,
                    progress=progress,
                    seed=seed,
                    netns=netns,
                    databases=databases,
                )
            )
    return results
