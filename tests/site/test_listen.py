"""The LISTEN connection of a site (``storage/listen.py``) on a real
PostgreSQL server: notifications reach the callbacks on the reactor, a
site's own are not handed back to it, a killed connection is reopened and
the callbacks told to catch up, and the thread ends with the last
subscription.  On SQLite nothing is listened to."""

from __future__ import annotations

import psycopg
import pytest
import pytest_twisted
from twisted.internet import reactor

from tasknet.site.storage.engine.listen import (
    DISPATCH,
    NODE_TAKEN,
    OUTBOX,
    RESYNC,
    Listener,
    NoWakeups,
    open_wakeups,
)
from tests.eventually import eventually
from tests.site_protocol.sites import pg_target

__all__ = ["pg_target"]


def external_notify(target: str, channel: str, payload: str) -> None:
    with psycopg.connect(target, autocommit=True) as connection:
        connection.execute("SELECT pg_notify(%s, %s)", (channel, payload))


@pytest_twisted.ensureDeferred
async def test_notifications_reach_the_callbacks_and_a_lost_connection_resyncs(
    pg_target: str,
) -> None:
    site = Listener(pg_target, reactor=reactor, ping_interval=0.2, reconnect_delay=0.05)
    other = Listener(pg_target, reactor=reactor)
    got: list[tuple[str, str | None]] = []
    heard: list[tuple[str, str | None]] = []
    subscriptions = [
        site.subscribe(OUTBOX, lambda c, p: got.append((c, p))),
        site.subscribe(DISPATCH, lambda c, p: got.append((c, p))),
        other.subscribe(DISPATCH, lambda c, p: heard.append((c, p))),
    ]
    try:
        await site.wait_listening()
        await other.wait_listening()
        assert site.running and site.connections == 1
        external_notify(pg_target, OUTBOX, "")
        external_notify(pg_target, DISPATCH, "42")
        external_notify(pg_target, NODE_TAKEN, "n1 3")  # nobody listens to it
        await eventually(lambda: got == [(OUTBOX, ""), (DISPATCH, "42")])
        # Its own notification goes to the others, not back to it.
        site.notify(DISPATCH, "7")
        await eventually(lambda: (DISPATCH, "7") in heard)
        assert (DISPATCH, "7") not in got

        # The server ends the LISTEN session: reopened, and told to catch up.
        with psycopg.connect(pg_target, autocommit=True) as connection:
            connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'tasknet-site listen' AND pid <> pg_backend_pid()"
            )
        await eventually(lambda: (DISPATCH, RESYNC) in got and (OUTBOX, RESYNC) in got)
        assert site.connections >= 2
        external_notify(pg_target, DISPATCH, "43")
        await eventually(lambda: (DISPATCH, "43") in got)
    finally:
        for subscription in subscriptions:
            await subscription.cancel()
    assert not site.running and not other.running
    assert [s.cancel().called for s in subscriptions] == [True] * 3  # idempotent


def test_unknown_channels_are_refused_and_sqlite_listens_to_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    wakeups = open_wakeups(str(tmp_path / "site.sqlite"), reactor)
    assert isinstance(wakeups, NoWakeups)
    wakeups.notify(DISPATCH, "1")
    assert wakeups.subscribe(OUTBOX, lambda c, p: None).cancel().called
    for make in (NoWakeups(), Listener("postgresql://127.0.0.1:1/none", reactor=reactor)):
        with pytest.raises(ValueError, match="unknown notification channel"):
            make.subscribe("tasknet_outbox; DROP TABLE x", lambda c, p: None)
        with pytest.raises(ValueError, match="unknown notification channel"):
            make.notify("other", "")
    assert isinstance(open_wakeups("postgresql://127.0.0.1:1/none", reactor), Listener)
