"""Real processes for drills: start, wait until ready, kill, restart, collect logs.

Every role runs as ``<venv>/bin/twistd -n --pidfile= --logfile=<dir>/twistd.log
<plugin> ...`` in its own directory.  Waiting is always polling with a bound
and a clear message; a process that dies while we wait is reported at once
with the tail of its log instead of waiting for the timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

POLL = 0.1


class DrillError(Exception):
    """The drill itself could not proceed (a process would not start, a wait timed out)."""


class ProcessDied(DrillError):
    """A process exited while we were waiting for it."""

    def __init__(self, proc: Proc, what: str) -> None:
        self.proc = proc
        super().__init__(
            f"{proc.name} exited (code {proc.returncode}) while waiting for {what}; "
            f"last log lines:\n{proc.log_tail()}"
        )


def twistd_command() -> list[str]:
    """The twistd of the running interpreter's environment."""
    sibling = Path(sys.executable).with_name("twistd")
    if sibling.exists():
        return [str(sibling)]
    shutil_twistd = shutil.which("twistd")
    if shutil_twistd:
        return [shutil_twistd]
    return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


def wait_for(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    procs: Sequence[Proc] = (),
    interval: float = POLL,
) -> None:
    """Poll ``check`` until true; raise :class:`DrillError` naming ``what`` on timeout.

    If any of ``procs`` exits meanwhile, raise :class:`ProcessDied` at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        for proc in procs:
            if not proc.alive:
                raise ProcessDied(proc, what)
        if time.monotonic() >= deadline:
            raise DrillError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


class Proc:
    """One twistd process of a tasknet role, restartable with the same arguments."""

    def __init__(self, name: str, plugin: str, args: Sequence[str], directory: Path) -> None:
        self.name = name
        self.plugin = plugin
        self.args = list(args)
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "twistd.log"
        self.console = self.dir / "console.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.prefix: list[str] = []  # e.g. ["ip", "netns", "exec", "ns"]

    def command(self) -> list[str]:
        return [
            *self.prefix,
            *twistd_command(),
            "-n",
            "--pidfile=",
            f"--logfile={self.log}",
            self.plugin,
            *self.args,
        ]

    def start(self) -> None:
        if self.alive:
            raise DrillError(f"{self.name} is already running (pid {self.pid})")
        self.starts += 1
        with self.console.open("ab") as console:
            console.write(f"--- start #{self.starts}: {' '.join(self.command())}\n".encode())
            console.flush()
            self.popen = subprocess.Popen(
                self.command(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,  # a Ctrl-C on the drill does not hit children first
            )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (the crash the drills are about)."""
        self._signal(signal.SIGKILL)
        self.wait_exit(10)

    def terminate(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait; SIGKILL if it will not go."""
        if not self.alive:
            return
        self._signal(signal.SIGTERM)
        try:
            self.wait_exit(timeout)
        except DrillError:
            self.kill()

    def restart(self) -> None:
        if self.alive:
            self.terminate()
        self.start()

    def wait_exit(self, timeout: float) -> int:
        if self.popen is None:
            return 0
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise DrillError(f"{self.name} (pid {self.pid}) alive after {timeout}s") from exc

    def _signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:  # exited between poll and kill
                pass

    def log_text(self) -> str:
        parts = []
        for path in (self.console, self.log):
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def log_contains(self, needle: str) -> bool:
        return needle in self.log_text()

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        wait_for(check, timeout, f"{self.name}: {what}", procs=[self])


def address_in_use(proc: Proc) -> bool:
    """Did the process fail because its port was taken meanwhile?"""
    text = proc.log_text()
    return "Address already in use" in text or "CannotListenError" in text
