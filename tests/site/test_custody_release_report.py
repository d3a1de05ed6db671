"""A node's ``released`` entries (DELIVERY.md "Custody", PROTOCOL.md
"Archives (v2)"), applied in the report's transaction: the site's node side
over a real database (either backend) and scripted v2 nodes over real TCP.

Only from the task's assigned node (else ``not_owner``, counted), only for
the current generation, only for a ``COMPLETED`` task; a ``CANCELLED``
release first settles the ``node_cancel`` row the site owed that node; a
duplicate report is ``DUPLICATE`` and applies nothing twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted

from tasknet.protocol.messages import ReleasedEntry, TaskEntry, TaskReport, TaskReportAck
from tasknet.site.storage import reports
from tests.site_protocol.harness import (
    ScriptedNode,
    Site,
    add_task,
    add_user,
    dropped_entries,
    outbox_count,
)


@pytest_twisted.async_yield_fixture
async def site(db_target: str) -> AsyncIterator[Site]:
    s = await Site(db_target).start()
    # The tests count the notifications written: with no webhook the running
    # executor deletes each row once fanned out, at a moment of its own.
    await s.side.outbox.stopService()
    try:
        yield s
    finally:
        await s.stop()


def _gone(site: Site, gid: int) -> tuple[Any, ...]:
    conn = site.sql()
    try:
        found = conn.execute(
            "SELECT archive_gone_reason, archive_gone_node, status_key, status"
            " FROM gallery WHERE gid = ?",
            (gid,),
        ).fetchone()
        return tuple(found)
    finally:
        conn.close()


def _gone_at(site: Site, gid: int) -> str | None:
    conn = site.sql()
    try:
        found = conn.execute("SELECT archive_gone_at FROM gallery WHERE gid = ?", (gid,))
        return found.fetchone()[0]  # type: ignore[no-any-return]
    finally:
        conn.close()


def _drops(site: Site) -> dict[str, dict[str, int]]:
    conn = site.sql()
    try:
        return dropped_entries(conn)
    finally:
        conn.close()


def _outbox(site: Site, gid: int) -> int:
    conn = site.sql()
    try:
        return outbox_count(conn, gid)
    finally:
        conn.close()


async def _send(
    node: ScriptedNode,
    report_id: str,
    revision: int,
    released: list[tuple[int, str, str]],
    tasks: list[tuple[Any, ...]] = (),  # type: ignore[assignment]
    ops: dict[int, str] | None = None,
) -> str:
    """Send a v2 report carrying ``released``; its ACK's result."""
    node.sendMessage(
        TaskReport(
            report_id,
            revision,
            tuple(TaskEntry(*t) for t in tasks),
            ops or {},
            (),
            tuple(ReleasedEntry(*r) for r in released),
        )
    )
    ack = await node.next(TaskReportAck)
    assert ack.report_id == report_id
    return str(ack.result)


def _setup(site: Site) -> int:
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=4, progress=1.0)  # completed on n1
        add_task(conn, 2, uid, node_id="n1", status=1, progress=0.5)  # still downloading
        add_task(conn, 3, uid, node_id="n2", status=4, progress=1.0)  # completed on n2
        return uid
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_the_owner_releasing_a_completed_generation_makes_it_archive_gone(
    site: Site,
) -> None:
    _setup(site)
    node = await site.connect("n1")
    before = _outbox(site, 1)
    assert await _send(node, "r1", 10, [(1, "op-1", "EXPIRED")]) == "APPLIED"
    assert _gone(site, 1) == ("EXPIRED", "n1", "ARCHIVE_GONE", 4)
    assert _gone_at(site, 1)
    assert _outbox(site, 1) == before + 1
    assert _drops(site) == {}


@pytest_twisted.ensureDeferred
async def test_a_release_from_a_node_that_does_not_own_the_task_is_not_owner(
    site: Site,
) -> None:
    _setup(site)
    node = await site.connect("n1")
    before = _outbox(site, 3)
    assert await _send(node, "r1", 10, [(3, "op-3", "DISK_BUDGET")]) == "APPLIED"
    assert _gone(site, 3) == (None, None, "COMPLETED", 4)
    assert _outbox(site, 3) == before
    assert _drops(site) == {"n1": {reports.NOT_OWNER: 1}}


@pytest_twisted.ensureDeferred
async def test_a_release_of_an_old_generation_or_an_unfinished_task_changes_nothing(
    site: Site,
) -> None:
    _setup(site)
    node = await site.connect("n1")
    before = (_outbox(site, 1), _outbox(site, 2))
    result = await _send(
        node,
        "r1",
        10,
        [(1, "op-1-earlier", "EXPIRED"), (2, "op-2", "CORRUPT"), (2, "op-2", "CANCELLED")],
    )
    assert result == "APPLIED"
    assert _gone(site, 1) == (None, None, "COMPLETED", 4)
    assert _gone(site, 2) == (None, None, "DOWNLOADING", 1)
    assert (_outbox(site, 1), _outbox(site, 2)) == before
    assert _drops(site) == {
        "n1": {reports.OLD_GENERATION: 1, reports.NOT_COMPLETED: 2},
    }


@pytest_twisted.ensureDeferred
async def test_a_duplicate_report_is_duplicate_and_applies_nothing_twice(site: Site) -> None:
    _setup(site)
    node = await site.connect("n1")
    assert await _send(node, "r1", 10, [(1, "op-1", "MISSING")]) == "APPLIED"
    at, notified = _gone_at(site, 1), _outbox(site, 1)
    assert await _send(node, "r1", 10, [(1, "op-1", "MISSING")]) == "DUPLICATE"
    # The node keeps the entry until an ACK: a later report carrying it again
    # is applied and finds the archive already gone.
    assert await _send(node, "r2", 11, [(1, "op-1", "EXPIRED")]) == "APPLIED"
    assert _gone(site, 1) == ("MISSING", "n1", "ARCHIVE_GONE", 4)
    assert (_gone_at(site, 1), _outbox(site, 1)) == (at, notified)
    assert _drops(site) == {}


@pytest_twisted.ensureDeferred
async def test_a_cancelled_release_settles_the_cancel_owed_and_changes_no_task(
    site: Site,
) -> None:
    _setup(site)
    conn = site.sql()
    try:
        # Task 3 moved from n1 to n2; the site owes n1 a CANCEL of op-3.
        conn.execute(
            "INSERT INTO node_cancel (node_id, gid, operation_id, queued_at)"
            " VALUES ('n1', 3, 'op-3', '2026-12-07T06:00:00.000Z')"
        )
    finally:
        conn.close()
    node = await site.connect("n1")
    before = _outbox(site, 3)
    assert await _send(node, "r1", 10, [(3, "op-3", "CANCELLED")]) == "APPLIED"
    conn = site.sql()
    try:
        assert conn.execute("SELECT COUNT(*) FROM node_cancel").fetchone()[0] == 0
    finally:
        conn.close()
    assert _gone(site, 3) == (None, None, "COMPLETED", 4)
    assert _outbox(site, 3) == before
    assert _drops(site) == {}
    # Once settled, a repeat is judged by the rules: not n1's task.
    assert await _send(node, "r2", 11, [(3, "op-3", "CANCELLED")]) == "APPLIED"
    assert _drops(site) == {"n1": {reports.NOT_OWNER: 1}}


@pytest_twisted.ensureDeferred
async def test_a_completion_and_its_release_in_one_report_end_gone(site: Site) -> None:
    _setup(site)
    node = await site.connect("n1")
    result = await _send(node, "r1", 10, [(2, "op-2", "DISK_BUDGET")], [(2, 4, 1.0)], {2: "op-2"})
    assert result == "APPLIED"
    assert _gone(site, 2) == ("DISK_BUDGET", "n1", "ARCHIVE_GONE", 4)
