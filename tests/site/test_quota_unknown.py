"""The quota with unknown outcomes (INTERFACES.md "Bounds, failures and
secrets"): every unmetered ``UNKNOWN`` counts at its cost in the quota check,
and a "submitted" verdict meters it into the week its create was checked
against, not the week of the verdict.

Real SQLite files, the real mock upstream on loopback with its ``timeout``
fault (the POST is charged, the answer never comes).
"""

from __future__ import annotations

import pytest_twisted

from tasknet.site.storage import create, reconcile, usage
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.schema import prepare_database
from tests.site.helpers import add_user, fault, lifecycle_env, one

GIDS = range(4100, 4130)


async def costs(env, gids) -> dict[int, int]:
    result = {}
    for gid in gids:
        prepared = await env.client.prepare(gid, "tok", 2.0)
        result[gid] = prepared.cost
    return result


@pytest_twisted.ensureDeferred
async def test_creates_that_time_out_cannot_pile_charges_past_the_quota(db_target):
    async with lifecycle_env(db_target, timeout=0.3, quota=0) as env:
        cost = await costs(env, GIDS)
        # Room for about three of them, whatever the mock's costs are.
        quota = sum(sorted(cost.values())[:3]) + 1
        run_write(
            connect(env.path),
            lambda c: c.execute('UPDATE "user" SET quota = ? WHERE id = ?', (quota, env.user_id)),
        )
        env.upstream.set_faults([fault("timeout")])
        answers: dict[int, object] = {}
        for gid in GIDS:
            try:
                answers[gid] = (await env.lifecycle.create(env.user_id, gid, "tok", "")).status
            except TaskError as e:
                answers[gid] = e.code
        unknown = [gid for gid, a in answers.items() if a == 202]
        refused = [gid for gid, a in answers.items() if a == "quota_exceeded"]
        assert unknown and refused
        assert set(unknown) | set(refused) == set(GIDS)
        # What the upstream really charged stays within the quota ...
        assert env.upstream.stats()["charged"] == sum(cost[g] for g in unknown) <= quota
        # ... and only the UNKNOWN ones were POSTed at all.
        assert {int(g) for g in env.upstream.stats()["postAttempts"]} == set(unknown)
        # Nothing is metered yet: the UNKNOWNs are counted, not charged.
        assert one(env.path, "SELECT COALESCE(SUM(used), 0) FROM weekly_usage")[0] == 0
        env.upstream.clear_faults()
        # "not submitted" gives the quota back: a create fits again.
        for gid in unknown:
            await env.lifecycle.resolve(gid, "not_submitted", "root", "audit says 0")
        cheapest = min(refused, key=cost.__getitem__)
        assert (await env.lifecycle.create(env.user_id, cheapest, "tok", "")).status == 201


def test_the_check_counts_unknown_of_any_week_and_releases_over_quota(db_target):
    path = db_target
    prepare_database(path)
    user_id, _ = add_user(path, "bob", quota=100)
    conn = connect(path)
    old_week, this_week = "2020-W01", usage.iso_week()
    op = run_write(conn, create.reserve, 1, user_id, "", "tok", old_week)
    assert run_write(conn, create.begin_submit, 1, op, 70, "t", old_week)
    assert run_write(conn, create.mark_unknown, 1, op, "submit", "timed out")
    # A later week's check still counts it: 70 + 40 > 100.
    op2 = run_write(conn, create.reserve, 2, user_id, "", "tok", this_week)
    assert not run_write(conn, create.begin_submit, 2, op2, 40, "t", this_week)
    assert conn.execute("SELECT COUNT(*) FROM task_operation WHERE gid = 2").fetchone()[0] == 0
    # 70 + 30 fits exactly.
    op3 = run_write(conn, create.reserve, 3, user_id, "", "tok", this_week)
    assert run_write(conn, create.begin_submit, 3, op3, 30, "t", this_week)
    conn.close()


def test_a_submitted_verdict_meters_into_the_week_the_create_was_checked_against(db_target):
    path = db_target
    prepare_database(path)
    user_id, _ = add_user(path, "carol", quota=1000)
    conn = connect(path)
    checked = "2020-W53"  # the create's check week; the verdict comes in another one
    op = run_write(conn, create.reserve, 9, user_id, "", "tok", checked)
    assert run_write(conn, create.begin_submit, 9, op, 25, "t", checked)
    assert run_write(conn, create.mark_unknown, 9, op, "submit", "timed out")
    assert usage.iso_week() != checked
    view = run_write(
        conn, reconcile.resolve_unknown, 9, "submitted", "root", "audit: 1", None, "http://x/a"
    )
    assert view is not None and view["state"] == "SUBMITTED"
    rows = conn.execute("SELECT week, used FROM weekly_usage WHERE user_id = ?", (user_id,))
    assert [tuple(r) for r in rows] == [(checked, 25)]
    metered = conn.execute("SELECT metered, metered_week FROM task_operation WHERE gid = 9")
    assert tuple(metered.fetchone()) == (1, checked)
    # Metered now, so it is no longer counted as in flight: counted once.
    assert usage.in_flight_cost(conn.cursor(), user_id) == 0
    conn.close()
