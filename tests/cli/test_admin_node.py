"""``tasknet-admin node reassign ID`` and ``node retire ID`` against real
databases (``db_target``: a SQLite file, a PostgreSQL database): each asks
first (``--yes`` skips it), is audited in ``node_custody_audit`` (actor,
note, counts), and changes nothing when refused, not confirmed or given a
node the site never heard of."""

from __future__ import annotations

import io
from contextlib import closing
from typing import Any

import pytest

from tasknet.cli import admin
from tasknet.site.storage import reassign, users
from tasknet.site.storage.engine import database as db
from tasknet.site.storage.engine.schema import prepare_database
from tests.site_protocol.harness import add_task, add_user, row


@pytest.fixture
def dbpath(db_target: str) -> str:
    assert prepare_database(db_target) is True
    with closing(db.connect(db_target)) as conn:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1", status=1, progress=0.5)
        add_task(conn, 2, uid, node_id="n1")
        add_task(conn, 3, uid, node_id="n1", status=4, progress=1.0)
        add_task(conn, 4, uid, node_id="n2", status=1, progress=0.5)
        db.run_write(conn, lambda c: users.add_node_key(c, "n1", "s1"))
    return db_target


def _cli(dbpath: str, *argv: str, answer: str | None = None) -> tuple[int, str, str, list[str]]:
    """Run the tool as ``main`` does, answering its question with ``answer``."""
    asked: list[str] = []
    out, err = io.StringIO(), io.StringIO()

    def ask(question: str) -> str:
        asked.append(question)
        assert answer is not None, f"asked unexpectedly: {question}"
        return answer

    args = admin.parse(admin.build_parser(), ["--db", dbpath, *argv])
    try:
        admin.run(args, out, ask)
        code = 0
    except admin.AdminError as error:
        print(error, file=err)
        code = 1
    return code, out.getvalue(), err.getvalue(), asked


def _state(dbpath: str) -> dict[str, Any]:
    with closing(db.connect(dbpath)) as conn:
        return {
            "tasks": {gid: row(conn, gid) for gid in (1, 2, 3, 4)},
            "cancels": conn.execute("SELECT COUNT(*) FROM node_cancel").fetchone()[0],
            "audit": conn.execute("SELECT COUNT(*) FROM node_custody_audit").fetchone()[0],
            "keys": db.run_read(conn, users.node_keys),
        }


def _audit(dbpath: str, node_id: str) -> list[reassign.AuditEntry]:
    with closing(db.connect(dbpath)) as conn:
        return db.run_read(conn, reassign.custody_audit, node_id)


def test_reassign_asks_then_moves_the_unfinished_tasks_and_is_audited(dbpath: str) -> None:
    code, out, _, asked = _cli(dbpath, "node", "reassign", "n1", "--note", "disk died", answer="y")
    assert code == 0, out
    assert asked == [
        "Move the 2 unfinished task(s) of node n1 (not connected) to other nodes? [y/N]"
    ]
    assert "2 unfinished task(s) moved off it, waiting for a node" in out
    state = _state(dbpath)
    for gid in (1, 2):
        task = state["tasks"][gid]
        assert (task["node_id"], task["status"], task["operation_id"], task["dispatched"]) == (
            None,
            None,
            f"op-{gid}",
            0,
        )
    assert state["tasks"][3]["node_id"] == "n1"  # completed: stays where it is
    assert state["tasks"][4]["node_id"] == "n2"
    assert state["cancels"] == 2
    [entry] = _audit(dbpath, "n1")
    assert (entry.action, entry.note, entry.tasks, entry.archives) == (
        "REASSIGN",
        "disk died",
        2,
        0,
    )
    assert entry.actor.startswith("tasknet-admin")


def test_retire_moves_marks_gone_removes_the_key_and_is_audited(dbpath: str) -> None:
    code, out, _, asked = _cli(dbpath, "node", "retire", "n1", "--yes", "--note", "sold")
    assert code == 0, out
    assert asked == []
    assert "1 archive(s) marked gone (NODE_RETIRED); its key removed" in out
    state = _state(dbpath)
    assert state["tasks"][1]["node_id"] is None and state["tasks"][2]["node_id"] is None
    assert "n1" not in state["keys"]
    assert state["cancels"] == 0  # it will never log in again: nothing is owed to it
    with closing(db.connect(dbpath)) as conn:
        gone = conn.execute(
            "SELECT archive_gone_reason, archive_gone_node, status_key FROM gallery WHERE gid = 3"
        ).fetchone()
    assert tuple(gone) == ("NODE_RETIRED", "n1", "ARCHIVE_GONE")
    [entry] = _audit(dbpath, "n1")
    assert (entry.action, entry.note, entry.tasks, entry.archives) == ("RETIRE", "sold", 2, 1)


def test_retiring_a_big_node_marks_every_archive_gone_in_batches(db_target: str) -> None:
    """More completed tasks than one transaction marks: every one is gone,
    and the audit and the tool count them all."""
    many = 2 * reassign.RETIRED_GONE_PER_TRANSACTION + 1
    assert prepare_database(db_target) is True
    with closing(db.connect(db_target)) as conn:
        uid, _ = add_user(conn, "alice")
        for gid in range(1, many + 1):
            add_task(conn, gid, uid, node_id="big", status=4, progress=1.0)
    code, out, _, _ = _cli(db_target, "node", "retire", "big", "--yes", "--note", "gone")
    assert code == 0, out
    assert f"{many} archive(s) marked gone (NODE_RETIRED)" in out
    with closing(db.connect(db_target)) as conn:
        keys = conn.execute(
            "SELECT status_key, COUNT(*) FROM gallery GROUP BY status_key"
        ).fetchall()
    assert [tuple(k) for k in keys] == [("ARCHIVE_GONE", many)]
    [entry] = _audit(db_target, "big")
    assert (entry.action, entry.archives) == ("RETIRE", many)


@pytest.mark.parametrize("answer", ["", "n", "no", "maybe"])
def test_not_confirmed_changes_nothing(dbpath: str, answer: str) -> None:
    before = _state(dbpath)
    for action in ("reassign", "retire"):
        code, _, err, asked = _cli(dbpath, "node", action, "n1", answer=answer)
        assert code == 1 and "not confirmed; nothing changed" in err
        assert len(asked) == 1
    assert _state(dbpath) == before


def test_an_unknown_node_is_refused_and_changes_nothing(dbpath: str) -> None:
    before = _state(dbpath)
    for action in ("reassign", "retire"):
        code, _, err, asked = _cli(dbpath, "node", action, "ghost", "--yes")
        assert code == 1 and "no node 'ghost' is known" in err and "nothing changed" in err
        assert asked == []
    assert _state(dbpath) == before


def test_a_bad_node_id_or_note_is_a_usage_error(
    dbpath: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _state(dbpath)
    for argv in (
        ["node", "retire", "bad id", "--yes"],
        ["node", "retire", "x" * 65, "--yes"],
        ["node", "reassign", "n1", "--yes", "--note", "   "],
        ["node", "explode", "n1"],
    ):
        with pytest.raises(SystemExit) as exited:
            admin.main(["--db", dbpath, *argv])
        assert exited.value.code == 2
        assert "tasknet-admin" in capsys.readouterr().err
    assert _state(dbpath) == before


def test_main_reads_the_answer_from_standard_input(
    dbpath: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))
    assert admin.main(["--db", dbpath, "node", "reassign", "n2"]) == 0
    captured = capsys.readouterr()
    assert "Move the 1 unfinished task(s) of node n2" in captured.err
    assert "1 unfinished task(s) moved off it" in captured.out
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal, no answer: refused
    assert admin.main(["--db", dbpath, "node", "retire", "n1"]) == 1
    assert "not confirmed" in capsys.readouterr().err
    assert "n1" in _state(dbpath)["keys"]
