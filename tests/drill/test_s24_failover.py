"""The failover drills' own parts (S24–S26, ``tasknet-drill --db postgres-ha``):
D9's 30 s counted from when a server takes writes again, what a create's
answer says about what was sent, the recovery figures' median and worst,
and which scenarios need the failover cluster.  S24 itself, on a real
pg_auto_failover cluster, is CI's quick set (tests/drill/test_quick_set.py).
"""

from __future__ import annotations

import time

from tasknet.cli.drill import recovery_figures
from tasknet.drill.databases import POSTGRES_HA_CHOICE, FailoverClusters, databases_for
from tasknet.drill.invariants import FAIL, PASS, Verdict, check_d9
from tasknet.drill.report import RunResult
from tasknet.drill.scenarios import SCENARIOS, CreateAnswer
from tasknet.site.storage import reaping
from tests.drill.test_invariants_sites import (
    GID,
    PID_A,
    PID_B,
    SITE_A,
    SITE_B,
    run,
    site,  # noqa: F401 - the fixture
    submitting,
    world,
    write,
)

# -- D9 across a database outage -------------------------------------------------------


def test_d9_counts_its_30_s_from_when_a_server_takes_writes_again(site: str) -> None:  # noqa: F811
    """site-b died 100 s ago, site-a ran all along, but no server took
    writes from just before the death until 10 s ago (the primary killed,
    the standby promoted): a reap now is in time; 45 s after the outage
    it would not be."""
    submitting(site, GID, 2)
    write(site, reaping.reap, 2, 1)
    now = time.time()
    runs = [run(SITE_A, PID_A, now - 200, None), run(SITE_B, PID_B, now - 200, now - 100)]
    down = world(site, runs)
    down.ledger.database_down.append([now - 101, now - 10])
    assert check_d9(down).status == PASS, check_d9(down)
    late = world(site, runs)
    late.ledger.database_down.append([now - 101, now - 45])
    verdict = check_d9(late)
    assert verdict.status == FAIL and "s after its site died" in verdict.detail
    # An outage that ended before the site died changes nothing.
    early = world(site, runs)
    early.ledger.database_down.append([now - 150, now - 120])
    assert check_d9(early).status == FAIL


# -- what the load's answers say -------------------------------------------------------


def answer(status: int, retry_after: str | None = None, error: str = "") -> CreateAnswer:
    return CreateAnswer(GID, SITE_A, 1.0, 2.0, status, None, retry_after, error)


def test_a_create_refused_before_any_post_is_a_503_with_retry_after_or_no_connection() -> None:
    assert answer(503, "5").refused_unsent
    assert not answer(503).refused_unsent  # no Retry-After: not the refusal S25 allows
    refused = "URLError: <urlopen error [Errno 111] Connection refused>"
    assert answer(0, error=refused).refused_unsent  # the site process was not there
    assert not answer(0, error="RemoteDisconnected: closed without response").refused_unsent
    assert not answer(0, error="TimeoutError: timed out").refused_unsent
    assert not answer(500).refused_unsent
    assert answer(201).to_json()["status"] == 201


# -- the figures -----------------------------------------------------------------------


def result(scenario: str, number: int, figures: dict[str, object]) -> RunResult:
    verdict = Verdict("E", PASS, "met", [{"figures": figures}])
    return RunResult(scenario, "title", number, [verdict], 100.0)


def test_recovery_figures_are_each_parts_median_and_worst_over_the_runs() -> None:
    results = [
        result("S24", 1, {"recovery_s": 40.0, "detection_s": 10.0, "promotion_s": 25.0}),
        result("S24", 2, {"recovery_s": 44.5, "detection_s": 11.0, "promotion_s": None}),
        result("S24", 3, {"recovery_s": 38.0, "detection_s": 9.0, "promotion_s": 24.0}),
        result("S25", 1, {"recovery_s": 12.0, "lost": []}),
        RunResult("S1", "title", 1, [Verdict("E", PASS, "met")], 1.0),
    ]
    figures = recovery_figures(results)
    assert set(figures) == {"S24", "S25"}
    assert figures["S24"]["recovery_s"] == {
        "runs": [40.0, 44.5, 38.0],
        "median": 40.0,
        "worst": 44.5,
    }
    assert figures["S24"]["detection_s"]["median"] == 10.0
    # A part a run could not measure is left out, not counted as zero.
    assert figures["S24"]["promotion_s"] == {"runs": [25.0, 24.0], "median": 24.5, "worst": 25.0}
    assert figures["S25"] == {"recovery_s": {"runs": [12.0], "median": 12.0, "worst": 12.0}}


def test_the_failover_scenarios_run_only_on_a_failover_cluster() -> None:
    assert isinstance(databases_for(POSTGRES_HA_CHOICE), FailoverClusters)
    for scenario in ("S24", "S25", "S26"):
        assert SCENARIOS[scenario].backends == (POSTGRES_HA_CHOICE,)
    assert all(
        POSTGRES_HA_CHOICE not in s.backends
        for s in SCENARIOS.values()
        if s.id not in ("S24", "S25", "S26")
    )


def test_the_host_cut_off_runs_figures_are_apart_from_the_kills() -> None:
    """``--db postgres-ha --netns``: S24 cuts the primary's host off the
    network; its figures are summed up as "S24 (host cut off)"."""
    results = [
        result("S24", 1, {"recovery_s": 31.0}),
        result("S24", 1, {"recovery_s": 40.0, "variant": "host cut off"}),
        result("S24", 2, {"recovery_s": 42.0, "variant": "host cut off"}),
    ]
    figures = recovery_figures(results)
    assert figures["S24"]["recovery_s"]["runs"] == [31.0]
    assert figures["S24 (host cut off)"]["recovery_s"] == {
        "runs": [40.0, 42.0],
        "median": 41.0,
        "worst": 42.0,
    }


def test_the_primarys_host_is_namespaced_only_when_asked() -> None:
    plain = databases_for(POSTGRES_HA_CHOICE)
    assert isinstance(plain, FailoverClusters) and not plain.primary_netns
    cut = databases_for(POSTGRES_HA_CHOICE, primary_netns=True)
    assert isinstance(cut, FailoverClusters) and cut.primary_netns
    assert "namespace" in cut.describe() and "namespace" not in plain.describe()
