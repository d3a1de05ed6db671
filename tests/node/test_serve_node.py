"""``tasknet-node --serve``: the options, the Hello the site receives, and
the endpoint of a real node answering a link the site would sign."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.python import usage
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Site

from tasknet.node.serve import DEFAULT_SERVE_MAX, derived_serve_url
from tasknet.node.service import NodeService, Options, makeService
from tasknet.protocol.archive_links import ArchiveLink, link_key
from tasknet.protocol.messages import ProtocolHello
from tests.node.harness import SECRET, logged_in_node, start_node
from tests.node.site_peer import ScriptedSite
from tests.node.test_serve_support import content_of
from tests.tls_certs import make_ca, make_site_cert


def parse(*argv: str) -> Options:
    options = Options()
    options.parseOptions(["--secret", "x", *argv])
    return options


def test_serve_options_and_their_defaults(tmp_path: Path) -> None:
    off = parse()
    assert (off["serve"], off["public-url"], off["serve-url"]) == (None, None, None)
    assert off["serve-max"] == DEFAULT_SERVE_MAX == 64
    on = parse(
        "--serve",
        "tcp:7300:interface=127.0.0.1",
        "--public-url",
        "https://node-1.example.org:7443/",
        "--serve-url",
        "http://10.0.0.5:7300/",
        "--serve-max",
        "8",
        "--data",
        str(tmp_path),
    )
    node = makeService(on)
    assert isinstance(node, NodeService)
    assert (node.serve, node.public_url, node.serve_url, node.serve_max) == (
        "tcp:7300:interface=127.0.0.1",
        "https://node-1.example.org:7443/",
        "http://10.0.0.5:7300/",
        8,
    )
    ca, ca_key = make_ca(tmp_path / "ca", "CA")
    key, cert = make_site_cert(tmp_path, ca, ca_key)
    assert parse("--serve", f"ssl:7443:privateKey={key}:certKey={cert}")["serve"].startswith("ssl:")


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (("--serve-max", "0"), "--serve-max must be at least 1"),
        (("--serve-max", "many"), "many"),
        (("--serve", "unix:/tmp/x"), "expected a tcp: or ssl: server endpoint"),
        (("--serve", "tcp:notaport"), "--serve tcp:notaport"),
        (("--serve", "ssl:7443:privateKey=/nonexistent/key.pem"), "--serve ssl:7443"),
        (("--public-url", "https://n.example/"), "--public-url needs --serve"),
        (("--serve-url", "http://127.0.0.1:7300/"), "--serve-url needs --serve"),
        (("--serve", "tcp:7300", "--public-url", "ftp://n.example/"), "expected http://HOST"),
        (("--serve", "tcp:7300", "--public-url", "https:///x"), "expected http://HOST"),
        (("--serve", "tcp:7300", "--serve-url", "http://h:99999/"), "not a URL"),
        (("--serve", "tcp:7300", "--public-url", "https://h/?a=1"), "no query"),
        (("--serve", "tcp:7300", "--public-url", "https://u:p@h/"), "user name"),
    ],
)
def test_bad_serve_options_are_refused_in_one_line(argv: tuple[str, ...], complaint: str) -> None:
    with pytest.raises(usage.UsageError) as refused:
        parse(*argv)
    message = str(refused.value)
    assert complaint in message and "\n" not in message


def test_the_serve_url_is_derived_only_for_loopback_tcp() -> None:
    assert derived_serve_url("tcp", "127.0.0.1", 7300) == "http://127.0.0.1:7300/"
    assert derived_serve_url("tcp6", "::1", 7300) == "http://[::1]:7300/"
    assert derived_serve_url("tcp", "0.0.0.0", 7300) == ""
    assert derived_serve_url("tcp", "192.0.2.4", 7300) == ""
    assert derived_serve_url("ssl", "127.0.0.1", 7443) == ""


def hellos(site: ScriptedSite) -> list[ProtocolHello]:
    return [m for m in site.received if isinstance(m, ProtocolHello)]


@pytest_twisted.ensureDeferred
async def test_the_hello_says_where_the_node_serves(tmp_path: Path) -> None:
    site = ScriptedSite(SECRET)
    await site.listen()
    try:
        public = "https://node-t.example.org:7443/"
        serving = {"serve": "tcp:0:interface=127.0.0.1", "public_url": public}
        async with logged_in_node(site, tmp_path / "a", **serving) as node:
            port = node.serve_port.getHost().port
            (hello,) = hellos(site)
            assert (hello.archive_url, hello.serve_url) == (public, f"http://127.0.0.1:{port}/")
        explicit = {**serving, "serve_url": "http://10.1.2.3:7300/", "public_url": None}
        async with logged_in_node(site, tmp_path / "b", logins=2, **explicit):
            hello = hellos(site)[-1]
            assert (hello.archive_url, hello.serve_url) == ("", "http://10.1.2.3:7300/")
        async with logged_in_node(site, tmp_path / "c", logins=3) as quiet:
            assert quiet.serve_port is None
            hello = hellos(site)[-1]
            assert (hello.archive_url, hello.serve_url) == ("", "")
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_real_node_serves_a_link_signed_with_its_secret(tmp_path: Path) -> None:
    site = ScriptedSite(SECRET)
    await site.listen()
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        async with logged_in_node(site, tmp_path / "n", serve="tcp:0:interface=127.0.0.1") as node:
            store = node.store
            assert store is not None
            content = content_of(200_000)
            await store.accept_download(77, "op-77", "Gallery 77", "http://u.invalid/", 2)
            path = node.data.archive_path(77, "op-77")
            path.write_bytes(content)
            digest = hashlib.sha256(content).hexdigest()
            assert await store.complete(77, "op-77", path.name, size=len(content), sha256=digest)
            exp = int(reactor.seconds()) + 600
            link = ArchiveLink.sign(link_key(SECRET), 77, "op-77", exp, 1)
            (_, serve_url) = node.hello_urls()
            response = await treq.get(link.url(serve_url), pool=pool)
            assert response.code == 200
            assert response.headers.getRawHeaders("etag") == [f'"sha256-{digest}"']
            assert hashlib.sha256(await response.content()).hexdigest() == digest
            forged = ArchiveLink.sign(link_key("not the secret"), 77, "op-77", exp, 1)
            refused = await treq.get(forged.url(serve_url), pool=pool)
            assert refused.code == 403
            assert (await refused.json()) == {
                "error": {"code": "link_invalid", "message": "the link is not valid"}
            }
            row = await store.archive(77, "op-77")
            assert row is not None and row.served_at is not None
    finally:
        await pool.closeCachedConnections()
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_a_taken_serve_port_fails_the_start(tmp_path: Path) -> None:
    taken = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Site(Resource()))
    site = ScriptedSite(SECRET)
    await site.listen()
    try:
        endpoint = f"tcp:{taken.getHost().port}:interface=127.0.0.1"
        with pytest.raises(Exception, match="Address already in use|Couldn't listen"):
            await start_node(site, tmp_path / "node", serve=endpoint)
        assert site.logins == 0  # it never dialled the site
    finally:
        await site.stop()
        await taken.stopListening()
