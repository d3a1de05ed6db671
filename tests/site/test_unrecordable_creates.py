"""Creates whose outcome the site cannot record are still answered, never
``500`` and never left hanging (SCALE.md "Database failover", DRILLS.md
S25), without a failover cluster (tests/site/test_failover_cluster.py has
the same on one):

* the database fails between the POST and its persist (every commit, the
  ``UNKNOWN`` too): ``202`` with the task as ``UNKNOWN`` (``SUBMIT_UNKNOWN``),
  the fields the task view has; the background retry records it later, and
  the view then says the same;
* the real site's database goes away (its sessions ended, no new ones
  allowed) while one create's POST is out and another's ``prepare`` is:
  the site fences itself and, before it stops, answers the first ``202``
  ``SUBMIT_UNKNOWN`` (before the POST's answer even came) and the second
  ``503`` with ``Retry-After``; that one is never POSTed, the first once,
  and the next site on the database finds it ``UNKNOWN`` and the other gid
  free;
* a site that stops (SIGTERM) answers the same way, on both backends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.web.client import HTTPConnectionPool

from tasknet.runtime import SystemEntropy
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.root import Tuning
from tasknet.site.storage import views
from tasknet.site.storage.engine.database import open_pool
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.backends import FailingCommits
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import (
    add_user,
    fault,
    lease_timeout_passed,
    lifecycle_env,
    query,
    running_site,
    site_options,
)

#: How long the upstream holds the POST (or the prepare) the test cuts into:
#: the early answers come well before it ends.
HELD_MS = 6000
#: Every key of the task view a create's answer carries.
VIEW_KEYS = frozenset(
    "gid name state status statusText progress operationId deleteOperationId node cost "
    "createdAt updatedAt owner size bytesDone speed eta completedAt archiveSize "
    "archiveSha256 archiveGone queued detail nodeConnected stalledSince".split()
)


@pytest_twisted.async_yield_fixture
async def upstream() -> AsyncIterator[RunningUpstream]:
    running = await start_upstream()
    try:
        yield running
    finally:
        await running.stop()


def _same_task(answered: dict[str, Any], recorded: dict[str, Any]) -> None:
    """The task a create answered while its outcome was unrecorded is the
    task as recorded later, but for what only the database knows."""
    assert set(answered) == set(recorded) == VIEW_KEYS
    for key in ("gid", "name", "state", "status", "statusText", "operationId", "size"):
        assert answered[key] == recorded[key], key
    assert (answered["state"], answered["status"]) == ("UNKNOWN", "SUBMIT_UNKNOWN")


@pytest_twisted.ensureDeferred
async def test_a_database_failing_between_the_post_and_its_persist_answers_202_unknown(
    db_target: str,
) -> None:
    gid = 4801
    async with lifecycle_env(db_target) as env:
        faults = FailingCommits(db_target)
        db = open_pool(env.path, storage_faults=faults, **site_runtime())
        lifecycle = Lifecycle(
            db,
            env.client,
            upstream_timeout=3.0,
            record_retry_for=0.3,
            retry_initial=0.05,
            retry_max=0.1,
            settle_interval=0.1,
            clock=reactor,
            entropy=SystemEntropy(),
        )
        try:
            env.upstream.set_faults([fault("latency", ms=300)])
            created = lifecycle.create(env.user_id, gid, "tok", "")
            await eventually(lambda: env.upstream.app.journal.post_attempts[gid] == 1)
            faults.left = 10**6  # from here on every commit fails: persist, UNKNOWN
            answer = await created
            assert answer.status == 202
            assert (answer.task["state"], answer.task["status"]) == ("UNKNOWN", "SUBMIT_UNKNOWN")
            assert lifecycle.settling == 1  # the UNKNOWN, retried in the background
            assert query(env.path, "SELECT state FROM task_operation")[0][0] == "SUBMITTING"
            faults.left = 0  # the database is back
            await eventually(lambda: lifecycle.settling == 0)
            recorded = await db.read(views.task_view, gid)
            assert recorded is not None
            _same_task(answer.task, recorded)
            assert env.posts(gid) == 1
        finally:
            lifecycle.stop()
            db.close()


async def _post_create(
    base_url: str, token: str, gid: int, pool: HTTPConnectionPool
) -> tuple[int, str | None, dict[str, Any], float]:
    """POST /api/tasks: status, Retry-After, document, when answered."""
    response = await treq.post(
        f"{base_url}/api/tasks",
        json={"gid": gid, "token": "t"},
        headers={"Authorization": [f"Bearer {token}"]},
        pool=pool,
    )
    document = await response.json()
    retry = response.headers.getRawHeaders(b"Retry-After")
    return response.code, retry[0].decode() if retry else None, document, time.monotonic()


def _database_goes_away(url: str) -> None:
    """No new session of the site's database, and every one ended: the
    site's lease, writer and readers meet a server that is not there."""
    database = url.rsplit("/", 1)[1].split("?")[0]
    admin_url = url.replace(f"/{database}", "/postgres", 1)
    query(admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    query(
        admin_url,
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
        "WHERE datname = ? AND pid <> pg_backend_pid()",
        database,
    )


def _database_is_back(url: str) -> None:
    database = url.rsplit("/", 1)[1].split("?")[0]
    admin_url = url.replace(f"/{database}", "/postgres", 1)
    query(admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')


async def _two_creates_under_way(
    base_url: str, token: str, upstream: RunningUpstream, pool: HTTPConnectionPool
) -> tuple[Deferred[Any], Deferred[Any]]:
    """Gid 4811's POST and gid 4812's prepare, both held by the upstream."""
    upstream.set_faults(
        [
            fault("latency", path="/api/galleries/4811/archive", ms=HELD_MS),
            fault("latency", "GET", "/api/galleries/4812", ms=HELD_MS),
        ]
    )
    posted = Deferred.fromCoroutine(_post_create(base_url, token, 4811, pool))
    await eventually(lambda: upstream.app.journal.post_attempts[4811] == 1)
    preparing = Deferred.fromCoroutine(_post_create(base_url, token, 4812, pool))
    await eventually(lambda: upstream.app.journal.requests >= 3)  # 4811's two, 4812's GET
    return posted, preparing


def _check_early_answers(
    posted: tuple[int, str | None, dict[str, Any], float],
    preparing: tuple[int, str | None, dict[str, Any], float],
    upstream: RunningUpstream,
) -> dict[str, Any]:
    status, _, document, _ = posted
    assert status == 202, document
    task = document["task"]
    assert (task["gid"], task["state"], task["status"]) == (4811, "UNKNOWN", "SUBMIT_UNKNOWN")
    status, retry_after, document, _ = preparing
    assert status == 503 and retry_after is not None, document
    assert document["error"]["code"] == "unavailable"
    assert "nothing was submitted for gid 4812" in document["error"]["message"]
    return dict(task)


@pytest_twisted.ensureDeferred
async def test_a_site_whose_database_goes_away_answers_its_creates_before_it_stops(
    pg_url: str, upstream: RunningUpstream
) -> None:
    _, token = add_user(pg_url, "alice")
    options = site_options(pg_url, upstream.base_url, "--upstream-timeout", "20")
    pool = HTTPConnectionPool(reactor, persistent=False)
    async with running_site(options, Tuning(instance_interval=0.2)) as site:
        parts = site.site
        posted, preparing = await _two_creates_under_way(site.base_url, token, upstream, pool)
        await deferToThread(_database_goes_away, pg_url)
        try:
            answers = (await posted, await preparing)
            # Answered before the POST's own answer came (it is still held).
            assert upstream.app.journal.posts[4811] == 0
            answered = _check_early_answers(*answers, upstream)
            await eventually(lambda: not site.service.running)  # fenced: it stopped
            assert parts.instance.lease.lost is not None
            # The chains run on to their end, and write nothing.
            await eventually(lambda: parts.lifecycle.in_flight == 0, timeout=HELD_MS / 1000 + 10)
            await parts.upstream.close()  # the prepare came back after the stop
        finally:
            await deferToThread(_database_is_back, pg_url)
        old_instance = parts.instance.lease.instance_id
    assert upstream.app.journal.posts[4811] == 1
    assert upstream.app.journal.post_attempts[4812] == 0
    # The next site on the database settles what the fenced one left.
    lease_timeout_passed(pg_url, old_instance)
    async with running_site(options) as site:
        status, document = await site.request("GET", "/api/tasks/4811", token=token)
        assert status == 200, document
        _same_task(answered, document["task"])
        status, _ = await site.request("GET", "/api/tasks/4812", token=token)
        assert status == 404  # released: free for a new create
    await pool.closeCachedConnections()


@pytest_twisted.ensureDeferred
async def test_a_stopping_site_answers_its_creates_in_flight(
    db_target: str, upstream: RunningUpstream
) -> None:
    prepare_database(db_target)
    _, token = add_user(db_target, "alice")
    options = site_options(db_target, upstream.base_url, "--upstream-timeout", "20")
    pool = HTTPConnectionPool(reactor, persistent=False)
    async with running_site(options) as site:
        parts = site.site
        posted, preparing = await _two_creates_under_way(site.base_url, token, upstream, pool)
        stopped = site.service.stopService()
        answers = (await posted, await preparing)
        assert upstream.app.journal.posts[4811] == 0  # still held: answered before it
        answered = _check_early_answers(*answers, upstream)
        await stopped
        await eventually(lambda: parts.lifecycle.in_flight == 0, timeout=HELD_MS / 1000 + 10)
        await parts.upstream.close()  # the prepare came back after the stop
        old_instance = parts.instance.lease.instance_id
    assert upstream.app.journal.post_attempts[4812] == 0
    # A live process's instance is reaped once its lease timeout passed.
    lease_timeout_passed(db_target, old_instance)
    async with running_site(options) as site:
        status, document = await site.request("GET", "/api/tasks/4811", token=token)
        assert status == 200, document
        # The stopped chain wrote nothing more: the start's recovery settled it.
        _same_task(answered, document["task"])
        status, _ = await site.request("GET", "/api/tasks/4812", token=token)
        assert status == 404
    assert upstream.app.journal.posts[4811] == 1
    await pool.closeCachedConnections()


@pytest_twisted.ensureDeferred
async def test_a_create_at_a_fenced_site_is_refused_at_once_with_retry_after(
    db_target: str, upstream: RunningUpstream
) -> None:
    prepare_database(db_target)
    _, token = add_user(db_target, "alice")
    async with running_site(site_options(db_target, upstream.base_url)) as site:
        site.site.lifecycle.answer_in_flight("a test's fence")
        status, retry_after, document, _ = await _post_create(site.base_url, token, 4821, site.pool)
        assert status == 503 and retry_after is not None, document
        assert document["error"]["code"] == "unavailable"
        assert "a test's fence" in document["error"]["message"]
    assert upstream.stats()["requests"] == 0
    assert query(db_target, "SELECT COUNT(*) FROM gallery")[0][0] == 0
