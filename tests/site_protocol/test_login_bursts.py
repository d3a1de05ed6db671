"""A burst of logins costs what those nodes hold, not the number of nodes
connected (bench B5, B10): the dispatcher catches up with the logins that
arrive together in one pass, for those nodes only; their takes and their
``node_seen`` rows share a transaction (``Database.write_joined``); the listener
admits logins at the pace their takes commit; and a create's dispatch
counts nobody's tasks."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.threads import deferToThread

from tasknet.protocol.messages import TaskCommand
from tasknet.site import node_listener
from tasknet.site.storage import dispatch
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import prepare_database
from tests.runtime import site_runtime
from tests.site_protocol.harness import Site, add_task, add_user, row

NODES = 24


def _world(site: Site) -> None:
    """Per node: one assigned task (resent at login) and one pending delete."""
    conn = site.sql()
    try:
        uid, _ = add_user(conn, "alice")
        for i in range(NODES):
            add_task(conn, 1000 + i, uid, node_id=f"n{i:02}")
            add_task(conn, 2000 + i, uid, "DELETE_PENDING", node_id=f"n{i:02}")
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_a_burst_of_logins_is_caught_up_for_those_nodes_only(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[list[str]] = []
    real = dispatch.pending_deletes_page

    def counting(cursor: Any, node_ids: list[str], *args: Any) -> dispatch.Page:
        passes.append(list(node_ids))
        return real(cursor, node_ids, *args)

    monkeypatch.setattr(dispatch, "pending_deletes_page", counting)
    site = await Site(db_target).start(dispatch_poll_interval=None)
    try:
        _world(site)
        nodes = await gatherResults(
            [Deferred.fromCoroutine(site.connect(f"n{i:02}")) for i in range(NODES)]
        )
        for i, node in enumerate(nodes):
            first, second = await node.next(TaskCommand), await node.next(TaskCommand)
            assert {(c.action, c.gid) for c in (first, second)} == {
                ("DOWNLOAD", 1000 + i),
                ("DELETE", 2000 + i),
            }
        await site.side.dispatcher.idle()
        # Every node's id went to one deletes pass of its login, and no pass
        # asked for the nodes already caught up: N ids in all, not N²/2.
        asked = [node for ids in passes for node in ids]
        assert sorted(asked) == [f"n{i:02}" for i in range(NODES)]
        # Nothing sent twice.
        assert all(len(node.messages) == 2 for node in nodes)
        conn = site.sql()
        try:
            assert all(row(conn, 1000 + i)["dispatched"] == 1 for i in range(NODES))
        finally:
            conn.close()
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_create_goes_to_the_least_loaded_node_as_counted_at_login(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[list[str]] = []
    real = dispatch.node_loads

    def counting(cursor: Any, node_ids: list[str]) -> dict[str, int]:
        counted.append(list(node_ids))
        return real(cursor, node_ids)

    monkeypatch.setattr(dispatch, "node_loads", counting)
    site = await Site(db_target).start(dispatch_poll_interval=None)
    try:
        conn = site.sql()
        uid, _ = add_user(conn, "alice")
        for gid in (1, 2):
            add_task(conn, gid, uid, node_id="n1")
        add_task(conn, 3, uid, node_id="n2")
        n1, n2, n3 = [await site.connect(n) for n in ("n1", "n2", "n3")]
        await site.side.dispatcher.idle()
        logins = len(counted)
        assert logins >= 1  # each login counts its own nodes (a read)
        # Loads 2, 1, 0: n3, then n3 or n2 (1 each, the lowest id), ...
        for gid in range(50, 56):
            add_task(conn, gid, uid, dispatched=0)
            await site.side.dispatcher.task_changed(gid)
        owners = [row(conn, gid)["node_id"] for gid in range(50, 56)]
        assert owners == ["n3", "n2", "n3", "n1", "n2", "n3"]
        assert len(counted) == logins  # no count per create
        conn.close()
        del n1, n2, n3
    finally:
        await site.stop()


def _pages_one_by_one(
    conn: dbmod.Connection, wanted: list[tuple[str, int]], limit: int
) -> list[tuple[str, list[int]]]:
    out = []
    for node, after in wanted:
        gids: list[int] = []
        while True:
            page = dbmod.run_write(conn, dispatch.claim_node_page, node, after, limit)
            gids += [c.gid for c in page.commands]
            if page.last_gid is None:
                break
            after = page.last_gid
        out.append((node, gids))
    return out


def _pages_together(
    conn: dbmod.Connection, wanted: list[tuple[str, int]], limit: int
) -> list[tuple[str, list[int]]]:
    found: dict[str, list[int]] = {node: [] for node, _ in wanted}
    todo = list(wanted)
    while todo:
        pages = dbmod.run_write(conn, dispatch.claim_nodes_pages, todo, limit)
        assert pages
        more = []
        for (node, _), page in zip(todo, pages, strict=False):
            found[node] += [c.gid for c in page.commands]
            if page.last_gid is not None:
                more.append((node, page.last_gid))
        todo = more + todo[len(pages) :]
    return list(found.items())


@pytest.mark.parametrize("limit", [1, 3, 500])
def test_pages_of_several_nodes_are_those_of_each_node(db_target: str, limit: int) -> None:
    prepare_database(db_target)
    conn = dbmod.connect(db_target)
    try:
        uid, _ = add_user(conn, "alice")
        gid = 1
        for n, count in enumerate([0, 4, 1, 7, 0, 2]):
            for _ in range(count):
                add_task(conn, gid, uid, node_id=f"n{n}")
                gid += 1
        add_task(conn, gid, uid, "DELETE_PENDING", node_id="n3")
        wanted = [(f"n{n}", 0) for n in range(6)]
        expected = _pages_one_by_one(conn, wanted, 10_000)
        assert _pages_together(conn, wanted, limit) == expected
        assert sum(len(gids) for _, gids in expected) == 15
    finally:
        conn.close()


def _insert_all(cursor: Any, names: list[str]) -> list[int]:
    out = []
    for name in names:
        if name == "bad":
            raise ValueError("a bad item")
        cursor.execute("INSERT INTO burst_probe (n) VALUES (?)", (len(name),))
        out.append(len(name))
    return out


@pytest_twisted.ensureDeferred
async def test_items_queued_while_the_writer_is_busy_share_one_write(db_target: str) -> None:
    prepare_database(db_target)
    db = dbmod.open_pool(db_target, **site_runtime())
    await db.write(lambda cursor: cursor.execute("CREATE TABLE burst_probe (n INTEGER)"))
    calls: list[list[str]] = []

    def recorded(cursor: Any, names: list[str]) -> list[int]:
        calls.append(list(names))
        return _insert_all(cursor, names)

    def joined(name: str) -> Deferred[int]:
        return db.write_joined(recorded, name).addCallback(lambda committed: committed.value)

    try:
        release = threading.Event()
        held = db.write(lambda cursor: release.wait(10))  # the writer is busy
        first = joined("a")
        rest = [joined("b" * n) for n in range(2, 40)]
        # A write queued after the items runs after all of them.
        seen = db.write(
            lambda cursor: cursor.execute("SELECT COUNT(*) FROM burst_probe").fetchone()[0]
        )
        await deferToThread(release.set)
        await held
        assert await first == 1
        assert await gatherResults(rest) == list(range(2, 40))
        assert await seen == 39
        assert len(calls) == 1 and len(calls[0]) == 39
        # Once that write started, a new item makes a new write; a failing
        # item fails alone (its write's items run again one by one), and the
        # next write works again.
        release.clear()
        held = db.write(lambda cursor: release.wait(10))
        good, bad = joined("x"), joined("bad")
        await deferToThread(release.set)
        await held
        assert await good == 1
        with pytest.raises(ValueError):
            await bad
        assert await joined("yz") == 2
        assert calls[1:] == [["x", "bad"], ["x"], ["bad"], ["yz"]]
    finally:
        db.close()


@pytest_twisted.ensureDeferred
async def test_logins_wait_for_the_logins_under_way(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_listener, "LOGINS_PER_TURN", 2)
    monkeypatch.setattr(node_listener, "LOGINS_IN_FLIGHT", 3)
    site = await Site(db_target).start(dispatch_poll_interval=None)
    most = 0
    real_admit_more = site.factory._admit_more

    def watched() -> None:
        nonlocal most
        real_admit_more()
        most = max(most, len(site.factory._in_flight))

    monkeypatch.setattr(site.factory, "_admit_more", watched)
    try:
        _world(site)
        nodes = await gatherResults(
            [Deferred.fromCoroutine(site.connect(f"n{i:02}")) for i in range(NODES)]
        )
        for i, node in enumerate(nodes):
            gids = {(await node.next(TaskCommand)).gid, (await node.next(TaskCommand)).gid}
            assert gids == {1000 + i, 2000 + i}
        assert 1 <= most <= 3
        assert site.side.nodes.ids() == [f"n{i:02}" for i in range(NODES)]
        assert all(s.life.holding is not None for s in site.side.nodes.values())
    finally:
        await site.stop()
