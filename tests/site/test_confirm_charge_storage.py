"""``create.reserve`` over a gone archive (DELIVERY.md "Getting it again"),
on both backends, one real transaction per step: what a new generation
resets, what a refusal leaves (nothing), and a re-create given back before
its POST (prepare failed) announced, since its row was visible."""

from __future__ import annotations

from typing import Any

import pytest

from tasknet.site.storage import create
from tasknet.site.storage.custody import mark_archive_gone
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.errors import TaskError
from tests.site_protocol.harness import add_task, add_user, outbox_count

WEEK = "2026-W49"
NOW = "2026-12-07T06:00:00.000Z"


def _gone_task(conn: Any, gid: int = 7) -> tuple[int, str]:
    user, _ = add_user(conn, "alice")
    op = add_task(conn, gid, user, node_id="n1", status=4, progress=1.0)["operation_id"]
    dbmod.run_write(
        conn,
        lambda c: c.execute(
            "UPDATE gallery SET archive_size = 10, archive_sha256 = ?, completed_at = ?,"
            " size = 10 WHERE gid = ?",
            ("ab" * 32, NOW, gid),
        ),
    )
    assert dbmod.run_write(
        conn,
        lambda c: mark_archive_gone(
            c, gid=gid, operation_id=op, reason="MISSING", node_id="n1", now=NOW
        ),
    )
    return user, op


def _reserve(conn: Any, gid: int, user: int, **kw: Any) -> str:
    return str(
        dbmod.run_write(conn, lambda c: create.reserve(c, gid, user, "", "tok2", WEEK, **kw))
    )


def _snapshot(conn: Any, gid: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT g.status, g.progress, g.node_id, g.archive_size, g.archive_sha256,"
        " g.archive_gone_reason, g.archive_gone_at, g.archive_gone_node, g.completed_at,"
        " g.status_key, g.token, g.name, o.state, o.operation_id, o.metered, o.cost,"
        " o.dispatched, o.step"
        " FROM gallery AS g JOIN task_operation AS o ON o.gid = g.gid WHERE g.gid = ?",
        (gid,),
    ).fetchone()
    return tuple(row)


def test_refusals_write_nothing(conn: Any) -> None:
    user, op = _gone_task(conn)
    other, _ = add_user(conn, "bob")
    before, notified = _snapshot(conn, 7), outbox_count(conn, 7)
    with pytest.raises(TaskError) as refused:
        _reserve(conn, 7, user)
    assert (refused.value.code, refused.value.details) == (
        "charge_confirmation_required",
        {"cost": 10},
    )
    with pytest.raises(TaskError) as refused:
        _reserve(conn, 7, other, confirm_charge=True)
    assert refused.value.code == "conflict"
    # The last cost would not fit this week's quota: refused before anything
    # is written, so the gone task stays as it was.
    dbmod.run_write(conn, lambda c: c.execute('UPDATE "user" SET quota = 5 WHERE id = ?', (user,)))
    with pytest.raises(TaskError) as refused:
        _reserve(conn, 7, user, confirm_charge=True)
    assert (refused.value.code, refused.value.details) == ("quota_exceeded", {"cost": 10})
    assert (_snapshot(conn, 7), outbox_count(conn, 7)) == (before, notified)


def test_a_held_archive_is_already_completed(conn: Any) -> None:
    user, _ = add_user(conn, "alice")
    add_task(conn, 8, user, node_id="n1", status=4, progress=1.0)
    add_task(conn, 9, user, node_id="n1", status=1, progress=0.5)
    for confirm in (False, True):
        with pytest.raises(TaskError) as refused:
            _reserve(conn, 8, user, confirm_charge=confirm)
        assert refused.value.code == "already_completed"
        # Unfinished: the answer of any live task.
        with pytest.raises(TaskError) as refused:
            _reserve(conn, 9, user, confirm_charge=confirm)
        assert refused.value.code == "conflict"


def test_a_confirmed_create_is_a_new_generation_over_a_fresh_row(conn: Any) -> None:
    user, op = _gone_task(conn)
    notified = outbox_count(conn, 7)
    new_op = _reserve(conn, 7, user, confirm_charge=True)
    assert new_op != op
    assert _snapshot(conn, 7) == (
        None, 0.0, None, None, None, None, None, None, None,
        "SUBMITTING", "tok2", "gallery 7", "RESERVED", new_op, 0, None, 0, create.RECREATE_STEP,
    )  # fmt: skip
    assert outbox_count(conn, 7) == notified + 1  # its row was visible: announced


def test_a_re_create_given_back_before_its_post_is_announced(conn: Any) -> None:
    user, _ = _gone_task(conn)
    new_op = _reserve(conn, 7, user, confirm_charge=True)
    notified = outbox_count(conn, 7)
    assert dbmod.run_write(conn, lambda c: create.release(c, 7, new_op))
    assert conn.execute("SELECT COUNT(*) FROM gallery WHERE gid = 7").fetchone()[0] == 0
    assert outbox_count(conn, 7) == notified + 1
    payload = conn.execute(
        "SELECT payload FROM notification_outbox WHERE gid = 7 ORDER BY id DESC"
    ).fetchone()[0]
    assert '"status":null' in payload.replace(" ", "")
