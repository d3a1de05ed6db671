"""End to end (DELIVERY.md, "Getting an archive (site)"): the real mock
upstream, a real site and two real v2 nodes with ``--serve`` as processes
(``tasknet.cli.demo.DemoStack``), on a SQLite file and on a PostgreSQL
database.  Real downloads complete; each archive is fetched the way its node
serves it -- node-1 has a public URL (the site answers ``303`` to a signed
link), node-3 serves the site only (the site streams it) -- whole, and
resumed from a byte offset, and hashes to the SHA-256 its task reports."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tasknet.cli.demo import SERVES_SITE, SERVES_USERS, DemoStack, NodeSpec
from tasknet.cli.jsonhttp import request
from tasknet.drill.pgserver import ThrowawayPostgres

pytestmark = pytest.mark.slow

TOKEN = "demo"
NODES = (
    NodeSpec("node-1", 2, "delivery-secret-node-1", SERVES_USERS),
    NodeSpec("node-3", 2, "delivery-secret-node-3", SERVES_SITE),
)


def _fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET, no redirect followed: status, headers (lower-case names), body."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        connection.close()


def _completed_on_each_node(site: str, first_gid: int) -> dict[str, dict[str, Any]]:
    """Tasks created until each node has completed one: node id -> its task."""
    held: dict[str, dict[str, Any]] = {}
    gids: list[int] = []
    deadline = time.monotonic() + 120
    next_gid = first_gid
    while len(held) < len(NODES):
        assert time.monotonic() < deadline, f"completed on {sorted(held)} only"
        if len(gids) < 4 * len(NODES):
            created = request(
                "POST", site + "api/tasks", {"gid": next_gid, "token": "t"}, token=TOKEN
            )
            assert created.status == 201, created.brief()
            gids.append(next_gid)
            next_gid += 1
        for gid in gids:
            task = request("GET", f"{site}api/tasks/{gid}", token=TOKEN).body["task"]
            if task["status"] == "COMPLETED" and task["node"] not in held:
                held[task["node"]] = task
        time.sleep(0.2)
    return held


@pytest.fixture(params=["sqlite", "postgresql"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DemoStack]:
    database_url = None
    name = f"delivery_{uuid.uuid4().hex[:12]}"
    server: ThrowawayPostgres | None = None
    if request.param == "postgresql":
        server = request.getfixturevalue("pg_server")
        database_url = server.create_database(name)
    demo = DemoStack(tmp_path / "stack", bandwidth=None, nodes=NODES, database_url=database_url)
    demo.start()
    try:
        yield demo
    finally:
        demo.stop()
        if server is not None:
            server.drop_database(name)


def test_archives_through_the_node_link_and_the_site_stream(
    stack: DemoStack, tmp_path: Path
) -> None:
    site = stack.url
    auth = {"Authorization": f"Bearer {TOKEN}"}
    tasks = _completed_on_each_node(site, 4101)
    names: dict[int, str] = {}
    for node_id, task in tasks.items():
        gid = task["gid"]
        digest, size = task["archiveSha256"], task["archiveSize"]
        assert isinstance(digest, str) and len(digest) == 64 and size > 0, task
        status, _, answer = _fetch(
            f"{site}api/tasks/{gid}/archive", {**auth, "Accept": "application/json"}
        )
        assert status == 200, answer
        link = json.loads(answer)
        assert link["node"] == node_id and link["sha256"] == digest and link["size"] == size
        via = "node" if node_id == "node-1" else "site"
        assert link["via"] == via
        names[gid] = link["name"]

        status, headers, body = _fetch(f"{site}api/tasks/{gid}/archive", auth)
        if via == "node":
            assert status == 303, body
            where = headers["location"]
            assert f"/archives/{gid}/{task['operationId']}?exp=" in where
            assert where.split("?")[0] == link["url"].split("?")[0]
            status, headers, body = _fetch(where)  # the signed link needs no credentials
        assert status == 200, body[:200]
        assert len(body) == size and hashlib.sha256(body).hexdigest() == digest
        assert headers["etag"] == f'"sha256-{digest}"'
        assert headers["content-disposition"].startswith("attachment;")

        # Resumed from a byte offset, through the same way.
        offset = size // 3
        ranged = {**auth, "Range": f"bytes={offset}-"}
        status, headers, rest = _fetch(f"{site}api/tasks/{gid}/archive", ranged)
        if via == "node":
            assert status == 303
            status, headers, rest = _fetch(headers["location"], {"Range": f"bytes={offset}-"})
        assert status == 206, rest[:200]
        assert headers["content-range"] == f"bytes {offset}-{size - 1}/{size}"
        assert hashlib.sha256(body[:offset] + rest).hexdigest() == digest
        if via == "site":
            # The validators reach the node and its answers come back.
            etag = f'"sha256-{digest}"'
            status, _, empty = _fetch(
                f"{site}api/tasks/{gid}/archive", {**auth, "If-None-Match": etag}
            )
            assert status == 304 and empty == b""
            changed = {**ranged, "If-Range": '"sha256-' + "0" * 64 + '"'}
            status, _, whole = _fetch(f"{site}api/tasks/{gid}/archive", changed)
            assert status == 200 and whole == body  # not the same file: all of it
            past = {**auth, "Range": f"bytes={size + 10}-"}
            status, headers, _ = _fetch(f"{site}api/tasks/{gid}/archive", past)
            assert status == 416 and headers["content-range"] == f"bytes */{size}"

    # The aria2 input file names every archive with its digest.
    gids = [task["gid"] for task in tasks.values()]
    status, headers, text = _fetch_post_links(site, gids)
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for task in tasks.values():
        assert f"  checksum=sha-256={task['archiveSha256']}" in text
    assert f"  header=Authorization: Bearer {TOKEN}" in text  # node-3's goes through the site
    aria2c = shutil.which("aria2c")
    if aria2c is None:
        if os.environ.get("TASKNET_REQUIRE_ARIA2") == "1":
            pytest.fail("TASKNET_REQUIRE_ARIA2=1 but aria2c is not installed")
        return
    # aria2c fetches every archive of the file and checks each digest.
    (tmp_path / "links.txt").write_text(text)
    saved = tmp_path / "by-aria2"
    done = subprocess.run(
        [aria2c, "-q", "-i", str(tmp_path / "links.txt"), "-d", str(saved)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for task in tasks.values():
        data = (saved / names[task["gid"]]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == task["archiveSha256"]


def _fetch_post_links(site: str, gids: list[int]) -> tuple[int, dict[str, str], str]:
    parts = urlsplit(site)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        body = ('{"gids": [' + ", ".join(str(g) for g in gids) + "]}").encode()
        connection.request(
            "POST",
            "/api/tasks/archive-links",
            body=body,
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "Content-Type": "application/json",
                "Accept": "text/plain",
            },
        )
        response = connection.getresponse()
        text = response.read().decode()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, text
    finally:
        connection.close()
