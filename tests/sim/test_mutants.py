"""The planted bugs stay caught (issue 39, item 3).

Each mutant of ``tests/sim/mutants/`` is applied to a scratch copy of
``tasknet/`` and only its recorded first catching seed is run (the full
blocks are ``python -m tests.sim.mutants run``): the seed must fail, naming
the recorded check.  A mutant with no recorded seed fails the suite unless
it says why it is expected to survive (``expected_uncaught``), and every
patch must still apply to the tree, or it measures nothing.
"""

from __future__ import annotations

import pytest

from tests.sim.mutants import Mutant, applies, load, patched, run, simulate
from tests.sim.test_world import require_postgres

MUTANTS = load()


def test_every_patch_still_applies_to_the_tree() -> None:
    stale = {m.name: why for m in MUTANTS if (why := applies(m)) is not None}
    assert not stale, f"patches that no longer apply (edit them again): {stale}"


def test_every_mutant_is_caught_or_says_why_not() -> None:
    missing = [m.name for m in MUTANTS if m.first_seed is None and not m.expected_uncaught]
    assert not missing, (
        f"mutants no seed of their block catches: {missing} (run "
        "`python -m tests.sim.mutants run --record NAME`, or mark them expected_uncaught)"
    )
    for m in MUTANTS:
        assert (m.first_seed is None) == (m.check is None), m.name
        assert m.patch.exists(), m.name


@pytest.mark.slow
@pytest.mark.parametrize(
    "mutant", [m for m in MUTANTS if m.first_seed is not None], ids=lambda m: m.name
)
def test_the_recorded_seed_catches_the_mutant(mutant: Mutant) -> None:
    if mutant.db == "postgres":
        require_postgres()
    seed = f"{mutant.first_seed}..{mutant.first_seed}"
    with patched(mutant) as scratch:
        done, report = simulate(scratch, mutant, seed, timeout=300)
    assert report is not None, done.stderr[-3000:]
    (outcome,) = report["seeds"]
    checks = [check for check, _ in outcome["failures"]]
    assert outcome["failed"] and mutant.check in checks, (
        f"{mutant.name}: seed {mutant.first_seed} ({mutant.db}) no longer fails "
        f"{mutant.check!r}; it failed {checks}\n{done.stdout[-3000:]}"
    )


@pytest.mark.slow
def test_the_runner_stops_at_the_first_failing_seed() -> None:
    """``tasknet-sim run --first-failure``: seed 0 fails for this mutant,
    and seeds 1..3 are never run."""
    (mutant,) = [m for m in MUTANTS if m.name == "ack_before_commit"]
    result = run(mutant, "0..3")
    assert result.error is None, result.error
    assert (result.caught, result.seed, result.seeds_run) == (True, 0, 1), result
    assert result.check == mutant.check
