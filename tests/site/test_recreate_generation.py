"""A gid re-created over its tombstone starts a generation afresh
(invariant 6): nothing of the deleted generation carries over.  The one the
fast suite missed (issue 39): the old generation's ``dispatched`` flag.  A
re-created task deleted before any node was sent it must complete its
delete at once, not wait for a node that was never told of it."""

from __future__ import annotations

from tasknet.site.storage import create, delete, dispatch, usage
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.storage.engine.schema import prepare_database
from tests.site.helpers import add_user, one


def _submit(path: str, gid: int, user_id: int) -> str:
    week = usage.iso_week()
    connection = connect(path)
    try:
        op = run_write(connection, create.reserve, gid, user_id, "", "t", week)
        run_write(connection, create.begin_submit, gid, op, 2, "", week)
        run_write(connection, create.persist_submitted, gid, op, f"http://u/{gid}/{op}", 2, week)
    finally:
        connection.close()
    return str(op)


def _write(path: str, fn: object, *args: object) -> object:
    connection = connect(path)
    try:
        return run_write(connection, fn, *args)  # type: ignore[arg-type]
    finally:
        connection.close()


def test_a_re_created_gid_deleted_before_dispatch_is_deleted_at_once(db_target: str) -> None:
    path = db_target
    prepare_database(path)
    alice, _ = add_user(path, "alice")
    # The first generation: sent to a node, then deleted by it.
    first = _submit(path, 5, alice)
    assert _write(path, dispatch.claim_task, 5, ["n1"]) is not None
    assert one(path, "SELECT dispatched FROM task_operation WHERE gid = 5")[0] == 1
    started = _write(path, delete.request_delete, 5, None)
    assert not started.completed and started.node == "n1"  # type: ignore[attr-defined]
    assert _write(path, delete.complete_delete, 5, started.delete_operation_id)  # type: ignore[attr-defined]
    assert one(path, "SELECT state FROM task_operation WHERE gid = 5")[0] == "DELETED"

    # Re-created over the tombstone and deleted again before any dispatch.
    second = _submit(path, 5, alice)
    assert second != first
    row = one(path, "SELECT state, dispatched FROM task_operation WHERE gid = 5")
    assert tuple(row) == ("SUBMITTED", 0), "the deleted generation's dispatched flag carried over"
    again = _write(path, delete.request_delete, 5, alice)
    assert again.completed and again.node is None  # type: ignore[attr-defined]
    row = one(path, "SELECT state, operation_id FROM task_operation WHERE gid = 5")
    assert tuple(row) == ("DELETED", second)
