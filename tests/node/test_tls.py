"""TLS end to end (INTERFACES.md, "Bounds, failures and secrets"; operations.md
"TLS"): the real site with its node listener and HTTP on ``ssl:`` endpoints,
a real node dialling ``tls:`` with the site's CA as its trust root.  The CA is
made here and thrown away; a node given another CA refuses the site."""

from __future__ import annotations

import datetime
import ipaddress
import json
from pathlib import Path

import pytest_twisted
import treq
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor
from twisted.internet.ssl import Certificate, trustRootFromCertificates
from twisted.internet.task import deferLater
from twisted.logger import globalLogPublisher
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool

from tasknet.node.service import NodeService
from tasknet.upstream.testing import start_upstream
from tests.node.site_peer import eventually
from tests.site.helpers import running_site, site_options

SECRET = "tls-secret"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(directory: Path, common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A CA certificate in ``directory/ca.pem`` (the node's trustRoots dir)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True)
    (directory / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def make_site_cert(
    directory: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    """The site's key and certificate (for localhost and 127.0.0.1), signed by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tasknet-site"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_path, cert_path = directory / "site.key", directory / "site.pem"
    key_path.write_bytes(_pem_key(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


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
