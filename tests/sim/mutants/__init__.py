"""The planted bugs as a regression suite (issue 39, item 3).

Each ``*.diff`` here is one small edit that breaks an invariant (never
committed to the code); ``mutants.json`` says, for each, what it breaks,
where, the block of seeds the simulator runs on it and, once measured, the
first seed of that block that fails and the check that catches it.

:func:`run` copies ``tasknet/`` to a scratch directory, applies the patch
there and runs ``tasknet-sim run --first-failure`` on the copy in a
subprocess (``PYTHONPATH`` pointed at it), so the tree under test is never
touched.  ``python -m tests.sim.mutants run [NAME...]`` prints the table;
``tests/sim/test_mutants.py`` replays only each recorded seed.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
MANIFEST = HERE / "mutants.json"

#: The simulator's CI blocks (tests/sim/test_world.py).
BLOCKS = {"sqlite": "0..239", "postgres": "0..23"}


@dataclass
class Mutant:
    """One entry of ``mutants.json``."""

    name: str
    group: str
    invariant: str
    where: str
    edit: str
    db: str = "sqlite"
    seeds: str = ""
    faults: list[str] | None = None
    first_seed: int | None = None
    check: str | None = None
    detail: str | None = None
    expected_uncaught: str | None = None

    @property
    def patch(self) -> Path:
        return HERE / f"{self.name}.diff"

    @property
    def block(self) -> str:
        return self.seeds or BLOCKS[self.db]


@dataclass
class Result:
    """What a run of the simulator on a mutant found."""

    name: str
    caught: bool
    seed: int | None = None
    check: str | None = None
    detail: str | None = None
    seconds: float = 0.0
    seeds_run: int = 0
    checks: list[str] = field(default_factory=list)
    error: str | None = None


def load() -> list[Mutant]:
    return [Mutant(**entry) for entry in json.loads(MANIFEST.read_text())["mutants"]]


def save(mutants: list[Mutant]) -> None:
    entries = [{k: v for k, v in vars(m).items()} for m in mutants]
    MANIFEST.write_text(json.dumps({"mutants": entries}, indent=1, ensure_ascii=False) + "\n")


_template: Path | None = None


def _compiled_template() -> Path:
    """A copy of ``tasknet/`` with its bytecode compiled, made once a process:
    each scratch copy is taken from it, caches and all (a cache is stamped
    with its source's mtime and size, which ``copy2`` keeps, not its path),
    so a run compiles only the modules its patch changed."""
    global _template
    if _template is None:
        where = Path(tempfile.mkdtemp(prefix="mutant-template-"))
        atexit.register(shutil.rmtree, where, True)
        shutil.copytree(
            ROOT / "tasknet",
            where / "tasknet",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(where / "tasknet")],
            env=_child_env(),
            check=True,
        )
        _template = where
    return _template


def _child_env(pythonpath: Path | None = None) -> dict[str, str]:
    """The environment of a process run on a scratch copy: the caches next
    to the sources (a PYTHONPYCACHEPREFIX would key them by the scratch
    path, compiling everything again and leaving them behind)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the template's caches are read, none written
    return env


def _copy_tree(scratch: Path) -> None:
    shutil.copytree(_compiled_template() / "tasknet", scratch / "tasknet", symlinks=True)


def _git_apply(patch: Path, where: Path, *, check: bool) -> subprocess.CompletedProcess[str]:
    args = ["git", "apply", "--whitespace=nowarn"]
    if check:
        args.append("--check")
    return subprocess.run(
        [*args, str(patch)],
        cwd=where,
        capture_output=True,
        text=True,
        check=False,
        # Outside any repository: git apply works on the files as a plain patch.
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(where.parent)},
    )


def applies(mutant: Mutant, tree: Path = ROOT) -> str | None:
    """``None`` when ``mutant``'s patch applies cleanly to ``tree``, else git's complaint."""
    done = _git_apply(mutant.patch, tree, check=True)
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()


@contextmanager
def patched(mutant: Mutant) -> Iterator[Path]:
    """A scratch copy of ``tasknet/`` with ``mutant`` applied (removed after)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"mutant-{mutant.name}-"))
    try:
        _copy_tree(scratch)
        done = _git_apply(mutant.patch, scratch, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{mutant.name}: the patch does not apply: {done.stderr.strip()}")
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def simulate(
    scratch: Path, mutant: Mutant, seeds: str, timeout: float = 3600
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """``tasknet-sim run`` of ``seeds`` on the patched copy, stopping at the
    first failing seed; its ``--json`` report (``None`` if it wrote none)."""
    report = scratch / "run.json"
    args = ["run", "--seeds", seeds, "--first-failure", "--json", str(report)]
    if mutant.db != "sqlite":
        args += ["--db", mutant.db]
    if mutant.faults:
        args += ["--faults", ",".join(mutant.faults)]
    done = subprocess.run(
        [sys.executable, "-m", "tasknet.cli.sim", *args],
        cwd=scratch,
        env=_child_env(scratch),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done, (json.loads(report.read_text()) if report.exists() else None)


def run(mutant: Mutant, seeds: str | None = None) -> Result:
    """Run ``mutant``'s block (or ``seeds``) and report its first failing seed."""
    started = time.perf_counter()
    try:
        with patched(mutant) as scratch:
            done, report = simulate(scratch, mutant, seeds or mutant.block)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return Result(mutant.name, False, error=str(e), seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if report is None:
        tail = (done.stderr or done.stdout)[-2000:]
        return Result(mutant.name, False, error=f"no report: {tail}", seconds=seconds)
    outcomes = report["seeds"]
    failing = [o for o in outcomes if o["failed"]]
    if not failing:
        return Result(mutant.name, False, seconds=seconds, seeds_run=len(outcomes))
    first = min(failing, key=lambda o: o["seed"])
    check, detail = first["failures"][0]
    return Result(
        mutant.name,
        True,
        first["seed"],
        check,
        detail[:300],
        seconds,
        len(outcomes),
        [c for c, _ in first["failures"]],
    )
