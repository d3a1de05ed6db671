"""What two sites do at the same moment on one PostgreSQL database
(SCALE.md 1, 3, 4): the create of one gid, two creates of one user's quota,
the assignment of one task, and a delete against a dispatch, each raced by
two connections running the site's own transactions.

On SQLite ``BEGIN IMMEDIATE`` serialises writers, and these transactions
are correct because of it.  On PostgreSQL every write is SERIALIZABLE, and
the database layer runs a transaction that lost a serialization conflict
again (``run_write``, ``Database.write``): so they are correct there too,
without row locks of their own.  The races here are made, not hoped for:
"site 1" runs its transaction up to its ``COMMIT`` and holds it there while
"site 2" runs the same kind of transaction (in a thread: it may have to wait
for site 1's locks); then site 1 commits, and whichever lost runs again, as
the database layer runs it.  Each test checks the invariant, whichever order
the database chose.  (A write that enqueues a notification also waits for
the outbox's ordering lock, tasknet/site/storage/outbox.py, so in the
create races site 2 mostly waits for site 1; the conflict of a delete and an
assignment is on the task's own rows.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from tasknet.site.storage import create, delete, dispatch
from tasknet.site.storage import usage as usage_weeks
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, SERIALIZABLE
from tests.site.helpers import add_user
from tests.site_protocol.harness import add_task

WEEK = usage_weeks.iso_week()


@dataclass
class Outcome:
    """What a transaction of one site came to: its result or its refusal,
    and whether it had to run again after a conflict."""

    result: Any = None
    error: BaseException | None = None
    reruns: int = 0


def _outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(result=fn())
    except (TaskError, psycopg.Error) as e:
        return Outcome(error=e)


def race(
    url: str, first: Callable[..., Any], second: Callable[..., Any]
) -> tuple[Outcome, Outcome]:
    """``first(cursor)`` through site 1, held before its COMMIT while
    ``second(cursor)`` runs through site 2 (to its commit, or until it waits
    for site 1's locks); then site 1 commits.  A loser runs again, as the
    database layer would."""
    one, two = connect(url), connect(url)
    try:
        cursor = one.cursor()
        cursor.execute(BEGIN_WRITE[SERIALIZABLE])
        held = _outcome(lambda: first(cursor))
        second_done: list[Outcome] = []
        thread = threading.Thread(
            target=lambda: second_done.append(_outcome(lambda: run_write(two, second)))
        )
        thread.start()
        _until_done_or_waiting(url, thread, two.raw.info.backend_pid)
        outcome = _commit(one, cursor, held, first)
        thread.join(30)
        assert not thread.is_alive()
        return outcome, second_done[0]
    finally:
        one.close()
        two.close()


def _until_done_or_waiting(url: str, thread: threading.Thread, pid: int) -> None:
    watcher = connect(url)
    try:
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?", (pid,)
            ).fetchone()
            if waiting is not None and waiting[0] == "Lock":
                return
            time.sleep(0.01)
    finally:
        watcher.close()


def _commit(connection: Any, cursor: Any, held: Outcome, first: Callable[..., Any]) -> Outcome:
    if held.error is not None:
        connection.execute("ROLLBACK")
        return held
    try:
        cursor.execute("COMMIT")
        return held
    except psycopg.errors.SerializationFailure:
        again = _outcome(lambda: run_write(connection, first))
        again.reruns = 1
        return again


def test_two_creates_of_one_gid_through_two_sites_have_one_winner(pg_url: str) -> None:
    alice, _ = add_user(pg_url, "alice")
    bob, _ = add_user(pg_url, "bob")
    one, two = race(
        pg_url,
        lambda c: create.reserve(c, 7, alice, "", "t", WEEK),
        lambda c: create.reserve(c, 7, bob, "", "t", WEEK),
    )
    outcomes = sorted([one, two], key=lambda o: o.error is None)
    loser, winner = outcomes
    assert winner.error is None and isinstance(winner.result, str)
    assert isinstance(loser.error, TaskError) and loser.error.code == "conflict"
    rows = _rows(pg_url, "SELECT operation_id, user_id FROM task_operation WHERE gid = 7")
    assert [r["operation_id"] for r in rows] == [winner.result]
    assert len(_rows(pg_url, "SELECT * FROM gallery WHERE gid = 7")) == 1


def test_two_creates_of_one_users_quota_through_two_sites_never_pass_it_together(
    pg_url: str,
) -> None:
    alice, _ = add_user(pg_url, "alice", quota=10)
    connection = connect(pg_url)
    try:
        op1 = run_write(connection, create.reserve, 1, alice, "", "t", WEEK)
        op2 = run_write(connection, create.reserve, 2, alice, "", "t", WEEK)
    finally:
        connection.close()
    # Each costs 6: either fits the quota of 10, both together do not.
    one, two = race(
        pg_url,
        lambda c: create.begin_submit(c, 1, op1, 6, "", WEEK),
        lambda c: create.begin_submit(c, 2, op2, 6, "", WEEK),
    )
    assert sorted([one.result, two.result]) == [False, True], (one, two)
    submitting = _rows(pg_url, "SELECT gid, cost FROM task_operation WHERE state = 'SUBMITTING'")
    assert len(submitting) == 1 and submitting[0]["cost"] == 6
    assert len(_rows(pg_url, "SELECT * FROM task_operation")) == 1  # the other released


def test_one_task_assigned_through_two_sites_goes_to_one_node(pg_url: str) -> None:
    alice, _ = add_user(pg_url, "alice")
    connection = connect(pg_url)
    try:
        add_task(connection, 5, alice, "SUBMITTED", dispatched=0)
    finally:
        connection.close()
    one, two = race(
        pg_url,
        lambda c: dispatch.claim_task(c, 5, ["n1"]),  # n1 is connected to site 1
        lambda c: dispatch.claim_task(c, 5, ["n2"]),  # n2 to site 2
    )
    [task] = _rows(pg_url, "SELECT node_id FROM gallery WHERE gid = 5")
    assert task["node_id"] in ("n1", "n2")
    # Each site sends only to a node connected to it: the command of the
    # site whose node did not get the task names the other (sticky) node,
    # so it is sent by no one but the holder's site.
    sent = [
        o.result.node_id
        for o, mine in ((one, "n1"), (two, "n2"))
        if o.result is not None and o.result.node_id == mine
    ]
    assert sent == [task["node_id"]]


@pytest.mark.parametrize("first", ["dispatch", "delete"])
def test_a_delete_through_one_site_racing_a_dispatch_through_the_other(
    pg_url: str, first: str
) -> None:
    alice, _ = add_user(pg_url, "alice")
    connection = connect(pg_url)
    try:
        add_task(connection, 5, alice, "SUBMITTED", dispatched=0)
    finally:
        connection.close()

    def dispatching(c: Any) -> Any:
        return dispatch.claim_task(c, 5, ["n1"])

    def deleting(c: Any) -> Any:
        return delete.request_delete(c, 5, alice)

    if first == "dispatch":
        sent, deleted = race(pg_url, dispatching, deleting)
    else:
        deleted, sent = race(pg_url, deleting, dispatching)
    assert deleted.error is None and sent.error is None, (deleted, sent)
    download = sent.result is not None and sent.result.action == "DOWNLOAD"
    # Never both: a DOWNLOAD decided and a delete completed at once (no node
    # confirmation) -- the node would keep a file the site has forgotten.
    assert not (download and deleted.result.completed)
    [state] = _rows(pg_url, "SELECT state FROM task_operation WHERE gid = 5")
    if download:
        assert state["state"] == "DELETE_PENDING"  # waits for the node to confirm
    else:
        assert deleted.result.completed and state["state"] == "DELETED"


def _rows(url: str, sql: str, *params: Any) -> list[Any]:
    connection = connect(url)
    try:
        return list(connection.execute(sql, params).fetchall())
    finally:
        connection.close()
