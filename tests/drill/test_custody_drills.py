"""The custody drills (S27–S29, tasknet/drill/custody_scenarios.py) and the
part of D10 they need: a generation sent to a node, then cancelled there
because it moved to another node (``--reassign-after``), is on one node, not
two; one that was never cancelled still fails D10.  Real SQLite files
(tests/drill/test_invariants.py's helpers)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tasknet.drill.invariants import FAIL, PASS, Ledger, World, check_d10
from tasknet.drill.scenarios import QUICK, QUICK_POSTGRES, SCENARIOS
from tasknet.drill.snapshot import read_node, read_site
from tasknet.node.paths import DataDir
from tasknet.site.storage.engine.database import POSTGRESQL, SQLITE
from tests.drill.test_invariants import GID, OP, site_db, sql, submitted

__all__ = ["site_db"]  # the fixture, used below


def _node(root: Path, node_id: str, actions: tuple[str, ...]) -> Path:
    """A node directory whose received_command holds ``actions`` for GID/OP, in order."""
    data = DataDir(root / node_id)
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
    for n, action in enumerate(actions):
        conn.execute(
            "INSERT INTO received_command (gid, operation_id, action, protocol, received_at)"
            " VALUES (?, ?, ?, 2, ?)",
            (GID, OP, action, float(n)),
        )
    conn.commit()
    conn.close()
    return data.root


def _d10(site_db: Path, nodes: dict[str, Path]) -> tuple[str, str]:
    world = World(
        site=read_site(site_db),
        nodes={node_id: read_node(node_id, path) for node_id, path in nodes.items()},
        node_dirs=nodes,
        upstream_stats={"posts": {}},
        journal=[],
        frames=[],
        webhook=None,
        ledger=Ledger(),
    )
    verdict = check_d10(world)
    return verdict.status, verdict.detail


def test_d10_a_generation_cancelled_on_the_node_it_moved_off_is_on_one_node(
    site_db: Path, tmp_path: Path
) -> None:
    submitted(site_db, status=4)
    sql(site_db, "UPDATE gallery SET node_id = 'n2' WHERE gid = ?", GID)
    moved_off = _node(tmp_path, "n1", ("DOWNLOAD", "CANCEL"))
    moved_to = _node(tmp_path, "n2", ("DOWNLOAD",))
    assert _d10(site_db, {"n1": moved_off, "n2": moved_to})[0] == PASS


def test_d10_still_fails_a_generation_sent_to_two_nodes_without_a_cancel(
    site_db: Path, tmp_path: Path
) -> None:
    submitted(site_db, status=4)
    sql(site_db, "UPDATE gallery SET node_id = 'n2' WHERE gid = ?", GID)
    nodes = {
        # A DOWNLOAD after the CANCEL (the node was sent it again): it counts.
        "n1": _node(tmp_path, "n1", ("DOWNLOAD", "CANCEL", "DOWNLOAD")),
        "n2": _node(tmp_path, "n2", ("DOWNLOAD",)),
    }
    status, detail = _d10(site_db, nodes)
    assert status == FAIL
    assert detail == f"gid {GID}: operation {OP} on 2 nodes (n1, n2)"


def test_s27_to_s29_run_on_either_database_and_are_not_quick() -> None:
    for scenario in ("S27", "S28", "S29"):
        assert SCENARIOS[scenario].backends == (SQLITE, POSTGRESQL)
        assert scenario not in QUICK and scenario not in QUICK_POSTGRES
