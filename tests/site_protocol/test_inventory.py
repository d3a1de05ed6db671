"""A node's archive inventory at the site (DELIVERY.md "Custody", PROTOCOL.md
"Archives (v2)", types 16 and 17), over real TCP with a scripted v2 node,
on both backends: a wiped node's completed tasks become ``ARCHIVE_GONE``
(``MISSING``), a node restored from an old backup is sent the tombstone's
``DELETE`` and misses its newer completions, a node given another node's
data directory lists orphans, an inventory cut halfway changes nothing,
25,000 archives in three parts judge in one transaction, and every
refused or bad inventory changes nothing."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import orjson
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from tasknet.protocol.messages import (
    FEATURE_ARCHIVE_INVENTORY,
    FEATURE_RELIABLE,
    FEATURE_SITE_PROOF,
    ArchiveInventory,
    ArchiveInventoryAck,
    Error,
    HeldArchive,
    Identity,
    Login,
    ProtocolHello,
    TaskCommand,
    encode,
    sign_login,
)
from tasknet.site.node_listener import INVENTORY_PARTS_MAX
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.inventory import GONE_PER_TRANSACTION
from tasknet.site.web.admin_nodes import nodes_view
from tests.eventually import eventually
from tests.site_protocol.harness import (
    TIMEOUT,
    ScriptedNode,
    Site,
    add_task,
    add_user,
    events_client,
    events_root,
    listen_http,
    secret_of,
)

SHA_A = hashlib.sha256(b"a").hexdigest()


class InventoryNode(ScriptedNode):
    """A v2 node that announces ``archive-inventory`` (``inventory=False``:
    one that does not); ``login=False``: it sends its inventory instead of
    logging in."""

    def __init__(
        self,
        node_id: str,
        *,
        inventory: bool = True,
        site_proof: bool = False,
        login: bool = True,
        early: ArchiveInventory | None = None,
    ) -> None:
        super().__init__(node_id, v2=True, site_proof=site_proof)
        self.announces_inventory = inventory
        self.login = login
        self.early = early

    def frameReceived(self, type_: int, payload: bytes) -> None:
        if type_ != Identity.TYPE:
            super().frameReceived(type_, payload)
            return
        self.frames.append((type_, payload))
        nonce = orjson.loads(payload)["nonce"]
        self.site_nonce = nonce
        features = [FEATURE_RELIABLE]
        if self.site_proof:
            features.append(FEATURE_SITE_PROOF)
        if self.announces_inventory:
            features.append(FEATURE_ARCHIVE_INVENTORY)
        self.sendMessage(ProtocolHello(features=tuple(features)))
        if not self.login:
            assert self.early is not None
            self.sendMessage(self.early)
            return
        self.sendMessage(
            Login(self.node_id, sign_login(secret_of(self.node_id), nonce, self.node_id))
        )

    def send_inventory(
        self, archives: list[HeldArchive], *, inventory_id: str = "inv-1", part_max: int = 10_000
    ) -> list[ArchiveInventory]:
        chunks = [archives[i : i + part_max] for i in range(0, len(archives), part_max)] or [[]]
        parts = [
            ArchiveInventory(inventory_id, n, len(chunks), tuple(chunk))
            for n, chunk in enumerate(chunks, start=1)
        ]
        for part in parts:
            self.sendMessage(part)
        return parts

    def send_raw(self, message: Any) -> None:
        """A message as it is, unchecked (a bad one on purpose)."""
        transport: Any = self.transport
        transport.write(encode(message))


async def connect(site: Site, node_id: str, **kw: Any) -> InventoryNode:
    node = InventoryNode(node_id, **kw)
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", site.port.getHost().port)
    await connectProtocol(endpoint, node)
    site.nodes.append(node)
    if node.login:
        assert await node.logged_in.addTimeout(TIMEOUT, reactor)
        if node.site_proof:
            assert await node.challenge()
        await eventually(lambda: node_id in site.side.nodes.ids())
    return node


def completed(conn: dbmod.Connection, gid: int, user: int, node_id: str, **kw: Any) -> str:
    """A COMPLETED task of ``node_id``; its operationId."""
    return str(add_task(conn, gid, user, node_id=node_id, status=4, **kw)["operation_id"])


def completed_many(conn: dbmod.Connection, user: int, first: int, count: int, node_id: str) -> None:
    """``count`` COMPLETED tasks of ``node_id`` from gid ``first`` (operationId
    ``op-GID``, size GID), 2,500 a statement and a transaction: a row at a
    time takes minutes on PostgreSQL, and so does one transaction (every
    row moves its user's one kept count); the generations first, so the
    task rows' triggers find them at once."""
    numbers = (
        "WITH RECURSIVE n(i) AS"
        " (SELECT CAST(? AS BIGINT) UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
    )

    def bulk(c: dbmod.Cursor, start: int, last: int) -> None:
        c.execute(
            numbers + "INSERT INTO task_operation (gid, operation_id, state, user_id, cost,"
            " metered, dispatched) SELECT i, 'op-' || i, 'SUBMITTED', ?, 10, 1, 1 FROM n",
            (start, last, user),
        )
        c.execute(
            numbers + "INSERT INTO gallery (gid, user_id, name, token, url, status, progress,"
            " node_id, cost, archive_size, archive_sha256) SELECT i, ?, 'g' || i, 'tok',"
            " 'http://u/f', 4, 1.0, ?, 10, i, ? FROM n",
            (start, last, user, node_id, SHA_A),
        )

    end = first + count
    for start in range(first, end, 2_500):
        last = min(start + 2_499, end - 1)
        dbmod.run_write(conn, lambda c, s=start, e=last: bulk(c, s, e))  # type: ignore[misc]


def held(gid: int, op: str | None = None, size: int = 100, sha: str = SHA_A) -> HeldArchive:
    return HeldArchive(gid, op or f"op-{gid}", size, sha)


def custody(conn: dbmod.Connection) -> dict[str, Any]:
    """Everything an inventory may change."""
    tasks = {
        int(r[0]): (r[1], r[2], r[3])
        for r in conn.execute(
            "SELECT gid, status_key, archive_gone_reason, archive_gone_node FROM gallery"
        ).fetchall()
    }
    return {
        "tasks": tasks,
        "inventory": [tuple(r) for r in conn.execute("SELECT * FROM node_inventory").fetchall()],
        "orphans": [tuple(r) for r in conn.execute("SELECT * FROM node_archive_orphan").fetchall()],
        "outbox": conn.execute("SELECT COUNT(*) FROM notification_outbox").fetchone()[0],
    }


def gone(conn: dbmod.Connection, gid: int) -> tuple[Any, ...]:
    r = conn.execute(
        "SELECT status_key, archive_gone_reason, archive_gone_node FROM gallery WHERE gid = ?",
        (gid,),
    ).fetchone()
    return tuple(r)


async def panel_entry(site: Site, node_id: str) -> dict[str, Any]:
    nodes = orjson.loads(await nodes_view(site.db, site.side.nodes, reactor))
    return next(n for n in nodes if n["id"] == node_id)


@pytest_twisted.ensureDeferred
async def test_a_wiped_node_s_completed_tasks_become_archive_gone_missing(site: Site) -> None:
    conn = site.sql()
    user, token = add_user(conn, "alice")
    for gid in (1, 2, 3):
        completed(conn, gid, user, "n1")
    add_task(conn, 4, user, node_id="n1", status=1)  # downloading: not judged
    completed(conn, 5, user, "n2")  # another node's
    http = await listen_http(events_root(site))
    events = await events_client(http.getHost().port, token)
    try:
        node = await connect(site, "n1")
        node.send_inventory([])  # wiped: holds nothing
        ack = await node.next(ArchiveInventoryAck)
        assert (ack.inventory_id, ack.part) == ("inv-1", 1)

        for gid in (1, 2, 3):
            assert gone(conn, gid) == ("ARCHIVE_GONE", "MISSING", "n1")
        assert gone(conn, 4) == ("DOWNLOADING", None, None)
        assert gone(conn, 5) == ("COMPLETED", None, None)
        # Each change announced through the outbox, after the commit.
        pushed = [(await events.next())["task"] for _ in range(3)]
        assert sorted(t["gid"] for t in pushed) == [1, 2, 3]
        assert {(t["status"], t["statusText"]) for t in pushed} == {("ARCHIVE_GONE", "归档已失效")}
        after = custody(conn)
        (row,) = after["inventory"]
        assert tuple(row)[:6] == ("n1", "inv-1", 0, 0, 3, 0)
        entry = await panel_entry(site, "n1")
        assert entry["orphans"] == []
        assert entry["inventory"]["missing"] == 3
        assert entry["inventory"]["archives"] == 0
        assert site.factory.handler.inventories_judged == 1  # type: ignore[attr-defined]

        # The same inventory again (the next connection): nothing more changes.
        await node.disconnect()
        node = await connect(site, "n1")
        node.send_inventory([], inventory_id="inv-2")
        await node.next(ArchiveInventoryAck)
        assert custody(conn)["tasks"] == after["tasks"]
        assert custody(conn)["orphans"] == []
        assert len(events.received) == 3
    finally:
        await events.shut()
        await http.stopListening()
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_node_restored_from_an_old_backup(site: Site) -> None:
    """It lists a deleted gid (DELETE with the tombstone's delete id), misses
    a newer completion (MISSING), keeps what it holds, and lists an archive
    of a gid the site does not know and an older generation as orphans,
    until an inventory no longer lists them."""
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    tomb = add_task(conn, 10, user, "DELETED", node_id="n1", status=4)
    kept = completed(conn, 11, user, "n1")
    completed(conn, 12, user, "n1")  # completed after the backup
    completed(conn, 13, user, "n1")
    dbmod.run_write(
        conn,
        lambda c: c.execute(
            "UPDATE gallery SET archive_size = 100, archive_sha256 = ? WHERE gid = 11", (SHA_A,)
        ),
    )
    node = await connect(site, "n1")

    node.send_inventory(
        [held(10), held(11, kept), held(13, "op-13-older"), held(13), held(99, "op-99", 7)]
    )
    command = await node.next(TaskCommand)
    assert (command.action, command.gid, command.operation_id) == (
        "DELETE",
        10,
        tomb["delete_operation_id"],
    )
    await node.next(ArchiveInventoryAck)

    assert gone(conn, 11) == ("COMPLETED", None, None)  # held as recorded
    assert gone(conn, 12) == ("ARCHIVE_GONE", "MISSING", "n1")
    assert gone(conn, 13) == ("COMPLETED", None, None)
    entry = await panel_entry(site, "n1")
    assert [(o["gid"], o["operationId"], o["size"]) for o in entry["orphans"]] == [
        (13, "op-13-older", 100),
        (99, "op-99", 7),
    ]
    assert entry["orphans"][0]["sha256"] == SHA_A
    inventory = entry["inventory"]
    assert (inventory["archives"], inventory["bytes"], inventory["missing"]) == (5, 407, 1)
    assert inventory["orphans"] == 2
    found_at = entry["orphans"][1]["foundAt"]

    # The node deleted gid 10 and the operator removed op-13-older: the next
    # inventory no longer lists them; the one still held keeps its found_at.
    await node.disconnect()
    node = await connect(site, "n1")
    node.send_inventory([held(11, kept), held(13), held(99, "op-99", 7)], inventory_id="inv-2")
    await node.next(ArchiveInventoryAck)
    assert node.pending(TaskCommand) == []
    entry = await panel_entry(site, "n1")
    assert [(o["gid"], o["foundAt"]) for o in entry["orphans"]] == [(99, found_at)]
    assert entry["inventory"]["inventoryId"] == "inv-2"
    conn.close()


@pytest_twisted.ensureDeferred
async def test_an_archive_whose_digest_differs_from_the_site_s_record_is_gone_corrupt(
    site: Site,
) -> None:
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    completed(conn, 30, user, "n1")
    completed(conn, 31, user, "n1")  # a legacy completion: no digest recorded
    dbmod.run_write(
        conn,
        lambda c: c.execute(
            "UPDATE gallery SET archive_size = 100, archive_sha256 = ? WHERE gid = 30", (SHA_A,)
        ),
    )
    node = await connect(site, "n1")
    node.send_inventory([held(30, sha="b" * 64), held(31, size=5, sha="c" * 64)])
    await node.next(ArchiveInventoryAck)
    assert gone(conn, 30) == ("ARCHIVE_GONE", "CORRUPT", "n1")
    assert gone(conn, 31) == ("COMPLETED", None, None)
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_node_given_another_node_s_data_directory(site: Site) -> None:
    """n1 comes back with n2's archives: n1's own are MISSING, n2's are
    listed as n1's orphans and never deleted; n2's tasks are untouched."""
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    completed(conn, 20, user, "n1")
    completed(conn, 21, user, "n2")
    completed(conn, 22, user, "n2")
    node = await connect(site, "n1")
    node.send_inventory([held(21), held(22)])
    await node.next(ArchiveInventoryAck)
    assert gone(conn, 20) == ("ARCHIVE_GONE", "MISSING", "n1")
    assert gone(conn, 21) == ("COMPLETED", None, None)
    assert gone(conn, 22) == ("COMPLETED", None, None)
    assert node.pending(TaskCommand) == []
    entry = await panel_entry(site, "n1")
    assert [o["gid"] for o in entry["orphans"]] == [21, 22]

    # n2 still holds its own: its inventory finds nothing amiss.
    other = await connect(site, "n2")
    other.send_inventory([held(21), held(22)])
    await other.next(ArchiveInventoryAck)
    assert gone(conn, 21) == ("COMPLETED", None, None)
    assert (await panel_entry(site, "n2"))["orphans"] == []
    conn.close()


@pytest_twisted.ensureDeferred
async def test_an_inventory_cut_halfway_changes_nothing(site: Site) -> None:
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    for gid in (40, 41, 42):
        completed(conn, gid, user, "n1")
    node = await connect(site, "n1")
    before = custody(conn)
    part1 = ArchiveInventory("inv-cut", 1, 2, (held(40),))
    node.sendMessage(part1)
    ack = await node.next(ArchiveInventoryAck)
    assert (ack.inventory_id, ack.part) == ("inv-cut", 1)
    await node.disconnect()  # lost before part 2
    await eventually(lambda: "n1" not in site.side.nodes.ids())
    assert custody(conn) == before

    # A part 2 of that inventory on the next connection is not the same inventory.
    node = await connect(site, "n1")
    node.sendMessage(ArchiveInventory("inv-cut", 2, 2, (held(41),)))
    ack = await node.next(ArchiveInventoryAck)
    assert ack.part == 2
    assert custody(conn) == before
    # A new inventory replaces the unfinished one; a part repeated is harmless.
    node.sendMessage(ArchiveInventory("inv-new", 1, 2, (held(40),)))
    node.sendMessage(ArchiveInventory("inv-new", 1, 2, (held(40),)))
    node.sendMessage(ArchiveInventory("inv-new", 2, 2, (held(41),)))
    acks = [await node.next(ArchiveInventoryAck) for _ in range(3)]
    assert [(a.inventory_id, a.part) for a in acks] == [
        ("inv-new", 1),
        ("inv-new", 1),
        ("inv-new", 2),
    ]
    assert gone(conn, 40)[1] is None
    assert gone(conn, 41)[1] is None
    assert gone(conn, 42) == ("ARCHIVE_GONE", "MISSING", "n1")
    conn.close()


@pytest_twisted.ensureDeferred
async def test_25000_archives_in_three_parts(site: Site) -> None:
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    count = 25_000

    completed_many(conn, user, 1, count, "n1")
    completed(conn, count + 1, user, "n1")  # the one the node lost
    node = await connect(site, "n1")
    archives = [held(gid, size=gid) for gid in range(1, count + 1)] + [held(10**9, "op-x", 1)]
    started = time.monotonic()
    parts = node.send_inventory(archives)
    assert [len(p.archives) for p in parts] == [10_000, 10_000, 5_001]
    acks = [await node.next(ArchiveInventoryAck, timeout=60) for _ in parts]
    seconds = time.monotonic() - started
    assert [a.part for a in acks] == [1, 2, 3]
    print(f"\n25,001 archives in 3 parts judged in {seconds:.2f} s ({site.db.backend})")
    assert seconds < 30
    assert gone(conn, count + 1) == ("ARCHIVE_GONE", "MISSING", "n1")
    assert gone(conn, 1) == ("COMPLETED", None, None)
    row = conn.execute("SELECT archives, bytes, missing, orphans FROM node_inventory").fetchone()
    assert tuple(row) == (count + 1, count * (count + 1) // 2 + 1, 1, 1)
    conn.close()


@pytest_twisted.ensureDeferred
async def test_a_wiped_node_s_thousands_are_marked_a_few_hundred_a_transaction(
    site: Site,
) -> None:
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    count = 2 * GONE_PER_TRANSACTION + 100
    completed_many(conn, user, 1, count, "n1")
    node = await connect(site, "n1")
    started = time.monotonic()
    node.send_inventory([held(count + 7, "op-unknown")])
    await node.next(ArchiveInventoryAck, timeout=60)
    handler: Any = site.factory.handler
    await eventually(lambda: handler.inventories_judged == 1, timeout=120)
    print(f"\n{count} MISSING in 3 transactions: {time.monotonic() - started:.2f} s")
    assert len(handler.last_verdict.missing) == count
    assert handler.last_verdict.pending == ()
    left = conn.execute(
        "SELECT COUNT(*) FROM gallery WHERE archive_gone_reason IS NULL"
    ).fetchone()[0]
    assert left == 0
    row = conn.execute("SELECT archives, missing, orphans FROM node_inventory").fetchone()
    assert tuple(row) == (1, count, 1)
    conn.close()


# -- refused and bad inventories: an Error, the connection closed, nothing changed


async def refused(site: Site, node: InventoryNode, conn: dbmod.Connection, before: Any) -> str:
    error = await node.next(Error)
    await node.lost.addTimeout(TIMEOUT, reactor)
    assert custody(conn) == before
    assert node.pending(ArchiveInventoryAck) == []
    return str(error.code)


@pytest_twisted.ensureDeferred
async def test_an_inventory_from_a_node_that_did_not_announce_the_feature_is_refused(
    site: Site,
) -> None:
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    completed(conn, 50, user, "n1")
    before = custody(conn)
    node = await connect(site, "n1", inventory=False)
    node.send_inventory([])
    assert await refused(site, node, conn, before) == "protocol_violation"
    conn.close()


@pytest_twisted.ensureDeferred
async def test_an_inventory_before_login_or_before_the_site_proof_is_refused(
    site: Site,
) -> None:
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    completed(conn, 51, user, "n1")
    before = custody(conn)
    early = InventoryNode("n1", login=False, early=ArchiveInventory("inv-1", 1, 1, ()))
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", site.port.getHost().port)
    await connectProtocol(endpoint, early)
    assert await refused(site, early, conn, before) == "unauthenticated"

    # A node that announced site-proof, logged in, not yet proven.
    node = InventoryNode("n1", site_proof=True)
    await connectProtocol(endpoint, node)
    assert await node.logged_in.addTimeout(TIMEOUT, reactor)
    node.send_inventory([])
    assert await refused(site, node, conn, before) == "protocol_violation"

    # Proven, it is judged.
    node = await connect(site, "n1", site_proof=True)
    node.send_inventory([])
    await node.next(ArchiveInventoryAck)
    assert gone(conn, 51) == ("ARCHIVE_GONE", "MISSING", "n1")
    conn.close()


BAD_PARTS = {
    "part beyond parts": ArchiveInventory("inv-1", 3, 2, ()),
    "part 0": ArchiveInventory("inv-1", 0, 2, ()),
    "too many archives": ArchiveInventory("inv-1", 1, 1, tuple(held(g) for g in range(1, 10_002))),
    "an uppercase sha256": ArchiveInventory("inv-1", 1, 1, (held(52, sha=SHA_A.upper()),)),
    "a short sha256": ArchiveInventory("inv-1", 1, 1, (held(52, sha="ab"),)),
    "too many parts": ArchiveInventory("inv-1", 1, INVENTORY_PARTS_MAX + 1, ()),
}


@pytest_twisted.ensureDeferred
async def test_bad_parts_are_bad_message(site: Site) -> None:
    conn = site.sql()
    user, _ = add_user(conn, "alice")
    completed(conn, 52, user, "n1")
    before = custody(conn)
    for name, part in BAD_PARTS.items():
        node = await connect(site, "n1")
        node.send_raw(part)
        assert await refused(site, node, conn, before) == "bad_message", name

    # The parts of one inventory changing their count.
    node = await connect(site, "n1")
    node.sendMessage(ArchiveInventory("inv-1", 1, 2, ()))
    await node.next(ArchiveInventoryAck)
    node.sendMessage(ArchiveInventory("inv-1", 2, 3, ()))
    assert await refused(site, node, conn, before) == "bad_message"
    conn.close()
