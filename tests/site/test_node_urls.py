"""Where a node serves its archives (DELIVERY.md "Serving (node)"): the site
believes a v2 node's Hello ``archiveUrl`` and ``serveUrl`` only once the
node is logged in and, with site-proof, proven; keeps them on the session
its registry holds (``archive_url``, ``serve_url``: ``""`` when none, on a
legacy session, and for a value that is not an http(s) URL with a host);
and shows them in ``/api/admin/nodes``.  The real site over loopback HTTP on
both backends, scripted nodes over real TCP."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.logger import globalLogPublisher

from tasknet.protocol.messages import ProtocolHello
from tasknet.site.node_listener import announced_url
from tasknet.upstream.testing import start_upstream
from tests.eventually import eventually
from tests.site.helpers import RunningSite, running_site, site_options
from tests.site_protocol.harness import TIMEOUT, ScriptedNode, secret_of

PUBLIC = "https://node-1.example.org:7443/"
INTERNAL = "http://127.0.0.1:7300"


class AnnouncingNode(ScriptedNode):
    """A scripted node whose Hello (v2) carries ``archive_url`` and ``serve_url``."""

    def __init__(self, node_id: str, archive_url: str, serve_url: str, **kwargs: Any) -> None:
        super().__init__(node_id, **kwargs)
        self.archive_url = archive_url
        self.serve_url = serve_url

    def sendMessage(self, message: Any) -> None:
        if isinstance(message, ProtocolHello):
            message = dataclasses.replace(
                message, archive_url=self.archive_url, serve_url=self.serve_url
            )
        super().sendMessage(message)


async def _connect(site: RunningSite, node: ScriptedNode) -> ScriptedNode:
    port = site.service.nodes_port.getHost().port
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), node)
    assert await node.logged_in.addTimeout(TIMEOUT, reactor)
    return node


async def _panel(site: RunningSite) -> dict[str, dict[str, Any]]:
    status, body = await site.request("GET", "/api/admin/nodes", token="demo")
    assert status == 200, body
    return {node["id"]: node for node in body["nodes"]}


def _urls(entry: dict[str, Any]) -> tuple[str, str]:
    return entry["archiveUrl"], entry["serveUrl"]


@pytest_twisted.ensureDeferred
async def test_hello_urls_are_believed_once_proven_and_shown_in_the_node_panel(
    db_target: str,
) -> None:
    upstream = await start_upstream()
    ids = ("n1", "n2", "n3", "n4")
    keys = [f"--node-key={i}:{secret_of(i)}" for i in ids]
    nodes: list[ScriptedNode] = []
    ignored: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if "not an http(s) URL" in (event.get("log_format") or ""):
            ignored.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        options = site_options(db_target, upstream.base_url, "--demo", *keys)
        async with running_site(options) as site:
            listener = site.site.node_side.listener
            registry = listener.nodes
            try:
                proving = await _connect(
                    site, AnnouncingNode("n1", PUBLIC, INTERNAL, site_proof=True)
                )
                nodes.append(proving)
                # Logged in, not yet proven: nothing believed, nothing listed as connected.
                (waiting,) = [s for s in listener.connections if s.node_id == "n1"]
                assert (waiting.archive_url, waiting.serve_url) == ("", "")
                assert registry.get("n1") is None
                panel = await _panel(site)
                assert "n1" not in panel or not panel["n1"]["connected"]
                assert "n1" not in panel or _urls(panel["n1"]) == ("", "")

                assert await proving.challenge()
                await eventually(lambda: registry.get("n1") is not None)
                session = registry["n1"]
                assert (session.archive_url, session.serve_url) == (PUBLIC, INTERNAL)
                # Without site-proof (the previous release): believed at login.
                nodes.append(await _connect(site, AnnouncingNode("n2", "", INTERNAL + "/")))
                # Not http(s) URLs with a host: ignored.
                nodes.append(
                    await _connect(site, AnnouncingNode("n3", "ftp://node-3/", "http:///x"))
                )
                # A legacy node has no Hello at all.
                nodes.append(await _connect(site, ScriptedNode("n4", v2=False)))
                await eventually(lambda: all(registry.get(i) is not None for i in ids))
                assert (registry["n2"].archive_url, registry["n2"].serve_url) == (
                    "",
                    INTERNAL + "/",
                )
                for node_id in ("n3", "n4"):
                    session = registry[node_id]
                    assert (session.archive_url, session.serve_url) == ("", "")
                # Each ignored value said once, with the node and the field.
                assert sorted((e["node_id"], e["field"], e["value"]) for e in ignored) == [
                    ("n3", "archiveUrl", "ftp://node-3/"),
                    ("n3", "serveUrl", "http:///x"),
                ]

                panel = await _panel(site)
                assert all(panel[i]["connected"] for i in ids)
                assert _urls(panel["n1"]) == (PUBLIC, INTERNAL)
                assert _urls(panel["n2"]) == ("", INTERNAL + "/")
                assert _urls(panel["n3"]) == ("", "")
                assert _urls(panel["n4"]) == ("", "")

                # Gone: no longer connected, and no URL shown for it.
                await proving.disconnect()
                nodes.remove(proving)
                await eventually(lambda: registry.get("n1") is None)
                panel = await _panel(site)
                # (Listed as seen once its disconnect's write committed.)
                gone = panel.get("n1")
                assert gone is None or (not gone["connected"] and _urls(gone) == ("", ""))
            finally:
                for node in nodes:
                    await node.disconnect()
    finally:
        globalLogPublisher.removeObserver(observe)
        await upstream.stop()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "http://127.0.0.1:7300",
        "http://127.0.0.1:7300/",
        "https://node-1.example.org:7443/",
        "https://node-1.example.org/base/path/",
        "http://[::1]:7300/",
    ],
)
def test_a_base_url_with_a_scheme_and_host_is_kept(value: str) -> None:
    assert announced_url(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "ftp://node-1/",
        "javascript:alert(1)",
        "file:///etc/passwd",
        "http://",
        "http:///path",
        "https://:7443/",
        "node-1.example.org:7443",
        "/archives",
        "http://node-1:99999/",
        "http://node-1:port/",
        "http://user:secret@node-1/",
        "http://node-1/?q=1",
        "http://node-1/#frag",
        "http://node 1/",
        "http://node-1/\n",
        "http://node-1/\x7f",
    ],
)
def test_anything_else_is_refused(value: str) -> None:
    assert announced_url(value) is None
