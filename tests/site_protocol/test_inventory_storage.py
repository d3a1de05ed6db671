"""The inventory's transaction on its own, on both backends:
``custody.mark_archives_gone`` keeps ``mark_archive_gone``'s rules for
many generations at once, and ``judge_inventory`` leaves a current
generation on another node alone, and settles orphans and the node's
inventory row (the wire is test_inventory.py's)."""

from __future__ import annotations

import pytest

from tasknet.protocol.messages import HeldArchive
from tasknet.site.storage.custody import mark_archives_gone
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.inventory import judge_inventory
from tests.site_protocol.harness import add_task, add_user

NOW = "2026-12-07T06:00:00.000Z"
SHA = "a" * 64


@pytest.fixture
def conn(db_target: str) -> dbmod.Connection:
    prepare_database(db_target)
    return dbmod.connect(db_target)


def reasons(conn: dbmod.Connection) -> dict[int, str | None]:
    rows = conn.execute("SELECT gid, archive_gone_reason FROM gallery ORDER BY gid").fetchall()
    return {int(r[0]): r[1] for r in rows}


def test_mark_archives_gone_keeps_the_rules_of_mark_archive_gone(conn: dbmod.Connection) -> None:
    user, _ = add_user(conn, "alice")
    add_task(conn, 1, user, node_id="n1", status=4)  # changes
    add_task(conn, 2, user, node_id="n1", status=4)  # named with another generation
    add_task(conn, 3, user, node_id="n2", status=4)  # another node's
    add_task(conn, 4, user, node_id="n1", status=1)  # not completed
    add_task(conn, 5, user, "DELETE_PENDING", node_id="n1", status=4)  # not SUBMITTED
    add_task(conn, 6, user, node_id="n1", status=4)  # named with gid 1's generation
    pairs = [(1, "op-1"), (2, "op-old"), (3, "op-3"), (4, "op-4"), (5, "op-5"), (6, "op-1")]

    changed = dbmod.run_write(
        conn,
        lambda c: mark_archives_gone(c, generations=pairs, reason="MISSING", node_id="n1", now=NOW),
    )
    assert changed == [1]
    assert reasons(conn) == {1: "MISSING", 2: None, 3: None, 4: None, 5: None, 6: None}
    row = conn.execute(
        "SELECT status_key, archive_gone_at, archive_gone_node FROM gallery WHERE gid = 1"
    ).fetchone()
    assert tuple(row) == ("ARCHIVE_GONE", NOW, "n1")
    outbox = conn.execute("SELECT COUNT(*) FROM notification_outbox WHERE gid = 1").fetchone()
    assert outbox[0] == 1
    # Already gone: nothing again; nothing at all for none; a bad reason refused.
    again = dbmod.run_write(
        conn,
        lambda c: mark_archives_gone(c, generations=pairs, reason="CORRUPT", node_id="n1", now=NOW),
    )
    assert again == []
    assert reasons(conn)[1] == "MISSING"
    assert (
        dbmod.run_write(
            conn,
            lambda c: mark_archives_gone(
                c, generations=[], reason="MISSING", node_id="n1", now=NOW
            ),
        )
        == []
    )
    with pytest.raises(ValueError, match="not an archive-gone reason"):
        dbmod.run_write(
            conn,
            lambda c: mark_archives_gone(
                c, generations=pairs, reason="LOST", node_id="n1", now=NOW
            ),
        )
    conn.close()


def test_judge_inventory_in_one_transaction(conn: dbmod.Connection) -> None:
    user, _ = add_user(conn, "alice")
    add_task(conn, 1, user, node_id="n1", status=4)  # held
    add_task(conn, 2, user, node_id="n1", status=4)  # missing
    add_task(conn, 3, user, node_id="n2", status=4)  # another node's, listed by n1
    add_task(conn, 4, user, node_id="n1", status=4)  # completed after the connection came
    add_task(conn, 5, user, "DELETED", node_id="n1", status=4)  # a tombstone
    dbmod.run_write(
        conn, lambda c: c.execute("UPDATE gallery SET completed_at = ? WHERE gid = 4", (NOW,))
    )
    dbmod.run_write(
        conn,
        lambda c: c.execute(
            "INSERT INTO node_cancel (node_id, gid, operation_id, queued_at) VALUES"
            " ('n1', 7, 'op-7', ?)",
            (NOW,),
        ),
    )
    listed = [
        HeldArchive(1, "op-1", 10, SHA),
        HeldArchive(1, "op-1", 10, SHA),  # listed twice: counted once
        HeldArchive(3, "op-3", 20, SHA),
        HeldArchive(5, "op-5", 30, SHA),
        HeldArchive(7, "op-7", 40, SHA),  # a CANCEL is owed for it
    ]
    verdict = dbmod.run_write(
        conn,
        lambda c: judge_inventory(
            c,
            node_id="n1",
            inventory_id="inv-1",
            archives=listed,
            now=NOW,
            completed_before=NOW,
        ),
    )
    assert (verdict.archives, verdict.bytes) == (4, 100)
    assert verdict.missing == (2,)
    assert [(d.gid, d.delete_operation_id) for d in verdict.deletes] == [(5, "del-5")]
    assert [(o.gid, o.operation_id) for o in verdict.orphans] == [(3, "op-3")]
    assert verdict.cancelling == 1
    assert reasons(conn) == {1: None, 2: "MISSING", 3: None, 4: None}
    row = conn.execute("SELECT * FROM node_inventory WHERE node_id = 'n1'").fetchone()
    assert tuple(row) == ("n1", "inv-1", 4, 100, 1, 1, NOW)

    # The next inventory no longer lists gid 3: its orphan row goes.
    verdict = dbmod.run_write(
        conn,
        lambda c: judge_inventory(
            c, node_id="n1", inventory_id="inv-2", archives=listed[:1], now=NOW
        ),
    )
    assert verdict.orphans == ()
    assert verdict.missing == (4,)  # no connection time given: judged
    assert conn.execute("SELECT COUNT(*) FROM node_archive_orphan").fetchone()[0] == 0
    conn.close()
