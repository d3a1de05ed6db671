"""Every fault kind, with its count/charge semantics checked on /_drill/*."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import pytest_twisted
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from tasknet.upstream import catalog
from tasknet.upstream.testing import RunningUpstream
from tests.eventually import eventually
from tests.upstream.conftest import Client

POST_ARCHIVE = "/api/galleries/*/archive"
COST = catalog.gallery(42).cost


def rule(fault: str, **extra: Any) -> dict[str, Any]:
    return {"method": "POST", "path": POST_ARCHIVE, "fault": fault, **extra}


async def expect_connection_failure(client: Client, method: str, path: str) -> None:
    with pytest.raises((ResponseNeverReceived, ResponseFailed)):
        await client.request(method, path)


async def assert_charged(client: Client, posts: dict[str, int], charged: int) -> None:
    stats = await client.stats()
    assert (stats["posts"], stats["charged"]) == (posts, charged)
    entries = (await client.journal())["entries"]
    assert sum(e["cost"] for e in entries) == charged
    assert len(entries) == sum(posts.values())


@pytest_twisted.ensureDeferred
async def test_latency_delays_then_answers_normally(client: Client) -> None:
    await client.put_faults([rule("latency", params={"ms": 200})])
    started = time.monotonic()
    code, body = await client.json("POST", "/api/galleries/42/archive")
    assert time.monotonic() - started >= 0.15
    assert (code, body["cost"]) == (200, COST)
    await assert_charged(client, {"42": 1}, COST)


@pytest_twisted.ensureDeferred
async def test_timeout_charges_and_never_answers_until_cleared(
    client: Client, upstream: RunningUpstream
) -> None:
    await client.put_faults([rule("timeout")])
    pending = client.request("POST", "/api/galleries/42/archive")
    settled: list[object] = []

    def note(result: object) -> object:
        settled.append(result)
        return result

    pending.addBoth(note)
    await eventually(lambda: len(upstream.app._hung) == 1)
    await assert_charged(client, {"42": 1}, COST)
    assert (await client.stats())["hung"] == 1
    assert settled == []
    code, _ = await client.json("DELETE", "/_drill/faults")  # clearing drops hung requests
    assert code == 200
    with pytest.raises((ResponseNeverReceived, ResponseFailed)):
        await pending
    assert (await client.stats())["hung"] == 0
    await assert_charged(client, {"42": 1}, COST)  # the charge stays


@pytest_twisted.ensureDeferred
async def test_reset_drops_hung_requests(client: Client, upstream: RunningUpstream) -> None:
    await client.put_faults([{"path": "/api/galleries/*", "fault": "timeout"}])
    pending = [client.request("GET", f"/api/galleries/{gid}") for gid in (1, 2)]
    await eventually(lambda: len(upstream.app._hung) == 2)
    await client.json("POST", "/_drill/reset")
    for request in pending:
        with pytest.raises((ResponseNeverReceived, ResponseFailed)):
            await request
    assert not upstream.app._hung


@pytest_twisted.ensureDeferred
async def test_client_giving_up_releases_the_hung_request(
    client: Client, upstream: RunningUpstream
) -> None:
    await client.put_faults([rule("timeout")])
    pending = client.request("POST", "/api/galleries/42/archive")
    await eventually(lambda: len(upstream.app._hung) == 1)
    pending.cancel()
    with pytest.raises(Exception):  # noqa: B017 - cancellation surfaces as various errors
        await pending
    await eventually(lambda: not upstream.app._hung)


@pytest_twisted.ensureDeferred
async def test_stop_with_a_hung_request_leaves_the_reactor_clean() -> None:
    from tasknet.upstream.testing import running_upstream

    async with running_upstream() as up:
        client = Client(up.base_url)
        up.set_faults([rule("timeout")])
        pending = client.request("POST", "/api/galleries/42/archive")
        await eventually(lambda: len(up.app._hung) == 1)
    with pytest.raises((ResponseNeverReceived, ResponseFailed)):
        await pending
    # the autouse reactor_is_clean fixture fails this test if anything leaked


@pytest_twisted.ensureDeferred
async def test_commit_then_drop_charges_but_gives_no_answer(client: Client) -> None:
    await client.put_faults([rule("commit_then_drop")])
    await expect_connection_failure(client, "POST", "/api/galleries/42/archive")
    await assert_charged(client, {"42": 1}, COST)
    code, body = await client.json("GET", "/api/galleries/42/archive")
    assert (code, body["submissions"]) == (200, 1)


@pytest_twisted.ensureDeferred
async def test_drop_before_charges_nothing(client: Client) -> None:
    await client.put_faults([rule("drop_before")])
    await expect_connection_failure(client, "POST", "/api/galleries/42/archive")
    await assert_charged(client, {}, 0)
    stats = await client.stats()
    assert stats["postAttempts"] == {"42": 1}
    assert stats["requests"] == 1


@pytest.mark.parametrize(("charged", "status"), [(False, 503), (True, 500), (True, 502)])
@pytest_twisted.ensureDeferred
async def test_error_status_charged_or_not(client: Client, charged: bool, status: int) -> None:
    await client.put_faults([rule("error", params={"status": status, "charged": charged})])
    code, body = await client.json("POST", "/api/galleries/42/archive")
    assert code == status
    assert "archiveUrl" not in body and body["error"]["code"] == "upstream_error"
    if charged:
        await assert_charged(client, {"42": 1}, COST)
    else:
        await assert_charged(client, {}, 0)


@pytest.mark.parametrize("charged", [False, True])
@pytest_twisted.ensureDeferred
async def test_an_error_without_an_error_body_is_a_proxy_s_page(
    client: Client, charged: bool
) -> None:
    await client.put_faults(
        [rule("error", params={"status": 502, "charged": charged, "body": False})]
    )
    response = await client.request("POST", "/api/galleries/42/archive")
    assert response.code == 502
    assert response.headers.getRawHeaders("content-type") == ["text/html"]
    assert b"<html>" in await response.content()
    await assert_charged(client, {"42": 1} if charged else {}, COST if charged else 0)


@pytest_twisted.ensureDeferred
async def test_error_defaults_to_500_uncharged(client: Client) -> None:
    await client.put_faults([rule("error")])
    code, _ = await client.json("POST", "/api/galleries/42/archive")
    assert code == 500
    await assert_charged(client, {}, 0)


@pytest.mark.parametrize("params", [{}, {"status": 409}])
@pytest_twisted.ensureDeferred
async def test_reject_is_a_4xx_with_an_error_body_and_no_charge(
    client: Client, params: dict[str, int]
) -> None:
    await client.put_faults([rule("reject", params=params)])
    code, body = await client.json("POST", "/api/galleries/42/archive")
    assert code == params.get("status", 403)
    assert body["error"]["code"] == "rejected" and body["error"]["message"]
    await assert_charged(client, {}, 0)
    assert (await client.stats())["postAttempts"] == {"42": 1}


@pytest_twisted.ensureDeferred
async def test_missing_marks_one_gid_missing(client: Client) -> None:
    await client.put_faults([{"path": "/api/galleries/13*", "fault": "missing"}])
    code, body = await client.json("GET", "/api/galleries/13")
    assert (code, body["error"]["code"]) == (404, "not_found")
    code, _ = await client.json("POST", "/api/galleries/13/archive")
    assert code == 404
    code, _ = await client.json("GET", "/api/galleries/14")
    assert code == 200
    await assert_charged(client, {}, 0)


@pytest_twisted.ensureDeferred
async def test_slow_body_on_a_post_still_charges_and_answers(client: Client) -> None:
    await client.put_faults([rule("slow_body", params={"bytes_per_s": 200})])
    started = time.monotonic()
    code, body = await client.json("POST", "/api/galleries/42/archive")
    elapsed = time.monotonic() - started
    length = len(json.dumps(body, separators=(",", ":")))
    assert code == 200 and body["cost"] == COST
    assert elapsed >= length / 200 * 0.5
    await assert_charged(client, {"42": 1}, COST)


@pytest_twisted.ensureDeferred
async def test_reset_mid_body_on_a_post_charges_and_cuts_the_answer(client: Client) -> None:
    await client.put_faults([rule("reset_mid_body", params={"after_bytes": 10})])
    response, body, failure = await client.raw("POST", "/api/galleries/42/archive")
    assert response.code == 200
    assert failure is not None
    assert body == b'{"archiveU'
    await assert_charged(client, {"42": 1}, COST)


@pytest_twisted.ensureDeferred
async def test_times_limits_firings(client: Client) -> None:
    await client.put_faults([rule("reject", times=2)])
    codes = [(await client.json("POST", "/api/galleries/42/archive"))[0] for _ in range(4)]
    assert codes == [403, 403, 200, 200]
    await assert_charged(client, {"42": 2}, 2 * COST)
    _, faults = await client.json("GET", "/_drill/faults")
    assert faults["rules"][0]["fired"] == 2
    assert (await client.stats())["faultsFired"] == 2


@pytest_twisted.ensureDeferred
async def test_times_zero_never_fires_and_probability_zero_never_fires(client: Client) -> None:
    await client.put_faults([rule("reject", times=0), rule("drop_before", probability=0)])
    code, _ = await client.json("POST", "/api/galleries/42/archive")
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_probability_is_partial_and_replays_after_reset(client: Client) -> None:
    async def outcomes() -> list[int]:
        await client.put_faults([rule("reject", probability=0.5)])
        return [(await client.json("POST", "/api/galleries/42/archive"))[0] for _ in range(30)]

    first = await outcomes()
    assert 5 <= first.count(403) <= 25
    stats = await client.stats()
    assert stats["posts"]["42"] == first.count(200)  # rejected ones are not charged
    await client.json("POST", "/_drill/reset")
    assert await outcomes() == first  # reseeded: the same draws


@pytest_twisted.ensureDeferred
async def test_rules_filter_by_method_and_path_first_match_wins(client: Client) -> None:
    await client.put_faults(
        [
            rule("reject", params={"status": 409}),
            rule("reject", params={"status": 410}),
            {"method": "GET", "path": "/files/*", "fault": "missing"},
        ]
    )
    assert (await client.json("POST", "/api/galleries/42/archive"))[0] == 409
    assert (await client.json("GET", "/api/galleries/42/archive"))[0] == 200  # GET: no rule
    assert (await client.json("GET", "/api/galleries/42"))[0] == 200
    assert (await client.json("GET", "/files/42-1.bin"))[0] == 404


@pytest_twisted.ensureDeferred
async def test_the_drill_control_plane_is_never_faulted(client: Client) -> None:
    await client.put_faults([{"method": "*", "path": "*", "fault": "drop_before"}])
    await expect_connection_failure(client, "GET", "/api/galleries/1")
    stats = await client.stats()
    assert stats["requests"] == 1
    code, _ = await client.json("DELETE", "/_drill/faults")
    assert code == 200
    assert (await client.json("GET", "/api/galleries/1"))[0] == 200
