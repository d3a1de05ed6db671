"""Issue 36, items 3 and 4, over real HTTP on both backends: a page of
``GET /api/tasks`` asked for by its number (``page=P``) is the page the
cursor reaches after P-1 turns, and ``POST /api/tasks/bulk`` with a
``filter`` acts on exactly the tasks the filter matches, counted and
confirmed (``expect``), bounded (``--max-bulk-matching``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
import pytest_twisted
from twisted.python import usage

from tasknet.site.service import Options
from tasknet.site.web.task_queries import MAX_PAGE_REACH
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import assert_error, running_site, site_options
from tests.site.test_views_api import Fixture, with_fixture

ORDERS = ("newest", "oldest", "gid", "size", "progress", "status")


def _gids(page: dict) -> list[int]:
    return [t["gid"] for t in page["tasks"]]


async def _walk(f: Fixture, query: str) -> list[dict]:
    """Every page of ``query`` by the cursor, in order."""
    pages: list[dict] = []
    after = None
    while True:
        cursor = f"&after={quote(str(after))}" if after is not None else ""
        status, page = await f.get(f"/api/tasks?{query}{cursor}")
        assert status == 200, page
        pages.append(page)
        after = page["next"]
        if after is None:
            return pages


@pytest_twisted.ensureDeferred
async def test_a_page_by_number_is_the_page_the_cursor_reaches(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        for gid in range(1001, 1024):
            await f.create(gid, name=f"task {gid}")
        await f.create(1099, f.bob)
        queries = [f"order={order}&limit=5" for order in ORDERS]
        # Several stored keys (SUBMITTED is SUBMITTED and QUEUED: merged
        # pages), a search by index (its matches first) and by scan.
        queries += ["status=SUBMITTED&limit=3", "q=101&limit=3", "q=10&limit=4&order=gid"]
        for query in queries:
            walked = await _walk(f, query)
            assert len(walked) > 2, query
            for number, expected in enumerate(walked, start=1):
                status, page = await f.get(f"/api/tasks?{query}&page={number}")
                assert status == 200, page
                assert _gids(page) == _gids(expected), (query, number)
                assert page["total"] == expected["total"], (query, number)
                # Next goes on by the cursor from there.
                assert page["next"] == expected["next"], (query, number)
            status, beyond = await f.get(f"/api/tasks?{query}&page={len(walked) + 1}")
            assert status == 200 and beyond["tasks"] == [] and beyond["next"] is None
            assert beyond["total"] == walked[0]["total"]
        # The admin's pages are everyone's.
        _, admin = await f.get("/api/tasks?order=gid&limit=5&page=5", f.admin)
        assert _gids(admin) == [1021, 1022, 1023, 1099]
        # The furthest page allowed: page × limit = MAX_PAGE_REACH.
        status, last = await f.get(f"/api/tasks?limit=50&page={MAX_PAGE_REACH // 50}")
        assert status == 200 and last["tasks"] == [] and last["total"] == 23

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_bad_page_numbers_answer_400(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        await f.create(7)
        await f.create(8)
        _, first = await f.get("/api/tasks?limit=1")
        after = quote(first["next"])
        for query in (
            "page=0",
            "page=-1",
            "page=x",
            "page=1.5",
            "page=",
            f"page={MAX_PAGE_REACH + 1}",
            f"limit=500&page={MAX_PAGE_REACH // 500 + 1}",
            f"limit=50&page={MAX_PAGE_REACH // 50 + 1}",
            f"limit=1&page=2&after={after}",
            f"limit=1&page=1&after={after}",
        ):
            assert_error(await f.get(f"/api/tasks?{query}"), 400, "invalid_request")

    await with_fixture(db_target, test)


async def _bulk(f: Fixture, body: Any, token: str | None = None) -> tuple[int, Any]:
    return await f.site.request("POST", "/api/tasks/bulk", token=token or f.alice, body=body)


async def _total(f: Fixture, query: str, token: str | None = None) -> int:
    status, page = await f.get(f"/api/tasks?{query}", token)
    assert status == 200, page
    return int(page["total"])


@pytest_twisted.ensureDeferred
async def test_a_bulk_filter_acts_on_the_matching_tasks_only(db_target: str) -> None:
    async def test(f: Fixture) -> None:
        for gid in range(2001, 2005):
            await f.create(gid, name="drop me")
        for gid in (2005, 2006):
            await f.create(gid, name="keep me")
        await f.create(2007, f.bob, name="drop me")  # bob's: outside alice's view
        for body in (
            {"action": "delete", "filter": [], "expect": 4},
            {"action": "delete", "filter": {"q": "drop"}},
            {"action": "delete", "filter": {"q": "drop"}, "expect": "4"},
            {"action": "delete", "filter": {"q": "drop"}, "expect": True},
            {"action": "delete", "filter": {"q": "drop"}, "expect": -1},
            {"action": "delete", "filter": {"q": "drop"}, "expect": 4.5},
            {"action": "delete", "filter": {"q": "drop"}, "expect": 4, "gids": [2001]},
            {"action": "delete", "filter": {"q": "drop", "owner": "bob"}, "expect": 4},
            {"action": "delete", "filter": {"q": 5}, "expect": 4},
            {"action": "delete", "filter": {"q": "x" * 257}, "expect": 0},
            {"action": "delete", "filter": {"q": "a\u0001"}, "expect": 0},
            {"action": "delete", "filter": {"status": "SUBMITTED"}, "expect": 6},
            {"action": "delete", "filter": {"status": ["submitted"]}, "expect": 6},
            {"action": "delete", "filter": {"node": ""}, "expect": 0},
            {"action": "delete", "filter": {"node": 1}, "expect": 0},
            {"action": "delete", "filter": {"favorite": 1}, "expect": 0},
            {"action": "purge", "filter": {}, "expect": 6},
        ):
            assert_error(await _bulk(f, body), 400, "invalid_request")
        assert await _total(f, "") == 6

        # A count that changed since the person confirmed: nothing is done.
        status, answer = await _bulk(f, {"action": "delete", "filter": {"q": "drop"}, "expect": 3})
        assert_error((status, answer), 409, "count_changed")
        assert answer["error"]["count"] == 4
        assert await _total(f, "") == 6

        # Retry acts on the failed deletes among them: none here.
        body = {"action": "retry", "filter": {"q": "drop", "status": ["SUBMITTED"]}, "expect": 4}
        status, answer = await _bulk(f, body)
        assert status == 200, answer
        assert answer == {
            "matched": 4,
            "done": 0,
            "notDone": 0,
            "notApplicable": 4,
            "reasons": {"not_retryable": {"count": 4, "gids": [2001, 2002, 2003, 2004]}},
        }
        assert await _total(f, "") == 6

        status, answer = await _bulk(f, {"action": "delete", "filter": {"q": "drop"}, "expect": 4})
        assert status == 200, answer
        assert answer == {"matched": 4, "done": 4, "notDone": 0, "notApplicable": 0, "reasons": {}}
        assert await _total(f, "q=drop") == 0
        assert await _total(f, "q=keep") == 2  # outside the filter: untouched
        status, task = await f.get("/api/tasks/2007", f.bob)
        assert status == 200 and task["task"]["status"] == "SUBMITTED"  # another user's

        # Favourites and an unknown node, as the list filters them.
        status, _ = await f.site.request("PUT", "/api/favorites/2005", token=f.alice)
        assert status == 200
        body = {"action": "delete", "filter": {"favorite": True, "node": "nobody"}, "expect": 0}
        assert await _bulk(f, body) == (
            200,
            {"matched": 0, "done": 0, "notDone": 0, "notApplicable": 0, "reasons": {}},
        )
        status, answer = await _bulk(
            f, {"action": "delete", "filter": {"favorite": True}, "expect": 1}
        )
        assert status == 200 and answer["done"] == 1, answer
        assert _gids((await f.get("/api/tasks"))[1]) == [2006]
        # An admin's filter covers everyone's tasks.
        status, answer = await _bulk(
            f, {"action": "delete", "filter": {"q": "drop"}, "expect": 1}, f.admin
        )
        assert status == 200 and answer["done"] == 1, answer
        assert await _total(f, "", f.bob) == 0

    await with_fixture(db_target, test)


@pytest_twisted.ensureDeferred
async def test_a_bulk_filter_over_the_bound_is_refused(db_target: str) -> None:
    upstream = await start_upstream()
    options = site_options(db_target, upstream.base_url, "--demo", "--max-bulk-matching=3")
    try:
        async with running_site(options) as site:
            f = Fixture(site, db_target, upstream)
            for gid in range(3001, 3005):
                await f.create(gid, name="first three" if gid < 3004 else "the last")
            body = {"action": "delete", "filter": {}, "expect": 4}
            status, answer = await _bulk(f, body)
            assert_error((status, answer), 413, "too_many_tasks")
            assert (answer["error"]["count"], answer["error"]["max"]) == (4, 3)
            assert await _total(f, "") == 4  # nothing done
            status, answer = await _bulk(f, {**body, "filter": {"q": "three"}, "expect": 3})
            assert status == 200 and answer["done"] == 3, answer
            assert await _total(f, "") == 1
    finally:
        await upstream.stop()


@pytest.mark.parametrize("value", ["0", "100001", "x"])
def test_max_bulk_matching_is_bounded(value: str) -> None:
    with pytest.raises(usage.UsageError):
        Options().parseOptions(
            ["--db", "x.sqlite", "--upstream", "http://u", f"--max-bulk-matching={value}"]
        )
