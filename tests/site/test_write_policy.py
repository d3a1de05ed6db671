"""The lifecycle's one write path (issue 37): every storage transaction it
runs declares its policy beside its function (``@write_policy``), and
``Lifecycle._run`` does what the policy says: wake the outbox after the
commit, retry a settling write for ``record_retry_for`` and keep trying
in the background on the site's clock.  Real databases (``db_target``),
the real mock upstream; only time is simulated (``task.Clock``)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from tasknet.runtime import SystemEntropy
from tasknet.site import lifecycle as lifecycle_module
from tasknet.site.lifecycle import Lifecycle, Unrecorded
from tasknet.site.storage import create, delete, reconcile, usage
from tasknet.site.storage.background_writes import BackgroundWrites
from tasknet.site.storage.engine.database import Database, connect, run_write
from tasknet.site.storage.write_policy import WritePolicy, policy_of, write_policy
from tests.backends import WriteLock
from tests.eventually import eventually
from tests.runtime import site_runtime
from tests.site.helpers import lifecycle_env, one

GID = 3737

_STORAGE = {"create": create, "delete": delete, "reconcile": reconcile}
_SETTLE = {"wakes_outbox": True, "keeps_trying": True, "create_step": True}

#: What each step declares, written out (not read from the code under test).
EXPECTED = {
    "reserve": WritePolicy(create_step=True),
    "reserve_again": WritePolicy(wakes_outbox=True, create_step=True),
    "begin_submit": WritePolicy(wakes_outbox=True, settles="SUBMITTING", create_step=True),
    "persist_and_view": WritePolicy(wakes_outbox=True, create_step=True),
    "release": WritePolicy(settles="release", **_SETTLE),
    "release_refused": WritePolicy(settles="release (POST refused)", **_SETTLE),
    "release_unsent": WritePolicy(settles="release (nothing sent)", **_SETTLE),
    "mark_unknown": WritePolicy(settles="UNKNOWN", **_SETTLE),
    "request_delete": WritePolicy(wakes_outbox=True),
    "recover": WritePolicy(wakes_outbox=True),
    "resolve_unknown": WritePolicy(wakes_outbox=True),
}


def _steps_run_by_the_lifecycle() -> set[Callable[..., Any]]:
    """The storage functions the lifecycle hands to ``_run`` or
    ``_keep_trying``, directly or through a local name."""
    tree = ast.parse(inspect.getsource(lifecycle_module))
    steps: set[Callable[..., Any]] = set()

    def storage_functions(node: ast.AST) -> list[Callable[..., Any]]:
        return [
            getattr(_STORAGE[n.value.id], n.attr)
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in _STORAGE
        ]

    for function in ast.walk(tree):
        if not isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        assigned = {
            target.id: node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            if call.func.attr not in ("_run", "_keep_trying") or not call.args:
                continue
            step = call.args[0]
            if isinstance(step, ast.Name):
                if step.id not in assigned:
                    continue  # the write path itself, passing its ``step`` on
                step = assigned[step.id]
            found = storage_functions(step)
            assert found, ast.unparse(call)
            steps.update(found)
    return steps


def test_every_step_the_lifecycle_runs_declares_its_policy() -> None:
    steps = _steps_run_by_the_lifecycle()
    assert {step.__name__: policy_of(step) for step in steps} == EXPECTED


def test_the_lifecycle_writes_only_through_its_one_path() -> None:
    tree = ast.parse(inspect.getsource(lifecycle_module))
    writers: set[str] = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef):
            for call in ast.walk(function):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr.startswith("write")
                    and ast.unparse(call.func.value) == "self.db"
                ):
                    writers.add(function.name)
    assert writers == {"_run", "_settled"}


def test_a_policy_is_declared_once_and_consistent() -> None:
    with pytest.raises(ValueError):
        write_policy(keeps_trying=True)  # keeps trying what? nothing settles
    with pytest.raises(TypeError, match="declares no write policy"):
        policy_of(usage.meter)


@pytest_twisted.ensureDeferred
async def test_the_outbox_is_woken_after_the_commits_whose_step_says_so(db_target: str) -> None:
    async with lifecycle_env(db_target) as env:
        wakes: list[str | None] = []

        def woken() -> None:
            row = one(env.path, "SELECT state FROM task_operation WHERE gid = ?", GID)
            wakes.append(row["state"] if row is not None else None)

        env.lifecycle.on_commit = woken
        run = env.lifecycle._run
        op = await run(create.reserve, GID, env.user_id, "", "tok", "2026-W01", None, "op-1")
        assert op == "op-1" and wakes == []  # committed, nothing announced
        assert await run(create.release, GID, op)
        assert wakes == [None]  # woken once the release committed
        # A step that declares nothing is refused before anything is written.
        with pytest.raises(TypeError):
            await run(usage.meter, env.user_id, "2026-W01", 5)
        assert one(env.path, "SELECT COUNT(*) FROM weekly_usage WHERE used > 0")[0] == 0
        assert wakes == [None]


def _reserved(target: str, user_id: int) -> str:
    conn = connect(target)
    try:
        return run_write(conn, create.reserve, GID, user_id, "", "tok", "2026-W01")
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_a_settling_step_keeps_trying_on_the_sites_clock_until_it_lands(
    db_target: str,
) -> None:
    clock = Clock()
    async with lifecycle_env(db_target) as env:
        db = Database(env.path, **site_runtime(), busy_timeout_ms=10, clock=clock)
        lifecycle = Lifecycle(
            db,
            env.client,
            upstream_timeout=3.0,
            record_retry_for=1.0,
            retry_initial=0.5,
            retry_max=0.5,
            settle_interval=5.0,
            clock=clock,
            entropy=SystemEntropy(),
        )
        wakes: list[None] = []
        lifecycle.on_commit = lambda: wakes.append(None)
        op = _reserved(env.path, env.user_id)
        lock = WriteLock(env.path).acquire()
        try:
            # Not kept trying: SUBMITTING is given up after its window.
            begun = Deferred.fromCoroutine(
                lifecycle._run(create.begin_submit, GID, op, 5, "t", "2026-W01")
            )
            released = Deferred.fromCoroutine(lifecycle._run(create.release, GID, op))
            for _ in range(2):  # 0.5 s, then 0.5 s: the 1 s window spent
                await eventually(lambda: len(clock.getDelayedCalls()) == 2)
                clock.advance(0.5)
            for settled in (begun, released):
                with pytest.raises(Unrecorded):
                    await settled
            assert lifecycle.settling == 1  # the release, not the SUBMITTING
            for _ in range(2):  # still locked: still settling, every 5 s
                await eventually(lambda: len(clock.getDelayedCalls()) == 1)
                clock.advance(5.0)
                await eventually(lambda: len(clock.getDelayedCalls()) == 1)
                assert lifecycle.settling == 1
        finally:
            lock.release()
        clock.advance(5.0)
        await eventually(lambda: lifecycle.settling == 0)
        assert wakes == [None]  # once, when the release landed
        assert one(env.path, "SELECT COUNT(*) FROM task_operation")[0] == 0
        lifecycle.stop()
        db.close()
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_background_writes_stop_on_the_stop(db_target: str) -> None:
    clock = Clock()
    async with lifecycle_env(db_target) as env:
        op = _reserved(env.path, env.user_id)
        background = BackgroundWrites(env.db, interval=5.0, clock=clock)
        landed = background.keep_trying("release of gid 3737", create.release, GID, op)
        assert background.pending == 1
        background.stop()
        assert await landed is False and background.pending == 0
        assert clock.getDelayedCalls() == []
        assert one(env.path, "SELECT state FROM task_operation")["state"] == "RESERVED"
