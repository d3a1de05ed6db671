"""Shrinking a failing schedule (``tasknet-sim shrink``).

Delta debugging over the schedule's steps: remove chunks of steps (halves,
then quarters, down to one step at a time) while the run still fails one
of the checks the original failure failed; the faults go first, then the
workload.  What is left is the smallest schedule found that still fails,
for a person to read (:meth:`~tasknet.sim.schedule.Schedule.describe`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tasknet.sim.run import Outcome
from tasknet.sim.schedule import Schedule

__all__ = ["Shrunk", "shrink"]


@dataclass
class Shrunk:
    schedule: Schedule
    outcome: Outcome
    runs: int


def shrink(
    schedule: Schedule,
    run: Callable[[Schedule], Outcome],
    *,
    max_runs: int = 400,
    progress: Callable[[str], None] | None = None,
) -> Shrunk | None:
    """The smallest schedule found that fails as ``schedule`` does
    (None: ``schedule`` does not fail)."""
    first = run(schedule)
    if not first.failed:
        return None
    wanted = first.failed_checks()
    best, best_outcome, runs = schedule, first, 1

    def still_fails(candidate: Schedule) -> Outcome | None:
        nonlocal runs
        runs += 1
        outcome = run(candidate)
        return outcome if outcome.failed_checks() & wanted else None

    for faults_only in (True, False):
        chunk = max(1, len(best.steps) // 2)
        while chunk >= 1 and runs < max_runs:
            removed_any = False
            start = 0
            while start < len(best.steps) and runs < max_runs:
                indexes = {
                    i
                    for i in range(start, min(start + chunk, len(best.steps)))
                    if best.steps[i].is_fault or not faults_only
                }
                if not indexes:
                    start += chunk
                    continue
                candidate = best.without(indexes)
                outcome = still_fails(candidate)
                if outcome is not None:
                    best, best_outcome, removed_any = candidate, outcome, True
                    if progress is not None:
                        progress(f"{len(best.steps)} steps still fail ({runs} runs)")
                else:
                    start += chunk
            if not removed_any:
                chunk //= 2
    return Shrunk(best, best_outcome, runs)
