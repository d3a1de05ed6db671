"""``tasknet-site`` start-up: schema check, ``--demo``, the order of
invariant 10 (recovery before dispatch), a failed recovery, node logins."""

from __future__ import annotations

import sqlite3

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.logger import globalLogPublisher
from zope.interface import implementer

from tasknet.node.link import site_client_service
from tasknet.protocol.session import INodeHandler
from tasknet.site.service import makeService
from tasknet.site.storage import tasks, users
from tasknet.site.storage.db import connect, run_read, run_write
from tasknet.site.storage.schema import load_script, prepare_database
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, raw, running_site, site_options, wait_for


def test_unmigrated_database_is_refused_naming_the_command(tmp_path, capsys):
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
async def test_demo_user_only_on_a_fresh_database(tmp_path):
    upstream = await start_upstream()
    try:
        fresh = str(tmp_path / "fresh.sqlite")
        async with running_site(site_options(fresh, upstream.base_url, "--demo")) as site:
            status, body = await site.request("GET", "/api/admin/unknown", token="demo")
            assert (status, body) == (200, {"tasks": []})
        existing = str(tmp_path / "existing.sqlite")
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
    week = tasks.iso_week()
    connection = connect(path)
    try:
        op1 = run_write(connection, tasks.reserve, 1, user_id, "", "t", week)
        run_write(connection, tasks.begin_submit, 1, op1, 2, "", week)
        op2 = run_write(connection, tasks.reserve, 2, user_id, "", "t", week)
        op3 = run_write(connection, tasks.reserve, 3, user_id, "", "t", week)
        run_write(connection, tasks.begin_submit, 3, op3, 2, "", week)
        run_write(connection, tasks.persist_submitted, 3, op3, "http://u/f", 2, week)
    finally:
        connection.close()
    return user_id, op1, op2


@pytest_twisted.ensureDeferred
async def test_start_runs_recovery_before_enabling_dispatch(tmp_path):
    path = str(tmp_path / "site.sqlite")
    _, op1, _ = _interrupted_state(path)
    upstream = await start_upstream()
    try:
        async with running_site(site_options(path, upstream.base_url)) as site:
            assert site.site.recovery_state == "done" and site.site.dispatch_enabled
            assert await site.request("GET", "/healthz") == (
                200,
                {"recovery": "done", "dispatch": "enabled"},
            )
            row = one(path, "SELECT state, operation_id, step FROM task_operation WHERE gid = 1")
            assert tuple(row) == ("UNKNOWN", op1, "recovery")
            assert one(path, "SELECT COUNT(*) FROM gallery WHERE gid = 2")[0] == 0
            assert one(path, "SELECT state FROM task_operation WHERE gid = 3")[0] == "SUBMITTED"
        assert upstream.stats()["requests"] == 0  # nothing resent
    finally:
        await upstream.stop()


@pytest_twisted.ensureDeferred
async def test_failed_recovery_accepts_nodes_but_dispatches_nothing(tmp_path):
    path = str(tmp_path / "site.sqlite")
    _interrupted_state(path)
    connection = raw(path)
    # The recovery transaction really fails (and rolls back as a whole).
    connection.execute(
        "CREATE TRIGGER recovery_fails BEFORE UPDATE OF step ON task_operation "
        "WHEN NEW.step = 'recovery' BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
    )
    connection.close()
    upstream = await start_upstream()
    try:
        async with running_site(site_options(path, upstream.base_url)) as site:
            assert await site.request("GET", "/healthz") == (
                200,
                {"recovery": "failed", "dispatch": "disabled"},
            )
            assert site.service.nodes_port is not None  # node connections still accepted
            assert one(path, "SELECT state FROM task_operation WHERE gid = 1")[0] == "SUBMITTING"
            assert one(path, "SELECT state FROM task_operation WHERE gid = 2")[0] == "RESERVED"
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
async def test_node_attach_and_detach_logged_with_negotiated_protocol(tmp_path, protocol):
    path = str(tmp_path / "site.sqlite")
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

                await wait_for(attached)
            finally:
                await client.stopService()
            await wait_for(lambda: any("disconnected" in e.get("log_format", "") for e in events))
    finally:
        globalLogPublisher.removeObserver(events.append)
        await upstream.stop()


def test_user_functions_for_the_admin_cli(tmp_path):
    path = str(tmp_path / "u.sqlite")
    prepare_database(path)
    connection = connect(path)
    try:
        user, token = run_write(connection, lambda c: users.create_user(c, "carol", quota=7))
        assert run_read(connection, users.user_by_token, token) == user
        stored = one(path, "SELECT token_hash FROM user WHERE name = 'carol'")[0]
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
async def test_make_service_with_full_wiring_starts_serves_and_stops_cleanly(tmp_path):
    import json

    import treq
    from twisted.web.client import HTTPConnectionPool

    path = str(tmp_path / "site.sqlite")
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
        assert service.site.dispatch_enabled
    finally:
        await service.stopService()
        await pool.closeCachedConnections()
        await upstream.stop()
    assert upstream.stats()["posts"] == {"99": 1}
