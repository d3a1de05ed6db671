"""Notifications across several sites on one real PostgreSQL database
(SCALE.md 6): every committed change reaches every site's WebSocket tail,
once and in commit order, even when a transaction holds an earlier id open;
a row is fanned out (here: deleted, no webhook) only once every open site
has read it; each webhook row is POSTed by one site, to the real loopback
receiver, also when two sites deliver at once and when one died holding
claims; ``NOTIFY`` wakes the tails and the poll still covers a lost one.

Each site is its own ``Database`` pools, instance row, outbox executor and
LISTEN connection, as the composition root builds them; the publisher is a
recording stand-in for the WebSocket hub (the executor's seam).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater

from tasknet.site.outbox import OutboxExecutor, SharedTail, SharedWebhook, WebhookSender
from tasknet.site.storage import outbox, users
from tasknet.site.storage.engine.database import Database, connect, open_pool, run_write
from tasknet.site.storage.engine.listen import Listener, NoWakeups, Wakeups
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, SERIALIZABLE
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import query
from tests.site_protocol.harness import WebhookReceiver, listen_http
from tests.site_protocol.sites import TwoSites, pg_target, register_instance

__all__ = ["pg_target"]


class RecordingPublisher:
    """Records each push (the gid of its task) and who it was for."""

    def __init__(self) -> None:
        self.gids: list[int] = []

    def listening(self) -> bool:
        return True

    def publish(self, user_id: int | None, payload: str) -> int:
        self.gids.append(json.loads(payload)["task"]["gid"])
        return 1


class SiteOutbox:
    """One site's outbox side: pools, instance, executor, wake-ups."""

    def __init__(
        self,
        target: str,
        name: str,
        *,
        webhook_url: str | None = None,
        wakeups: Wakeups | None = None,
        poll_interval: float | None = None,
        webhook_lease: float = outbox.WEBHOOK_LEASE,
        clock: Any = None,
    ) -> None:
        clock = reactor if clock is None else clock
        self.db: Database = open_pool(target, **site_runtime())
        self.instance_id = register_instance(target, name)
        self.listener = Listener(target, reactor=reactor)
        self.publisher = RecordingPublisher()
        self.webhook = (
            WebhookSender(
                webhook_url, self.db, concurrency=3, backoff=0.05, clock=clock, reactor=reactor
            )
            if webhook_url
            else None
        )
        self.executor = OutboxExecutor(
            self.db,
            None if self.webhook else self.publisher,
            SharedWebhook(self.webhook, self.db, self.instance_id, lease=webhook_lease, clock=clock)
            if self.webhook
            else None,
            tail=SharedTail(self.db, self.instance_id),
            poll_interval=poll_interval,
            mark_interval=0.02,
            prune_interval=None,
            wakeups=self.listener if wakeups is None else wakeups,
            clock=clock,
        )
        self._listens = wakeups is None

    async def start(self) -> SiteOutbox:
        assert self.executor.tail.shared
        self.executor.startService()
        await self.executor.wake()
        if self._listens:
            await self.listener.wait_listening()
        return self

    async def stop(self) -> None:
        await self.executor.stopService()
        await eventually(lambda: not self.listener.running)
        self.db.close()


class Sites(TwoSites):
    """Two sites' outbox executors on one database, and a user of it."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        conn = connect(target)
        try:
            user, _ = run_write(conn, lambda c: users.create_user(c, "alice"))
        finally:
            conn.close()
        self.user_id = user.id

    async def site(self, name: str, **options: Any) -> SiteOutbox:  # type: ignore[override]
        site = await SiteOutbox(self.target, name, **options).start()
        self.started.append(site)
        return site


@pytest_twisted.async_yield_fixture
async def sites(pg_target: str) -> AsyncIterator[Sites]:
    both = Sites(pg_target)
    try:
        yield both
    finally:
        await both.stop()


def announce(user_id: int, gids: list[int]) -> Any:
    """A write transaction that announces ``gids`` (one outbox row each)."""

    def body(cursor: Any) -> None:
        for gid in gids:
            outbox.enqueue_task_change(cursor, gid, user_id=user_id)

    return body


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_change_committed_through_one_site_reaches_the_others_tail_in_order(
    sites: Sites,
) -> None:
    # No poll: only NOTIFY tasknet_outbox can wake the tails.
    a = await sites.site("site-a")
    b = await sites.site("site-b")
    await a.db.write(announce(sites.user_id, [1, 2, 3]))
    await eventually(lambda: b.publisher.gids == [1, 2, 3])
    await eventually(lambda: a.publisher.gids == [1, 2, 3])

    # A transaction takes the next id and stays open (another process: a
    # raw connection); a later one through site A must not be read first.
    held = connect(sites.target)
    cursor = held.cursor()
    cursor.execute(BEGIN_WRITE[SERIALIZABLE])
    outbox.enqueue_task_change(cursor, 10, user_id=sites.user_id)
    later: Deferred[None] = a.db.write(announce(sites.user_id, [11]))
    await sleep(0.5)
    # The later one waits for the outbox order; neither is visible yet.
    assert not later.called
    assert b.publisher.gids == [1, 2, 3] and a.publisher.gids == [1, 2, 3]
    cursor.execute("COMMIT")
    held.close()
    await later
    await eventually(lambda: b.publisher.gids == [1, 2, 3, 10, 11])
    await eventually(lambda: a.publisher.gids == [1, 2, 3, 10, 11])

    # Both tails passed every row: without a webhook they are deleted.
    await eventually(
        lambda: query(sites.target, "SELECT COUNT(*) FROM notification_outbox")[0][0] == 0
    )
    await sleep(0.2)
    assert b.publisher.gids == [1, 2, 3, 10, 11] and a.publisher.gids == [1, 2, 3, 10, 11]


@pytest_twisted.ensureDeferred
async def test_a_row_stays_until_every_open_sites_tail_has_read_it(sites: Sites) -> None:
    a = await sites.site("site-a")
    # Site C has joined the readers and is slow: it has read nothing since.
    c_instance = register_instance(sites.target, "site-c")
    conn = connect(sites.target)
    try:
        run_write(conn, outbox.join_readers, c_instance)
        run_write(conn, announce(sites.user_id, [5, 6]))
        await eventually(lambda: a.publisher.gids == [5, 6])
        await sleep(0.3)  # site A's marks are written meanwhile
        assert [r[0] for r in query(sites.target, "SELECT gid FROM notification_outbox")] == [5, 6]
        assert query(sites.target, "SELECT COUNT(*) FROM outbox_reader")[0][0] == 2

        # Site C has read them: the next mark of site A deletes them.
        run_write(conn, lambda c: outbox.mark_read(c, c_instance, 10**9, skip_webhook=True))
        run_write(conn, announce(sites.user_id, [7]))
        await eventually(lambda: a.publisher.gids == [5, 6, 7])
        await eventually(
            lambda: query(sites.target, "SELECT COUNT(*) FROM notification_outbox")[0][0] == 0
        )

        # A gone site (reaped) holds nothing back at all.
        run_write(conn, outbox.join_readers, c_instance)
        conn.execute("UPDATE site_instance SET reaped_at = 'x' WHERE id = ?", (c_instance,))
        run_write(conn, announce(sites.user_id, [8]))
        await eventually(lambda: a.publisher.gids == [5, 6, 7, 8])
        await eventually(
            lambda: query(sites.target, "SELECT COUNT(*) FROM notification_outbox")[0][0] == 0
        )
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_the_poll_covers_a_lost_notification(sites: Sites) -> None:
    b = await sites.site("site-b", wakeups=NoWakeups(), poll_interval=0.2)
    conn = connect(sites.target)
    try:
        run_write(conn, announce(sites.user_id, [1]))
    finally:
        conn.close()
    await eventually(lambda: b.publisher.gids == [1])


@pytest_twisted.ensureDeferred
async def test_a_tail_registers_as_its_site_starts_so_its_first_drain_misses_nothing(
    sites: Sites,
) -> None:
    # A client connects to a site that has not drained yet; a change is
    # committed (nobody wakes the tail: no NOTIFY, no poll), then a wake.
    # A tail registered only at that first drain would start past the row.
    site = SiteOutbox(sites.target, "site-a", wakeups=NoWakeups())
    sites.started.append(site)
    site.executor.startService()
    await eventually(
        lambda: (
            query(
                sites.target,
                "SELECT COUNT(*) FROM outbox_reader WHERE instance_id = ?",
                site.instance_id,
            )[0][0]
            == 1
        )
    )
    conn = connect(sites.target)
    try:
        run_write(conn, announce(sites.user_id, [4]))
    finally:
        conn.close()
    await site.executor.wake()
    assert site.publisher.gids == [4]


def delivered_ids(receiver: WebhookReceiver) -> list[int]:
    return [int(h["X-Tasknet-Notification"]) for h in receiver.headers]


def outbox_ids(target: str) -> list[int]:
    return [int(r[0]) for r in query(target, "SELECT id FROM notification_outbox ORDER BY id")]


@pytest_twisted.ensureDeferred
async def test_two_sites_delivering_at_once_post_each_row_once(sites: Sites) -> None:
    receiver = WebhookReceiver()
    http = await listen_http(receiver)
    url = f"http://127.0.0.1:{http.getHost().port}/hook"
    try:
        conn = connect(sites.target)
        try:
            for start in range(0, 60, 10):
                run_write(conn, announce(sites.user_id, list(range(start, start + 10))))
        finally:
            conn.close()
        ids = outbox_ids(sites.target)
        a = await sites.site("site-a", webhook_url=url)
        b = await sites.site("site-b", webhook_url=url)
        # More rows while both run: both wake and claim at once.
        await a.db.write(announce(sites.user_id, list(range(100, 130))))
        ids = outbox_ids(sites.target)
        assert len(ids) == 90
        await eventually(lambda: len(receiver.headers) >= 90, timeout=20.0)
        await eventually(
            lambda: (
                query(
                    sites.target,
                    "SELECT COUNT(*) FROM notification_outbox WHERE webhook_state = 'delivered'",
                )[0][0]
                == 90
            ),
            timeout=10.0,
        )
        await sleep(0.3)
        assert sorted(delivered_ids(receiver)) == ids  # each once
        claimers = {
            r[0] for r in query(sites.target, "SELECT webhook_claimed_by FROM notification_outbox")
        }
        assert claimers <= {a.instance_id, b.instance_id}
    finally:
        await http.stopListening()


@pytest_twisted.ensureDeferred
async def test_rows_a_dead_site_had_claimed_are_delivered_by_another_once(
    sites: Sites,
) -> None:
    receiver = WebhookReceiver()
    http = await listen_http(receiver)
    url = f"http://127.0.0.1:{http.getHost().port}/hook"
    dead = register_instance(sites.target, "site-dead")
    conn = connect(sites.target)
    try:
        run_write(conn, announce(sites.user_id, [1, 2, 3, 4]))
        ids = outbox_ids(sites.target)
        # The dead site claimed two rows for a second, two for an hour, and
        # died before delivering any.
        short = run_write(conn, outbox.claim_webhook_rows, dead, 2, 1.0)
        long = run_write(conn, outbox.claim_webhook_rows, dead, 2, 3600.0)
        assert [r.id for r in short + long] == ids
        b = await sites.site("site-b", webhook_url=url, poll_interval=0.2)
        # The short claims lapse and are taken over; the long ones wait.
        await eventually(lambda: sorted(delivered_ids(receiver)) == ids[:2], timeout=5.0)
        await sleep(0.5)
        assert sorted(delivered_ids(receiver)) == ids[:2]
        # The reaper frees what the dead instance held: delivered at once.
        assert run_write(conn, outbox.release_outbox_of, dead) == 2
        await eventually(lambda: sorted(delivered_ids(receiver)) == ids, timeout=5.0)
        await sleep(0.5)
        assert sorted(delivered_ids(receiver)) == ids  # each once
        assert {
            r[0] for r in query(sites.target, "SELECT webhook_claimed_by FROM notification_outbox")
        } == {b.instance_id}
    finally:
        conn.close()
        await http.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_clean_stop_gives_its_claims_back(sites: Sites) -> None:
    receiver = WebhookReceiver(delay=30.0)  # never answers while the site runs
    http = await listen_http(receiver)
    url = f"http://127.0.0.1:{http.getHost().port}/hook"
    try:
        a = await sites.site("site-a", webhook_url=url)
        await a.db.write(announce(sites.user_id, [1, 2]))
        await eventually(lambda: len(receiver.headers) == 2)
        claimed = query(
            sites.target,
            "SELECT COUNT(*) FROM notification_outbox WHERE webhook_claimed_by = ?",
            a.instance_id,
        )
        assert claimed[0][0] == 2
        await a.stop()
        sites.started.remove(a)
        rows = query(
            sites.target,
            "SELECT webhook_state, webhook_claimed_by FROM notification_outbox ORDER BY id",
        )
        assert [tuple(r) for r in rows] == [("pending", None), ("pending", None)]
        assert query(sites.target, "SELECT COUNT(*) FROM outbox_reader")[0][0] == 0
    finally:
        await http.stopListening()


@pytest_twisted.ensureDeferred
async def test_held_claims_are_renewed_every_third_of_the_lease_on_the_sites_clock(
    sites: Sites,
) -> None:
    receiver = WebhookReceiver(delay=30.0)  # holds the requests: the rows stay held
    http = await listen_http(receiver)
    url = f"http://127.0.0.1:{http.getHost().port}/hook"
    clock = Clock()
    try:
        a = await sites.site("site-a", webhook_url=url, webhook_lease=30.0, clock=clock)
        await a.db.write(announce(sites.user_id, [1, 2]))
        await eventually(lambda: len(receiver.headers) == 2)

        def until() -> list[str]:
            rows = query(
                sites.target, "SELECT webhook_claimed_until FROM notification_outbox ORDER BY id"
            )
            return [r[0] for r in rows]

        first = until()
        clock.advance(9.9)
        await sleep(0.3)
        assert until() == first
        clock.advance(0.1)  # a third of the lease since the start
        await eventually(lambda: all(u > f for u, f in zip(until(), first, strict=True)))
    finally:
        await http.stopListening()
