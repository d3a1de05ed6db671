"""Real processes for drills: start, wait until ready, kill, collect logs
(each on a :class:`tasknet.process.Child`).

Every role runs as ``<venv>/bin/twistd -n --pidfile= --logfile=<dir>/twistd.log
<plugin> ...`` in its own directory.  Waiting is always polling with a bound
and a clear message; a process that dies while we wait is reported at once
with the tail of its log instead of waiting for the timeout.

A process can also be *stopped* (``SIGSTOP``: by itself at a site fault
point, S23) and continued (:meth:`Proc.cont`); :meth:`Proc.stopped` reads
its state from ``/proc``, and :func:`tcp_connections` the TCP connections
it holds (Linux).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasknet.process import Child, twistd_command

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


@dataclass
class Run:
    """One run of a :class:`Proc`: its pid and wall-clock lifetime (evidence
    for D9: was a site alive when another settled its submissions?).
    ``ended`` is when the drill sent the signal that ended it (the process
    was alive until at least then), or, for a process that exited by itself,
    the first moment the drill saw it gone (an upper bound)."""

    pid: int | None
    started: float
    ended: float | None = None
    how: str | None = None  # "SIGKILL" | "SIGTERM" | "exited"
    #: When the drill ended this run's database lease by hand while the
    #: process lived on, stopped (S23's fence): from then on the database
    #: counts the run as gone, whatever the process does when it resumes.
    fenced: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "started": self.started,
            "ended": self.ended,
            "how": self.how,
            "fenced": self.fenced,
        }


class Proc:
    """One twistd process of a tasknet role, restartable with the same arguments."""

    def __init__(
        self,
        name: str,
        plugin: str,
        args: Sequence[str],
        directory: Path,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.plugin = plugin
        self.args = list(args)
        #: Variables added to the drill's own environment at each start
        #: (a site fault point, S23); change it before a restart.
        self.env: dict[str, str] = dict(env or {})
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "twistd.log"
        self.console = self.dir / "console.log"
        self.child: Child | None = None
        self.starts = 0
        self.prefix: list[str] = []  # e.g. ["ip", "netns", "exec", "ns"]
        self.runs: list[Run] = []

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
        command = self.command()
        env = {**os.environ, **self.env} if self.env else None
        self.child = Child(self.name, command, self.console, cwd=self.dir, env=env)
        started = time.time()
        extra = "".join(f"{k}={v} " for k, v in sorted(self.env.items()))
        self.child.start(banner=f"--- start #{self.starts}: {extra}{' '.join(command)}\n")
        self.runs.append(Run(self.child.pid, started))

    @property
    def popen(self) -> subprocess.Popen[bytes] | None:
        return None if self.child is None else self.child.popen

    @property
    def pid(self) -> int | None:
        return None if self.child is None else self.child.pid

    @property
    def alive(self) -> bool:
        alive = self.child is not None and self.child.alive
        if not alive:
            self._ended("exited")
        return alive

    def _ended(self, how: str) -> None:
        """Note the end of the current run (the first note wins)."""
        if self.runs and self.runs[-1].ended is None:
            self.runs[-1].ended = time.time()
            self.runs[-1].how = how

    @property
    def returncode(self) -> int | None:
        return None if self.child is None else self.child.returncode

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (the crash the drills are about)."""
        if self.child is not None:
            if self.child.alive:
                self._ended("SIGKILL")
            self.child.signal(signal.SIGKILL)
        self.wait_exit(10)

    @property
    def stopped(self) -> bool:
        """Whether the process is alive and stopped (``SIGSTOP``)."""
        return self.pid is not None and self.alive and process_state(self.pid) in ("T", "t")

    def cont(self) -> None:
        """SIGCONT: a stopped process resumes where it stopped."""
        if self.child is not None:
            self.child.signal(signal.SIGCONT)

    def note_fenced(self) -> None:
        """The drill ended this run's database lease (see :attr:`Run.fenced`)."""
        if self.runs and self.runs[-1].fenced is None:
            self.runs[-1].fenced = time.time()

    def terminate(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait; SIGKILL if it will not go.  A stopped process
        is continued too, so that it can act on the SIGTERM."""
        if not self.alive:
            return
        if self.child is not None:
            self._ended("SIGTERM")
            self.child.signal(signal.SIGTERM)
            self.child.signal(signal.SIGCONT)
        try:
            self.wait_exit(timeout)
        except DrillError:
            self.kill()

    def wait_exit(self, timeout: float) -> int:
        if self.child is None:
            return 0
        try:
            return self.child.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise DrillError(f"{self.name} (pid {self.pid}) alive after {timeout}s") from exc

    def log_text(self) -> str:
        parts = []
        for path in (self.console, self.log):
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        wait_for(check, timeout, f"{self.name}: {what}", procs=[self])


def address_in_use(proc: Proc) -> bool:
    """Did the process fail because its port was taken meanwhile?"""
    text = proc.log_text()
    return "Address already in use" in text or "CannotListenError" in text


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` in ``/proc/PID/stat`` (``T``:
    stopped), None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses.
    return text[text.rfind(")") + 2 :][:1] or None


@dataclass(frozen=True)
class TcpConnection:
    """One IPv4 TCP socket of a process, from ``/proc/PID/net/tcp``."""

    local: tuple[str, int]
    remote: tuple[str, int]
    state: str  # "ESTABLISHED", "LISTEN", ...
    send_queue: int  # bytes written by the process, not yet acknowledged by the peer

    def to_json(self) -> dict[str, Any]:
        return {
            "local": f"{self.local[0]}:{self.local[1]}",
            "remote": f"{self.remote[0]}:{self.remote[1]}",
            "state": self.state,
            "send_queue": self.send_queue,
        }


_TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


def _address(text: str) -> tuple[str, int]:
    host, port = text.split(":")
    packed = struct.pack("<I", int(host, 16))  # the kernel's byte order, as hex
    return socket.inet_ntoa(packed), int(port, 16)


def tcp_connections(pid: int) -> list[TcpConnection]:
    """The IPv4 TCP sockets ``pid`` holds open (its network namespace's
    ``/proc/PID/net/tcp``, matched to its descriptors by inode); empty
    when the process is gone."""
    inodes: set[str] = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[9] not in inodes:
            continue
        tx_queue = int(fields[4].split(":")[0], 16)
        found.append(
            TcpConnection(
                _address(fields[1]),
                _address(fields[2]),
                _TCP_STATES.get(fields[3], fields[3]),
                tx_queue,
            )
        )
    return found
