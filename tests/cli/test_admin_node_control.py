"""``tasknet-admin node drain|pause|resume|limit ID`` against real databases
(``db_target``: a SQLite file, a PostgreSQL database): each sets the node's
``node_control`` row and says what the node is now; a node the site never
heard of, or a bad limit, changes nothing (exit 1, or a usage error)."""

from __future__ import annotations

from contextlib import closing

import pytest

from tasknet.site.storage.engine import database as db
from tests.cli.test_admin_node import _cli, dbpath  # noqa: F401 (the fixture)


def _controls(path: str) -> list[tuple[str, str, int | None, str]]:
    with closing(db.connect(path)) as conn:
        return [
            (r[0], r[1], r[2], r[3])
            for r in conn.execute(
                "SELECT node_id, mode, download_limit, note FROM node_control ORDER BY node_id"
            ).fetchall()
        ]


def test_drain_pause_limit_and_resume_say_what_the_node_is_now(dbpath: str) -> None:  # noqa: F811
    code, out, _, asked = _cli(dbpath, "node", "drain", "n1", "--note", "disk swap")
    assert (code, asked) == (0, [])
    assert out == (
        "node n1: draining (no new task; what it holds finishes); download limit: no bound"
        " (a running site obeys it at its next assignment)\n"
    )
    assert _controls(dbpath) == [("n1", "DRAINING", None, "disk swap")]

    code, out, _, _ = _cli(dbpath, "node", "limit", "n2", "2000")
    assert code == 0 and "n2: active (new tasks go to it); download limit: at most 2,000" in out
    code, out, _, _ = _cli(dbpath, "node", "pause", "n1")
    assert code == 0 and "n1: paused (no new task until resumed)" in out
    assert _controls(dbpath) == [("n1", "PAUSED", None, ""), ("n2", "ACTIVE", 2000, "")]

    code, out, _, _ = _cli(dbpath, "node", "resume", "n1")
    assert code == 0 and "n1: active (new tasks go to it); download limit: no bound" in out
    code, out, _, _ = _cli(dbpath, "node", "limit", "n2", "none")
    assert code == 0 and "download limit: no bound" in out
    assert _controls(dbpath) == []  # active with no bound: no row


def test_an_unknown_node_is_refused_and_changes_nothing(dbpath: str) -> None:  # noqa: F811
    code, out, err, _ = _cli(dbpath, "node", "pause", "ghost")
    assert (code, out) == (1, "")
    assert err == "no node 'ghost' is known to this site; nothing changed\n"
    assert _controls(dbpath) == []


@pytest.mark.parametrize("limit", ["0", "-3", "2.5", "lots", "100001"])
def test_a_bad_limit_is_a_usage_error(
    dbpath: str,  # noqa: F811
    limit: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _cli(dbpath, "node", "limit", "n1", limit)
    assert exit_.value.code == 2
    assert "a download limit is a whole number from 1 to 100,000 or none" in capsys.readouterr().err
    assert _controls(dbpath) == []
