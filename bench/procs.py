"""Processes the benchmarks start: twistd roles and load generators.

Everything measured runs in its own process so that its reactor, CPU time and
memory are its own: ``/proc/<pid>`` gives CPU seconds, RSS and limits without
any cooperation from the process.  Waiting is polling with a bound; a child
that dies while we wait is reported at once with the tail of its log.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tasknet.process import Child, port_open, twistd_command

POLL = 0.05
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
REPO_ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1


try:  # resolved here, not in the forked child (which should only make the call)
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the bench dies, even by SIGKILL, so no
    site or load process is left running on a shared machine (Linux only)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def _raise_open_files() -> None:
    """In the child: the soft RLIMIT_NOFILE up to the hard limit (B5 holds
    10,000 node connections in the site, one fd each; a login shell's
    soft limit is often 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        # An unlimited hard limit cannot be the soft one: take a large number.
        wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass  # the process reports its limit; the benchmark then says it is too low


def _child_setup() -> None:
    _die_with_parent()
    _raise_open_files()


class BenchError(Exception):
    """A benchmark could not proceed (a process died, a wait timed out)."""


class Proc(Child):
    """A child process (started at once) with its output in a log file (or a
    pipe for load nodes), and what ``/proc`` says about it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        cwd: Path,
        pipe_stdio: bool = False,
    ) -> None:
        env = dict(os.environ)
        # The bench runs from a checkout: make sure children import this tree.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        super().__init__(
            name,
            argv,
            log_path,
            cwd=cwd,
            env=env,
            pipe_stdio=pipe_stdio,
            preexec_fn=_child_setup,
        )
        log_path.write_bytes(b"")  # a fresh log per process
        self.start()
        self.started_at = time.time()

    @property
    def pid(self) -> int:
        assert self.popen is not None  # started in __init__
        return self.popen.pid

    def died(self, what: str) -> BenchError:
        return BenchError(
            f"{self.name} exited (code {self.returncode}) while {what}; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    # ------------------------------------------------------------ /proc readings

    def cpu_seconds(self) -> float:
        """User + system CPU time so far (fields 14 and 15 of /proc/<pid>/stat)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        # The command name may contain spaces: split after its closing parenthesis.
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def memory(self) -> dict[str, int]:
        """Current and peak resident set size in bytes (VmRSS, VmHWM)."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def open_files_limit(self) -> tuple[int, int]:
        """The process's own (soft, hard) RLIMIT_NOFILE."""
        for line in Path(f"/proc/{self.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
        raise BenchError(f"no open-files limit for pid {self.pid}")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    # ------------------------------------------------------------ lifetime

    def log_has(self, marker: str) -> bool:
        return marker in self.log_text()

    def wait_until(
        self, check: Callable[[], bool], timeout: float, what: str, *, fatal: str | None = None
    ) -> None:
        """Poll ``check``; fail at once if the process exits or logs ``fatal``."""
        deadline = time.monotonic() + timeout
        while not check():
            if not self.alive:
                raise self.died(f"waiting for {what}")
            if fatal is not None and self.log_has(fatal):
                raise BenchError(
                    f"{self.name} logged {fatal!r} while we waited for {what}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise BenchError(f"{self.name}: timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(POLL)

    def wait_port(self, port: int, timeout: float = 30.0) -> None:
        self.wait_until(lambda: port_open(port), timeout, f"port {port}")

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def twistd(name: str, plugin: str, args: Sequence[str], directory: Path) -> Proc:
    """``twistd -n <plugin> ...`` in ``directory``, logging to ``directory/<name>.log``."""
    directory.mkdir(parents=True, exist_ok=True)
    # --logfile=- : the twistd log goes to stdout, i.e. the same file as stderr.
    argv = [*twistd_command(), "-n", "--pidfile=", "--logfile=-", plugin, *args]
    return Proc(name, argv, directory / f"{name}.log", cwd=directory)
