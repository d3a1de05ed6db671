"""TLS end to end (INTERFACES.md, "Bounds, failures and secrets"; operations.md
"TLS"): the real site with its node listener and HTTP on ``ssl:`` endpoints,
a real node dialling ``tls:`` with the site's CA as its trust root.  The CA is
made here and thrown away; a node given another CA refuses the site."""

from __future__ import annotations

import json
from pathlib import Path

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.ssl import Certificate, trustRootFromCertificates
from twisted.internet.task import deferLater
from twisted.logger import globalLogPublisher
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool

from tasknet.node.service import NodeService
from tasknet.runtime import RealThreadPools, SystemEntropy
from tasknet.upstream.testing import start_upstream
from tests.eventually import eventually
from tests.site.helpers import running_site, site_options
from tests.tls_certs import make_ca, make_site_cert

SECRET = "tls-secret"


def quick_retry(attempt: int) -> float:
    return 0.1


async def _node(connect: str, data: Path) -> NodeService:
    node = NodeService(
        connect=connect,
        node_id="node-t",
        secret=SECRET,
        data=str(data),
        retry_policy=quick_retry,
        debounce=0.05,
        reactor=reactor,
        threads=RealThreadPools(),
        entropy=SystemEntropy(),
    )
    node.startService()
    await node.ready
    return node


@pytest_twisted.ensureDeferred
async def test_node_over_tls_logs_in_and_refuses_a_site_from_another_ca(tmp_path: Path) -> None:
    ca, ca_key = make_ca(tmp_path / "site-ca", "tasknet test CA")
    make_ca(tmp_path / "other-ca", "some other CA")
    key, cert = make_site_cert(tmp_path, ca, ca_key)
    ssl = f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
    path = str(tmp_path / "site.sqlite")
    upstream = await start_upstream()
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        options = site_options(path, upstream.base_url, "--node-key", f"node-t:{SECRET}", "--demo")
        options["http"] = options["nodes"] = ssl
        async with running_site(options) as site:
            service = site.service
            nodes_port = service.nodes_port.getHost().port
            http_port = service.http_port.getHost().port

            # HTTP over TLS, verified against the site's CA.
            trust = trustRootFromCertificates(
                [Certificate.loadPEM((tmp_path / "site-ca" / "ca.pem").read_bytes())]
            )
            agent = Agent(reactor, BrowserLikePolicyForHTTPS(trust), pool=pool)
            response = await treq.get(f"https://localhost:{http_port}/healthz", agent=agent)
            assert response.code == 200
            assert json.loads(await treq.content(response))["recovery"] == "done"

            # A node that trusts only another CA never logs in.
            stranger = await _node(
                f"tls:localhost:{nodes_port}:trustRoots={tmp_path / 'other-ca'}",
                tmp_path / "stranger",
            )
            try:
                await deferLater(reactor, 1.0, lambda: None)
                assert stranger.link is None
                retries = [e for e in events if "Scheduling retry" in str(e.get("log_format"))]
                assert len(retries) >= 2  # it dialled, refused the handshake, dialled again
                # ... and says why (issue 36, item 12), not only "Scheduling retry".
                why = [
                    e["why"]
                    for e in events
                    if str(e.get("log_format", "")).startswith("TLS with the site at")
                ]
                assert why and all("certificate verify failed" in text for text in why)
            finally:
                await stranger.stopService()
            response = await treq.get(
                f"https://localhost:{http_port}/api/admin/nodes",
                headers={"Authorization": ["Bearer demo"]},
                agent=agent,
            )
            assert response.code == 200
            assert json.loads(await treq.content(response)) == {"nodes": []}

            # The same node trusting the site's CA logs in over TLS.
            node = await _node(
                f"tls:localhost:{nodes_port}:trustRoots={tmp_path / 'site-ca'}",
                tmp_path / "node",
            )
            try:
                link = await eventually(lambda: node.link, what="login over TLS")
                assert link.protocol_version == 2
                assert link.transport.getPeerCertificate() is not None  # TLS, not plain TCP
                response = await treq.get(
                    f"https://localhost:{http_port}/api/admin/nodes",
                    headers={"Authorization": ["Bearer demo"]},
                    agent=agent,
                )
                [seen] = json.loads(await treq.content(response))["nodes"]
                assert (seen["id"], seen["connected"]) == ("node-t", True)
            finally:
                await node.stopService()
    finally:
        globalLogPublisher.removeObserver(events.append)
        await pool.closeCachedConnections()
        await upstream.stop()
