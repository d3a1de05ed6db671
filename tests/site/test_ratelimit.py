"""The per-user create rate limit: token buckets on the site's clock
(``task.Clock`` here), and over HTTP the ``429 rate_limited`` answer with
``Retry-After`` that writes nothing and asks the upstream nothing."""

from __future__ import annotations

import pytest
import pytest_twisted
import treq
from twisted.internet.task import Clock
from twisted.python import usage

from tasknet.site.ratelimit import DEFAULT_BURST, DEFAULT_RATE, CreateRateLimiter
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, one, running_site, site_options


def test_a_burst_then_the_rate_per_user():
    clock = Clock()
    limiter = CreateRateLimiter(2.0, 3, clock)
    assert [limiter.take(1) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take(1) == pytest.approx(0.5)  # empty: half a second to a token
    assert limiter.take(2) == 0.0  # another user has a bucket of their own
    clock.advance(0.25)
    assert limiter.take(1) == pytest.approx(0.25)  # half a token: not enough, none taken
    clock.advance(0.25)
    assert limiter.take(1) == 0.0
    assert limiter.take(1) > 0
    clock.advance(100)  # refills to the burst, never past it
    assert [limiter.take(1) for _ in range(4)][-1] > 0


def test_a_clock_stepping_back_gives_nothing():
    clock = Clock()
    clock.advance(1000)
    limiter = CreateRateLimiter(1.0, 1, clock)
    assert limiter.take(7) == 0.0
    clock.rightNow = 10.0  # the clock jumps back
    assert limiter.take(7) > 0
    clock.rightNow = 1001.0
    assert limiter.take(7) == 0.0


def test_idle_buckets_are_forgotten_past_the_tracking_bound():
    clock = Clock()
    limiter = CreateRateLimiter(10.0, 5, clock, max_tracked=100)
    for user in range(100):
        limiter.take(user)
    clock.advance(0.5)  # 5 tokens at 10/s: every bucket is full again
    limiter.take(1000)
    assert limiter.tracked == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        CreateRateLimiter(0.0, 1, Clock())
    with pytest.raises(ValueError):
        CreateRateLimiter(1.0, 0, Clock())


@pytest.mark.parametrize("args", [["--create-rate", "-1"], ["--create-burst", "0"]])
def test_bad_options_are_refused(args):
    with pytest.raises(usage.UsageError):
        site_options("x.sqlite", "http://127.0.0.1:1", *args)


def test_defaults_stay_clear_of_the_create_benchmark():
    # B2: 32 clients in a closed loop, one user, about 350-600 creates/s.
    assert DEFAULT_RATE >= 600 and DEFAULT_BURST >= 32
    options = site_options("x.sqlite", "http://127.0.0.1:1")
    assert (options["create-rate"], options["create-burst"]) == (DEFAULT_RATE, DEFAULT_BURST)


@pytest_twisted.ensureDeferred
async def test_over_http_the_limit_answers_429_with_retry_after_and_writes_nothing(db_target):
    upstream = await start_upstream()
    path = db_target
    options = site_options(path, upstream.base_url, "--create-rate", "0.1", "--create-burst", "2")
    try:
        async with running_site(options) as site:
            _, alice = add_user(path, "alice")
            _, bob = add_user(path, "bob")
            for gid in (11, 12):
                status, _ = await site.request(
                    "POST", "/api/tasks", token=alice, body={"gid": gid, "token": "t"}
                )
                assert status == 201
            outbox_before = one(path, "SELECT COUNT(*) FROM notification_outbox")[0]
            requests_before = upstream.stats()["requests"]
            response = await treq.post(
                site.base_url + "/api/tasks",
                json={"gid": 13, "token": "t"},
                headers={"Authorization": [f"Bearer {alice}"]},
                pool=site.pool,
            )
            document = await response.json()
            assert response.code == 429
            assert document["error"]["code"] == "rate_limited"
            # 0.1/s with the bucket empty: 10 s to the next token.
            assert response.headers.getRawHeaders("Retry-After") == ["10"]
            assert one(path, "SELECT COUNT(*) FROM gallery WHERE gid = 13")[0] == 0
            assert one(path, "SELECT COUNT(*) FROM notification_outbox")[0] <= outbox_before
            assert upstream.stats()["requests"] == requests_before
            # A bad body is limited too (the check comes first) ...
            status, document = await site.request(
                "POST", "/api/tasks", token=alice, data=b"not json"
            )
            assert (status, document["error"]["code"]) == (429, "rate_limited")
            # ... and another user is not.
            status, _ = await site.request(
                "POST", "/api/tasks", token=bob, body={"gid": 14, "token": "t"}
            )
            assert status == 201
    finally:
        await upstream.stop()


@pytest_twisted.ensureDeferred
async def test_a_create_rate_of_zero_means_no_limit(db_target):
    upstream = await start_upstream()
    path = db_target
    options = site_options(path, upstream.base_url, "--create-rate", "0", "--create-burst", "1")
    try:
        async with running_site(options) as site:
            assert site.site.web.create_limiter is None
            _, alice = add_user(path, "alice", quota=10**6)
            for gid in (21, 22, 23):
                status, _ = await site.request(
                    "POST", "/api/tasks", token=alice, body={"gid": gid, "token": "t"}
                )
                assert status == 201
    finally:
        await upstream.stop()
