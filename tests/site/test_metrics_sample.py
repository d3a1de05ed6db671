"""What ``/metrics`` samples from the database for the alert rules
(``deploy/prometheus/tasknet-rules.yml``): per-user quota use, per-node
unfinished tasks and last report, site instances by status; on both backends."""

from __future__ import annotations

import sqlite3

import pytest

from tasknet.site.storage import instances, stats, throughput
from tasknet.site.storage.engine.database import run_read, run_write
from tasknet.site.storage.usage import iso_week, meter
from tests.site_protocol.harness import add_task, add_user

NOW = 1_796_000_000.0


def test_quota_use_counts_metered_in_flight_and_unknown(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    bob, _ = add_user(conn, "bob")
    add_user(conn, "carol")  # nothing used: no series
    week = iso_week()
    run_write(conn, meter, alice, week, 30)
    run_write(conn, meter, alice, "2001-W01", 999)  # another week
    add_task(conn, 1, alice, "UNKNOWN")  # cost 10, unmetered: counts
    add_task(conn, 2, alice, "SUBMITTING")  # cost 10, in flight: counts
    add_task(conn, 3, alice, "SUBMITTED")  # metered (by meter above, in this harness): not again
    add_task(conn, 4, bob, "UNKNOWN")
    run_write(conn, lambda c: c.execute('UPDATE "user" SET quota = 40 WHERE id = ?', (bob,)))
    use = run_read(conn, stats.quota_use)
    assert use == {"alice": (50, 5000), "bob": (10, 40)}
    assert run_read(conn, stats.quota_use, "2001-W01")["alice"] == (1019, 5000)


def test_unfinished_tasks_by_node_with_the_last_report(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    add_task(conn, 1, alice, node_id="n1", status=1, progress=0.5)
    add_task(conn, 2, alice, node_id="n1")  # assigned, not reported yet
    add_task(conn, 3, alice, node_id="n1", status=4, progress=1.0)  # completed: not counted
    add_task(conn, 4, alice, node_id="n2", status=4, progress=1.0)  # only completed: no series
    add_task(conn, 5, alice, node_id="n3", status=2, progress=1.0)
    add_task(conn, 6, alice)  # not dispatched
    run_write(conn, throughput.record_node_seen, "n3", 2, [], True, NOW - 50)
    run_write(
        conn,
        lambda c: c.executemany(
            "INSERT INTO node_seen (node_id, last_seen_at, last_report_at) VALUES (?, ?, ?)",
            [("n1", throughput.iso(NOW - 5), throughput.iso(NOW - 60))],
        ),
    )
    nodes = run_read(conn, stats.unfinished_by_node)
    assert nodes == {"n1": (2, pytest.approx(NOW - 60)), "n3": (1, pytest.approx(NOW - 50))}


def test_unfinished_tasks_of_a_node_never_seen(conn: sqlite3.Connection) -> None:
    alice, _ = add_user(conn, "alice")
    add_task(conn, 1, alice, node_id="n9", status=1)
    assert run_read(conn, stats.unfinished_by_node) == {"n9": (1, None)}


def test_instance_counts_by_status(conn: sqlite3.Connection) -> None:
    assert run_read(conn, stats.instance_counts) == {"open": 0, "ended": 0, "reaped": 0}
    first = run_write(conn, instances.register, "a", "host", 1)
    second = run_write(conn, instances.register, "b", "host", 2)
    run_write(conn, instances.register, "c", "host", 3)
    run_write(conn, instances.end, first)
    run_write(
        conn,
        lambda c: c.execute(
            "UPDATE site_instance SET reaped_at = ?, reaped_by = ? WHERE id = ?",
            (throughput.iso(NOW), first, second),
        ),
    )
    assert run_read(conn, stats.instance_counts) == {"open": 1, "ended": 1, "reaped": 1}


def test_metrics_sample_has_every_key(conn: sqlite3.Connection) -> None:
    sample = run_read(conn, stats.metrics_sample)
    assert set(sample) == {"states", "statuses", "nodeBytes", "quota", "nodes", "instances"}
