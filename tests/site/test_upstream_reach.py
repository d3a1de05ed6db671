"""``GET /api/upstream`` (issue 36, item 9): the site-wide word on the
upstream that the web UI's banner shows on every page, whatever rows the
page holds.  A real site on both backends, the real mock upstream over
loopback (stopped, then started again on its port), a scripted v2 node
over real TCP reporting a download that cannot reach it."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet.task import Clock

from tasknet.failures import cannot_reach, plain_words
from tasknet.protocol.messages import TaskCommand, TaskReportAck
from tasknet.site.upstream_client import UpstreamReach
from tasknet.upstream.testing import start_upstream
from tests.site.test_views_api import Fixture, with_fixture

REFUSED = (
    "retrying in 8 s: the connection was refused (nothing answers at that address) (errno 111)"
)


async def _reach(f: Fixture, token: str) -> dict[str, Any]:
    status, body = await f.get("/api/upstream", token)
    assert status == 200, body
    return dict(body["upstream"])


async def _report(node: Any, report_id: str, revision: int, entry: tuple, ops: dict) -> None:
    node.report(report_id, revision, [entry], ops)
    assert (await node.next(TaskReportAck)).result == "APPLIED"


@pytest_twisted.ensureDeferred
async def test_the_upstream_word_counts_downloads_that_cannot_reach_it_and_the_sites_calls(
    db_target: str,
) -> None:
    async def test(f: Fixture) -> None:
        calm = {"reachable": True, "since": None, "reason": None, "downloadsNotReaching": 0}
        assert await _reach(f, f.alice) == calm
        status, _ = await f.site.request("GET", "/api/upstream")
        assert status == 401

        node = await f.connect("n1")
        task = await f.create(501)
        command = await node.next(TaskCommand)
        ops = {501: command.operation_id}
        # The node cannot reach the upstream: its owner and an admin are
        # told, another user is not (their downloads all reach it).
        await _report(node, "r1", 1, (501, 1, 0.2, False, REFUSED), ops)
        assert await _reach(f, f.alice) == {**calm, "reachable": False, "downloadsNotReaching": 1}
        assert (await _reach(f, f.admin))["downloadsNotReaching"] == 1
        assert await _reach(f, f.bob) == calm
        # A retry for another reason (the upstream answered 503) is not "down".
        await _report(node, "r2", 2, (501, 1, 0.2, False, "retrying in 8 s: HTTP 503"), ops)
        assert await _reach(f, f.alice) == calm
        await _report(node, "r3", 3, (501, 1, 0.2, False, REFUSED), ops)
        assert (await _reach(f, f.alice))["downloadsNotReaching"] == 1
        # Its next report moves on without a word: it reaches it again.
        await _report(node, "r4", 4, (501, 1, 0.5), ops)
        assert await _reach(f, f.alice) == calm
        assert task["gid"] == 501

        # The site's own call finds nobody there: since then, in words.
        port = f.upstream.port
        await f.upstream.stop()
        status, body = await f.site.request(
            "POST", "/api/tasks", token=f.alice, body={"gid": 502, "token": "t"}
        )
        assert (status, body["error"]["code"]) == (502, "upstream_unavailable")
        down = await _reach(f, f.bob)  # site-wide: whoever asks
        assert down["reachable"] is False and down["since"].endswith("Z")
        assert down["reason"] is not None and cannot_reach(down["reason"]), down
        assert down["downloadsNotReaching"] == 0
        # Back on its port: the next call is answered and the word clears.
        again = await start_upstream(endpoint=f"tcp:{port}:interface=127.0.0.1")
        try:
            await f.create(503)
            assert await _reach(f, f.bob) == calm
        finally:
            await again.stop()

    await with_fixture(db_target, test)


def test_the_first_failure_since_the_last_answer_is_kept_on_the_sites_clock() -> None:
    clock = Clock()
    reach = UpstreamReach(clock)
    assert (reach.failing_since, reach.reason) == (None, None)
    clock.advance(10)
    reach.not_reached("the connection was refused")
    clock.advance(5)
    reach.not_reached("the connection timed out")
    assert (reach.failing_since, reach.reason) == (10, "the connection was refused")
    reach.answered()
    assert (reach.failing_since, reach.reason) == (None, None)


def test_cannot_reach_is_the_words_of_a_peer_not_reached() -> None:
    from twisted.internet import error

    for failure in (
        error.ConnectionRefusedError("111"),
        error.DNSLookupError("x"),
        error.TCPTimedOutError("x"),
        error.NoRouteError("x"),
    ):
        words = plain_words(failure)
        assert words is not None and cannot_reach(f"retrying in 8 s: {words}"), failure
    for words in ("retrying in 8 s: HTTP 503", "no space left on the disk (errno 28)", ""):
        assert not cannot_reach(words)
    assert not cannot_reach(str(plain_words(error.ConnectionLost())))
