"""``/api/events`` bounds: a rotated token closes its sockets (on the
factory's clock, and end to end with ``tasknet-admin`` in another process),
and a client that does not read is cut off past its send buffer."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.internet.utils import getProcessOutputAndValue

from tasknet.site.storage import users
from tasknet.site.storage.engine.database import connect, run_write
from tasknet.site.web.events import CLOSE_TOKEN_INVALID, SEND_BUFFER_LIMIT, TOKEN_CHECK_INTERVAL
from tasknet.upstream.testing import start_upstream
from tests.eventually import eventually
from tests.site.helpers import add_user, running_site, site_options
from tests.site.rawhttp import open_websocket
from tests.site_protocol.harness import events_client

ADMIN = str(Path(sys.executable).parent / "tasknet-admin")


async def _with_site(target, test):
    upstream = await start_upstream()
    path = target
    try:
        async with running_site(site_options(path, upstream.base_url)) as site:
            await test(site, path, site.service.http_port.getHost().port)
    finally:
        await upstream.stop()


def _factory(site):
    return site.site.web.events.factory


def _rotate(path: str, name: str) -> str:
    connection = connect(path)
    try:
        return run_write(connection, users.rotate_token, name)
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_a_rotated_token_closes_its_sockets_at_the_next_check_on_the_clock(db_target):
    async def test(site, path, port):
        clock = Clock()
        _factory(site).clock = clock
        _, alice = add_user(path, "alice")
        _, bob = add_user(path, "bob")
        alice_socket = await events_client(port, alice)
        alice_second = await events_client(port, alice)
        bob_socket = await events_client(port, bob)
        try:
            _rotate(path, "alice")
            # Nothing happens until the check is due on the factory's clock.
            await deferLater(reactor, 0.2, lambda: None)
            assert not alice_socket.closed.called
            clock.advance(TOKEN_CHECK_INTERVAL - 0.01)
            await deferLater(reactor, 0.1, lambda: None)
            assert not alice_socket.closed.called
            clock.advance(0.01)
            codes = [
                await alice_socket.closed.addTimeout(5, reactor),
                await alice_second.closed.addTimeout(5, reactor),
            ]
            assert codes == [CLOSE_TOKEN_INVALID, CLOSE_TOKEN_INVALID]
            # bob's token did not change: his socket stays, and gets pushes.
            clock.advance(TOKEN_CHECK_INTERVAL)
            await deferLater(reactor, 0.1, lambda: None)
            assert not bob_socket.closed.called
            assert len(_factory(site).open_clients) == 1
        finally:
            await bob_socket.shut()
        # The last socket gone, the factory holds no timer.
        assert _factory(site)._token_loop is None

    await _with_site(db_target, test)


@pytest_twisted.ensureDeferred
async def test_tasknet_admin_rotating_a_token_in_another_process_closes_the_socket(db_target):
    async def test(site, path, port):
        _, alice = add_user(path, "alice")
        socket = await events_client(port, alice)
        try:
            out, err, code = await getProcessOutputAndValue(
                ADMIN, ["--db", path, "user", "token", "alice"], env=os.environ
            )
            assert code == 0, err
            new_token = out.decode().strip()
            # Within 5 s of the rotation (one check interval plus the closing
            # handshake), with a margin for a loaded machine.
            assert await socket.closed.addTimeout(7, reactor) == CLOSE_TOKEN_INVALID
            # The new token opens a socket.
            fresh = await events_client(port, new_token)
            await fresh.shut()
        finally:
            await socket.shut()

    await _with_site(db_target, test)


async def _silent_client(port: int, token: str):
    """A WebSocket client over raw TCP that completes the handshake, then
    never reads again."""
    client, _ = await open_websocket(port, token)
    client.transport.pauseProducing()  # stop reading from the socket
    return client


@pytest_twisted.ensureDeferred
async def test_a_websocket_client_that_does_not_read_is_cut_off(db_target):
    async def test(site, path, port):
        user_id, token = add_user(path, "alice")
        factory = _factory(site)
        silent = await _silent_client(port, token)
        reader = await events_client(port, token)
        await eventually(lambda: len(factory.open_clients) == 2)
        payload = json.dumps({"type": "task", "task": {"pad": "x" * 65536}})
        pushed = 0
        limit = 64 * 1024 * 1024  # far past any socket buffer plus the bound
        while len(factory.open_clients) == 2 and pushed < limit:
            factory.hub.publish(user_id, payload)
            pushed += len(payload)
            await deferLater(reactor, 0, lambda: None)
        assert pushed < limit, "the silent client was never cut off"
        await eventually(lambda: len(factory.open_clients) == 1)
        # The one that reads is still there, and got everything.
        assert not reader.closed.called
        await eventually(lambda: len(reader.received) * len(payload) >= pushed, timeout=10)
        assert factory.send_buffer_limit == SEND_BUFFER_LIMIT
        silent.transport.resumeProducing()
        await silent.closed.addTimeout(5, reactor)
        await reader.shut()

    await _with_site(db_target, test)


def test_the_factory_pings_silent_clients_by_default():
    from tasknet.site.web.events import PING_INTERVAL, PING_TIMEOUT, EventHub, EventsFactory

    factory = EventsFactory(EventHub(), lambda token: None, clock=Clock())
    assert (factory.autoPingInterval, factory.autoPingTimeout) == (PING_INTERVAL, PING_TIMEOUT)
    assert PING_INTERVAL + PING_TIMEOUT <= 30


@pytest_twisted.ensureDeferred
async def test_a_client_that_never_answers_a_ping_is_closed(db_target):
    async def test(site, path, port):
        _, token = add_user(path, "alice")
        factory = _factory(site)
        factory.setProtocolOptions(autoPingInterval=0.3, autoPingTimeout=0.3)
        silent = await _silent_client(port, token)  # nothing is pushed to it
        await eventually(lambda: len(factory.open_clients) == 1)
        await eventually(lambda: len(factory.open_clients) == 0, timeout=5)
        silent.transport.resumeProducing()
        await silent.closed.addTimeout(5, reactor)

    await _with_site(db_target, test)
