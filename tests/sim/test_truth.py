"""The checks against the world's truth (issue 39) and the checks' own gaps.

Each check is shown to fail, with a clear message, on a world state or a
trace made by hand that breaks it; the runs show the faults that make those
failures reachable fire and are survived by the unmodified code.
"""

from __future__ import annotations

import re
import sqlite3
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tasknet.sim.liar import LyingNodes
from tasknet.sim.run import Outcome, run_schedule
from tasknet.sim.schedule import FAULT_KINDS, IN_FLIGHT_POINTS, Schedule, Step, generate
from tasknet.sim.truth import LatePosts, archive_mismatches, reap_of_live, unaccounted_charges
from tasknet.sim.world import World
from tasknet.upstream import catalog


def plant_a_state_outside_the_table(db: str) -> None:
    """What no site can write (the CHECK and the transition triggers refuse
    it), written behind the site's back: the check must still see it."""
    connection = sqlite3.connect(db)
    try:
        connection.execute("PRAGMA ignore_check_constraints = ON")
        for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'task_operation'"
        ).fetchall():
            connection.execute(f'DROP TRIGGER "{name}"')
        gid = connection.execute("SELECT MIN(gid) FROM task_operation").fetchone()[0]
        connection.execute("UPDATE task_operation SET state = 'LOST' WHERE gid = ?", (gid,))
        connection.commit()
    finally:
        connection.close()


def test_a_state_outside_the_transition_table_after_the_run_fails_the_seed(
    tmp_path: Path,
) -> None:
    outcome = run_schedule(
        generate(2, faults=("crash_upstream",)),
        workdir=tmp_path,
        before_checks=plant_a_state_outside_the_table,
    )
    assert outcome.failed
    transitions = [d for c, d in outcome.failures if c == "transitions"]
    assert len(transitions) == 1, outcome.failures
    assert "state 'LOST' is not in the table" in transitions[0]
    # Among the first failures the run line names.
    assert outcome.failures[0][0] == "transitions", outcome.failures


def test_with_several_sites_half_the_pauses_at_submitting_stop_only_the_time_check() -> None:
    """Between the upstream timeout (5 s) and the lease timeout (8 s): the
    POST gate's time check, not its lease check, is what stops the POST."""
    pauses = [
        step.lasts
        for seed in range(24)
        for step in generate(seed, sites=2).steps
        if step.kind == "pause_at_submitting" and step.lasts >= 5
    ]
    short = [p for p in pauses if p <= 8]
    assert 6 <= len(short) <= 18 and any(p >= 12 for p in pauses), pauses


# -- every charge accounted ------------------------------------------------------------


def test_a_charge_no_generation_accounts_for_fails() -> None:
    failures = unaccounted_charges({7: 2, 8: 1}, [(7, "a")], [], [])
    assert failures == [
        "gid 7: the upstream charged 2 time(s), but only 1 generation(s) are metered,"
        " UNKNOWN or reconciled: a (metered)",
        "gid 8: the upstream charged 1 time(s), but only 0 generation(s) are metered,"
        " UNKNOWN or reconciled: none",
    ]


def test_a_charge_is_accounted_by_metering_unknown_or_a_verdict_each_generation_once() -> None:
    assert unaccounted_charges({7: 3}, [(7, "a")], [(7, "b")], [(7, "c")]) == []
    # One generation metered and reconciled too still accounts for one charge.
    assert unaccounted_charges({7: 2}, [(7, "a")], [], [(7, "a")]) != []
    assert unaccounted_charges({}, [(7, "a")], [], []) == []


# -- no late POST ----------------------------------------------------------------------


def test_a_post_written_past_the_upstream_timeout_after_its_submitting_commit_fails() -> None:
    late = LatePosts()
    late.submitting("op1", 10.0)
    late.submitting("op1", 12.0)  # still SUBMITTING at a later commit: the first counts
    assert late.post("site", 7, "op1", 15.0, 5.0) is None
    failure = late.post("site", 7, "op1", 16.25, 5.0)
    assert failure == (
        "gid 7: site wrote the POST of operation op1 6.250 s after its SUBMITTING commit"
        " (upstream timeout 5 s)"
    )
    # A generation whose commit was not seen is another check's business.
    assert late.post("site", 8, "op2", 99.0, 5.0) is None
    assert late.post("site", 8, None, 99.0, 5.0) is None


# -- no reap of a live site --------------------------------------------------------------


def test_a_reap_of_an_instance_alive_with_a_fresh_lease_fails() -> None:
    failure = reap_of_live(3, "site2", alive=True, stale_for=None, paused_for=2.5, cut_off=True)
    assert failure == (
        "site instance 3 (site2) was reaped while its process is alive and its lease fresh"
        " on its own clock (paused for 2.500 s, cut off)"
    )
    assert "running and connected" in str(
        reap_of_live(3, "site", alive=True, stale_for=None, paused_for=None, cut_off=False)
    )


def test_a_generation_of_a_live_instance_settled_by_a_reap_fails() -> None:
    failure = reap_of_live(
        4,
        "site",
        alive=True,
        stale_for=None,
        paused_for=None,
        cut_off=False,
        settled="gid 7's SUBMITTING (operation op1)",
    )
    assert failure == (
        "site instance 4 (site) had gid 7's SUBMITTING (operation op1) settled by a reap"
        " while its process is alive and its lease fresh on its own clock (running and connected)"
    )


def test_a_reap_of_a_dead_or_stale_or_former_instance_passes() -> None:
    assert reap_of_live(3, None, alive=True, stale_for=None, paused_for=None, cut_off=False) is None
    assert reap_of_live(3, "s", alive=False, stale_for=None, paused_for=None, cut_off=False) is None
    assert reap_of_live(3, "s", alive=True, stale_for=8.5, paused_for=9.0, cut_off=True) is None


# -- every archive the upstream's bytes ---------------------------------------------------


def node_with_archive(data_dir: Path, gid: int, body: bytes) -> None:
    from tasknet.node.paths import DataDir

    data = DataDir(data_dir)
    data.archives.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(data.archives / f"{gid}.zip", "w") as archive:
        archive.writestr(f"{gid}.bin", body)
    store = sqlite3.connect(data.database)
    store.execute("CREATE TABLE archive (gid INTEGER, operation_id TEXT, file TEXT)")
    store.execute("INSERT INTO archive VALUES (?, 'op1', ?)", (gid, f"{gid}.zip"))
    store.commit()
    store.close()


def test_an_archive_held_as_complete_with_a_short_body_fails(tmp_path: Path) -> None:
    size = catalog.gallery(107).size
    node_with_archive(tmp_path, 107, catalog.archive_slice(107, 0, 1000))
    [failure] = archive_mismatches("n2", tmp_path)
    assert failure.startswith(
        "n2 holds gid 107 (operation op1) as complete, but its archive holds 1000 bytes"
    )
    assert f"not the upstream's {size} bytes" in failure


def test_an_archive_of_the_upstream_s_bytes_passes(tmp_path: Path) -> None:
    node_with_archive(tmp_path, 107, catalog.archive_slice(107, 0, catalog.gallery(107).size))
    assert archive_mismatches("n2", tmp_path) == []


# -- the faults ----------------------------------------------------------------------------


@pytest.mark.parametrize("point", IN_FLIGHT_POINTS)
def test_a_crash_in_flight_strikes_at_each_point_and_the_seed_passes(
    point: str, tmp_path: Path
) -> None:
    """Right after SUBMITTING commits, as the upstream answers an applied
    POST, and once the answer arrived before the persist: after the
    restart every charge is metered, UNKNOWN or reconciled."""
    for seed in range(8):
        schedule = generate(seed, faults=("crash_in_flight",))
        steps = tuple(
            replace(s, params=tuple((k, point if k == "at" else v) for k, v in s.params))
            if s.kind == "crash_in_flight"
            else s
            for s in schedule.steps
        )
        outcome = run_schedule(
            replace(schedule, steps=steps), workdir=tmp_path / str(seed), keep_trace=None
        )
        assert not outcome.failed, (seed, outcome.failures)
        if outcome.faults.get("crash_in_flight"):
            # The POST's answer (or the POST itself) struck it, not a commit.
            struck = any(" in flight" in line for line in outcome.trace)
            assert struck == (point != "submitting"), outcome.trace[-20:]
            return
    pytest.fail(f"no crash at {point} over seeds 0..7")


def test_a_node_s_completion_on_the_wire_when_it_went_for_good_is_not_a_task_left_behind() -> None:
    """Seed 62 (the harness): n3 finished gid 104 and went for good with its
    report on the wire; the site, paused, committed it after.  The task
    was not unfinished (reassign), and no one waits for that report's ACK
    (D6)."""
    outcome = run_schedule(generate(62))
    assert not outcome.failed, outcome.failures


def test_the_truth_faults_leave_the_other_schedules_as_they_were() -> None:
    from tasknet.sim.schedule import TRUTH_FAULT_KINDS

    for seed in range(40):
        every = generate(seed)
        others = generate(seed, faults=tuple(k for k in FAULT_KINDS if k not in TRUTH_FAULT_KINDS))
        assert tuple(s for s in every.steps if s.kind not in TRUTH_FAULT_KINDS) == others.steps
    kinds = {s.kind for seed in range(40) for s in generate(seed).steps}
    assert set(TRUTH_FAULT_KINDS) <= kinds
    for seed in range(10):
        for kind in TRUTH_FAULT_KINDS:
            alone = [s.kind for s in generate(seed, faults=(kind,)).steps if s.is_fault]
            assert alone == [kind]


# -- a node that lies within its rights ----------------------------------------------------


def site_rows(rows: dict[int, tuple[str, str | None]]) -> sqlite3.Connection:
    """A site database by hand: gid -> (state, the gallery's detail)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE task_operation (gid INTEGER, state TEXT)")
    db.execute("CREATE TABLE gallery (gid INTEGER, detail TEXT)")
    for gid, (state, detail) in rows.items():
        db.execute("INSERT INTO task_operation VALUES (?, ?)", (gid, state))
        db.execute("INSERT INTO gallery VALUES (?, ?)", (gid, detail))
    return db


def judge(db: sqlite3.Connection, *lies: tuple[str, str, list[int], str]) -> list[tuple[str, str]]:
    """Each lie (report id, kind, gids, the site's ACK result) told by n2 and
    ACKed by the site: the failures."""
    failures: list[tuple[str, str]] = []
    watch = LyingNodes(
        World(0),
        0,
        lambda sql, params: db.execute(sql, params).fetchone(),
        lambda check, detail: failures.append((check, detail)),
        lambda kind: None,
    )
    watch.make_liar("n2")
    for report_id, kind, gids, result in lies:
        watch.told(report_id, "n2", kind, f"{kind} report {report_id}", gids)
        ack = {"reportId": report_id, "result": result}
        watch.frame({"node": "n2", "type": 13, "direction": "to_client", "link": 1, "payload": ack})
    return failures


def test_a_lie_the_site_applied_fails() -> None:
    db = site_rows({7: ("SUBMITTED", "lie: repeat at revision 5"), 8: ("DELETED", None)})
    assert judge(
        db,
        ("r1", "repeat", [7], "APPLIED"),
        ("r2", "wrong_delete", [8], "APPLIED"),
        ("r3", "replay", [], "APPLIED"),
    ) == [
        ("lie-applied", "n2's repeat report r1: gid 7 now shows 'lie: repeat at revision 5'"),
        (
            "lie-applied",
            "n2's wrong_delete report r2: gid 8 DELETED by a confirmation of another delete id",
        ),
        ("lie-applied", "n2's replay report r3: ACKed APPLIED, not DUPLICATE"),
    ]


def test_a_lie_the_site_dropped_passes() -> None:
    db = site_rows({7: ("SUBMITTED", "retrying in 8 s"), 8: ("DELETE_PENDING", None)})
    assert (
        judge(
            db,
            ("r1", "foreign", [7], "APPLIED"),
            ("r2", "wrong_delete", [8], "APPLIED"),
            ("r3", "replay", [], "DUPLICATE"),
        )
        == []
    )


def test_a_lie_s_mark_left_on_a_task_at_the_end_fails(tmp_path: Path) -> None:
    def plant(db: str) -> None:
        connection = sqlite3.connect(db)
        connection.execute("UPDATE gallery SET detail = 'lie: lower at revision 3'")
        connection.commit()
        connection.close()

    outcome = run_schedule(
        generate(2, faults=("liar_node",)), workdir=tmp_path, before_checks=plant
    )
    lies = [d for c, d in outcome.failures if c == "lie-applied"]
    assert lies and "shows a lie's 'lie: lower at revision 3'" in lies[0], outcome.failures


def _claims(outcome: Outcome) -> list[tuple[int, float]]:
    """(gid, simulated second) of each completion a liar claimed, from the trace."""
    claims = []
    for line in outcome.trace:
        found = re.match(r"(\d+) fault \S+ lies: complete .* naming gid\(s\) \[(\d+)\]", line)
        if found:
            claims.append((int(found[2]), int(found[1]) / 1e6))
    return claims


def _run_reading_tasks(
    schedule: Schedule, tmp_path: Path, plant: Callable[[sqlite3.Connection], None] | None = None
) -> tuple[Outcome, dict[int, tuple[Any, ...]]]:
    """Run ``schedule`` keeping its trace; the outcome and every task as
    the run left it: gid -> (status, archive_gone_reason, state)."""
    tasks: dict[int, tuple[Any, ...]] = {}

    def read(db: str) -> None:
        connection = sqlite3.connect(db)
        for gid, *row in connection.execute(
            "SELECT g.gid, g.status, g.archive_gone_reason, o.state FROM gallery g"
            " JOIN task_operation o ON o.gid = g.gid"
        ):
            tasks[gid] = tuple(row)
        if plant is not None:
            plant(connection)
            connection.commit()
        connection.close()

    outcome = run_schedule(schedule, workdir=tmp_path, before_checks=read, keep_trace=None)
    return outcome, tasks


def test_a_completion_claimed_without_a_download_is_the_site_s_to_believe(
    tmp_path: Path,
) -> None:
    """The site shows it 下载完成 (it cannot tell), no node holds it, and
    while the connection it was told on lasts the custody check excuses it;
    every fetch of it is refused, none answered with bytes."""
    outcome, tasks = _run_reading_tasks(generate(2, faults=("liar_node",)), tmp_path)
    assert not outcome.failed, outcome.failures
    [(gid, _at)] = _claims(outcome)
    assert tasks[gid] == (4, None, "SUBMITTED")
    answers = [line for line in outcome.trace if f" fetch site gid {gid} " in line and ": " in line]
    assert answers, f"gid {gid} never fetched"
    assert not any(" 200" in a.split(": ", 1)[1] for a in answers), answers


def test_a_claim_the_site_dropped_gives_the_node_its_command_after_all(tmp_path: Path) -> None:
    """Seed 250's liar claims gid 126 at a revision an honest report in
    flight overtook (dropped: ``stale``); the DOWNLOAD kept from the node is
    then given to it, so the task is downloaded rather than stuck unseen."""
    outcome, tasks = _run_reading_tasks(generate(250), tmp_path)
    assert not outcome.failed, outcome.failures
    assert any("claim of gid 126 dropped: command given" in line for line in outcome.trace)
    assert tasks[126][0] == 4


def test_a_claimed_completion_is_missing_after_the_liar_s_next_inventory(
    tmp_path: Path,
) -> None:
    """The liar restarts after its lie: the inventory of its next connection
    lacks the generation, so the site makes it ARCHIVE_GONE (MISSING); were
    it still shown 下载完成, the custody check would fail."""
    schedule = generate(16, faults=("liar_node",))
    outcome, _ = _run_reading_tasks(schedule, tmp_path / "told")
    [(gid, at)] = _claims(outcome)
    crash = Step(round(at + 1, 3), "crash_node", "n2", lasts=3.0)
    crashed = replace(schedule, steps=tuple(sorted((*schedule.steps, crash), key=lambda s: s.at)))
    outcome, tasks = _run_reading_tasks(crashed, tmp_path / "crashed")
    assert not outcome.failed, outcome.failures
    assert tasks[gid] == (4, "MISSING", "SUBMITTED")

    def unmark(connection: sqlite3.Connection) -> None:
        connection.execute("UPDATE gallery SET archive_gone_reason = NULL WHERE gid = ?", (gid,))

    outcome, _ = _run_reading_tasks(crashed, tmp_path / "unmarked", unmark)
    custody = [d for c, d in outcome.failures if c == "custody"]
    assert custody and custody[0].startswith(f"gid {gid}: the site shows COMPLETED"), (
        outcome.failures
    )


# -- the reaper faults of several sites on PostgreSQL --------------------------------------


@pytest.mark.parametrize("kind", ["reap_in_flight", "cut_off_early"])
def test_each_reaper_fault_fires_on_postgresql_and_is_survived(kind: str, tmp_path: Path) -> None:
    """A reap while the live site has a SUBMITTING in flight, and a site
    whose lease lock is free while its lease is fresh: the unmodified
    reaper touches neither (``reap-of-live`` judges every reap)."""
    from tests.sim.test_world import require_postgres, run_json

    require_postgres()
    done, report = run_json(tmp_path, "--db", "postgres", "--seeds", "0..3", "--faults", kind)
    failing = [s for s in report["seeds"] if s["failed"]]
    assert not failing, done.stdout[-4000:]
    fired = sum(s["faults"].get(kind, 0) for s in report["seeds"])
    assert fired > 0, f"{kind} never fired over seeds 0..3: {report['seeds']}"


def test_the_reaper_faults_leave_the_other_schedules_as_they_were() -> None:
    from tasknet.sim.schedule import POSTGRES_FAULT_KINDS

    for seed in range(24):
        every = generate(seed, faults=FAULT_KINDS + POSTGRES_FAULT_KINDS, sites=2)
        others = generate(seed, faults=FAULT_KINDS, sites=2)
        kept = tuple(s for s in every.steps if s.kind not in POSTGRES_FAULT_KINDS)
        assert kept == others.steps
        # One site: none drawn.
        assert generate(seed, faults=FAULT_KINDS + POSTGRES_FAULT_KINDS) == generate(seed)
