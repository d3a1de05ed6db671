"""Several sites on one real PostgreSQL database, in one test process.

Each :class:`SharedSite` is the node side of one site as the composition
root builds it (``root.build_node_side``): its own database pools, its own
instance (a ``site_instance`` row, as the lease registers it), its own
``--name``, its own LISTEN connection and its own node listener on a
loopback port.  Tests drive nodes with the scripted peers of the harness.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from tasknet.drill.pgserver import ThrowawayPostgres
from tasknet.site.root import Tuning, build_node_side
from tasknet.site.storage import instances
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.listen import Listener, Wakeups
from tasknet.site.storage.engine.schema import prepare_database
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site_protocol.harness import NodeKeys, Site

_numbers = iter(range(1, 1_000_000))


@pytest.fixture
def pg_target(pg_server: ThrowawayPostgres) -> Iterator[str]:
    """A fresh PostgreSQL database with the site schema, dropped after."""
    name = f"sites_{os.getpid()}_{next(_numbers)}"
    url = pg_server.create_database(name)
    prepare_database(url)
    yield url
    pg_server.drop_database(name)


def register_instance(target: str, name: str) -> int:
    """A new open instance row, as a site's lease registers it."""
    connection = dbmod.connect(target)
    try:
        return dbmod.run_write(
            connection, instances.register, name, socket.gethostname(), os.getpid()
        )
    finally:
        connection.close()


class SharedSite(Site):
    """One of several sites on ``target`` (see the module doc)."""

    def __init__(self, target: str, name: str) -> None:
        super().__init__(target)
        self.name = name
        self.instance_id = register_instance(target, name)
        self.listener = Listener(target, reactor=reactor, application_name=f"test {name}")

    async def start(  # type: ignore[override]
        self,
        *,
        dispatch: bool = True,
        webhook_url: str | None = None,
        wakeups: Wakeups | None = None,
        clock: Any = None,
        **tuning: Any,
    ) -> SharedSite:
        """As :meth:`Site.start`; ``wakeups`` replaces the site's LISTEN
        connection (``NoWakeups()``: a site that hears nothing); ``clock``
        (a ``task.Clock``) times the node side's timers instead of the reactor."""
        self.db = dbmod.open_pool(self.path, **site_runtime())
        self.side = build_node_side(
            self.db,
            reactor if clock is None else clock,
            entropy=site_runtime()["entropy"],
            node_keys=NodeKeys(),
            site_name=self.name,
            webhook_url=webhook_url,
            tuning=Tuning(
                **({"outbox_poll_interval": None, "dispatch_assign_delay": 0.0} | tuning)
            ),
            instance_id=self.instance_id,
            wakeups=self.listener if wakeups is None else wakeups,
        )
        self.side.outbox.startService()
        await self.side.outbox.wake()
        self.side.ownership.startService()
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self.factory)
        if dispatch:
            self.side.dispatcher.startService()
            await self.side.dispatcher.idle()
        if wakeups is None:
            await self.listener.wait_listening()
        return self

    async def stop(self) -> None:
        await super().stop()
        await eventually(lambda: not self.listener.running)  # the LISTEN thread ended


class TwoSites:
    """The shared sites of one test on one database, stopped in reverse order."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.started: list[Any] = []

    async def site(self, name: str, **options: Any) -> SharedSite:
        site = await SharedSite(self.target, name).start(**options)
        self.started.append(site)
        return site

    async def stop(self) -> None:
        for site in reversed(self.started):
            await site.stop()


@pytest_twisted.async_yield_fixture
async def sites(pg_target: str) -> AsyncIterator[TwoSites]:
    both = TwoSites(pg_target)
    try:
        yield both
    finally:
        await both.stop()
