"""Issue 38: failed and slowed authentications are counted in ``/metrics``
(``tasknet_auth_failures_total{kind}``, ``tasknet_auth_throttled_total
{kind}``; ``kind``: ``token``, ``sign_in``, ``node_secret``).  Before, 3,000
wrong tokens left no trace.  The real site over HTTP on loopback, either
backend, its limiter given a threshold a test reaches quickly."""

from __future__ import annotations

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor

from tasknet.site.ratelimit import AuthFailureLimiter
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import RunningSite, running_site, site_options

THRESHOLD = 5
WRONG = 8


async def counts(site: RunningSite) -> dict[tuple[str, str], float]:
    status, page = await site.request("GET", "/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(page.decode()):
        for sample in family.samples:
            if sample.name in ("tasknet_auth_failures_total", "tasknet_auth_throttled_total"):
                found[(sample.name, sample.labels["kind"])] = sample.value
    return found


@pytest_twisted.ensureDeferred
async def test_wrong_tokens_and_sign_ins_are_counted_by_kind(db_target: str) -> None:
    upstream = await start_upstream()
    try:
        async with running_site(site_options(db_target, upstream.base_url, "--demo")) as site:
            before = await counts(site)
            # Every series is there from the start (an alert's rate() needs it).
            assert set(before) == {
                (name, kind)
                for name in ("tasknet_auth_failures_total", "tasknet_auth_throttled_total")
                for kind in ("token", "sign_in", "node_secret")
            }
            auth = site.site.web.auth
            auth.guesses = AuthFailureLimiter(reactor, threshold=THRESHOLD, rate=0.01)
            for n in range(WRONG):
                await site.request("GET", "/api/me", token=f"guess-{n}")
            # Another address's bucket for the sign-ins (a fresh limiter).
            auth.guesses = AuthFailureLimiter(reactor, threshold=THRESHOLD, rate=0.01)
            origin = {"Origin": [site.base_url]}
            for n in range(WRONG):
                await site.request(
                    "POST", "/api/session", body={"token": f"guess-{n}"}, headers=origin
                )
            after = await counts(site)
            delta = {key: after[key] - before[key] for key in after}
            assert delta == {
                ("tasknet_auth_failures_total", "token"): THRESHOLD,
                ("tasknet_auth_throttled_total", "token"): WRONG - THRESHOLD,
                ("tasknet_auth_failures_total", "sign_in"): THRESHOLD,
                ("tasknet_auth_throttled_total", "sign_in"): WRONG - THRESHOLD,
                ("tasknet_auth_failures_total", "node_secret"): 0,
                ("tasknet_auth_throttled_total", "node_secret"): 0,
            }
    finally:
        await upstream.stop()
