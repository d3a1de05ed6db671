"""``tasknet-site`` start-up: schema check, ``--demo``, the order of
invariant 10 (recovery before dispatch), a failed recovery, node logins."""

from __future__ import annotations

import json
import socket
import sqlite3

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import deferLater
from twisted.logger import globalLogPublisher
from twisted.web.client import HTTPConnectionPool
from zope.interface import implementer

from tasknet.node.link import site_client_service
from tasknet.protocol.messages import TaskReportAck
from tasknet.protocol.session import INodeHandler
from tasknet.runtime import SystemEntropy
from tasknet.site.root import Tuning, build_site, makeService
from tasknet.site.storage import create, usage, users
from tasknet.site.storage.engine.database import connect, run_read, run_write
from tasknet.site.storage.engine.schema import load_script, prepare_database
from tasknet.upstream.testing import start_upstream
from tests.backends import WriteLock, add_failing_trigger, backend_of, replication_of
from tests.eventually import eventually
from tests.site.helpers import (
    add_user,
    one,
    query,
    raw,
    running_site,
    site_options,
)
from tests.site_protocol.harness import ScriptedNode, secret_of


def test_unmigrated_database_is_refused_naming_the_command(tmp_path, capsys):
    # SQLite only: a legacy (v1) database is SQLite's; PostgreSQL starts at v4.
    path = str(tmp_path / "legacy.sqlite")
    connection = sqlite3.connect(path)
    connection.executescript(load_script("schema_v1.sql"))
    connection.execute("INSERT INTO user (name, token_hash) VALUES ('x', 'h')")
    connection.commit()
    connection.close()
    with pytest.raises(SystemExit) as stopped:
        makeService(site_options(path, "http://127.0.0.1:1"))
    assert stopped.value.code == 1
    assert f"run: tasknet-migrate --db {path}" in capsys.readouterr().err
    connection = sqlite3.connect(path)
    tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
    connection.close()
    assert "task_operation" not in tables  # nothing changed


def test_options_validate_node_keys_and_numbers():
    from twisted.python.usage import UsageError

    for bad in (
        ["--node-key", "nosecret"],
        ["--node-key", ":x"],
        ["--upstream-timeout", "0"],
        ["--default-quota", "-1"],
        ["--upstream", "ftp://x"],
        ["--webhook", "file:///etc/passwd"],
    ):
        with pytest.raises(UsageError):
            site_options("x.sqlite", "http://127.0.0.1:1", *bad)
    options = site_options(
        "x.sqlite", "http://127.0.0.1:1", "--node-key", "n1:s1", "--node-key", "n2:s:2"
    )
    assert options["node-keys"] == {"n1": "s1", "n2": "s:2"}


@pytest_twisted.ensureDeferred
async def test_demo_user_only_on_a_fresh_database(new_db_target):
    upstream = await start_upstream()
    try:
        fresh = new_db_target("fresh")
        async with running_site(site_options(fresh, upstream.base_url, "--demo")) as site:
            status, body = await site.request("GET", "/api/admin/unknown", token="demo")
            assert (status, body) == (200, {"tasks": []})
        existing = new_db_target("existing")
        prepare_database(existing)
        async with running_site(site_options(existing, upstream.base_url, "--demo")) as site:
            status, _ = await site.request("GET", "/api/tasks", token="demo")
            assert status == 401
    finally:
        await upstream.stop()


def _interrupted_state(path: str) -> tuple[int, str, str]:
    """What a crash leaves: gid 1 SUBMITTING, gid 2 RESERVED, gid 3 SUBMITTED."""
    prepare_database(path)
    user_id, _ = add_user(path, "alice")
    week = usage.iso_week()
    connection = connect(path)
    try:
        op1 = run_write(connection, create.reserve, 1, user_id, "", "t", week)
        run_write(connection, create.begin_submit, 1, op1, 2, "", week)
        op2 = run_write(connection, create.reserve, 2, user_id, "", "t", week)
        op3 = run_write(connection, create.reserve, 3, user_id, "", "t", week)
        run_write(connection, create.begin_submit, 3, op3, 2, "", week)
        run_write(connection, create.persist_submitted, 3, op3, "http://u/f", 2, week)
    finally:
        connection.close()
    return user_id, op1, op2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) != 0


@pytest_twisted.ensureDeferred
async def test_start_runs_recovery_before_enabling_dispatch(db_target):
    path = db_target
    _, op1, _ = _interrupted_state(path)
    upstream = await start_upstream()
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    nodes_port = _free_port()
    options = site_options(path, upstream.base_url)
    options["nodes"] = f"tcp:{nodes_port}:interface=127.0.0.1"
    service = build_site(options)
    # Another process holds the write lock: recovery waits for it.
    lock = WriteLock(path).acquire()
    try:
        service.startService()
        # While recovery is held: no node port, no HTTP, dispatch off.
        for _ in range(5):
            assert _refused(nodes_port)
            assert service.parts.health.recovery == "pending"
            assert service.nodes_port is None and service.http_port is None
            assert not service.parts.health.dispatch_enabled
            await settle_for(0.05)
        lock.release()
        await service.ready
        assert not _refused(nodes_port)
        pool = HTTPConnectionPool(reactor, persistent=False)
        try:
            response = await treq.get(
                f"http://127.0.0.1:{service.http_port.getHost().port}/healthz", pool=pool
            )
            assert json.loads(await treq.content(response)) == {
                "site": options["name"],
                "backend": backend_of(db_target),
                "recovery": "done",
                "dispatch": "enabled",
                "database": "ok",
                "replication": replication_of(db_target),
            }
        finally:
            await pool.closeCachedConnections()
        # And in that order, by the log.
        texts = [e.get("log_format", "") for e in events]

        def first(prefix: str) -> int:
            return next(i for i, t in enumerate(texts) if t.startswith(prefix))

        assert first("recovery:") < first("node listener on") < first("dispatch enabled")
        assert first("dispatch enabled") < first("HTTP on")
        row = one(path, "SELECT state, operation_id, step FROM task_operation WHERE gid = 1")
        assert tuple(row) == ("UNKNOWN", op1, "recovery")
        assert one(path, "SELECT COUNT(*) FROM gallery WHERE gid = 2")[0] == 0
        assert one(path, "SELECT state FROM task_operation WHERE gid = 3")[0] == "SUBMITTED"
        assert upstream.stats()["requests"] == 0  # nothing resent
    finally:
        globalLogPublisher.removeObserver(events.append)
        lock.release()
        await service.stopService()
        await upstream.stop()


async def settle_for(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def _scripted_node(service, node_id: str) -> ScriptedNode:
    node = ScriptedNode(node_id)
    port = service.nodes_port.getHost().port
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), node)
    return node


@pytest_twisted.ensureDeferred
async def test_failed_recovery_accepts_nodes_but_dispatches_nothing(db_target):
    path = db_target
    _interrupted_state(path)
    op3 = one(path, "SELECT operation_id FROM task_operation WHERE gid = 3")[0]
    # The recovery transaction really fails (and rolls back as a whole).
    add_failing_trigger(
        path,
        "recovery_fails",
        "task_operation",
        "disk I/O error",
        event="UPDATE OF step",
        when="NEW.step = 'recovery'",
    )
    connection = raw(path)
    # gid 3 is n1's (a node changes only the tasks assigned to it), sent
    # before the restart; dispatched = 0 stays to show nothing resends it.
    connection.execute("UPDATE gallery SET node_id = 'n1' WHERE gid = 3")
    connection.close()
    upstream = await start_upstream()
    try:
        options = site_options(path, upstream.base_url, "--node-key", f"n1:{secret_of('n1')}")
        async with running_site(options) as site:
            assert await site.request("GET", "/healthz") == (
                200,
                {
                    "site": options["name"],
                    "backend": backend_of(path),
                    "recovery": "failed",
                    "dispatch": "disabled",
                    "database": "ok",
                    "replication": replication_of(path),
                },
            )
            # The dispatcher service was never started; the outbox was.
            assert not site.service.getServiceNamed("dispatch").running
            assert site.service.getServiceNamed("outbox").running
            assert one(path, "SELECT state FROM task_operation WHERE gid = 1")[0] == "SUBMITTING"
            assert one(path, "SELECT state FROM task_operation WHERE gid = 2")[0] == "RESERVED"
            # A real node logs in: accepted, and its report is applied and ACKed ...
            node = await _scripted_node(site.service, "n1")
            assert await node.logged_in
            node.report("r1", 1000, [(3, 1, 0.25)], {3: op3})
            ack = await node.next(TaskReportAck)
            assert (ack.report_id, ack.result) == ("r1", "APPLIED")
            row = one(path, "SELECT status, progress FROM gallery WHERE gid = 3")
            assert tuple(row) == (1, 0.25)
            # ... but the SUBMITTED gid 3 was never (re)sent to it: dispatch
            # is disabled, so no login pass ran.
            assert node.messages == [ack]
            assert one(path, "SELECT dispatched FROM task_operation WHERE gid = 3")[0] == 0
            await node.disconnect()
    finally:
        await upstream.stop()


@implementer(INodeHandler)
class _Node:
    def __init__(self) -> None:
        self.up: Deferred[object] = Deferred()

    def link_up(self, link: object) -> None:
        if not self.up.called:
            self.up.callback(link)

    def message_received(self, link: object, message: object) -> None:
        pass

    def link_down(self, link: object) -> None:
        pass


@pytest.mark.parametrize("protocol", [1, 2])
@pytest_twisted.ensureDeferred
async def test_node_attach_and_detach_logged_with_negotiated_protocol(db_target, protocol):
    path = db_target
    upstream = await start_upstream()
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        options = site_options(path, upstream.base_url, "--node-key", "n1:secret")
        async with running_site(options) as site:
            port = site.service.nodes_port.getHost().port
            node = _Node()
            client = site_client_service(
                f"tcp:host=127.0.0.1:port={port}",
                "n1",
                "secret",
                node,
                protocol=protocol,
                reactor=reactor,
                entropy=SystemEntropy(),
            )
            client.startService()
            try:
                await node.up

                def attached() -> bool:
                    return any(
                        e.get("log_format", "").startswith("node {node_id} logged in")
                        and e.get("protocol_version") == protocol
                        for e in events
                    )

                await eventually(attached)
            finally:
                await client.stopService()
            await eventually(lambda: any("disconnected" in e.get("log_format", "") for e in events))
    finally:
        globalLogPublisher.removeObserver(events.append)
        await upstream.stop()


def test_user_functions_for_the_admin_cli(db_target):
    path = db_target
    prepare_database(path)
    connection = connect(path)
    try:
        user, token = run_write(connection, lambda c: users.create_user(c, "carol", quota=7))
        assert run_read(connection, users.user_by_token, token) == user
        stored = one(path, "SELECT token_hash FROM \"user\" WHERE name = 'carol'")[0]
        assert stored == users.hash_token(token) and token not in stored
        with pytest.raises(users.UserError):
            run_write(connection, lambda c: users.create_user(c, "carol"))
        with pytest.raises(users.UserError):
            run_write(connection, lambda c: users.create_user(c, "bad name"))
        assert run_write(connection, users.set_quota, "carol", 9).quota == 9
        new = run_write(connection, users.rotate_token, "carol")
        assert run_read(connection, users.user_by_token, token) is None
        assert run_read(connection, users.user_by_token, new).name == "carol"
        assert [u.name for u in run_read(connection, users.list_users)] == ["carol"]
        secret = run_write(connection, users.add_node_key, "node-9", None)
        assert run_read(connection, users.node_keys) == {"node-9": secret}
        assert run_write(connection, users.remove_node_key, "node-9") is True
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_make_service_with_full_wiring_starts_serves_and_stops_cleanly(db_target):
    import json

    import treq
    from twisted.web.client import HTTPConnectionPool

    path = db_target
    upstream = await start_upstream()
    pool = HTTPConnectionPool(reactor, persistent=False)
    service = makeService(site_options(path, upstream.base_url, "--demo"))
    service.startService()
    try:
        await service.ready
        base = f"http://127.0.0.1:{service.http_port.getHost().port}"
        response = await treq.post(
            base + "/api/tasks",
            data=json.dumps({"gid": 99, "token": "t"}).encode(),
            headers={"Authorization": ["Bearer demo"]},
            pool=pool,
        )
        body = json.loads(await treq.content(response))
        assert response.code == 201 and body["task"]["state"] == "SUBMITTED"
        assert service.parts.health.dispatch_enabled
        # Every timed part is a running child service of the site.
        assert sorted(service.namedServices) == [
            "dispatch",
            "housekeeping",
            "instance",
            "node-keys",
            "node-ownership",
            "outbox",
        ]
        assert all(child.running for child in service)
    finally:
        await service.stopService()
        await pool.closeCachedConnections()
        await upstream.stop()
    assert not any(child.running for child in service)
    assert upstream.stats()["posts"] == {"99": 1}


@pytest_twisted.ensureDeferred
async def test_default_quota_is_what_the_admin_gives_new_users(db_target):
    from tasknet.cli.admin import main as admin

    path = db_target
    prepare_database(path)
    assert admin(["--db", path, "user", "add", "early"]) == 0  # no site started yet
    upstream = await start_upstream()
    try:
        async with running_site(site_options(path, upstream.base_url, "--default-quota", "42")):
            assert admin(["--db", path, "user", "add", "bob"]) == 0
            assert admin(["--db", path, "user", "add", "carol", "--quota", "7"]) == 0
    finally:
        await upstream.stop()
    quotas = dict(query(path, 'SELECT name, quota FROM "user"'))
    assert quotas == {"early": users.DEFAULT_QUOTA, "bob": 42, "carol": 7}


@pytest_twisted.ensureDeferred
async def test_node_keys_added_or_removed_by_the_admin_apply_without_a_restart(db_target):
    path = db_target
    upstream = await start_upstream()

    try:
        # n2's key on the command line wins over the table's.
        options = site_options(path, upstream.base_url, "--node-key", f"n2:{secret_of('n2')}")
        async with running_site(options, Tuning(node_keys_refresh=0.05)) as site:
            connection = connect(path)
            try:
                run_write(connection, users.add_node_key, "n7", secret_of("n7"))
                run_write(connection, users.add_node_key, "n2", "not-the-option")
            finally:
                connection.close()
            await eventually(lambda: "n7" in site.site.node_side.listener.node_keys)
            assert site.site.node_side.listener.node_keys["n2"] == secret_of("n2")
            node = await _scripted_node(site.service, "n7")
            assert await node.logged_in is True
            await node.disconnect()

            connection = connect(path)
            try:
                assert run_write(connection, users.remove_node_key, "n7")
            finally:
                connection.close()
            await eventually(lambda: "n7" not in site.site.node_side.listener.node_keys)
            refused = await _scripted_node(site.service, "n7")
            assert await refused.logged_in is False
            await refused.lost
    finally:
        await upstream.stop()


@pytest_twisted.ensureDeferred
async def test_stop_acks_committed_reports_before_closing_node_connections(db_target):
    import threading

    path = db_target
    upstream = await start_upstream()
    options = site_options(path, upstream.base_url, "--node-key", f"n1:{secret_of('n1')}")
    service = build_site(options)
    service.startService()
    stopped = None
    try:
        await service.ready
        node = await _scripted_node(service, "n1")
        assert await node.logged_in
        db = service.parts.db
        # Hold the writer so the report is received but not yet committed
        # when the stop begins.
        running, release = threading.Event(), threading.Event()

        def hold(cursor) -> None:
            running.set()
            release.wait(10)

        held = db.write(hold)
        await eventually(running.is_set)
        node.report("r-stop", 1000)
        await eventually(lambda: len(db._queue) >= 1)  # the report's transaction waits
        stopped = service.stopService()
        await settle_for(0.1)
        assert not node.lost.called  # connections stay open while the report is in flight
        release.set()
        await held
        await stopped
        await node.lost
        acks = [m for m in node.messages if isinstance(m, TaskReportAck)]
        assert [(a.report_id, a.result) for a in acks] == [("r-stop", "APPLIED")]
        assert query(path, "SELECT report_id FROM report_receipt")[0][0] == "r-stop"
    finally:
        if stopped is None:
            await service.stopService()
        await upstream.stop()
