"""Group commit changes nothing but the number of commits: a batch of reports
queued together, run by the database layer's group commit
(``db.run_coalesced``: the writer's own code, one call of
``reports.apply_reports`` with its set-at-a-time runs, the savepoint
fallback) leaves exactly the state, outcomes and notifications of the same
reports applied one per transaction.
Real databases (SQLite files, PostgreSQL databases: copies of one seeded
template); generated batches mix every rule (duplicates, repeated gids,
stale revisions, old generations, legacy rows and messages, deletes).  A copy
of a PostgreSQL database costs a ``CREATE DATABASE``, so the property runs
fewer examples there: the statements are the same, the generated variety is
SQLite's."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from twisted.python.failure import Failure

from tasknet.protocol.messages import (
    DeletedEntry,
    DeleteResult,
    StatusReport,
    TaskEntry,
    TaskReport,
)
from tasknet.site.storage import reports
from tasknet.site.storage.engine import database as dbmod
from tasknet.site.storage.engine.schema import prepare_database
from tests.backends import BACKENDS, INTEGRITY_ERRORS, SeededCopies, add_failing_trigger
from tests.site_protocol.harness import add_task, add_user

NODES = ("n1", "n2")
GIDS = range(1, 12)  # 10 is never seeded: an unknown gid


def _seed(path: str) -> None:
    prepare_database(path)
    conn = dbmod.connect(path)
    try:
        uid, _ = add_user(conn, "alice")
        add_task(conn, 1, uid, node_id="n1")
        add_task(conn, 2, uid, node_id="n2", status=1, progress=0.5)
        add_task(conn, 3, uid, node_id=None)  # not sent to any node: nobody may report it
        add_task(conn, 4, uid, "DELETED")
        add_task(conn, 5, uid, "DELETE_PENDING", node_id="n1", status=4, progress=1.0)
        add_task(conn, 6, uid, None, node_id="n1", status=1)  # legacy row
        add_task(conn, 7, uid, None)  # legacy row, never dispatched
        add_task(conn, 8, uid, "UNKNOWN")
        add_task(conn, 9, uid, "DELETE_PENDING", node_id="n2", status=4, progress=1.0)
        # COMPLETED: an entry of its node with a lower status is dropped (regressed).
        add_task(conn, 11, uid, node_id="n1", status=4, progress=1.0)
        conn.execute("UPDATE gallery SET size = 1000")
    finally:
        conn.close()


#: Examples of a property per backend (see the module's docstring).
_EXAMPLES = {"sqlite": 1.0, "postgresql": 0.1}


def _copies_of(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    seed: Callable[[str], None],
) -> Iterator[SeededCopies]:
    server = request.getfixturevalue("pg_server") if request.param == "postgresql" else None
    copies = SeededCopies(seed, name=name, directory=tmp_path_factory.mktemp(name), server=server)
    try:
        yield copies
    finally:
        copies.close()


@pytest.fixture(scope="module", params=BACKENDS)
def template(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SeededCopies]:
    yield from _copies_of(request, tmp_path_factory, "batches", _seed)


def _examples(copies: SeededCopies, count: int) -> int:
    return max(1, round(count * _EXAMPLES[copies.backend]))


# Mostly the task's own operationId (so entries apply and runs really write),
# sometimes none, another gid's, or one nobody has.
_operation_id_kinds = st.sampled_from(["own", "own", "own", None, "op-1", "op-x"])
_entries = st.lists(
    st.tuples(
        st.sampled_from(GIDS),
        st.integers(1, 4),
        st.sampled_from([0.0, 0.5, 1.0, 0.30000000000000004]),
    ),
    max_size=4,
)
# A v2 completion may carry its archive's size and SHA-256 (two digests: a
# later one for the same generation replaces the first).
_digests = st.sampled_from([None, (1000, "a" * 64), (2000, "b" * 64)])


def _v2_entry(entry: tuple[int, int, float], digest: tuple[int, str] | None) -> TaskEntry:
    gid, status, progress = entry
    if digest is None or status != 4:
        return TaskEntry(gid, status, progress)
    return TaskEntry(gid, status, progress, False, "", *digest)


_deleted = st.lists(
    st.tuples(
        st.sampled_from([5, 9, 4, 1]),
        st.sampled_from(["del-5", "del-9", "del-x"]),
        st.sampled_from(["DELETED", "NOT_FOUND", "FAILED"]),
    ),
    max_size=1,
)


@st.composite
def _task_report(draw: st.DrawFn) -> TaskReport:
    entries = draw(_entries)
    return TaskReport(
        # A small pool of ids: some repeat within a batch or across batches.
        report_id=draw(st.sampled_from(["a", "b", "c", "d", "e", "f", "g"])),
        revision=draw(st.sampled_from([100, 200, 300])),
        gallery_tasks=tuple(_v2_entry(e, draw(_digests)) for e in entries),
        operation_ids={
            g: f"op-{g}" if kind == "own" else kind
            for g, _, _ in entries
            if (kind := draw(_operation_id_kinds)) is not None
        },
        deleted=tuple(DeletedEntry(g, op, r, "why") for g, op, r in draw(_deleted)),
    )


_message = st.one_of(
    _task_report(),
    _task_report(),
    _task_report(),
    st.builds(StatusReport, st.builds(lambda e: tuple(TaskEntry(*t) for t in e), _entries)),
    st.builds(DeleteResult, st.sampled_from([5, 9]), st.booleans(), st.just("")),
)
_batch = st.lists(st.tuples(st.sampled_from(NODES), _message), min_size=1, max_size=6)

_FRESH_ID = re.compile(r"\b[0-9a-f]{32}\b")
# Read off the clock as the report is applied: differ between runs.
_TIMES = ("createdAt", "updatedAt", "completedAt", "speed", "eta")


def _state(path: str) -> dict[str, Any]:
    """Everything a report can change, without timestamps; generated
    operationIds (uuid4 hex, different in each run) read as ``<fresh>``."""
    conn = dbmod.connect(path)
    try:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return [
                tuple(_FRESH_ID.sub("<fresh>", v) if isinstance(v, str) else v for v in r)
                for r in conn.execute(sql)
            ]

        outbox: dict[int, list[dict[str, Any]]] = {}
        for gid, user_id, payload in rows(
            "SELECT gid, user_id, payload FROM notification_outbox ORDER BY id"
        ):
            task = json.loads(payload)["task"]
            outbox.setdefault(gid, []).append(
                {k: v for k, v in task.items() if k not in _TIMES} | {"user": user_id}
            )
        return {
            "gallery": rows("SELECT gid, status, progress, node_id FROM gallery ORDER BY gid"),
            "archives": rows("SELECT gid, archive_size, archive_sha256 FROM gallery ORDER BY gid"),
            "operations": rows(
                "SELECT gid, operation_id, state, last_revision, legacy, dispatched,"
                " delete_operation_id, delete_result, delete_reason"
                " FROM task_operation ORDER BY gid"
            ),
            "receipts": rows("SELECT report_id, node_id, revision FROM report_receipt ORDER BY 1"),
            "drops": rows("SELECT node_id, reason, count FROM node_dropped_entry ORDER BY 1, 2"),
            "bytes": rows("SELECT node_id, bytes FROM node_bytes ORDER BY 1"),
            # Summed over the minutes: a batch and its reports may fall in two.
            "throughput": rows(
                "SELECT node_id, user_id, SUM(bytes), SUM(completed) FROM throughput_minute"
                " GROUP BY node_id, user_id ORDER BY 1, 2"
            ),
            "outbox": outbox,
        }
    finally:
        conn.close()


def _one_by_one(path: str, batch: list[tuple[str, reports.NodeReport]]) -> list[Any]:
    conn = dbmod.connect(path)
    try:
        return [dbmod.run_write(conn, reports.apply_report, node, m) for node, m in batch]
    finally:
        conn.close()


def _queued(batch: list[tuple[str, reports.NodeReport]]) -> list[reports.QueuedReport]:
    return [reports.QueuedReport(node, m) for node, m in batch]


def _grouped(path: str, batch: list[tuple[str, reports.NodeReport]]) -> list[Any]:
    conn = dbmod.connect(path)
    try:
        return dbmod.run_coalesced(conn, reports.apply_reports, _queued(batch))
    finally:
        conn.close()


def test_a_batch_equals_its_reports_one_per_transaction(template: SeededCopies) -> None:
    @settings(
        max_examples=_examples(template, 100),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(batch=_batch)
    def check(batch: list[tuple[str, reports.NodeReport]]) -> None:
        alone, together = template.copy(), template.copy()
        expected = _one_by_one(alone, batch)
        got = _grouped(together, batch)
        regressed = any(reports.REGRESSED in o.drop_counts for o in expected)
        event(f"regressed entries: {regressed}")
        assert got == expected
        assert _state(together) == _state(alone)

    check()


def test_a_batch_of_independent_reports_runs_together_and_matches(
    template: SeededCopies,
) -> None:
    """The usual batch (one report per node, disjoint gids) takes the
    set-at-a-time path; duplicates inside the batch and before it are
    answered DUPLICATE exactly as one by one."""
    batch: list[tuple[str, reports.NodeReport]] = [
        ("n1", TaskReport("r1", 100, (TaskEntry(1, 1, 0.5),), {1: "op-1"}, ())),
        (
            "n2",
            TaskReport(
                "r2",
                100,
                (TaskEntry(2, 2, 0.5), TaskEntry(3, 1, 0.1)),
                {2: "op-2", 3: "op-3"},
                (DeletedEntry(9, "del-9", "DELETED", ""),),
            ),
        ),
        ("n1", TaskReport("r3", 100, (TaskEntry(6, 3, 0.7),), {6: "op-6"}, ())),
        ("n1", TaskReport("r1", 100, (TaskEntry(1, 4, 1.0),), {1: "op-1"}, ())),  # repeat
        ("n1", TaskReport("r4", 200, (TaskEntry(1, 4, 1.0),), {1: "op-1"}, ())),  # same gid
        ("n2", TaskReport("r5", 150, (TaskEntry(1, 2, 0.7),), {1: "op-1"}, ())),  # not n2's
    ]
    alone, together = template.copy(), template.copy()
    expected = _one_by_one(alone, batch)
    got = _grouped(together, batch)
    assert got == expected
    assert [o.result for o in got] == ["APPLIED"] * 3 + ["DUPLICATE"] + ["APPLIED"] * 2
    assert got[5].dropped == {1: reports.NOT_OWNER}
    assert got[1].dropped == {3: reports.NOT_OWNER}
    assert got[0].changed == [1] and got[1].changed == [2] and got[1].deletes_completed == [9]
    assert got[2].backfilled == [6] and got[4].changed == [1]
    state = _state(together)
    assert state == _state(alone)
    assert [n["status"] for n in state["outbox"][1]] == ["DOWNLOADING", "COMPLETED"]
    assert state["gallery"][2] == (3, None, 0.0, None)  # a v2 row is never claimed


def test_a_run_that_fails_is_retried_report_by_report(template: SeededCopies) -> None:
    """A failure inside the batch call rolls it back to its savepoint and
    the database layer applies its reports one by one, a savepoint each:
    only the failing report is lost."""
    path = template.copy()
    add_failing_trigger(
        path,
        "refuse_0123",
        "gallery",
        "injected failure",
        event="UPDATE",
        when="NEW.progress = 0.123",
    )
    conn = dbmod.connect(path)
    try:
        batch: list[tuple[str, reports.NodeReport]] = [
            ("n1", TaskReport("a", 100, (TaskEntry(1, 1, 0.2),), {1: "op-1"}, ())),
            ("n2", TaskReport("bad", 100, (TaskEntry(2, 1, 0.123),), {2: "op-2"}, ())),
            ("n1", TaskReport("c", 101, (TaskEntry(6, 1, 0.2),), {}, ())),
        ]
        results = dbmod.run_coalesced(conn, reports.apply_reports, _queued(batch))
    finally:
        conn.close()
    assert [type(r).__name__ for r in results] == [
        "ReportOutcome",
        "Failure",
        "ReportOutcome",
    ]
    assert "injected failure" in results[1].getErrorMessage()
    state = _state(path)
    assert [r[0] for r in state["receipts"]] == ["a", "c"]
    assert set(state["outbox"]) == {1, 6}
    assert state["gallery"][1] == (2, 1, 0.5, "n2")  # untouched


_POISON = 0.123  # the progress the injected trigger refuses


def _seed_poisoned(path: str) -> None:
    """The seeded database with a trigger that fails any report writing
    progress 0.123 (a real database error inside the report's statements)."""
    _seed(path)
    add_failing_trigger(
        path,
        "refuse_poison",
        "gallery",
        "injected failure",
        event="UPDATE",
        when=f"NEW.progress = {_POISON}",
    )


@pytest.fixture(scope="module", params=BACKENDS)
def poisoned_template(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SeededCopies]:
    yield from _copies_of(request, tmp_path_factory, "poisoned", _seed_poisoned)


def _poisoned(report: reports.NodeReport, gid: int) -> reports.NodeReport:
    if isinstance(report, TaskReport):
        return TaskReport(
            report.report_id,
            report.revision,
            (*report.gallery_tasks, TaskEntry(gid, 1, _POISON)),
            {**report.operation_ids, gid: f"op-{gid}"},
            report.deleted,
        )
    if isinstance(report, StatusReport):
        return StatusReport((*report.gallery_tasks, TaskEntry(gid, 1, _POISON)))
    return report


def _one_by_one_or_failed(path: str, batch: list[tuple[str, reports.NodeReport]]) -> list[Any]:
    conn = dbmod.connect(path)
    results: list[Any] = []
    try:
        for node, message in batch:
            try:
                results.append(dbmod.run_write(conn, reports.apply_report, node, message))
            except INTEGRITY_ERRORS as e:
                assert "injected failure" in str(e)
                results.append("failed")
    finally:
        conn.close()
    return results


def test_a_batch_with_failing_reports_equals_them_one_per_transaction(
    poisoned_template: SeededCopies,
) -> None:
    """Some reports fail (the trigger): the batch call fails, the database
    layer applies its reports one by one, and exactly the reports that fail
    alone fail; the rest commit as if each had its own transaction."""

    @settings(
        max_examples=_examples(poisoned_template, 60),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(batch=_batch, data=st.data())
    def check(batch: list[tuple[str, reports.NodeReport]], data: st.DataObject) -> None:
        poison = data.draw(st.sets(st.integers(0, len(batch) - 1)))
        batch = [
            (node, _poisoned(m, data.draw(st.sampled_from([1, 2, 6]))))
            if i in poison
            else (node, m)
            for i, (node, m) in enumerate(batch)
        ]
        alone, together = poisoned_template.copy(), poisoned_template.copy()
        expected = _one_by_one_or_failed(alone, batch)
        failed = expected.count("failed")
        event(f"failing reports: {min(failed, 2)}{'+' * (failed > 2)}")
        got = [
            "failed" if isinstance(r, Failure) and "injected failure" in r.getErrorMessage() else r
            for r in _grouped(together, batch)
        ]
        assert got == expected
        assert _state(together) == _state(alone)

    check()
