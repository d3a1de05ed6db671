"""Custody's counters on the site's ``/metrics`` (tasknet/site/metrics.py):
``tasknet_archives_released_total{reason}`` counts a ``released`` entry once
its report committed and only when it made the task ``ARCHIVE_GONE`` (a
dropped, repeated or duplicate one counts nothing), over real TCP with
scripted v2 nodes, on both backends; ``count_inventory`` sorts an inventory
by what it found; every custody series is on the page from the start."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families

from tasknet.protocol.messages import ReleasedEntry, TaskReport, TaskReportAck
from tasknet.site import metrics
from tests.site_protocol.harness import ScriptedNode, Site, add_task, add_user


@pytest_twisted.async_yield_fixture
async def site(db_target: str) -> AsyncIterator[Site]:
    s = await Site(db_target).start()
    try:
        yield s
    finally:
        await s.stop()


def _page() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render_latest().decode())
        for s in family.samples
    }


def _released(reason: str) -> float:
    return _page()[("tasknet_archives_released_total", (("reason", reason),))]


async def _send(node: ScriptedNode, report_id: str, revision: int, *released: ReleasedEntry) -> str:
    node.sendMessage(TaskReport(report_id, revision, (), {}, (), tuple(released)))
    ack = await node.next(TaskReportAck)
    return str(ack.result)


def test_every_custody_series_is_on_the_page_from_the_start() -> None:
    page = _page()
    for reason in metrics.RELEASE_REASONS:
        assert ("tasknet_archives_released_total", (("reason", reason),)) in page
    for result in metrics.INVENTORY_RESULTS:
        assert ("tasknet_inventories_total", (("result", result),)) in page
    for cause in metrics.REASSIGN_CAUSES:
        assert ("tasknet_tasks_reassigned_total", (("cause", cause),)) in page
    assert ("tasknet_inventory_missing_total", ()) in page


def test_an_inventory_is_counted_by_what_it_found() -> None:
    before = _page()

    def grew(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return _page()[(name, labels)] - before[(name, labels)]

    metrics.count_inventory(0, 0)
    metrics.count_inventory(3, 2)
    metrics.count_inventory(0, 5)
    metrics.count_inventory(0, 0, corrupt=2)  # listed, but not as recorded
    assert grew("tasknet_inventories_total", (("result", "clean"),)) == 1
    assert grew("tasknet_inventories_total", (("result", "missing"),)) == 2
    assert grew("tasknet_inventories_total", (("result", "orphans"),)) == 1
    assert grew("tasknet_inventory_missing_total") == 3
    assert grew("tasknet_archives_released_total", (("reason", "MISSING"),)) == 3
    assert grew("tasknet_archives_released_total", (("reason", "CORRUPT"),)) == 2


@pytest_twisted.ensureDeferred
async def test_a_release_is_counted_once_when_it_made_the_archive_gone(site: Site) -> None:
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=4, progress=1.0)  # completed on n1
        add_task(conn, 2, uid, node_id="n1", status=4, progress=1.0)
        add_task(conn, 3, uid, node_id="n2", status=4, progress=1.0)  # n2's
        add_task(conn, 4, uid, node_id="n1", status=1, progress=0.5)  # not completed
    finally:
        conn.close()
    budget, corrupt, expired = _released("DISK_BUDGET"), _released("CORRUPT"), _released("EXPIRED")
    n1 = await site.connect("n1")
    result = await _send(
        n1,
        "r1",
        10,
        ReleasedEntry(1, "op-1", "DISK_BUDGET"),
        ReleasedEntry(1, "op-1", "DISK_BUDGET"),  # a repeat in one report
        ReleasedEntry(2, "op-2", "CORRUPT"),
        ReleasedEntry(3, "op-3", "EXPIRED"),  # not n1's: not_owner
        ReleasedEntry(4, "op-4", "EXPIRED"),  # not completed: dropped
        ReleasedEntry(2, "op-old", "EXPIRED"),  # another generation
    )
    assert result == "APPLIED"
    assert _released("DISK_BUDGET") - budget == 1
    assert _released("CORRUPT") - corrupt == 1
    assert _released("EXPIRED") - expired == 0
    # The same report again (its ACK lost) and a later one repeating the
    # releases: the tasks are already gone, nothing more is counted.
    assert await _send(n1, "r1", 10, ReleasedEntry(1, "op-1", "DISK_BUDGET")) == "DUPLICATE"
    assert await _send(n1, "r2", 11, ReleasedEntry(1, "op-1", "DISK_BUDGET")) == "APPLIED"
    assert _released("DISK_BUDGET") - budget == 1
