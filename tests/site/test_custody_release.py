"""Custody's release and gone (DELIVERY.md "Custody"), on both backends:
``storage/custody.py``'s ``mark_archive_gone`` (the one writer of
``gallery.archive_gone_*``) and ``settle_cancel``, over a real database."""

from __future__ import annotations

from typing import Any

import pytest

from tasknet.protocol.messages import ReleasedEntry, TaskEntry, TaskReport
from tasknet.site.storage import reports
from tasknet.site.storage.custody import mark_archive_gone, settle_cancel
from tasknet.site.storage.engine import database as dbmod
from tests.site_protocol.harness import add_task, add_user, outbox_count

NOW = "2026-12-07T06:00:00.000Z"


def _gone(conn: Any, gid: int) -> tuple[Any, ...]:
    found = conn.execute(
        "SELECT archive_gone_reason, archive_gone_at, archive_gone_node, status_key"
        " FROM gallery WHERE gid = ?",
        (gid,),
    ).fetchone()
    return tuple(found)


def _mark(conn: Any, gid: int, op: str, reason: str = "EXPIRED", node: str = "n1") -> bool:
    return bool(
        dbmod.run_write(
            conn,
            lambda c: mark_archive_gone(
                c, gid=gid, operation_id=op, reason=reason, node_id=node, now=NOW
            ),
        )
    )


def test_mark_archive_gone_changes_only_a_completed_current_generation_of_its_node(
    conn: Any,
) -> None:
    user, _ = add_user(conn, "alice")
    done = add_task(conn, 1, user, node_id="n1", status=4, progress=1.0)["operation_id"]
    running = add_task(conn, 2, user, node_id="n1", status=1, progress=0.5)["operation_id"]
    add_task(conn, 3, user, "DELETE_PENDING", node_id="n1", status=4)
    before = outbox_count(conn)

    assert not _mark(conn, 1, "op-other")  # another generation
    assert not _mark(conn, 1, done, node="n2")  # not the node that holds it
    assert not _mark(conn, 2, running)  # not completed
    assert not _mark(conn, 3, "op-3")  # a delete under way
    assert not _mark(conn, 99, "op-99")  # no such task
    assert outbox_count(conn) == before
    assert _gone(conn, 1) == (None, None, None, "COMPLETED")

    assert _mark(conn, 1, done, reason="CORRUPT")
    assert _gone(conn, 1) == ("CORRUPT", NOW, "n1", "ARCHIVE_GONE")
    assert outbox_count(conn, 1) == 1
    # Already gone: the first reason stays, nothing is announced again.
    assert not _mark(conn, 1, done, reason="MISSING")
    assert _gone(conn, 1) == ("CORRUPT", NOW, "n1", "ARCHIVE_GONE")
    assert outbox_count(conn, 1) == 1


def test_mark_archive_gone_refuses_a_reason_that_is_not_one(conn: Any) -> None:
    user, _ = add_user(conn, "alice")
    op = add_task(conn, 1, user, node_id="n1", status=4)["operation_id"]
    with pytest.raises(ValueError, match="not an archive-gone reason"):
        _mark(conn, 1, op, reason="BORED")
    assert _gone(conn, 1)[0] is None


def test_settle_cancel_forgets_only_that_nodes_row(conn: Any) -> None:
    dbmod.run_write(
        conn,
        lambda c: c.executemany(
            "INSERT INTO node_cancel (node_id, gid, operation_id, queued_at) VALUES (?, ?, ?, ?)",
            [("n1", 1, "op-1", NOW), ("n2", 2, "op-2", NOW)],
        ),
    )

    def settle(node: str, op: str) -> bool:
        return bool(
            dbmod.run_write(conn, lambda c: settle_cancel(c, node_id=node, operation_id=op))
        )

    assert not settle("n1", "op-2")
    assert settle("n1", "op-1")
    assert not settle("n1", "op-1")
    rows = conn.execute("SELECT node_id, operation_id FROM node_cancel").fetchall()
    assert [tuple(r) for r in rows] == [("n2", "op-2")]


def test_releases_of_several_nodes_apply_in_one_batch(conn: Any) -> None:
    """The pipeline's coalesced write (``reports.apply_reports``): a release
    counts as an entry of its report -- reports of different nodes apply
    together, each by its own rules, and one naming another's gid is not
    mixed into the same run."""
    user, _ = add_user(conn, "alice")
    add_task(conn, 1, user, node_id="n1", status=4, progress=1.0)
    add_task(conn, 2, user, node_id="n2", status=4, progress=1.0)
    add_task(conn, 3, user, node_id="n3", status=1, progress=0.5)

    def report(report_id: str, released: list[tuple[int, str, str]], tasks: Any = ()) -> Any:
        return TaskReport(
            report_id,
            5,
            tuple(TaskEntry(*t) for t in tasks),
            {t[0]: f"op-{t[0]}" for t in tasks},
            (),
            tuple(ReleasedEntry(*r) for r in released),
        )

    queued = [
        reports.QueuedReport("n1", report("a", [(1, "op-1", "EXPIRED")])),
        reports.QueuedReport(
            "n2", report("b", [(2, "op-2", "DISK_BUDGET"), (3, "op-3", "CORRUPT")])
        ),
        # n3 names gid 3 too: not in the run above, applied after it.
        reports.QueuedReport("n3", report("c", [], [(3, 1, 0.75)])),
    ]
    outcomes = dbmod.run_write(conn, lambda c: reports.apply_reports(c, queued))
    assert [o.result for o in outcomes] == ["APPLIED"] * 3
    assert (outcomes[0].released, outcomes[1].released) == ([1], [2])
    assert outcomes[1].dropped == {3: reports.NOT_OWNER}
    assert _gone(conn, 1)[0] == "EXPIRED" and _gone(conn, 2)[0] == "DISK_BUDGET"
    assert _gone(conn, 3)[0] is None
    assert conn.execute("SELECT progress FROM gallery WHERE gid = 3").fetchone()[0] == 0.75
    assert reports._independent_run(queued, 0) == queued[:2]
