"""A completion's archive digest (DELIVERY.md "Integrity"), on both backends:
schema v11's ``gallery.archive_size`` and ``archive_sha256``, written when a
v2 status-4 entry carrying them is applied and shown in the task object as
``archiveSize`` and ``archiveSha256`` (the API, the WebSocket).  The real
site and mock upstream over loopback HTTP, scripted nodes over real TCP;
the report rules (owner, generation, revision) with the site's node side
over a real database."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint

from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tests.backends import INTEGRITY_ERRORS, execute
from tests.site.test_views_api import Fixture, with_fixture
from tests.site_protocol.harness import (
    EventsClient,
    ScriptedNode,
    Site,
    add_task,
    add_user,
    dropped_entries,
)


@pytest_twisted.async_yield_fixture
async def site(db_target: str) -> AsyncIterator[Site]:
    """The site's node side over a real database (no upstream, no HTTP)."""
    s = await Site(db_target).start()
    try:
        yield s
    finally:
        await s.stop()


ARCHIVE = b"the archive's bytes"
SHA = hashlib.sha256(ARCHIVE).hexdigest()


def _done(gid: int, content: bytes | None = ARCHIVE) -> tuple[Any, ...]:
    """A completion entry, with its digest unless ``content`` is None."""
    if content is None:
        return (gid, 4, 1.0)
    return (gid, 4, 1.0, False, "", len(content), hashlib.sha256(content).hexdigest())


def _digest(conn: Any, gid: int) -> tuple[Any, Any]:
    row = conn.execute("SELECT archive_size, archive_sha256 FROM gallery WHERE gid = ?", (gid,))
    found = row.fetchone()
    return (found[0], found[1])


async def _applied(node: ScriptedNode, *report: Any, **named: Any) -> None:
    node.report(*report, **named)
    assert (await node.next(TaskReportAck)).result == "APPLIED"


async def _events(f: Fixture, token: str) -> EventsClient:
    from autobahn.twisted.websocket import WebSocketClientFactory

    port = f.site.service.http_port.getHost().port
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/api/events?token={token}")
    factory.protocol = EventsClient
    client: Any = await TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(factory)  # type: ignore[arg-type]
    await client.opened
    return client  # type: ignore[no-any-return]


async def _push_of(client: EventsClient, gid: int, status: str) -> dict[str, Any]:
    """The first push of ``gid`` at ``status`` (earlier pushes skipped)."""
    while True:
        # A loaded machine's push may come after TIMEOUT: a failure here is
        # a push that never comes.
        push = await client.next(timeout=30.0)
        task = push.get("task") or {}
        if task.get("gid") == gid and task.get("status") == status:
            return task  # type: ignore[no-any-return]


@pytest_twisted.ensureDeferred
async def test_a_completion_with_its_digest_is_shown_and_pushed_and_one_without_is_null(
    db_target: str,
) -> None:
    async def test(f: Fixture) -> None:
        events = await _events(f, f.alice)
        try:
            node = await f.connect("n1")
            created = await f.create(301)
            assert created["archiveSize"] is None and created["archiveSha256"] is None
            await f.create(302)
            ops = {}
            for _ in range(2):
                command = await node.next(TaskCommand)
                ops[command.gid] = command.operation_id
            await _applied(node, "r1", 1, [(301, 1, 0.5), (302, 1, 0.5)], ops)
            _, task = await f.get("/api/tasks/301")
            assert (task["task"]["archiveSize"], task["task"]["archiveSha256"]) == (None, None)

            await _applied(node, "r2", 2, [_done(301), _done(302, None)], ops)
            pushed = await _push_of(events, 301, "COMPLETED")
            assert (pushed["archiveSize"], pushed["archiveSha256"]) == (len(ARCHIVE), SHA)
            status, body = await f.get("/api/tasks/301")
            assert status == 200
            assert (body["task"]["archiveSize"], body["task"]["archiveSha256"]) == (
                len(ARCHIVE),
                SHA,
            )
            # A completion without them (an older v2 node): null, as a legacy one's.
            _, body = await f.get("/api/tasks/302")
            assert body["task"]["status"] == "COMPLETED"
            assert (body["task"]["archiveSize"], body["task"]["archiveSha256"]) == (None, None)
            # The list answers the same object; an admin sees it too.
            _, page = await f.get("/api/tasks?order=gid")
            listed = {t["gid"]: t for t in page["tasks"]}
            assert listed[301]["archiveSha256"] == SHA and listed[302]["archiveSha256"] is None
            _, body = await f.get("/api/tasks/301", f.admin)
            assert body["task"]["archiveSize"] == len(ARCHIVE)
        finally:
            await events.shut()

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_a_recreated_gid_starts_without_a_digest_and_the_old_generation_writes_none(
    db_target: str,
) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1")
        await f.create(303)
        first = (await node.next(TaskCommand)).operation_id
        await _applied(node, "r1", 1, [_done(303)], {303: first})
        status, _ = await f.site.request("DELETE", "/api/tasks/303", token=f.alice)
        assert status in (200, 202)
        delete = await node.next(TaskCommand)
        assert delete.action == "DELETE"
        await _applied(node, "r2", 2, [], deleted=[(303, delete.operation_id, "DELETED", "")])
        again = await f.create(303)
        assert (again["archiveSize"], again["archiveSha256"]) == (None, None)
        second = (await node.next(TaskCommand)).operation_id
        assert second != first
        # The first generation's completion, reported again: dropped, nothing written.
        other = b"another archive"
        await _applied(node, "r3", 3, [_done(303, other)], {303: first})
        _, body = await f.get("/api/tasks/303")
        assert body["task"]["status"] == "SUBMITTED"
        assert (body["task"]["archiveSize"], body["task"]["archiveSha256"]) == (None, None)
        # The new generation's own completion records its own digest.
        await _applied(node, "r4", 4, [_done(303, other)], {303: second})
        _, body = await f.get("/api/tasks/303")
        assert (body["task"]["archiveSize"], body["task"]["archiveSha256"]) == (
            len(other),
            hashlib.sha256(other).hexdigest(),
        )

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_entries_that_are_not_applied_record_no_digest(site: Site) -> None:
    conn = site.sql()
    try:
        alice, _ = add_user(conn, "alice")
        for gid in (1, 2, 3):
            add_task(conn, gid, alice, node_id="n1", status=1, progress=0.5)
        n1 = await site.connect("n1")
        n2 = await site.connect("n2")
        # Not the owner: dropped.
        await _applied(n2, "x1", 500, [_done(1)], {1: "op-1"})
        # Another generation's operationId: dropped.
        await _applied(n1, "a1", 1000, [_done(2)], {2: "op-older"})
        # A stale revision (at or below the node's mark): dropped.
        await _applied(n1, "a2", 1001, [(3, 1, 0.6)], {3: "op-3"})
        await _applied(n1, "a3", 1000, [_done(3)], {3: "op-3"})
        for gid in (1, 2, 3):
            assert _digest(conn, gid) == (None, None)
            status = conn.execute("SELECT status FROM gallery WHERE gid = ?", (gid,))
            assert status.fetchone()[0] == 1
        drops = dropped_entries(conn)
        assert drops["n2"] == {"not_owner": 1}
        assert drops["n1"] == {"old_generation": 1, "stale": 1}
        # The owner's own completion of its generation, at a fresh revision: recorded.
        await _applied(n1, "a4", 1002, [_done(1), _done(3, None)], {1: "op-1", 3: "op-3"})
        assert _digest(conn, 1) == (len(ARCHIVE), SHA)
        assert _digest(conn, 3) == (None, None)
        # Repeated in the next snapshot without a digest: what is recorded stays.
        await _applied(n1, "a5", 1003, [_done(1, None)], {1: "op-1"})
        assert _digest(conn, 1) == (len(ARCHIVE), SHA)
    finally:
        conn.close()


@pytest.mark.parametrize(
    "size, sha256",
    [
        (-1, SHA),
        (1, SHA.upper()),
        (1, SHA[:63]),
        (1, SHA + "0"),
        (1, "g" * 64),
        (1, ""),
    ],
)
def test_the_schema_refuses_a_digest_that_is_not_64_lowercase_hex(
    db_target: str, size: int, sha256: str
) -> None:
    from tasknet.site.storage.engine.schema import prepare_database
    from tests.site.helpers import add_user as add_user_at
    from tests.site.helpers import one

    prepare_database(db_target)
    alice, _ = add_user_at(db_target, "alice")
    execute(
        db_target,
        "INSERT INTO gallery (gid, user_id, name, token) VALUES (?, ?, 'g', 't')",
        7,
        alice,
    )
    with pytest.raises(INTEGRITY_ERRORS):
        execute(
            db_target,
            "UPDATE gallery SET archive_size = ?, archive_sha256 = ? WHERE gid = 7",
            size,
            sha256,
        )
    assert tuple(one(db_target, "SELECT archive_size, archive_sha256 FROM gallery")) == (None, None)
    execute(
        db_target,
        "UPDATE gallery SET archive_size = ?, archive_sha256 = ? WHERE gid = 7",
        len(ARCHIVE),
        SHA,
    )
    assert tuple(one(db_target, "SELECT archive_size, archive_sha256 FROM gallery")) == (
        len(ARCHIVE),
        SHA,
    )
