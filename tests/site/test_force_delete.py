"""Force-delete of a stuck ``DELETE_PENDING`` (INTERFACES.md, "Stuck deletes"):
the API on the real site over HTTP, the node's late confirmation over real
TCP, and ``tasknet-admin force-delete`` on the same kind of file."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from tasknet.cli import admin
from tasknet.protocol.messages import TaskReportAck
from tasknet.site.storage import create, delete, dispatch, usage
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, query, running_site, site_options
from tests.site_protocol.harness import ScriptedNode, secret_of


def _submitted(path: str, gid: int, user_id: int, node: str | None) -> str:
    """A SUBMITTED task, assigned to ``node`` when given; its operation id."""
    week = usage.iso_week()
    connection = connect(path)
    try:
        op = run_write(connection, create.reserve, gid, user_id, "", "t", week)
        run_write(connection, create.begin_submit, gid, op, 2, "", week)
        run_write(connection, create.persist_submitted, gid, op, f"http://u/{gid}", 2, week)
        if node is not None:
            assert run_write(connection, dispatch.claim_task, gid, [node]) is not None
    finally:
        connection.close()
    return op


def _stuck(path: str, gid: int, user_id: int, node: str = "n1") -> str:
    """A DELETE_PENDING whose node never answers; its delete operation id."""
    _submitted(path, gid, user_id, node)
    connection = connect(path)
    try:
        started = run_write(connection, delete.request_delete, gid, None)
    finally:
        connection.close()
    assert not started.completed and started.node == node
    return started.delete_operation_id


def _state(path: str, gid: int) -> str | None:
    row = one(path, "SELECT state FROM task_operation WHERE gid = ?", gid)
    return row[0] if row else None


def _audits(path: str, gid: int) -> list[tuple]:
    return [
        tuple(r)
        for r in query(
            path,
            "SELECT gid, delete_operation_id, node_id, actor, note FROM force_delete_audit "
            "WHERE gid = ?",
            gid,
        )
    ]


@pytest_twisted.ensureDeferred
async def test_api_force_delete_tombstones_audits_and_ignores_the_late_confirmation(
    db_target: str,
) -> None:
    path = db_target
    prepare_database(path)
    alice, alice_token = add_user(path, "alice")
    _, root_token = add_user(path, "root", admin=True)
    delete_id = _stuck(path, 7, alice)
    _submitted(path, 8, alice, "n1")
    upstream = await start_upstream()
    try:
        options = site_options(path, upstream.base_url, "--node-key", f"n1:{secret_of('n1')}")
        async with running_site(options) as site:
            url = "/api/admin/tasks/7/force-delete"
            # Refusals change nothing.
            status, body = await site.request("POST", url, token=alice_token, body={"note": "x"})
            assert status == 403 and body["error"]["code"] == "forbidden"
            for bad in ({}, {"note": 5}, {"note": ""}, {"note": "n" * 2001}, ["note"]):
                status, body = await site.request("POST", url, token=root_token, body=bad)
                assert status == 400 and body["error"]["code"] == "invalid_request", bad
            status, body = await site.request(
                "POST", "/api/admin/tasks/99/force-delete", token=root_token, body={"note": "x"}
            )
            assert status == 404 and body["error"]["code"] == "not_found"
            status, body = await site.request(
                "POST", "/api/admin/tasks/8/force-delete", token=root_token, body={"note": "x"}
            )
            assert status == 409 and body["error"]["code"] == "conflict"
            assert _state(path, 8) == "SUBMITTED"
            assert _state(path, 7) == "DELETE_PENDING" and _audits(path, 7) == []

            note = "node n1 was decommissioned; disk destroyed"
            status, first = await site.request("POST", url, token=root_token, body={"note": note})
            assert status == 200
            assert first["gid"] == 7 and first["state"] == "DELETED"
            assert first["forced"]["actor"] == "root" and first["forced"]["note"] == note
            assert first["forced"]["node"] == "n1"
            assert first["forced"]["deleteOperationId"] == delete_id
            assert _state(path, 7) == "DELETED"
            assert one(path, "SELECT COUNT(*) FROM gallery WHERE gid = 7")[0] == 0
            assert _audits(path, 7) == [(7, delete_id, "n1", "root", note)]
            status, _ = await site.request("GET", "/api/tasks/7", token=root_token)
            assert status == 404

            # Idempotent: the same answer again, nothing written.
            status, again = await site.request(
                "POST", url, token=root_token, body={"note": "another"}
            )
            assert (status, again) == (200, first)
            assert len(_audits(path, 7)) == 1

            # The node comes back after all and confirms: ACKed, ignored.
            node = ScriptedNode("n1")
            port = site.service.nodes_port.getHost().port
            await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), node)
            assert await node.logged_in
            node.report("late-1", 10**6, deleted=[(7, delete_id, "DELETED", "")])
            ack = await node.next(TaskReportAck)
            assert ack.report_id == "late-1"
            assert _state(path, 7) == "DELETED"
            assert one(path, "SELECT COUNT(*) FROM gallery WHERE gid = 7")[0] == 0
            assert len(_audits(path, 7)) == 1
            await node.disconnect()
    finally:
        await upstream.stop()


def test_a_tombstone_the_node_confirmed_is_a_conflict_not_a_force(db_target: str) -> None:
    path = db_target
    prepare_database(path)
    alice, _ = add_user(path, "alice")
    delete_id = _stuck(path, 5, alice)
    connection = connect(path)
    try:
        assert run_write(connection, delete.complete_delete, 5, delete_id)
        with pytest.raises(delete.TaskError) as refused:
            run_write(connection, delete.force_delete, 5, "root", "why")
    finally:
        connection.close()
    assert refused.value.code == "conflict" and "confirmed" in refused.value.message
    assert _audits(path, 5) == []


def _cli(path: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = admin.main(["--db", path, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_admin_force_delete(db_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = db_target
    prepare_database(path)
    alice, _ = add_user(path, "alice")
    delete_id = _stuck(path, 3, alice, node="gone")
    _submitted(path, 4, alice, None)

    with pytest.raises(SystemExit) as usage_error:
        admin.main(["--db", path, "force-delete", "3"])
    assert usage_error.value.code == 2
    with pytest.raises(SystemExit):
        admin.main(["--db", path, "force-delete", "3", "--note", "  "])
    capsys.readouterr()
    code, _, err = _cli(path, capsys, "force-delete", "4", "--note", "x")
    assert code == 1 and "not DELETE_PENDING" in err and _state(path, 4) == "SUBMITTED"
    code, _, err = _cli(path, capsys, "force-delete", "77", "--note", "x")
    assert code == 1 and "no task 77" in err

    code, out, _ = _cli(path, capsys, "force-delete", "3", "--note", "node gone retired")
    assert code == 0
    assert f"gid 3: DELETED (forced; node gone never confirmed delete {delete_id})" in out
    assert _state(path, 3) == "DELETED"
    [(gid, audited_delete, node, actor, note)] = _audits(path, 3)
    assert (gid, audited_delete, node, note) == (3, delete_id, "gone", "node gone retired")
    assert actor.startswith("tasknet-admin")

    code, out, _ = _cli(path, capsys, "force-delete", "3", "--note", "again")
    assert code == 0 and "already force-deleted" in out and "nothing changed" in out
    assert len(_audits(path, 3)) == 1
