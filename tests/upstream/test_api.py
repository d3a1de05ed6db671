"""Every endpoint over real loopback HTTP."""

from __future__ import annotations

import pytest_twisted

from tasknet.upstream import catalog
from tasknet.upstream.testing import RunningUpstream
from tests.upstream.conftest import Client


@pytest_twisted.ensureDeferred
async def test_metadata_is_read_only_and_deterministic(client: Client) -> None:
    code, body = await client.json("GET", "/api/galleries/42?token=abc")
    assert code == 200
    assert body == catalog.gallery(42).to_json()
    assert set(body) == {"gid", "title", "pages", "size", "cost"}
    stats = await client.stats()
    assert stats["requests"] == 1
    assert stats["posts"] == {} and stats["charged"] == 0


@pytest_twisted.ensureDeferred
async def test_every_post_counts_and_charges(client: Client, upstream: RunningUpstream) -> None:
    cost = catalog.gallery(42).cost
    for n in (1, 2, 3):
        code, body = await client.json("POST", "/api/galleries/42/archive")
        assert code == 200
        assert body == {"archiveUrl": f"{upstream.base_url}/files/42-{n}.bin", "cost": cost}
    await client.json("POST", "/api/galleries/7/archive")

    stats = await client.stats()
    assert stats["posts"] == {"42": 3, "7": 1}
    assert stats["postAttempts"] == {"42": 3, "7": 1}
    assert stats["charged"] == 3 * cost + catalog.gallery(7).cost
    journal = await client.journal()
    assert [(e["seq"], e["gid"], e["cost"]) for e in journal["entries"]] == [
        (1, 42, cost),
        (2, 42, cost),
        (3, 42, cost),
        (4, 7, catalog.gallery(7).cost),
    ]
    assert [e["submission"] for e in journal["entries"]] == [1, 2, 3, 1]
    assert journal["entries"][0]["at"] <= journal["entries"][3]["at"]
    assert upstream.app.journal.posts[42] == 3  # the in-process view agrees


@pytest_twisted.ensureDeferred
async def test_audit_reports_submissions_without_side_effects(client: Client) -> None:
    code, body = await client.json("GET", "/api/galleries/9/archive")
    assert (code, body["submissions"], body["lastAt"], body["archiveUrl"]) == (200, 0, None, None)
    await client.json("POST", "/api/galleries/9/archive")
    _, second = await client.json("POST", "/api/galleries/9/archive")
    code, body = await client.json("GET", "/api/galleries/9/archive")
    assert code == 200 and body["submissions"] == 2
    journal = await client.journal()
    assert body["lastAt"] == journal["entries"][-1]["at"]
    assert body["archiveUrl"] == second["archiveUrl"]
    assert (await client.stats())["posts"] == {"9": 2}


@pytest_twisted.ensureDeferred
async def test_archive_url_serves_the_deterministic_bytes(client: Client) -> None:
    _, body = await client.json("POST", "/api/galleries/42/archive")
    response, data, failure = await client.raw("GET", body["archiveUrl"])
    assert (response.code, failure) == (200, None)
    assert response.length == catalog.gallery(42).size  # the Content-Length header
    assert data == catalog.archive_bytes(42)
    stats = await client.stats()
    assert stats["fileGets"] == {"42-1.bin": 1}
    assert stats["rangedGets"] == {}


@pytest_twisted.ensureDeferred
async def test_reset_clears_counts_charges_journal_and_faults(client: Client) -> None:
    await client.json("POST", "/api/galleries/5/archive")
    await client.put_faults([{"path": "/api/galleries/6", "fault": "missing"}])
    code, body = await client.json("POST", "/_drill/reset")
    assert code == 200
    stats = await client.stats()
    assert (stats["posts"], stats["charged"], stats["requests"]) == ({}, 0, 0)
    assert (await client.journal())["entries"] == []
    assert (await client.json("GET", "/_drill/faults"))[1] == {"rules": []}
    # and submission numbers restart
    _, body = await client.json("POST", "/api/galleries/5/archive")
    assert body["archiveUrl"].endswith("/files/5-1.bin")


@pytest_twisted.ensureDeferred
async def test_drill_endpoints_are_not_counted(client: Client) -> None:
    await client.stats()
    await client.journal()
    await client.json("GET", "/_drill/faults")
    assert (await client.stats())["requests"] == 0


@pytest_twisted.ensureDeferred
async def test_request_log_records_method_path_and_range(client: Client) -> None:
    await client.request("GET", "/files/3-1.bin", headers={"Range": "bytes=0-9"})
    await client.json("POST", "/api/galleries/3/archive")
    requests = (await client.journal())["requests"]
    assert [(r["method"], r["path"], r["range"]) for r in requests] == [
        ("GET", "/files/3-1.bin", "bytes=0-9"),
        ("POST", "/api/galleries/3/archive", None),
    ]
