"""The node panel's disk figures (``/api/admin/nodes``' ``disk``,
tasknet/site/node_disk.py): what a connected node's serve endpoint says on
``GET /healthz``, read at most every REFRESH_SECONDS, never waited for
longer than PANEL_WAIT, forgotten after FORGET_SECONDS, ``null`` when
unknown.  Small twisted.web servers on loopback play the nodes' serve
endpoints; the real site over loopback HTTP on both backends, scripted
nodes over real TCP."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from tasknet.site import node_disk
from tasknet.site.node_disk import NodeDiskFigures, parse_health
from tasknet.upstream.testing import start_upstream
from tests.eventually import eventually
from tests.site.helpers import running_site, site_options
from tests.site.test_node_urls import AnnouncingNode, _connect, _panel
from tests.site_protocol.harness import secret_of

#: A node's /healthz disk figures, and the panel's ``disk`` made of them.
HEALTH = {"archives": 12, "archiveBytes": 3_000_000, "diskFree": 9_000_000_000, "diskBudget": None}
DISK = {"archives": 12, "bytes": 3_000_000, "free": 9_000_000_000, "budget": None}


class Health(Resource):
    """``/healthz`` of a scripted serve endpoint: ``body`` (JSON), or no
    answer at all while ``hang``; counts the requests."""

    isLeaf = True

    def __init__(self, body: Any, *, status: int = 200, hang: bool = False) -> None:
        super().__init__()
        self.body = body
        self.status = status
        self.hang = hang
        self.requests = 0
        self.hanging: list[Request] = []

    def render_GET(self, request: Request) -> bytes | int:
        self.requests += 1
        if self.hang:
            self.hanging.append(request)
            return NOT_DONE_YET
        request.setResponseCode(self.status)
        request.setHeader(b"Content-Type", b"application/json")
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


async def _serve(health: Health) -> tuple[str, Any]:
    root = Resource()
    root.putChild(b"healthz", health)
    port = reactor.listenTCP(0, Site(root), interface="127.0.0.1")  # type: ignore[attr-defined]
    return f"http://127.0.0.1:{port.getHost().port}", port


def test_the_disk_object_of_a_health_body() -> None:
    assert parse_health(json.dumps({"status": "ok", **HEALTH}).encode()) == DISK
    # A figure that is not a whole number >= 0 is unknown; the rest stay.
    odd = {"archives": -1, "archiveBytes": True, "diskFree": "9", "diskBudget": 2.5}
    assert parse_health(json.dumps(odd).encode()) == dict.fromkeys(DISK)
    assert parse_health(b'{"diskFree": 5}') == {**dict.fromkeys(DISK), "free": 5}
    assert parse_health(b'{"status": "ok"}') is None  # a node that says nothing of its disk
    assert parse_health(b"[]") is None
    assert parse_health(b"not json") is None


@pytest_twisted.ensureDeferred
async def test_figures_are_read_when_stale_kept_on_failure_and_forgotten() -> None:
    health = Health({"status": "ok", **HEALTH})
    url, port = await _serve(health)
    clock = Clock()
    clock.advance(1_000_000)
    disks = NodeDiskFigures(reactor, clock)  # type: ignore[arg-type]
    try:
        await disks.refresh({"n1": url, "n2": ""})
        figures = disks.figures("n1", url)
        assert figures is not None and health.requests == 1
        assert figures.to_json() == {**DISK, "at": figures.to_json()["at"]}
        assert disks.figures("n2", "") is None  # no serve endpoint: nothing read
        assert disks.figures("n1", "http://127.0.0.1:1") is None  # another URL: not its
        # Fresh: not read again.
        clock.advance(node_disk.REFRESH_SECONDS - 1)
        await disks.refresh({"n1": url})
        assert health.requests == 1
        # Stale: read again; a failed read keeps the last figures.
        clock.advance(2)
        health.status = 500
        await disks.refresh({"n1": url})
        assert health.requests == 2
        assert disks.figures("n1", url) == figures
        # A node that stops saying anything of its disk: unknown at once.
        clock.advance(node_disk.REFRESH_SECONDS)
        health.status, health.body = 200, {"status": "ok"}
        await disks.refresh({"n1": url})
        assert disks.figures("n1", url) is None
        # Read again, then silent past FORGET_SECONDS: forgotten.
        health.body = HEALTH
        clock.advance(node_disk.REFRESH_SECONDS)
        await disks.refresh({"n1": url})
        assert disks.figures("n1", url) is not None
        clock.advance(node_disk.FORGET_SECONDS + 1)
        assert disks.figures("n1", url) is None
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_node_that_does_not_answer_delays_the_panel_by_the_wait_only() -> None:
    health = Health(HEALTH, hang=True)
    url, port = await _serve(health)
    clock = Clock()
    disks = NodeDiskFigures(reactor, clock)  # type: ignore[arg-type]
    try:
        waited = disks.refresh({"n1": url})
        await eventually(lambda: health.requests == 1)
        assert not waited.called
        clock.advance(node_disk.PANEL_WAIT)
        assert waited.called
        assert disks.figures("n1", url) is None
        # A second panel while the read is in flight starts no other read.
        again = disks.refresh({"n1": url})
        clock.advance(node_disk.PANEL_WAIT)
        assert again.called and health.requests == 1
        # The read gives up on its own (FETCH_TIMEOUT, the reactor's time).
        done: Deferred[None] = Deferred()
        reactor.callLater(node_disk.FETCH_TIMEOUT + 0.5, done.callback, None)  # type: ignore[attr-defined]
        await done
        assert disks.figures("n1", url) is None
    finally:
        for request in health.hanging:
            request.transport.abortConnection()  # type: ignore[union-attr]
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_the_panel_shows_each_connected_nodes_disk_or_null(db_target: str) -> None:
    answering = Health({"status": "ok", **HEALTH})
    silent = Health({"status": "ok"})  # a node that does not give its disk
    answering_url, answering_port = await _serve(answering)
    silent_url, silent_port = await _serve(silent)
    upstream = await start_upstream()
    keys = [f"--node-key={i}:{secret_of(i)}" for i in ("n1", "n2", "n3")]
    try:
        async with running_site(site_options(db_target, upstream.base_url, "--demo", *keys)) as s:
            registry = s.site.node_side.listener.nodes
            nodes = [
                await _connect(s, AnnouncingNode("n1", "", answering_url)),
                await _connect(s, AnnouncingNode("n2", "", silent_url)),
                await _connect(s, AnnouncingNode("n3", "", "")),  # serves nothing
            ]
            try:
                await eventually(lambda: all(registry.get(n) for n in ("n1", "n2", "n3")))
                # On a loaded machine the first panel may give up waiting
                # before the read is done: the next one shows it.
                panel = await _panel(s)
                for _ in range(20):
                    if panel["n1"]["disk"] is not None:
                        break
                    await deferLater(reactor, 0.2, lambda: None)
                    panel = await _panel(s)
                disk = panel["n1"]["disk"]
                assert {k: v for k, v in disk.items() if k != "at"} == DISK
                assert disk["at"].endswith("Z")
                assert panel["n2"]["disk"] is None
                assert panel["n3"]["disk"] is None
                # A second look within REFRESH_SECONDS reads nothing again.
                await _panel(s)
                assert (answering.requests, silent.requests) == (1, 1)
            finally:
                for node in nodes:
                    await node.disconnect()
            # Disconnected: no serveUrl, no figures.
            await eventually(lambda: registry.get("n1") is None)
            panel = await _panel(s)
            assert panel["n1"]["disk"] is None
    finally:
        await upstream.stop()
        await answering_port.stopListening()
        await silent_port.stopListening()
