"""``--db`` as a libpq multi-host URL (SCALE.md "Database failover" 1) and
the replication check's answers, without a failover cluster: the suite's one
throwaway server plays the second host, a port nobody listens on the first.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import pytest_twisted

from tasknet.cli import admin, migrate
from tasknet.drill.pgserver import ThrowawayPostgres
from tasknet.process import free_port
from tasknet.site import metrics
from tasknet.site.storage.engine.database import connect, describe, redact
from tasknet.site.storage.engine.schema import prepare_database
from tasknet.site.storage.engine.targets import several_hosts
from tasknet.site.storage.lease import judge_replication, wait_for_primary
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import running_site, site_options
from tests.ui.test_metrics import _sample, _scrape


def multi_host(server: ThrowawayPostgres, dbname: str, *, password: str | None = None) -> str:
    """A URL whose first host refuses connections and whose second is the
    suite's server, as ``pg_autoctl show uri`` spells one."""
    user = "postgres" if password is None else f"postgres:{password}"
    return (
        f"postgresql://{user}@127.0.0.1:{free_port()},127.0.0.1:{server.port}/{dbname}"
        "?target_session_attrs=read-write&connect_timeout=5"
    )


@pytest.fixture
def failover_url(pg_server: ThrowawayPostgres, pg_url: str) -> str:
    return multi_host(pg_server, pg_url.rsplit("/", 1)[1])


def test_a_multi_host_url_whose_first_host_is_down_connects_to_the_second(
    failover_url: str, pg_server: ThrowawayPostgres
) -> None:
    connection = connect(failover_url)
    try:
        row = connection.execute("SELECT inet_server_port() AS port").fetchone()
        assert int(row["port"]) == pg_server.port
    finally:
        connection.close()


def test_the_schema_is_prepared_through_a_multi_host_url(
    pg_server: ThrowawayPostgres,
) -> None:
    name = "failover_url_prepare"
    pg_server.drop_database(name)
    pg_server.create_database(name)
    try:
        prepare_database(multi_host(pg_server, name))
        tables = pg_server.psql(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'task_operation'", name
        )
        assert tables.strip() == "1"
    finally:
        pg_server.drop_database(name)


def test_a_password_in_a_multi_host_url_is_redacted(pg_server: ThrowawayPostgres) -> None:
    url = multi_host(pg_server, "site", password="s3cr%40t")
    shown = describe(url)
    assert "s3cr" not in shown and "127.0.0.1" in shown and "," in shown
    assert "s3cr" not in redact(f'connection to "{url}" failed: password s3cr@t', url)


@pytest_twisted.ensureDeferred
async def test_the_site_runs_on_a_multi_host_url_and_says_it_has_no_standby(
    failover_url: str,
) -> None:
    upstream = await start_upstream()
    try:
        async with running_site(site_options(failover_url, upstream.base_url)) as site:
            status, health = await site.request("GET", "/healthz")
            assert status == 200, health
            assert health["database"] == "ok" and health["replication"] == "none"
    finally:
        await upstream.stop()


@pytest.mark.parametrize(
    ("settings", "answer"),
    [
        # names, synchronous_commit, in sync, connected, slots, hidden
        (("", "on", 0, 0, 0, 0), "none"),
        (("ANY 1 (pgautofailover_standby_2)", "on", 1, 1, 1, 0), "sync"),
        (("FIRST 1 (s2)", "remote_apply", 1, 1, 0, 0), "sync"),
        # The standby stopped, the manager has not noticed yet.
        (("ANY 1 (pgautofailover_standby_2)", "on", 0, 0, 1, 0), "async"),
        # pg_auto_failover's wait_primary: no names, the slot is still there.
        (("", "on", 0, 0, 1, 0), "async"),
        # A standby streams but commits do not wait for it.
        (("", "on", 0, 1, 0, 0), "async"),
        (("s2", "local", 1, 1, 0, 0), "async"),
        (("s2", "remote_write", 1, 1, 0, 0), "async"),
        # The role cannot see the standbys' state.
        (("s2", "on", 0, 1, 1, 1), "unknown"),
    ],
)
def test_the_replication_check_answers(settings: tuple[Any, ...], answer: str) -> None:
    assert judge_replication(*settings) == answer


@pytest_twisted.inlineCallbacks
def test_the_replication_gauges_follow_healthz() -> Any:
    documents = [
        {"replication": "sync"},
        {"replication": "async since 2026-12-07T05:00:00.000Z"},
        {"replication": "none"},
    ]

    def refresh() -> None:
        metrics.set_health(documents.pop(0))

    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_db_replication_sync") == 1
    assert _sample(body, "tasknet_db_replication_async_since_seconds") == 0
    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_db_replication_sync") == 0
    assert _sample(body, "tasknet_db_replication_async_since_seconds") == 1796619600.0
    _, body = yield _scrape(refresh)
    assert _sample(body, "tasknet_db_replication_sync") == 0
    assert _sample(body, "tasknet_db_replication_async_since_seconds") == 0


def test_tasknet_migrate_and_tasknet_admin_take_a_multi_host_url(
    pg_server: ThrowawayPostgres, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "failover_url_cli"
    pg_server.drop_database(name)
    pg_server.create_database(name)
    url = multi_host(pg_server, name)
    try:
        assert migrate.main(["--db", url]) == 0
        assert admin.main(["--db", url, "user", "add", "alice"]) == 0
        capsys.readouterr()
        assert admin.main(["--db", url, "user", "list"]) == 0
        assert "alice" in capsys.readouterr().out
    finally:
        pg_server.drop_database(name)


class FakeTime:
    """The wait's clock and pause: a pause moves the clock, nothing sleeps."""

    def __init__(self, on_pause: Any = None) -> None:
        self.now = 0.0
        self.pauses = 0
        self._on_pause = on_pause

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses += 1
        self.now += seconds
        if self._on_pause is not None:
            self._on_pause(self.pauses)


def test_a_starting_site_waits_for_the_primary_then_connects() -> None:
    port = free_port()
    server = ThrowawayPostgres(port=port, settings={"fsync": "off"})

    def on_pause(pauses: int) -> None:
        if pauses == 3:  # the primary comes up while the site waits
            server.start()

    clock = FakeTime(on_pause)
    try:
        waited = wait_for_primary(
            f"postgresql://postgres@127.0.0.1:{free_port()},127.0.0.1:{port}/postgres"
            "?target_session_attrs=read-write",
            30,
            pause=0.5,
            monotonic=clock.monotonic,
            sleep=clock.sleep,
        )
    finally:
        server.stop()
    assert clock.pauses == 3 and waited == 1.5


def test_the_wait_for_the_primary_gives_up_after_its_timeout() -> None:
    clock = FakeTime()
    with pytest.raises(psycopg.OperationalError):
        wait_for_primary(
            f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
            10,
            pause=0.5,
            monotonic=clock.monotonic,
            sleep=clock.sleep,
        )
    assert clock.now == 10.0 and clock.pauses == 20


def test_the_wait_for_the_primary_does_not_wait_for_a_database_that_does_not_exist(
    pg_server: ThrowawayPostgres,
) -> None:
    clock = FakeTime()
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        wait_for_primary(
            pg_server.url("no_such_database"), 10, monotonic=clock.monotonic, sleep=clock.sleep
        )
    assert clock.pauses == 0


@pytest.mark.parametrize(
    ("target", "several"),
    [
        ("postgresql://u@h1:5432,h2:5432/tasknet?target_session_attrs=read-write", True),
        ("postgres://h1,h2/tasknet", True),
        ("host=h1,h2 port=5432,5433 dbname=tasknet", False),  # not a --db URL form
        ("postgresql://u@h1:5432/tasknet", False),
        ("site.sqlite", False),
        ("postgresql://u:pw@[::1/broken", False),
    ],
)
def test_a_failover_target_names_several_hosts(target: str, several: bool) -> None:
    assert several_hosts(target) is several
