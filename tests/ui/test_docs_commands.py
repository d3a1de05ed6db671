"""Every command of README.md, docs/operations.md and docs/simulation.md runs as written.

The ```sh blocks of each document are run in order, in one fresh directory
per document (commands whose first path is the repository's own, such as
``scripts/demo`` or ``. .venv/bin/activate``, run in the repository), with
``.venv/bin`` first on ``PATH``, as the README tells the reader to set up:

* a short command must exit 0 within :data:`COMMAND_TIMEOUT`;
* a long-running one (``twistd -n ...``, ``scripts/demo``, ``tasknet-demo``)
  is started, must come up (its readiness line in its output, see
  :data:`READY`), keeps running while the rest of its block runs (so a
  ``curl`` after a ``twistd -n`` talks to it), and is stopped with SIGTERM at
  the end of the block; it must then exit;
* ``umask``, ``export`` and ``cd`` lines hold for the rest of the document,
  as they would in the reader's shell.

Before docs/operations.md runs, its directory gets a fresh ``site.sqlite``
(what a site's first start creates): that page's ``tasknet-admin --db
site.sqlite`` examples assume a site has run there.

A block may be preceded by marker comments, each with its reason, which the
report names:

* ``<!-- docs-test: skip (REASON) -->``: the whole block is not run;
* ``<!-- docs-test: skip "PREFIX" (REASON) -->``: its commands starting
  with PREFIX are not run;
* ``<!-- docs-test: exit N "PREFIX" (REASON) -->``: those commands must exit N.

Slow (real processes, several seconds each): marked ``slow``.  The documents'
commands listen on their fixed ports (8080, 7100, 7200, ...): ``one_worker``,
so two of them never run at once under pytest-xdist.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tasknet.site.storage.engine.schema import prepare_database

pytestmark = [pytest.mark.slow, pytest.mark.one_worker]

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/operations.md", "docs/simulation.md")
COMMAND_TIMEOUT = 120.0
READY_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0

#: What a long-running command prints once it is up, by what it runs.
READY = {
    "tasknet-upstream": "tasknet-upstream listening on",
    "tasknet-site": "HTTP on ",
    "tasknet-node": "logged in to the site",
    "demo": "tasknet demo is ready",
}
_STATE_COMMANDS = ("umask", "export", "cd")
_MARKER = re.compile(
    r"<!--\s*docs-test:\s*(skip|exit\s+(\d+))\s*(?:\"([^\"]+)\")?\s*\(([^)]+)\)\s*-->"
)


@dataclass
class Rule:
    kind: str  # "skip" or "exit"
    prefix: str | None  # None: every command of the block
    reason: str
    status: int = 0


@dataclass
class Block:
    document: str
    line: int
    commands: list[str]
    rules: list[Rule] = field(default_factory=list)

    def rule_for(self, command: str) -> Rule | None:
        for rule in self.rules:
            if rule.prefix is None or command.startswith(rule.prefix):
                return rule
        return None


def blocks_of(document: str) -> list[Block]:
    """The ```sh blocks of ``document`` with their marker rules."""
    lines = (REPO / document).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```sh":
            index += 1
            continue
        rules = []
        above = index - 1
        while above >= 0 and lines[above].strip().startswith("<!-- docs-test:"):
            match = _MARKER.fullmatch(lines[above].strip())
            assert match, f"{document}:{above + 1}: malformed docs-test marker"
            kind, status, prefix, reason = match.groups()
            rules.append(Rule("exit" if status else "skip", prefix, reason, int(status or 0)))
            above -= 1
        start = index + 1
        index = start
        while lines[index].strip() != "```":
            index += 1
        found.append(Block(document, start, _commands(lines[start:index]), rules))
        index += 1
    return found


def _commands(lines: list[str]) -> list[str]:
    """Shell commands: continuation lines joined, blank and comment lines dropped."""
    commands: list[str] = []
    current = ""
    for line in lines:
        current += line
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.strip().startswith("#"):
            commands.append(current.strip())
        current = ""
    return commands


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def _program(command: str) -> list[str]:
    """The words of ``command`` without leading ``NAME=value`` assignments."""
    words = _words(command)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)
    return words


def long_running(command: str) -> str | None:
    """The :data:`READY` key of a long-running command, else None."""
    words = _program(command)
    if not words:
        return None
    if words[0] in ("scripts/demo", "tasknet-demo"):
        return "demo"
    if Path(words[0]).name == "twistd" and "-n" in words:
        for name in ("tasknet-upstream", "tasknet-site", "tasknet-node"):
            if name in words:
                return name
    return None


def in_repository(command: str) -> bool:
    """Whether the command names a path of the repository (``scripts/…``,
    ``.venv/…``): then it is run there, as the reader would."""
    words = _program(command)
    for word in words[:2]:
        if "/" in word and not word.startswith("/") and (REPO / word).exists():
            return True
    return False


def environment() -> dict[str, str]:
    env = dict(os.environ)
    venv_bin = str(REPO / ".venv" / "bin")
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(REPO / ".venv")
    env.pop("PYTHONPATH", None)
    return env


@dataclass
class Running:
    command: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class DocumentRun:
    """Runs the blocks of one document in ``workdir``, collecting failures."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env = environment()
        self.state: list[str] = []  # umask/export/cd lines so far
        self.failures: list[str] = []
        self.skipped: list[str] = []
        self.ran: list[str] = []
        self._logs = 0

    def _cwd(self, command: str) -> Path:
        return REPO if in_repository(command) else self.workdir

    def _script(self, command: str) -> str:
        return "\n".join([*self.state, command])

    def run_block(self, block: Block) -> None:
        started: list[Running] = []
        try:
            for command in block.commands:
                where = f"{block.document}:{block.line}: {command}"
                rule = block.rule_for(command)
                if rule is not None and rule.kind == "skip":
                    self.skipped.append(f"{where}  [{rule.reason}]")
                    continue
                expected = rule.status if rule is not None else 0
                kind = long_running(command)
                if kind is not None:
                    running = self._start(command, kind, where)
                    if running is not None:
                        started.append(running)
                else:
                    self._run(command, expected, where)
                if _program(command)[:1] and _program(command)[0] in _STATE_COMMANDS:
                    self.state.append(command)
        finally:
            for running in reversed(started):
                self._stop(running, f"{block.document}:{block.line}: {running.command}")

    def _run(self, command: str, expected: int, where: str) -> None:
        self.ran.append(where)
        try:
            done = subprocess.run(
                ["bash", "-c", self._script(command)],
                cwd=self._cwd(command),
                env=self.env,
                capture_output=True,
                timeout=COMMAND_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            self.failures.append(f"{where}\n  did not finish within {COMMAND_TIMEOUT:g} s")
            return
        if done.returncode != expected:
            self.failures.append(
                f"{where}\n  exit {done.returncode}, expected {expected}\n"
                f"  stdout: {done.stdout.decode(errors='replace')[-1500:]}\n"
                f"  stderr: {done.stderr.decode(errors='replace')[-1500:]}"
            )

    def _start(self, command: str, kind: str, where: str) -> Running | None:
        self.ran.append(where)
        self._logs += 1
        log = self.workdir.parent / f"{self.workdir.name}-long-{self._logs}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", self._script(command)],
                cwd=self._cwd(command),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, stopped as one
            )
        running = Running(command, process, log)
        deadline = time.monotonic() + READY_TIMEOUT
        while READY[kind] not in running.output():
            if process.poll() is not None:
                self.failures.append(
                    f"{where}\n  exited {process.returncode} before coming up:\n"
                    f"{running.output()[-3000:]}"
                )
                return None
            if time.monotonic() > deadline:
                self.failures.append(
                    f"{where}\n  not up within {READY_TIMEOUT:g} s (waiting for "
                    f"{READY[kind]!r}):\n{running.output()[-3000:]}"
                )
                return running
            time.sleep(0.1)
        return running

    def _stop(self, running: Running, where: str) -> None:
        process = running.process
        if process.poll() is not None:
            self.failures.append(
                f"{where}\n  had exited ({process.returncode}) before the end of its block:\n"
                f"{running.output()[-3000:]}"
            )
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.failures.append(f"{where}\n  did not stop within {STOP_TIMEOUT:g} s of SIGTERM")


def _fresh_site_database(directory: Path) -> None:
    path = directory / "site.sqlite"
    prepare_database(str(path))
    sqlite3.connect(path).close()


def test_blocks_and_markers_are_found() -> None:
    """The parser sees the documents' blocks (a guard for the test below)."""
    readme = blocks_of("README.md")
    assert any(long_running(c) == "tasknet-site" for b in readme for c in b.commands)
    assert any(b.rules for b in readme)
    assert _commands(["a \\", "  b", "# note", "", "c  # why"]) == ["a    b", "c  # why"]
    assert long_running("TASKNET_NODE_SECRET=x twistd -n --pidfile= tasknet-node") == (
        "tasknet-node"
    )
    assert long_running("twistd --help") is None
    assert in_repository("scripts/demo --port 0") and in_repository(". .venv/bin/activate")
    assert not in_repository("tasknet-admin --db site.sqlite user list")


@pytest.mark.parametrize("document", DOCUMENTS)
# operations.md is well over a hundred real commands and processes: on a busy
# 2-core machine that alone passed the suite's 180 s per test.
@pytest.mark.timeout(600)
def test_every_command_runs_as_written(document: str, tmp_path: Path) -> None:
    workdir = tmp_path / Path(document).stem
    workdir.mkdir()
    if document == "docs/operations.md":
        _fresh_site_database(workdir)
    run = DocumentRun(workdir)
    for block in blocks_of(document):
        run.run_block(block)
    print(f"\n{document}: ran {len(run.ran)} command(s), skipped {len(run.skipped)}:")
    for skipped in run.skipped:
        print(f"  skipped {skipped}")
    assert not run.failures, "\n\n".join(run.failures)
