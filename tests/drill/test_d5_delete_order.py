"""D5, strictly: no DOWNLOAD follows the DELETE of its task in what a node
received (its database, or the proxy's forwarded frames), with no time
margin; only a new generation may be downloaded again."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

from tasknet.drill.invariants import FAIL, PASS, Ledger, check_d5
from tasknet.node.paths import DataDir
from tests.drill.test_invariants import GID, OP, site_db, sql, submitted, world  # noqa: F401

DELETE_OP = "del-4242"


def _deleted(db: Path) -> None:
    submitted(db)
    sql(
        db,
        "UPDATE task_operation SET state = 'DELETE_PENDING', delete_operation_id = ? WHERE gid = ?",
        DELETE_OP,
        GID,
    )


def _node(tmp_path: Path, commands: list[tuple[str, str | None]]) -> Path:
    from tests.drill.test_invariants import node_dir

    root = node_dir(tmp_path)
    conn = sqlite3.connect(DataDir(root).database)
    conn.executemany(
        "INSERT INTO received_command (gid, operation_id, action, protocol, received_at)"
        " VALUES (?, ?, ?, 2, 1.0)",
        [(GID, op, action) for action, op in commands],
    )
    conn.commit()
    conn.close()
    return root


def test_download_before_its_delete_passes(site_db: Path, tmp_path: Path) -> None:  # noqa: F811
    _deleted(site_db)
    node = _node(tmp_path, [("DOWNLOAD", OP), ("DELETE", DELETE_OP)])
    assert check_d5(world(site_db, node)).status == PASS


def test_download_after_its_delete_fails_whatever_the_timing(
    site_db: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    _deleted(site_db)
    # The node never got the first DOWNLOAD; the stale one follows the DELETE.
    node = _node(tmp_path, [("DELETE", DELETE_OP), ("DOWNLOAD", OP)])
    verdict = check_d5(world(site_db, node))
    assert verdict.status == FAIL
    assert verdict.detail == f"gid {GID}: DOWNLOAD after its DELETE (n1 database, command #2)"


def test_stale_download_in_the_proxy_frames_fails(site_db: Path) -> None:  # noqa: F811
    _deleted(site_db)

    def frame(seq: int, action: str, op: str) -> dict:
        return {
            "node": "n1",
            "seq": seq,
            "link": 1,
            "type": 11,
            "direction": "to_client",
            "action": "forwarded",
            "at": 1.0,
            "payload": {"operationId": op, "action": action, "gid": GID, "name": "", "url": ""},
        }

    frames = [frame(2, "DOWNLOAD", OP), frame(1, "DELETE", DELETE_OP)]
    verdict = check_d5(world(site_db, frames=frames))
    assert verdict.status == FAIL
    assert "proxy of n1" in verdict.detail


def test_a_new_generation_after_a_delete_may_be_downloaded(
    site_db: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    _deleted(site_db)
    node = _node(tmp_path, [("DOWNLOAD", "old-op"), ("DELETE", "old-del"), ("DOWNLOAD", OP)])
    ledger = Ledger(generations=Counter({GID: 2}))
    assert check_d5(world(site_db, node, ledger=ledger)).status == PASS
    # The old generation again, though, is a stale DOWNLOAD.
    node2 = _node(
        tmp_path / "again", [("DOWNLOAD", "old-op"), ("DELETE", "old-del"), ("DOWNLOAD", "old-op")]
    )
    assert check_d5(world(site_db, node2, ledger=ledger)).status == FAIL
