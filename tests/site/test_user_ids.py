"""Issue 38, Build 3: a user id is never given twice (schema v12), on both
backends.

Before: on SQLite (``user.id`` a rowid alias without AUTOINCREMENT) a
removed user's id went to the next user added, who then saw the removed
user's completions and bytes in ``/api/stats`` (the throughput rollups keep
them under the id).  Now ``user_id_high`` is the highest id ever given and a
new user's id is always above it, whoever inserts the row; the removed
user's rollup rows stay under an id that names no one, ever again, and count
in the admin's site-wide totals only."""

from __future__ import annotations

from typing import Any

import pytest_twisted

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.site.storage import users
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.sql import sql
from tasknet.upstream import catalog
from tests.site.helpers import add_user, raw
from tests.site.test_views_api import Fixture, with_fixture

_INSERT_WITHOUT_ID = sql(
    "INSERT INTO \"user\" (name, token_hash, is_admin, quota, created_at) VALUES (?, ?, 0, 5, 'x')"
)


def _add(conn: Any, name: str) -> int:
    return dbmod.run_write(conn, users.create_user, name)[0].id


def _remove(conn: Any, name: str) -> None:
    dbmod.run_write(conn, users.remove_user, name)


def test_a_removed_users_id_is_not_given_again(conn: Any) -> None:
    alice, bob = _add(conn, "alice"), _add(conn, "bob")
    _remove(conn, "bob")  # the highest id: SQLite's rowid would give it again
    carol = _add(conn, "carol")
    assert carol > bob > alice
    _remove(conn, "alice")
    _remove(conn, "carol")
    dave = _add(conn, "dave")
    assert dave > carol
    assert [u.id for u in dbmod.run_read(conn, users.list_users)] == [dave]


def test_any_writer_of_a_user_row_gets_a_new_id(conn: Any) -> None:
    """The mark is kept by the database, not by create_user alone."""
    _add(conn, "alice")
    bob = _add(conn, "bob")
    _remove(conn, "bob")
    dbmod.run_write(conn, lambda c: c.execute(_INSERT_WITHOUT_ID, ("eve", "h-eve")))
    eve = dbmod.run_read(conn, users.get_user, "eve")
    assert eve is not None and eve.id > bob


#: Creates here must be answered 201: a loaded CI machine once took more
#: than the fixture's 0.5 s upstream timeout and made one UNKNOWN (202).
PATIENT = ("--upstream-timeout", "10")


async def _complete_delete_and_remove(f: Fixture, token: str, name: str) -> None:
    """``name`` completes gid 301 on node n1, deletes it, and is removed."""
    node = await f.connect("n1")
    await f.create(301, token)
    command = await node.next(TaskCommand)
    ops = {301: command.operation_id}
    node.report("r1", 1, [(301, 4, 1.0)], ops)
    await node.next(TaskReportAck)
    status, stats = await f.get("/api/stats?window=3600", token)
    assert status == 200 and _completed(stats) == 1
    assert _bytes(stats) == catalog.gallery(301).size
    status, _ = await f.site.request("DELETE", "/api/tasks/301", token=token)
    assert status == 202
    delete = await node.next(TaskCommand)
    assert delete.action == "DELETE"
    node.report("r2", 2, [], {}, deleted=[(301, delete.operation_id, "DELETED", "")])
    await node.next(TaskReportAck)
    # The ack follows the report's transaction: the task is gone now.
    status, _ = await f.get("/api/tasks/301", token)
    assert status == 404
    connection = raw(f.path)
    try:
        _remove(connection, name)
    finally:
        connection.close()


def _completed(stats: dict) -> int:
    return sum(int(b["completed"]) for b in stats["buckets"])


def _bytes(stats: dict) -> int:
    return sum(int(b["bytes"]) for b in stats["buckets"])


@pytest_twisted.ensureDeferred
async def test_the_next_user_sees_nothing_of_a_removed_one(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        carol_id, carol = add_user(f.path, "carol")
        await _complete_delete_and_remove(f, carol, "carol")
        dave_id, dave = add_user(f.path, "dave")
        assert dave_id > carol_id
        status, stats = await f.get("/api/stats?window=3600", dave)
        assert status == 200
        assert _completed(stats) == 0 and _bytes(stats) == 0
        assert all(w["used"] == 0 for w in stats["usage"]["weeks"])
        # The site's totals keep the removed user's numbers, under no name.
        _, admin = await f.get("/api/stats?window=3600", f.admin)
        assert _completed(admin) == 1

    await with_fixture(db_target, test, *PATIENT)
