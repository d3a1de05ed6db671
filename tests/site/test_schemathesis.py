"""Schemathesis against a real site, with the site's own OpenAPI document
(``tasknet/site/web/openapi.py``; issue 24, item 2).

The site runs as real processes (``tasknet.cli.demo.DemoStack``: the mock
upstream, ``twistd -n tasknet-site --demo`` and one v2 node), once on a
SQLite file and once on a PostgreSQL database of the session's throwaway
server, so schemathesis' blocking HTTP calls never share a reactor with the
site.  Every operation is tested (``@schema.parametrize()``: the examples,
coverage and fuzzing phases, positive and negative data) and then a state
machine follows the document's links (create -> get, delete, favorites,
resolve; delete -> force-delete; list -> get), with the mock upstream set
to answer some gids with each outcome (``UPSTREAM_FAULTS``) so that
creates meet 404, 422 and UNKNOWN too and resolve has real work.  The
checks: no 5xx, status codes, content types, response schemas and headers
as documented, and the others of schemathesis' default set.

Every built-in check runs (``--checks all``; issue 38): ``use_after_free``
as :func:`use_after_completed_delete` (a ``202`` delete is documented as
pending) and, for ``GET /api/tasks``, ``positive_data_acceptance`` as
:func:`positive_data_acceptance_of_listing` (an ``after`` of another order's
shape is a documented ``400``: a pattern cannot tie it to ``order``; so are
``page`` with ``after`` and ``page × limit`` over ``MAX_PAGE_REACH``).

The seed changes from run to run (the workers of one pytest-xdist run share
it) and is printed, and added to any failure, so that a failure can be
replayed: ``TASKNET_SCHEMATHESIS_SEED=N`` pins it.  A small example count
keeps CI at a couple of minutes; ``TASKNET_SCHEMATHESIS_EXAMPLES=500`` makes
a longer run (docs/operations.md, "The API contract").

Every call is made as the demo admin (``Authorization: Bearer demo``) from
the site's own origin (``Origin``, as a browser would send): schemathesis'
``ignored_auth`` check sends the same requests without the credentials too.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis.stateful import get_state_machine_test
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import positive_data_acceptance, use_after_free

from tasknet.cli import jsonhttp
from tasknet.cli.demo import DemoStack, NodeSpec
from tasknet.drill.pgserver import ThrowawayPostgres
from tasknet.site.storage.views import Order, parse_cursor
from tasknet.site.web import openapi
from tasknet.site.web.task_queries import MAX_PAGE_REACH

pytestmark = pytest.mark.slow

#: Fuzzing examples per operation (and state machine runs): small in CI.
EXAMPLES = int(os.environ.get("TASKNET_SCHEMATHESIS_EXAMPLES") or 0) or 50


def _seed() -> int:
    """``TASKNET_SCHEMATHESIS_SEED``, else one per run: the run's id under
    pytest-xdist (every worker of the run agrees), else a random one."""
    pinned = os.environ.get("TASKNET_SCHEMATHESIS_SEED")
    if pinned:
        return int(pinned)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run:
        return int(run[:8], 16)
    return secrets.randbelow(2**32)


SEED = _seed()
REPLAY = f"schemathesis seed {SEED}: replay with TASKNET_SCHEMATHESIS_SEED={SEED}"
#: Steps of one state machine run (the runs go on until EXAMPLES x STEPS).
STEPS = 20

NODE = NodeSpec("node-1", 2, "schemathesis-node-secret")


def _fault(method: str, gids: str, fault: str, **params: Any) -> dict[str, Any]:
    path = f"/api/galleries/{gids}" + ("/archive" if method == "POST" else "")
    return {"method": method, "path": path, "fault": fault, "params": params, "times": None}


#: The mock upstream's answers by the gid's last digit, so that creates meet
#: every outcome (and the same ones for the same seed): 1 it has no such
#: gallery (404), 9 it refuses the POST (422), 7 and 3 the POST's outcome is
#: unknown (202 UNKNOWN: the reconcile operations get real work), charged
#: (the audit shows the POST) and not.
UPSTREAM_FAULTS = [
    _fault("GET", "*1", "missing"),
    _fault("POST", "*9", "reject", status=403),
    _fault("POST", "*7", "error", status=500, charged=True),
    _fault("POST", "*3", "error", status=503, charged=False),
]
TOKEN = "demo"


def _schema() -> Any:
    loaded = schemathesis.openapi.from_dict(openapi.document())
    loaded.config.seed = SEED
    loaded.config.generation.update(
        modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
        max_examples=EXAMPLES,
        database="none",
    )
    checks = loaded.config.checks
    # --checks all: every built-in check (max_response_time takes a limit: none).
    for field in dataclasses.fields(checks):
        check = getattr(checks, field.name)
        if field.name != "max_response_time" and hasattr(check, "enabled"):
            check.enabled = True
    # 101: the WebSocket handshake of /api/events succeeded.
    for check in (checks.not_a_server_error, checks.positive_data_acceptance):
        check.expected_statuses = ["101", *check.expected_statuses]
    # 422: the upstream refused a valid create (UPSTREAM_FAULTS); bad input is 400.
    checks.positive_data_acceptance.expected_statuses.append("422")
    # 410: a valid archive request for a task whose archive is gone (ARCHIVE_GONE:
    # the state machine retires a node, whose completed tasks' archives go with it).
    checks.positive_data_acceptance.expected_statuses.append("410")
    # 426: /api/events refuses a handshake of another version (RFC 6455 4.2.2)
    # or a request that is no handshake at all (no Upgrade header).
    for refusing in (checks.negative_data_rejection, checks.missing_required_header):
        refusing.expected_statuses = [*refusing.expected_statuses, "426"]
    return loaded


schema = _schema()


@dataclass
class LiveSite:
    backend: str
    stack: DemoStack

    @property
    def base_url(self) -> str:
        return self.stack.url.rstrip("/")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}", "Origin": self.base_url}


@contextmanager
def _live_site(data_dir: Path, backend: str, database_url: str | None = None) -> Iterator[LiveSite]:
    stack = DemoStack(data_dir, bandwidth=None, nodes=(NODE,), database_url=database_url)
    stack.start()
    try:
        faults = {"rules": UPSTREAM_FAULTS}
        reply = jsonhttp.request("PUT", f"{stack.upstream_url}/_drill/faults", faults)
        assert reply.status == 200, reply.body
        yield LiveSite(backend, stack)
    finally:
        stack.stop()


# One fixture (and one test function) per backend: pytest-twisted wraps a
# hypothesis test's inner function in place, so two parameters of one
# function would share, and double-wrap, it.


@pytest.fixture(scope="module")
def sqlite_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSite]:
    with _live_site(tmp_path_factory.mktemp("schemathesis-sqlite"), "sqlite") as site:
        yield site


@pytest.fixture(scope="module")
def postgresql_site(
    pg_server: ThrowawayPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveSite]:
    name = f"st_{uuid.uuid4().hex[:12]}"
    # Empty: the site creates the schema and, with --demo, the demo user.
    url = pg_server.create_database(name)
    try:
        data_dir = tmp_path_factory.mktemp("schemathesis-postgresql")
        with _live_site(data_dir, "postgresql", url) as site:
            yield site
    finally:
        pg_server.drop_database(name)


def use_after_completed_delete(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' ``use_after_free``, for deletes that completed: a
    ``202`` delete is pending (the node still has to delete the archive;
    the task shows ``DELETE_PENDING`` until then), so the task is still
    there, as documented."""
    for related in ctx.internals.find_related(case_id=case.id):
        if related.operation.method.lower() == "delete":
            answer = ctx.internals.find_response(case_id=related.id)
            if answer is not None and answer.status_code == 202:
                return None
    result: bool | None = use_after_free(ctx, response, case)
    return result


def positive_data_acceptance_of_listing(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' ``positive_data_acceptance``, except for the one ``400``
    the document gives schema-valid data: ``GET /api/tasks`` with an
    ``after`` that matches the pattern (the union of every order's shape)
    but not the shape of its ``order`` (a pattern cannot tie two
    parameters).  Only when the site's own parser refuses that pair.  So are
    ``page`` with ``after`` and ``page × limit`` over
    :data:`~tasknet.site.web.task_queries.MAX_PAGE_REACH` (documented)."""
    if case.operation.label == "GET /api/tasks" and response.status_code == 400:
        query = case.query or {}
        page, limit = query.get("page"), query.get("limit", 50)
        if page is not None and "after" in query:
            return None
        if str(page).isdigit() and str(limit).isdigit():
            if int(str(page)) * int(str(limit)) > MAX_PAGE_REACH:
                return None
        after, order = query.get("after"), query.get("order", Order.NEWEST.value)
        if isinstance(after, str) and order in openapi.ORDERS:
            try:
                parse_cursor(Order(order), after)
            except ValueError:
                return None
    result: bool | None = positive_data_acceptance(ctx, response, case)
    return result


#: Built-in checks run as a variant of their own (above), and the variants.
EXCLUDED = [use_after_free, positive_data_acceptance]
VARIANTS = [use_after_completed_delete, positive_data_acceptance_of_listing]


#: Requests made, by backend and operation (printed at the end of the module).
CALLS: Counter[tuple[str, str]] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not CALLS:
        return
    for backend in sorted({backend for backend, _ in CALLS}):
        counts = {label: n for (b, label), n in CALLS.items() if b == backend}
        operations = [label for label in counts if label != "links"]
        with capture.global_and_fixture_disabled():
            reporter.write_line(
                f"\nschemathesis ({backend}, seed {SEED}, {EXAMPLES} examples, all checks): "
                f"{sum(counts[label] for label in operations)} cases over {len(operations)} "
                f"operations, {counts.get('links', 0)} state machine steps"
            )


@pytest.fixture(scope="module", autouse=True)
def _say_the_seed(request: pytest.FixtureRequest) -> None:
    """The seed on the console, under pytest-xdist too (a worker's standard
    error is the console's; its terminal reporter is not)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            sys.stderr.write(f"\n{REPLAY}\n")
            sys.stderr.flush()


def _call(case: Any, site: LiveSite) -> None:
    CALLS[site.backend, case.operation.label] += 1
    try:
        case.call_and_validate(
            base_url=site.base_url,
            headers=site.headers,
            excluded_checks=EXCLUDED,
            additional_checks=VARIANTS,
        )
    except BaseException as e:
        e.add_note(REPLAY)
        raise


@schema.parametrize()
def test_every_operation_sqlite(case: Any, sqlite_site: LiveSite) -> None:
    _call(case, sqlite_site)


def test_links_sqlite(sqlite_site: LiveSite) -> None:
    _run_links(sqlite_site)


@schema.parametrize()
def test_every_operation_postgresql(case: Any, postgresql_site: LiveSite) -> None:
    _call(case, postgresql_site)


def test_links_postgresql(postgresql_site: LiveSite) -> None:
    _run_links(postgresql_site)


def _run_links(live_site: LiveSite) -> None:
    """The state machine of the document's links (create -> get -> delete ...).

    The site keeps its state from one run to the next, so a run replayed
    (to shrink a failure, or by Hypothesis' own bookkeeping) need not meet
    the same answers: Hypothesis then says its data generation is "flaky".
    As schemathesis' own runner does, that ends the test without hiding
    anything: every failure a check found is kept here as it happens and
    fails the test, flaky or not."""
    base = schema.as_state_machine()
    found: list[BaseException] = []

    class Workflow(base):  # type: ignore[valid-type, misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": live_site.base_url, "headers": live_site.headers}

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            CALLS[live_site.backend, "links"] += 1
            try:
                case.validate_response(
                    response,
                    additional_checks=[*(additional_checks or []), *VARIANTS],
                    excluded_checks=EXCLUDED,
                    transport_kwargs=kwargs or None,
                    recorder=self.recorder,
                )
            except FailureGroup as failures:
                found.append(failures)
                raise

    settings = hypothesis.settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    # A flaky run ends early: run again, from the next seed, until the
    # steps are done (or the attempts are).
    wanted = EXAMPLES * STEPS
    for attempt in range(10 + EXAMPLES // 10):
        if CALLS[live_site.backend, "links"] >= wanted or found:
            break
        test = get_state_machine_test(Workflow, settings=settings)
        try:
            hypothesis.seed(SEED * 1000 + attempt)(test)()
        except hypothesis.errors.Flaky:
            pass
    if found:
        found[0].add_note(REPLAY)
        raise found[0]
