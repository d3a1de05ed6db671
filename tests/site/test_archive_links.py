"""Archive links over real loopback HTTP (DELIVERY.md, "Getting an archive
(site)"): the real site and mock upstream, scripted v2 nodes over real TCP
announcing where they serve, and each link checked with ``verify_link``
under the node's link key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.python import usage

from tasknet.protocol.archive_links import link_key, verify_link
from tasknet.protocol.messages import ProtocolHello, TaskCommand, TaskReportAck
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.web import openapi
from tasknet.upstream.testing import start_upstream
from tests.eventually import eventually
from tests.site.helpers import SiteWithUsers, assert_error, one, running_site, site_options
from tests.site_protocol.harness import TIMEOUT, ScriptedNode, secret_of

JSON = {"Accept": ["application/json"]}


class ServingNode(ScriptedNode):
    """A scripted v2 node whose Hello announces ``archive_url`` and ``serve_url``."""

    def __init__(self, node_id: str, archive_url: str = "", serve_url: str = "") -> None:
        super().__init__(node_id)
        self.archive_url = archive_url
        self.serve_url = serve_url
        self.revision = 0
        self.operations: dict[int, str] = {}

    def sendMessage(self, message: Any) -> None:
        if isinstance(message, ProtocolHello):
            message = dataclasses.replace(
                message, archive_url=self.archive_url, serve_url=self.serve_url
            )
        super().sendMessage(message)

    async def take(self) -> int:
        """The next DOWNLOAD: its gid (its operationId remembered)."""
        command = await self.next(TaskCommand)
        self.operations[command.gid] = command.operation_id
        return int(command.gid)

    async def finish(self, gid: int, content: bytes | None = b"the archive") -> None:
        """Report ``gid`` complete (with the archive's size and SHA-256 unless
        ``content`` is None: a completion that carries neither)."""
        self.revision += 1
        entry: tuple[Any, ...] = (gid, 4, 1.0)
        if content is not None:
            entry = (gid, 4, 1.0, False, "", len(content), hashlib.sha256(content).hexdigest())
        report_id = f"{self.node_id}-r{self.revision}"
        self.report(report_id, self.revision, [entry], dict(self.operations))  # type: ignore[list-item]
        ack = await self.next(TaskReportAck)
        assert ack.result == "APPLIED", ack


class Fixture(SiteWithUsers):
    def __init__(self, site: Any, path: str, upstream: Any) -> None:
        super().__init__(site, path, upstream)
        self.nodes: list[ServingNode] = []

    def user_id(self, name: str) -> int:
        return int(one(self.path, 'SELECT id FROM "user" WHERE name = ?', name)[0])

    async def connect(
        self, node_id: str, archive_url: str = "", serve_url: str = ""
    ) -> ServingNode:
        node = ServingNode(node_id, archive_url, serve_url)
        port = self.site.service.nodes_port.getHost().port
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), node)
        assert await node.logged_in.addTimeout(TIMEOUT, reactor)
        self.nodes.append(node)
        return node

    async def create(self, gid: int, token: str | None = None, name: str = "") -> None:
        body: dict[str, Any] = {"gid": gid, "token": "t"}
        if name:
            body["name"] = name
        status, answer = await self.site.request(
            "POST", "/api/tasks", token=token or self.alice, body=body
        )
        assert status == 201, answer

    async def completed(
        self, node: ServingNode, gid: int, token: str | None = None, name: str = ""
    ) -> bytes:
        """``gid`` created (by ``token``'s user), sent to ``node`` and completed."""
        content = f"archive of {gid}".encode() * 100
        await self.create(gid, token, name)
        assert await node.take() == gid
        await node.finish(gid, content)
        return content

    async def http(
        self,
        method: str,
        path: str,
        token: str | None,
        headers: dict[str, list[str]] | None = None,
        body: Any = None,
        data: bytes | None = None,
    ) -> tuple[int, Any, Any]:
        """``(status, headers, document or bytes)``; redirects not followed."""
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = [f"Bearer {token}"]
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = ["application/json"]
        response = await treq.request(
            method,
            self.site.base_url + path,
            headers=all_headers,
            data=data,
            allow_redirects=False,
            pool=self.site.pool,
        )
        content = await treq.content(response)
        try:
            document: Any = json.loads(content)
        except ValueError:
            document = content
        return response.code, response.headers, document

    async def metric(self, name: str, **labels: str) -> float:
        _, _, page = await self.http("GET", "/metrics", None)
        text = page.decode() if isinstance(page, bytes) else str(page)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        raise AssertionError(f"no {name} {labels}")


async def with_fixture(target: str, test: Any, *extra: str) -> None:
    upstream = await start_upstream()
    keys = [f"--node-key=n{i}:{secret_of(f'n{i}')}" for i in (1, 2, 3)]
    try:
        options = site_options(target, upstream.base_url, "--demo", *keys, *extra)
        async with running_site(options) as site:
            fixture = Fixture(site, target, upstream)
            try:
                await test(fixture)
            finally:
                for node in fixture.nodes:
                    await node.disconnect()
    finally:
        await upstream.stop()


def documented_error(answer: dict[str, Any]) -> None:
    """The error object has only fields the OpenAPI document's ``Error`` names."""
    error = openapi.document()["components"]["schemas"]["Error"]["properties"]["error"]
    assert set(answer["error"]) <= set(error["properties"]), answer


def _link_parts(url: str) -> tuple[str, int, str, int, int, str]:
    """``(base, gid, operationId, exp, user, sig)`` of a signed node link."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    head, _, rest = parts.path.partition("/archives/")
    gid, operation_id = rest.split("/")
    base = f"{parts.scheme}://{parts.netloc}{head}"
    return (
        base,
        int(gid),
        operation_id,
        int(query["exp"][0]),
        int(query["user"][0]),
        query["sig"][0],
    )


def _valid(node_id: str, url: str, gid: int, operation_id: str, user: int) -> bool:
    _, linked_gid, linked_op, exp, linked_user, sig = _link_parts(url)
    assert (linked_gid, linked_op, linked_user) == (gid, operation_id, user)
    return verify_link(link_key(secret_of(node_id)), gid, operation_id, exp, user, sig)


@pytest_twisted.ensureDeferred
async def test_json_and_303_links_are_signed_for_the_owner_and_an_admin(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1", archive_url="https://n1.example.org:7443/")
        content = await f.completed(node, 701, name="Holiday/pictures: 1")
        operation_id = node.operations[701]
        alice = f.user_id("alice")
        issued_before = await f.metric("tasknet_archive_links_total", via="node")

        status, _, link = await f.http("GET", "/api/tasks/701/archive", f.alice, JSON)
        assert status == 200, link
        assert link["via"] == "node" and link["node"] == "n1"
        assert link["size"] == len(content)
        assert link["sha256"] == hashlib.sha256(content).hexdigest()
        assert link["name"] == "Holiday_pictures_ 1.zip"
        assert link["url"].startswith("https://n1.example.org:7443/archives/701/")
        assert _valid("n1", link["url"], 701, operation_id, alice)
        exp = _link_parts(link["url"])[3]
        assert link["expiresAt"] == iso(exp)
        # The default --link-ttl is ten minutes.
        assert 590 <= exp - reactor.seconds() <= 601

        # Without Accept: application/json, a 303 to the same kind of link.
        status, headers, body = await f.http("GET", "/api/tasks/701/archive", f.alice)
        assert status == 303, body
        location = headers.getRawHeaders(b"location")[0].decode()
        assert _valid("n1", location, 701, operation_id, alice)
        assert body["url"] == location
        # HEAD answers the same, without a body.
        status, headers, body = await f.http("HEAD", "/api/tasks/701/archive", f.alice)
        assert status == 303 and body == b"" and headers.getRawHeaders(b"location")
        status, _, body = await f.http("HEAD", "/api/tasks/701/archive", f.alice, JSON)
        assert status == 200 and body == b""

        # Another user's task answers as a missing one; an admin gets a link in their name.
        assert_error(
            (await f.http("GET", "/api/tasks/701/archive", f.bob, JSON))[::2], 404, "not_found"
        )
        assert_error(
            (await f.http("GET", "/api/tasks/9999/archive", f.alice, JSON))[::2], 404, "not_found"
        )
        status, _, link = await f.http("GET", "/api/tasks/701/archive", f.admin, JSON)
        assert status == 200 and _valid("n1", link["url"], 701, operation_id, f.user_id("demo"))
        # No credentials: 401.
        assert_error(
            (await f.http("GET", "/api/tasks/701/archive", None, JSON))[::2], 401, "unauthorized"
        )
        assert await f.metric("tasknet_archive_links_total", via="node") == issued_before + 5

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_refusals_not_ready_offline_and_not_served(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        serving = await f.connect("n1", serve_url="http://127.0.0.1:9/")
        await f.create(801)
        assert await serving.take() == 801
        # Not complete: 409 with its status.
        status, _, answer = await f.http("GET", "/api/tasks/801/archive", f.alice, JSON)
        assert_error((status, answer), 409, "archive_not_ready")
        assert answer["error"]["status"] == "SUBMITTED"
        documented_error(answer)
        await serving.finish(801)
        status, _, link = await f.http("GET", "/api/tasks/801/archive", f.alice, JSON)
        assert status == 200 and link["via"] == "site", link
        assert link["url"].endswith("/api/tasks/801/archive")
        assert link["url"].startswith(f.site.base_url)

        # Its node goes away: 503 node_offline with Retry-After.
        await serving.disconnect()
        f.nodes.remove(serving)
        await eventually(lambda: "n1" not in f.site.site.node_side.nodes)
        status, headers, answer = await f.http("GET", "/api/tasks/801/archive", f.alice, JSON)
        assert_error((status, answer), 503, "node_offline")
        assert int(headers.getRawHeaders(b"retry-after")[0]) > 0
        assert answer["error"]["node"] == "n1"
        documented_error(answer)
        status, headers, answer = await f.http("GET", "/api/tasks/801/archive", f.alice)
        assert_error((status, answer), 503, "node_offline")

        # A node that serves nothing (no --serve, or a legacy node): 409.
        quiet = await f.connect("n2")
        await f.create(802)
        assert await quiet.take() == 802
        await quiet.finish(802, None)
        status, _, answer = await f.http("GET", "/api/tasks/802/archive", f.alice, JSON)
        assert_error((status, answer), 409, "archive_not_served")
        documented_error(answer)
        # A completion without size and SHA-256 is still linked, with nulls.
        await quiet.disconnect()
        f.nodes.remove(quiet)
        await eventually(lambda: "n2" not in f.site.site.node_side.nodes)
        quiet = await f.connect("n2", archive_url="http://n2.example.org/")
        status, _, link = await f.http("GET", "/api/tasks/802/archive", f.alice, JSON)
        assert status == 200, link
        assert link["size"] is None and link["sha256"] is None and link["name"].endswith(".zip")

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_archive_links_json_aria2_and_missing(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        public = await f.connect("n1", archive_url="https://n1.example.org/")
        content = await f.completed(public, 901, name="First")
        await f.create(902)  # on n1, not complete
        await f.create(903, f.bob)
        assert {await public.take(), await public.take()} == {902, 903}
        alice = f.user_id("alice")

        body = {"gids": [901, 902, 903, 904, 901]}
        status, _, answer = await f.http("POST", "/api/tasks/archive-links", f.alice, body=body)
        assert status == 200, answer
        assert [link["gid"] for link in answer["links"]] == [901]
        (link,) = answer["links"]
        assert set(link) == {"gid", "url", "expiresAt", "size", "sha256", "name"}
        assert link["name"] == "First.zip" and link["size"] == len(content)
        assert _valid("n1", link["url"], 901, public.operations[901], alice)
        assert answer["missing"] == [
            {"gid": 902, "code": "archive_not_ready"},
            {"gid": 903, "code": "not_found"},  # bob's, as for the task itself
            {"gid": 904, "code": "not_found"},
        ]

        # The aria2 input file: the link, then its out= and checksum= lines.
        text = {"Accept": ["text/plain"]}
        status, headers, page = await f.http(
            "POST", "/api/tasks/archive-links", f.alice, text, body={"gids": [901, 902]}
        )
        assert status == 200, page
        assert headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain")
        lines = page.decode().splitlines()
        assert lines[0] == "# gid 902: archive_not_ready"
        assert _valid("n1", lines[1], 901, public.operations[901], alice)
        assert lines[2:] == [
            "  out=First.zip",
            f"  checksum=sha-256={hashlib.sha256(content).hexdigest()}",
        ]

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_aria2_through_the_site_carries_a_bearer_token_only(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1", serve_url="http://127.0.0.1:9/")
        await f.completed(node, 911, name="Via site")
        text = {"Accept": ["text/plain, application/json;q=0.5"]}
        status, _, page = await f.http(
            "POST", "/api/tasks/archive-links", f.alice, text, body={"gids": [911]}
        )
        assert status == 200, page
        lines = page.decode().splitlines()
        assert lines[0] == f"{f.site.base_url}/api/tasks/911/archive"
        assert lines[1] == "  out=Via site.zip"
        assert lines[-1] == f"  header=Authorization: Bearer {f.alice}"
        # A browser session (the cookie) is never written into the file.
        status, headers, _ = await f.http(
            "POST",
            "/api/session",
            None,
            {"Origin": [f.site.base_url]},
            body={"token": f.alice},
        )
        assert status == 200
        cookie = headers.getRawHeaders(b"set-cookie")[0].decode().split(";")[0]
        status, _, page = await f.http(
            "POST",
            "/api/tasks/archive-links",
            None,
            {**text, "Cookie": [cookie], "Origin": [f.site.base_url]},
            body={"gids": [911]},
        )
        assert status == 200, page
        assert "header=" not in page.decode() and "Bearer" not in page.decode()

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_archive_links_bad_bodies_are_400_and_issue_nothing(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1", archive_url="https://n1.example.org/")
        await f.completed(node, 921)
        before = await f.metric("tasknet_archive_links_total", via="node")
        bad: list[Any] = [
            [],
            {},
            {"gids": []},
            {"gids": 921},
            {"gids": "921"},
            {"gids": ["921"]},
            {"gids": [921.5]},
            {"gids": [True]},
            {"gids": [None]},
            {"gids": [0]},
            {"gids": [-1]},
            {"gids": [2**31]},
            {"gids": [10**100]},
            {"gids": [921] * 1001},
            {"gids": list(range(1, 1002))},
        ]
        for body in bad:
            status, _, answer = await f.http("POST", "/api/tasks/archive-links", f.alice, body=body)
            assert_error((status, answer), 400, "invalid_request")
        for data in (b"", b"not json", b'{"gids": [921', b"\xff\xfe"):
            status, _, answer = await f.http(
                "POST",
                "/api/tasks/archive-links",
                f.alice,
                {"Content-Type": ["application/json"]},
                data=data,
            )
            assert_error((status, answer), 400, "invalid_request")
        assert await f.metric("tasknet_archive_links_total", via="node") == before
        # 1,000 gids is the most; repeats are answered once; 921.0 is 921.
        gids: list[Any] = [921.0, *range(1, 1000)]
        status, _, answer = await f.http(
            "POST", "/api/tasks/archive-links", f.alice, body={"gids": gids}
        )
        assert status == 200, answer
        assert [link["gid"] for link in answer["links"]] == [921]
        assert len(answer["missing"]) == 998  # 921 once; 1..999 without it
        # Bad gids in the path of the single route.
        for path in (
            "/api/tasks/0/archive",
            "/api/tasks/x/archive",
            "/api/tasks/99999999999/archive",
        ):
            status, _, answer = await f.http("GET", path, f.alice, JSON)
            assert status in (400, 404), (path, answer)

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_link_ttl_option(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        node = await f.connect("n1", archive_url="https://n1.example.org/")
        await f.completed(node, 931)
        status, _, link = await f.http("GET", "/api/tasks/931/archive", f.alice, JSON)
        assert status == 200
        assert 85 <= _link_parts(link["url"])[3] - reactor.seconds() <= 91

    await with_fixture(db_target, test, "--link-ttl", "1.5m")


def test_the_options() -> None:
    options = site_options("x.sqlite", "http://127.0.0.1:1")
    assert options["link-ttl"] == 600.0 and options["archive-streams-per-user"] == 4
    options = site_options("x.sqlite", "http://127.0.0.1:1", "--link-ttl", "2h")
    assert options["link-ttl"] == 7200.0
    options = site_options("x.sqlite", "http://127.0.0.1:1", "--link-ttl", "45")
    assert options["link-ttl"] == 45.0
    for bad in (
        ["--link-ttl", "ten"],
        ["--link-ttl", "0"],
        ["--link-ttl", "5x"],
        ["--archive-streams-per-user", "0"],
        ["--archive-streams-per-user", "two"],
    ):
        with pytest.raises(usage.UsageError):
            site_options("x.sqlite", "http://127.0.0.1:1", *bad)
