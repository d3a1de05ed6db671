"""D9 and D10 (several sites on one database) on real databases, SQLite
and PostgreSQL: each check passes on a sound state and FAILs, with evidence
that names the instance, the node or the task, on the breakage it exists to
catch.  The states are written with the site's own storage transactions
(instances, reaps, node sessions), the site processes' lifetimes as the
drill records them (``Ledger.site_runs``)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tasknet.drill.invariants import FAIL, NA, PASS, Ledger, World, check_d9, check_d10, db_time
from tasknet.drill.snapshot import read_node, read_site
from tasknet.node.paths import DataDir
from tasknet.site.storage import create, instances, node_sessions, reaping, users
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.storage.engine.schema import prepare_database

GID = 4242
WEEK = "2026-W49"
SITE_A, SITE_B = "site-a", "site-b"
PID_A, PID_B = 1101, 1102


def write(target: str, fn: Any, *args: Any) -> Any:
    """One write transaction of the site's storage code on ``target``."""
    conn = connect(target)
    try:
        return run_write(conn, fn, *args)
    finally:
        conn.close()


@pytest.fixture
def site(db_target: str) -> str:
    """A site database at schema v4 with the demo user and two instances
    (1: site-a, 2: site-b)."""
    prepare_database(db_target)
    write(db_target, lambda cur: users.create_user(cur, "demo", admin=True, token="demo"))
    assert write(db_target, instances.register, SITE_A, "host", PID_A) == 1
    assert write(db_target, instances.register, SITE_B, "host", PID_B) == 2
    return db_target


def run(site_name: str, pid: int, started: float, ended: float | None) -> dict[str, Any]:
    how = None if ended is None else "SIGKILL"
    return {"site": site_name, "pid": pid, "started": started, "ended": ended, "how": how}


def submitting(target: str, gid: int, instance_id: int) -> str:
    """A generation of ``gid`` in flight (SUBMITTING) written by ``instance_id``."""

    def begin(cur: Any) -> str:
        user = users.get_user(cur, "demo")
        assert user is not None
        operation_id = create.reserve(cur, gid, user.id, "demo", "tok", WEEK, instance_id)
        assert create.begin_submit(cur, gid, operation_id, 3, "t", WEEK, 10, instance_id)
        return operation_id

    return str(write(target, begin))


def submitted(target: str, gid: int, instance_id: int) -> str:
    operation_id = submitting(target, gid, instance_id)
    assert write(target, create.persist_submitted, gid, operation_id, "http://a/x.zip", 3, WEEK)
    return operation_id


def world(
    target: str,
    runs: list[dict[str, Any]],
    *,
    nodes: dict[str, Path] | None = None,
    listings: dict[str, list[dict[str, Any]]] | None = None,
    links: dict[str, dict[str, int]] | None = None,
    observed_at: float | None = None,
) -> World:
    nodes = nodes or {}
    return World(
        site=read_site(target),
        nodes={n: read_node(n, d) for n, d in nodes.items()},
        node_dirs=dict(nodes),
        upstream_stats={"posts": {}},
        journal=[],
        frames=[],
        webhook=None,
        ledger=Ledger(site_runs=runs),
        site_listings=listings or {},
        node_links=links or {},
        live_nodes=set(nodes),
        observed_at=observed_at if observed_at is not None else time.time(),
    )


# -- D9 --------------------------------------------------------------------------------


def test_d9_passes_and_shows_who_reaped_what_when(site: str) -> None:
    operation_id = submitting(site, GID, 2)
    started = time.time() - 20
    killed = time.time() - 0.5
    write(site, reaping.reap, 2, 1)
    runs = [run(SITE_A, PID_A, started, None), run(SITE_B, PID_B, started, killed)]
    verdict = check_d9(world(site, runs))
    assert verdict.status == PASS, verdict
    [entry] = verdict.evidence
    assert entry["gid"] == GID and entry["operation_id"] == operation_id
    assert (entry["instance"], entry["instance_site"]) == (2, SITE_B)
    assert (entry["reaped_by"], entry["reaped_by_site"]) == (1, SITE_A)
    assert (entry["from_state"], entry["outcome"]) == ("SUBMITTING", "UNKNOWN")
    assert 0 <= entry["seconds_after_death"] < 30


def test_d9_fails_when_a_live_sites_submission_was_settled(site: str) -> None:
    submitting(site, GID, 2)
    write(site, reaping.reap, 2, 1)  # site-b is alive: its lease was never gone
    started = time.time() - 20
    runs = [run(SITE_A, PID_A, started, None), run(SITE_B, PID_B, started, None)]
    verdict = check_d9(world(site, runs))
    assert verdict.status == FAIL
    assert verdict.detail == (
        f"gid {GID}: SUBMITTING of instance 2 ({SITE_B}, pid {PID_B}) settled by"
        f" instance 1 ({SITE_A}, pid {PID_A}) while its site was alive"
    )
    assert verdict.evidence[0]["reap"]["reaped_by"] == 1


def test_d9_a_stopped_site_whose_lease_was_ended_counts_as_gone(site: str) -> None:
    """S23: site-b's process lives on, stopped, after the drill ended its
    lease by hand; reaping it from then on is right, before it is not."""
    submitting(site, GID, 2)
    started = time.time() - 20
    fenced = run(SITE_B, PID_B, started, None)
    fenced["fenced"] = time.time() - 1.0
    write(site, reaping.reap, 2, 1)
    verdict = check_d9(world(site, [run(SITE_A, PID_A, started, None), fenced]))
    assert verdict.status == PASS, verdict
    [entry] = verdict.evidence
    assert 0.5 < entry["seconds_after_death"] < 30
    # It resumed and exited later: the lease's end still counts as its death.
    fenced["ended"], fenced["how"] = time.time() + 5, "exited"
    assert check_d9(world(site, [run(SITE_A, PID_A, started, None), fenced])).status == PASS
    # Reaped before the drill ended its lease: a live site's submission settled.
    fenced["fenced"] = time.time() + 2
    verdict = check_d9(world(site, [run(SITE_A, PID_A, started, None), fenced]))
    assert verdict.status == FAIL and "while its site was alive" in verdict.detail


def test_d9_fails_when_a_dead_sites_submission_was_settled_late(site: str) -> None:
    submitting(site, GID, 2)
    # Read before the reap writes its time: a loaded machine's commit must
    # not make the reap look earlier than 100 s after the kill.
    before = time.time()
    write(site, reaping.reap, 2, 1)
    started = before - 200
    killed = before - 100  # site-a ran all along: it had 30 s to do it
    runs = [run(SITE_A, PID_A, started, None), run(SITE_B, PID_B, started, killed)]
    verdict = check_d9(world(site, runs))
    assert verdict.status == FAIL
    assert "settled 100." in verdict.detail and "s after its site died" in verdict.detail


def test_d9_a_single_site_restarted_later_has_30_s_from_its_start(site: str) -> None:
    submitting(site, GID, 2)
    write(site, reaping.reap, 2, 1)
    # site-b died 100 s ago, alone; site-a (its next run, say) started 5 s ago.
    runs = [
        run(SITE_B, PID_B, time.time() - 200, time.time() - 100),
        run(SITE_A, PID_A, time.time() - 5, None),
    ]
    assert check_d9(world(site, runs)).status == PASS


def test_d9_fails_when_a_dead_instance_is_left_in_flight(site: str) -> None:
    submitting(site, GID, 2)  # never reaped
    started = time.time() - 200
    runs = [run(SITE_A, PID_A, started, None), run(SITE_B, PID_B, started, time.time() - 60)]
    verdict = check_d9(world(site, runs))
    assert verdict.status == FAIL
    whats = [item["what"] for item in verdict.evidence]
    assert any("generation(s) still ['SUBMITTING'] past the bound" in w for w in whats)
    assert any("was not reaped within 30 s" in w for w in whats)
    assert verdict.evidence[0]["operations"][0]["gid"] == GID
    # Not yet due: judged only once 30 s passed after another site could reap it.
    early = world(site, runs, observed_at=runs[1]["ended"] + 10)
    assert check_d9(early).status == PASS


def test_d9_fails_for_a_reap_of_an_instance_the_drill_never_ran(site: str) -> None:
    submitting(site, GID, 2)
    write(site, reaping.reap, 2, 1)
    verdict = check_d9(world(site, [run(SITE_A, PID_A, time.time() - 20, None)]))
    assert verdict.status == FAIL
    assert "that instance is no site run of the drill" in verdict.detail


def test_d9_passes_when_a_site_starts_beside_a_live_one_and_settles_nothing(
    site: str,
) -> None:
    submitting(site, GID, 1)  # site-a's submission in flight while site-b starts
    started = time.time() - 20
    runs = [run(SITE_A, PID_A, started, None), run(SITE_B, PID_B, started + 10, None)]
    verdict = check_d9(world(site, runs))
    assert verdict.status == PASS and verdict.evidence == []


def test_d9_is_not_applicable_while_no_instance_died_or_joined(db_target: str) -> None:
    prepare_database(db_target)
    write(db_target, instances.register, SITE_A, "host", PID_A)
    verdict = check_d9(world(db_target, [run(SITE_A, PID_A, time.time() - 20, None)]))
    assert verdict.status == NA
    assert verdict.detail == "no site instance died or started beside another"


def test_db_time_reads_what_the_database_writes(site: str) -> None:
    write(site, reaping.reap, 2, 1)
    row = read_site(site).instances[2]
    assert row["reaped_at"] is not None
    assert abs(db_time(row["reaped_at"]) - time.time()) < 60  # type: ignore[operator]
    assert db_time(None) is None and db_time("not a time") is None


# -- D10 -------------------------------------------------------------------------------


def node_dir(tmp_path: Path, node_id: str, downloads: tuple[tuple[int, str], ...] = ()) -> Path:
    """A node data directory whose database received ``downloads`` (gid, operationId)."""
    data = DataDir(tmp_path / node_id)
    data.create()
    conn = sqlite3.connect(data.database)
    conn.executescript(
        "CREATE TABLE task (gid INTEGER PRIMARY KEY, operation_id TEXT, status INTEGER);"
        "CREATE TABLE deletion (gid INTEGER PRIMARY KEY, operation_id TEXT, result TEXT);"
        "CREATE TABLE in_flight_report (id INTEGER PRIMARY KEY, report_id TEXT,"
        " revision INTEGER, body TEXT, created_at REAL);"
        "CREATE TABLE received_command (id INTEGER PRIMARY KEY AUTOINCREMENT, gid INTEGER,"
        " operation_id TEXT, action TEXT, protocol INTEGER, received_at REAL);"
    )
    for gid, operation_id in downloads:
        conn.execute(
            "INSERT INTO received_command (gid, operation_id, action, protocol, received_at)"
            " VALUES (?, ?, 'DOWNLOAD', 2, 1.0)",
            (gid, operation_id),
        )
    conn.commit()
    conn.close()
    return data.root


def held(target: str, node_id: str, instance_id: int, site_name: str) -> None:
    write(
        target, node_sessions.take, node_id, instance_id, site_name, 2, [], "2026-12-01T00:00:00Z"
    )


def listed(node_id: str, holder: str | None) -> dict[str, Any]:
    return {"id": node_id, "connected": holder is not None, "site": holder}


ALIVE = [run(SITE_A, PID_A, 0.0, None), run(SITE_B, PID_B, 0.0, None)]


def test_d10_passes_when_each_node_has_one_holder(site: str, tmp_path: Path) -> None:
    held(site, "n1", 1, SITE_A)
    verdict = check_d10(
        world(
            site,
            ALIVE,
            nodes={"n1": node_dir(tmp_path, "n1")},
            listings={SITE_A: [listed("n1", SITE_A)], SITE_B: [listed("n1", SITE_A)]},
            links={"n1": {SITE_A: 1, SITE_B: 0}},
        )
    )
    assert verdict.status == PASS, verdict


def test_d10_fails_when_two_sites_each_claim_the_node(site: str, tmp_path: Path) -> None:
    held(site, "n1", 1, SITE_A)
    verdict = check_d10(
        world(
            site,
            ALIVE,
            nodes={"n1": node_dir(tmp_path, "n1")},
            listings={SITE_A: [listed("n1", SITE_A)], SITE_B: [listed("n1", SITE_B)]},
            links={"n1": {SITE_A: 1, SITE_B: 0}},
        )
    )
    assert verdict.status == FAIL
    assert verdict.detail == f"{SITE_B} shows n1 held by ['{SITE_B}'], node_session says {SITE_A}"


def test_d10_fails_when_an_older_connection_stays_open(site: str, tmp_path: Path) -> None:
    held(site, "n1", 2, SITE_B)  # the newest login won at site-b; site-a never closed its own
    verdict = check_d10(
        world(
            site,
            ALIVE,
            nodes={"n1": node_dir(tmp_path, "n1")},
            listings={SITE_A: [listed("n1", SITE_B)], SITE_B: [listed("n1", SITE_B)]},
            links={"n1": {SITE_A: 1, SITE_B: 1}},
        )
    )
    assert verdict.status == FAIL
    assert verdict.detail.startswith("n1 has 2 open connection(s)")
    assert verdict.evidence[0]["open_links"] == {SITE_A: 1, SITE_B: 1}


def test_d10_fails_when_a_node_is_listed_twice(site: str, tmp_path: Path) -> None:
    held(site, "n1", 1, SITE_A)
    verdict = check_d10(
        world(site, ALIVE, listings={SITE_A: [listed("n1", SITE_A), listed("n1", SITE_A)]})
    )
    assert verdict.status == FAIL and verdict.detail == f"{SITE_A} lists n1 2 times"


def test_d10_fails_when_a_dead_instance_still_holds_the_node(site: str, tmp_path: Path) -> None:
    held(site, "n1", 2, SITE_B)
    runs = [run(SITE_A, PID_A, 0.0, None), run(SITE_B, PID_B, 0.0, time.time() - 60)]
    verdict = check_d10(world(site, runs, nodes={"n1": node_dir(tmp_path, "n1")}))
    assert verdict.status == FAIL
    assert verdict.detail == f"n1 held by instance 2 ({SITE_B}, pid {PID_B}), which is not running"


def test_d10_fails_when_a_running_node_is_held_by_no_site(site: str, tmp_path: Path) -> None:
    verdict = check_d10(world(site, ALIVE, nodes={"n1": node_dir(tmp_path, "n1")}))
    assert (
        verdict.status == FAIL and verdict.detail == "n1 runs, but no site holds it (node_session)"
    )


def test_d10_fails_when_a_task_went_to_two_nodes(site: str, tmp_path: Path) -> None:
    operation_id = submitted(site, GID, 1)
    held(site, "n1", 1, SITE_A)
    held(site, "n2", 2, SITE_B)
    nodes = {
        "n1": node_dir(tmp_path, "n1", ((GID, operation_id),)),
        "n2": node_dir(tmp_path, "n2", ((GID, operation_id),)),
    }
    verdict = check_d10(world(site, ALIVE, nodes=nodes))
    assert verdict.status == FAIL
    assert verdict.detail == f"gid {GID}: operation {operation_id} on 2 nodes (n1, n2)"
    # One node only: it holds the one task it was sent.
    nodes["n2"] = node_dir(tmp_path / "other", "n2")
    assert check_d10(world(site, ALIVE, nodes=nodes)).status == PASS


def test_d10_is_not_applicable_without_nodes_or_tasks(site: str) -> None:
    assert check_d10(world(site, ALIVE)).status == NA
