"""The checks against the world's truth (issue 39) and the checks' own gaps.

Each check is shown to fail, with a clear message, on a world state or a
trace made by hand that breaks it; the runs show the faults that make those
failures reachable fire and are survived by the unmodified code.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tasknet.sim.run import run_schedule
from tasknet.sim.schedule import generate


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
