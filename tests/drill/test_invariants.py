"""D1–D8 on real SQLite files: each check passes on a sound system and FAILs,
with self-explaining evidence, on the breakage it exists to catch."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tasknet.drill.invariants import (
    FAIL,
    NA,
    PASS,
    Ledger,
    World,
    check_all,
    check_d1,
    check_d2,
    check_d3,
    check_d4,
    check_d5,
    check_d6,
    check_d7,
    check_d8,
)
from tasknet.drill.snapshot import read_node, read_site
from tasknet.node.paths import DataDir

GID = 4242
OP = "op-4242"
COST = 7


def _script(name: str) -> str:
    return resources.files("tasknet.site.storage.engine").joinpath(name).read_text(encoding="utf-8")


@pytest.fixture
def site_db(tmp_path: Path) -> Path:
    db = tmp_path / "site.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(_script("schema_v1.sql"))
    conn.executescript(_script("migrate_task_operation_v2.sql"))
    conn.execute("INSERT INTO user (id, name, token_hash, is_admin) VALUES (1, 'demo', 'h', 1)")
    conn.commit()
    conn.close()
    return db


def sql(db: Path, statement: str, *params: Any) -> None:
    conn = sqlite3.connect(db)
    conn.execute(statement, params)
    conn.commit()
    conn.close()


def submitted(db: Path, *, metered: int = 1, status: int | None = None) -> None:
    """A task submitted and metered (the sound outcome of a create)."""
    sql(
        db,
        "INSERT INTO gallery (gid, user_id, status, cost) VALUES (?, 1, ?, ?)",
        GID,
        status,
        COST,
    )
    sql(
        db,
        "INSERT INTO task_operation (gid, operation_id, state, user_id, cost, metered)"
        " VALUES (?, ?, 'RESERVED', 1, ?, 0)",
        GID,
        OP,
        COST,
    )
    sql(db, "UPDATE task_operation SET state = 'SUBMITTING' WHERE gid = ?", GID)
    sql(
        db,
        "UPDATE task_operation SET state = 'SUBMITTED', metered = ?, metered_week = '2026-W49'"
        " WHERE gid = ?",
        metered,
        GID,
    )
    if metered:
        sql(db, "INSERT INTO weekly_usage (user_id, week, used) VALUES (1, '2026-W49', ?)", COST)


def node_dir(tmp_path: Path, *, commands: tuple[tuple[int, str | None], ...] = ()) -> Path:
    data = DataDir(tmp_path / "n1")
    data.create()
    conn = sqlite3.connect(data.database)
    conn.executescript(
        "CREATE TABLE task (gid INTEGER PRIMARY KEY, operation_id TEXT, status INTEGER);"
        "CREATE TABLE deletion (gid INTEGER PRIMARY KEY, operation_id TEXT, result TEXT);"
        "CREATE TABLE in_flight_report (id INTEGER PRIMARY KEY, report_id TEXT,"
        " revision INTEGER, body TEXT, created_at REAL);"
        "CREATE TABLE received_command (id INTEGER PRIMARY KEY AUTOINCREMENT, gid INTEGER,"
        " operation_id TEXT, action TEXT, protocol INTEGER, received_at REAL);"
    )
    for gid, op in commands:
        conn.execute(
            "INSERT INTO received_command (gid, operation_id, action, protocol, received_at)"
            " VALUES (?, ?, 'DOWNLOAD', 2, 1.0)",
            (gid, op),
        )
    conn.commit()
    conn.close()
    return data.root


def world(
    site_db: Path,
    node: Path | None = None,
    *,
    posts: dict[str, int] | None = None,
    journal: list[dict[str, Any]] | None = None,
    frames: list[dict[str, Any]] | None = None,
    ledger: Ledger | None = None,
    webhook: list[Any] | None = None,
) -> World:
    nodes = {"n1": read_node("n1", node)} if node else {}
    return World(
        site=read_site(site_db),
        nodes=nodes,
        node_dirs={"n1": node} if node else {},
        upstream_stats={"posts": posts or {}},
        journal=journal if journal is not None else [{"seq": 1, "gid": GID, "cost": COST}],
        frames=frames or [],
        webhook=webhook,
        ledger=ledger or Ledger(),
    )


def test_a_sound_submitted_task_passes_every_check(site_db: Path, tmp_path: Path) -> None:
    submitted(site_db, status=4)
    node = node_dir(tmp_path, commands=((GID, OP),))
    DataDir(node).archive_path(GID, OP).write_bytes(b"zip")
    sql(
        site_db,
        "INSERT INTO notification_outbox (gid, payload) VALUES (?, ?)",
        GID,
        json.dumps({"task": {"gid": GID, "status": "COMPLETED", "operationId": OP}}),
    )
    verdicts = {v.invariant: v.status for v in check_all(world(site_db, node, posts={str(GID): 1}))}
    assert verdicts == {
        "D1": PASS,
        "D2": PASS,
        "D3": PASS,
        "D4": NA,
        "D5": PASS,
        "D6": NA,
        "D7": PASS,
        "D8": NA,
        "D9": NA,
        "D10": PASS,  # one node holds the one task it was sent
    }


def test_d1_fails_on_a_second_post(site_db: Path) -> None:
    verdict = check_d1(world(site_db, posts={str(GID): 2}))
    assert verdict.status == FAIL
    assert verdict.detail == f"gid {GID}: 2 upstream POSTs for 1 generation(s)"
    assert verdict.evidence[0]["journal"] == [{"seq": 1, "gid": GID, "cost": COST}]
    ledger = Ledger(generations=Counter({GID: 2}))
    assert check_d1(world(site_db, posts={str(GID): 2}, ledger=ledger)).status == PASS


def test_d2_fails_on_a_submitted_task_without_metering(site_db: Path) -> None:
    submitted(site_db, metered=0)
    verdict = check_d2(world(site_db))
    assert verdict.status == FAIL
    assert verdict.detail.startswith(f"gid {GID}: SUBMITTED but not metered")
    assert verdict.evidence[0]["operation"]["operation_id"] == OP


def test_d2_fails_when_usage_does_not_add_up(site_db: Path) -> None:
    submitted(site_db)
    sql(site_db, "UPDATE weekly_usage SET used = used * 2")
    verdict = check_d2(world(site_db))
    assert verdict.status == FAIL
    assert "weekly_usage total 14 != sum of metered costs 7" in verdict.detail


def test_d3_fails_when_a_completion_is_not_shown(site_db: Path, tmp_path: Path) -> None:
    submitted(site_db, status=1)
    node = node_dir(tmp_path)
    DataDir(node).archive_path(GID, OP).write_bytes(b"zip")
    verdict = check_d3(world(site_db, node))
    assert verdict.status == FAIL
    assert verdict.detail == f"gid {GID}: complete on n1 but the site shows status 1"


def test_d4_fails_when_a_deleted_gid_comes_back(site_db: Path) -> None:
    submitted(site_db)
    sql(site_db, "UPDATE task_operation SET state = 'DELETE_PENDING' WHERE gid = ?", GID)
    sql(site_db, "UPDATE task_operation SET state = 'DELETED' WHERE gid = ?", GID)
    verdict = check_d4(world(site_db))  # the gallery row is still there
    assert verdict.status == FAIL
    assert verdict.detail == f"gid {GID}: DELETED tombstone but the gallery row is back"
    sql(site_db, "DELETE FROM gallery WHERE gid = ?", GID)
    assert check_d4(world(site_db)).status == PASS


def test_d5_fails_on_a_download_of_an_unknown_operation(site_db: Path, tmp_path: Path) -> None:
    sql(site_db, "INSERT INTO gallery (gid, user_id) VALUES (?, 1)", GID)
    sql(
        site_db,
        "INSERT INTO task_operation (gid, operation_id, state) VALUES (?, ?, 'RESERVED')",
        GID,
        OP,
    )
    sql(site_db, "UPDATE task_operation SET state = 'SUBMITTING' WHERE gid = ?", GID)
    sql(site_db, "UPDATE task_operation SET state = 'UNKNOWN' WHERE gid = ?", GID)
    node = node_dir(tmp_path, commands=((GID, OP),))
    verdict = check_d5(world(site_db, node))
    assert verdict.status == FAIL
    assert verdict.detail == f"gid {GID}: DOWNLOAD sent for an unconfirmed (UNKNOWN) operation"
    assert verdict.evidence[0]["command"]["source"] == "n1 database"


def _frame(
    type_: int, direction: str, payload: dict[str, Any], action: str = "forwarded"
) -> dict[str, Any]:
    return {
        "node": "n1",
        "seq": 1,
        "link": 1,
        "type": type_,
        "direction": direction,
        "action": action,
        "at": 1.0,
        "payload": payload,
    }


def test_d6_fails_on_an_ack_without_commit_and_on_a_lost_report(site_db: Path) -> None:
    frames = [
        _frame(12, "to_server", {"reportId": "r1", "revision": 5}),
        _frame(13, "to_client", {"reportId": "r1", "result": "APPLIED"}),
    ]
    verdict = check_d6(world(site_db, frames=frames))
    assert verdict.status == FAIL
    whats = [e["what"] for e in verdict.evidence]
    assert "report r1 sent by n1 was never committed (lost)" in whats
    assert "ACK for report r1 without a committed receipt" in whats
    sql(site_db, "INSERT INTO report_receipt (report_id, node_id, revision) VALUES ('r1', 'n1', 5)")
    assert check_d6(world(site_db, frames=frames)).status == PASS
    frames.append(_frame(13, "to_client", {"reportId": "r1", "result": "APPLIED"}))
    assert check_d6(world(site_db, frames=frames)).detail == "report r1 ACKed APPLIED 2 times"


def test_d6_a_committed_report_no_node_keeps_may_go_unacked(site_db: Path) -> None:
    """A report committed and never ACKed fails D6 (its node would send it
    again until ACKed), unless it is one no node keeps (a simulated lie)."""
    frames = [_frame(12, "to_server", {"reportId": "r2", "revision": 6})]
    sql(site_db, "INSERT INTO report_receipt (report_id, node_id, revision) VALUES ('r2', 'n1', 6)")
    assert check_d6(world(site_db, frames=frames)).detail == "report r2 committed but never ACKed"
    unkept = Ledger(unkept_reports={"r2"})
    assert check_d6(world(site_db, frames=frames, ledger=unkept)).status == PASS


def test_d7_fails_on_a_repeated_notification(site_db: Path) -> None:
    submitted(site_db, status=4)
    task = {"gid": GID, "status": "COMPLETED", "operationId": OP}
    for updated in ("t1", "t2"):
        sql(
            site_db,
            "INSERT INTO notification_outbox (gid, payload) VALUES (?, ?)",
            GID,
            json.dumps({"task": {**task, "updatedAt": updated}}),
        )
    verdict = check_d7(world(site_db))
    assert verdict.status == FAIL
    assert verdict.detail.startswith(f"gid {GID}: notification 2 repeats 1")


def test_d7_fails_on_a_lost_completion_notification(site_db: Path) -> None:
    submitted(site_db, status=4)
    verdict = check_d7(world(site_db))
    assert verdict.status == FAIL
    assert verdict.detail == f"gid {GID}: shown 下载完成 but no such notification"


def test_snapshots_are_read_only(site_db: Path) -> None:
    before = site_db.stat().st_mtime_ns
    read_site(site_db)
    assert site_db.stat().st_mtime_ns == before
    with pytest.raises(FileNotFoundError):
        read_site(site_db.with_name("missing.sqlite"))
    assert not site_db.with_name("missing.sqlite").exists()


def test_d7_fails_when_a_notification_never_reaches_the_webhook(site_db: Path) -> None:
    submitted(site_db, status=4)
    task = {"gid": GID, "status": "COMPLETED", "operationId": OP}
    sql(
        site_db,
        "INSERT INTO notification_outbox (gid, payload, webhook_state) VALUES (?, ?, ?)",
        GID,
        json.dumps({"task": task}),
        "delivered",
    )
    verdict = check_d7(world(site_db, webhook=[]))
    assert verdict.status == FAIL
    assert verdict.detail == (
        f"notification 1 (gid {GID}) never reached the webhook (outbox says delivered)"
    )
    # Received (twice: at-least-once delivery is allowed): nothing lost.
    got = [{"id": "1", "body": {"task": task}}] * 2
    assert check_d7(world(site_db, webhook=got)).status == PASS


FORGED_REVISION = 2**62


def _owned_by_n1(db: Path, *, status: int, progress: float, revision: int | None) -> None:
    submitted(db, status=status)
    sql(db, "UPDATE gallery SET node_id = 'n1', progress = ? WHERE gid = ?", progress, GID)
    sql(db, "UPDATE task_operation SET last_revision = ? WHERE gid = ?", revision, GID)


def _receipt(db: Path, report_id: str, node_id: str, revision: int) -> None:
    sql(
        db,
        "INSERT INTO report_receipt (report_id, node_id, revision) VALUES (?, ?, ?)",
        report_id,
        node_id,
        revision,
    )


def _node_task(node: Path, status: int, progress: float) -> None:
    conn = sqlite3.connect(DataDir(node).database)
    conn.execute("ALTER TABLE task ADD COLUMN progress REAL")
    conn.execute("INSERT INTO task VALUES (?, ?, ?, ?)", (GID, OP, status, progress))
    conn.commit()
    conn.close()


def test_d8_passes_when_each_revision_came_from_the_tasks_own_node(site_db: Path) -> None:
    _owned_by_n1(site_db, status=1, progress=0.5, revision=1000)
    _receipt(site_db, "r1", "n1", 1000)
    _receipt(site_db, "h1", "n4", FORGED_REVISION)  # dropped: changed nothing
    verdict = check_d8(world(site_db))
    assert verdict.status == PASS, verdict.detail


def test_d8_fails_on_a_revision_another_node_sent(site_db: Path) -> None:
    _owned_by_n1(site_db, status=4, progress=1.0, revision=FORGED_REVISION)
    _receipt(site_db, "r1", "n1", 1000)
    _receipt(site_db, "h1", "n4", FORGED_REVISION)
    verdict = check_d8(world(site_db))
    assert verdict.status == FAIL
    assert "came from ['n4'], not from its node n1" in verdict.detail


def test_d8_fails_when_a_forged_status_is_shown_that_its_node_does_not_hold(
    site_db: Path, tmp_path: Path
) -> None:
    _owned_by_n1(site_db, status=4, progress=1.0, revision=1000)
    _receipt(site_db, "r1", "n1", 1000)
    node = node_dir(tmp_path)
    _node_task(node, 1, 0.3)  # n1 is still downloading
    forged = {"node": "n4", "gid": GID, "revision": FORGED_REVISION, "status": 4, "progress": 1.0}
    verdict = check_d8(world(site_db, node, ledger=Ledger(forged=[forged])))
    assert verdict.status == FAIL
    assert "shows what n4 forged" in verdict.detail


def test_d8_passes_when_the_owner_itself_completed_what_was_forged(
    site_db: Path, tmp_path: Path
) -> None:
    _owned_by_n1(site_db, status=4, progress=1.0, revision=2000)
    _receipt(site_db, "r2", "n1", 2000)
    node = node_dir(tmp_path)
    DataDir(node).archive_path(GID, OP).write_bytes(b"zip")  # completed and ACKed
    forged = {"node": "n4", "gid": GID, "revision": FORGED_REVISION, "status": 4, "progress": 1.0}
    verdict = check_d8(world(site_db, node, ledger=Ledger(forged=[forged])))
    assert verdict.status == PASS, verdict.detail


def test_d8_fails_on_a_forged_delete_that_completed(site_db: Path, tmp_path: Path) -> None:
    submitted(site_db, status=4)
    sql(site_db, "UPDATE gallery SET node_id = 'n1' WHERE gid = ?", GID)
    sql(
        site_db,
        "UPDATE task_operation SET state = 'DELETE_PENDING', delete_operation_id = 'd'"
        " WHERE gid = ?",
        GID,
    )
    sql(site_db, "UPDATE task_operation SET state = 'DELETED' WHERE gid = ?", GID)
    sql(site_db, "DELETE FROM gallery WHERE gid = ?", GID)
    node = node_dir(tmp_path)
    DataDir(node).archive_path(GID, OP).write_bytes(b"zip")  # the file stayed on n1
    forged = {"node": "n4", "gid": GID, "revision": FORGED_REVISION, "delete_operation_id": "d"}
    verdict = check_d8(world(site_db, node, ledger=Ledger(forged=[forged])))
    assert verdict.status == FAIL
    assert "while n1 still holds it" in verdict.detail
