"""The real mock upstream over simulated TCP, and twisted.web clients on it."""

from __future__ import annotations

import pytest
import treq
from treq.client import HTTPClient
from twisted.internet.defer import Deferred, TimeoutError
from twisted.web._newclient import ResponseNeverReceived
from twisted.web.client import Agent, HTTPConnectionPool, PartialDownloadError, ResponseFailed
from twisted.web.http_headers import Headers

from tasknet.netclient import DirectEndpoints, quiet_pool
from tasknet.sim import World
from tasknet.upstream import catalog
from tests.sim.worlds import agent, client, fetch, serve_upstream

BASE = "http://127.0.0.1:7200"


def test_agent_downloads_archives_from_the_real_upstream() -> None:
    world = World(1)
    app, _ = serve_upstream(world)
    web = agent(client(world))
    for gid in (1, 2, 3):
        code, body = world.wait(fetch(web, f"{BASE}/files/{gid}-1.bin"))
        assert code == 200 and body == catalog.archive_bytes(gid)
    # By name: Agent's HostnameEndpoint asks the simulated resolver.
    code, body = world.wait(fetch(web, "http://localhost:7200/api/galleries/5"))
    assert code == 200 and b'"gid":5' in body
    assert app.journal.stats()["requests"] == 4
    world.assert_clean()


def test_treq_submits_and_audits_on_a_persistent_pool() -> None:
    world = World(2)
    app, _ = serve_upstream(world)
    reactor = client(world)
    pool = HTTPConnectionPool(reactor, persistent=True)
    http = HTTPClient(Agent(reactor, pool=pool))

    async def exchange() -> tuple[dict, dict]:
        submitted = await (await http.post(f"{BASE}/api/galleries/42/archive")).json()
        audit = await (await http.get(f"{BASE}/api/galleries/42/archive")).json()
        return submitted, audit

    submitted, audit = world.wait(Deferred.fromCoroutine(exchange()))
    assert submitted["cost"] == catalog.gallery(42).cost
    assert audit["submissions"] == 1 and audit["archiveUrl"].endswith("/files/42-1.bin")
    assert app.journal.posts[42] == 1
    assert len(world.network.connections) == 1  # the one kept-alive connection
    world.wait(pool.closeCachedConnections())
    world.run_until(lambda: not world.network.connections, within=1)
    world.assert_clean()


def test_the_nodes_own_http_path_resumes_with_range() -> None:
    world = World(3)
    serve_upstream(world)
    reactor = client(world, "node")
    # What the node's worker builds: DirectEndpoints (no resolver), a quiet pool.
    web = Agent.usingEndpointFactory(
        reactor, DirectEndpoints(reactor), pool=quiet_pool(reactor, persistent=False)
    )
    headers = Headers({b"Range": [b"bytes=1000-"]})
    code, body = world.wait(fetch(web, f"{BASE}/files/7-1.bin", headers=headers))
    assert code == 206 and body == catalog.archive_bytes(7)[1000:]
    world.assert_clean()


def test_upstream_faults_run_on_the_simulated_clock() -> None:
    world = World(4)
    app, _ = serve_upstream(world)
    web = agent(client(world))
    # latency: answered 2 simulated seconds later.
    app.set_faults(
        {"rules": [{"path": "/api/galleries/*", "fault": "latency", "params": {"ms": 2000}}]}
    )
    start = world.now
    code, _ = world.wait(fetch(web, f"{BASE}/api/galleries/3"))
    assert code == 200 and world.now - start >= 2.0
    # reset_mid_body: the bytes written go out, then an RST (SO_LINGER 0 on
    # the simulated socket); the client sees a broken body.
    app.set_faults(
        {
            "rules": [
                {"path": "/files/*", "fault": "reset_mid_body", "params": {"after_bytes": 5000}}
            ]
        }
    )
    with pytest.raises((PartialDownloadError, ResponseFailed)):
        world.wait(fetch(web, f"{BASE}/files/9-1.bin"))
    # timeout: never answered; the client gives up on its own clock.
    app.set_faults({"rules": [{"path": "/files/*", "fault": "timeout"}]})
    start = world.now
    with pytest.raises((TimeoutError, ResponseNeverReceived)):
        world.wait(fetch(web, f"{BASE}/files/9-1.bin", timeout=30, clock=client(world)))
    assert world.now - start == pytest.approx(30)
    world.run_for(1)  # the client's RST reaches the upstream
    assert app.drop_hung() == 0
    assert app.faults.fired_total == 3
    world.assert_clean()


def test_a_slow_link_and_a_partition_during_a_download() -> None:
    world = World(5)
    serve_upstream(world)
    web = agent(client(world))
    size = catalog.gallery(1).size
    world.network.set_link("client", "upstream", bandwidth=100_000)
    start = world.now
    pending = fetch(web, f"{BASE}/files/1-1.bin")
    world.run_for(1)
    world.network.partition("client", "upstream")
    world.run_for(20)
    assert not pending.called
    world.network.heal()
    code, body = world.wait(pending)
    assert code == 200 and body == catalog.archive_bytes(1)
    assert world.now - start >= size / 100_000 + 20
    world.assert_clean()


def test_treq_module_functions_take_the_reactor() -> None:
    world = World(6)
    serve_upstream(world)
    reactor = client(world)
    pool = HTTPConnectionPool(
        reactor, persistent=False
    )  # treq's global pool would outlive the world
    response = world.wait(treq.get(f"{BASE}/api/galleries/8", reactor=reactor, pool=pool))
    assert response.code == 200
    assert world.wait(treq.json_content(response))["gid"] == 8
