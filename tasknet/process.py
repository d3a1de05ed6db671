"""Child processes of the tools: ``tasknet-demo``, ``tasknet-drill`` and the
benchmarks start twistd roles (and load generators) the same way.

One :class:`Child` per process: started in a session of its own (a Ctrl-C on
the terminal reaches only the parent, which stops the children in order),
its output appended to a log file, stopped with SIGTERM and, if it will not
go, SIGKILL.  Free loopback ports are found by binding port 0; another
process may take one before our child binds it, so a caller that cares
retries on "Address already in use".  No component of the site or node
imports this module: it is for the programs that run them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

LOOPBACK = "127.0.0.1"
STOP_TIMEOUT = 10.0


def twistd_command() -> list[str]:
    """The twistd of the running interpreter's environment (the venv we run in)."""
    sibling = Path(sys.executable).with_name("twistd")
    if sibling.exists():
        return [str(sibling)]
    found = shutil.which("twistd")
    if found:
        return [found]
    return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago (our child binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on ``port`` now.  SO_REUSEADDR, as
    Twisted's listening ports set it: a port whose last connections are in
    TIME-WAIT (a process stopped a moment ago) is free for a server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


class Child:
    """One child process whose output goes to ``log_path`` (appended).

    ``pipe_stdio``: stdin and stdout are pipes (a load generator driven by
    the parent); stderr still goes to the log.  ``preexec_fn`` runs in the
    child before exec (e.g. ``prctl(PR_SET_PDEATHSIG)``)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        pipe_stdio: bool = False,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.pipe_stdio = pipe_stdio
        self.preexec_fn = preexec_fn
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, banner: str | None = None) -> None:
        """Start the process; ``banner`` is written to the log first."""
        self.cwd.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            if banner is not None:
                log.write(banner.encode())
                log.flush()
            # The child has its own descriptor of the log: ours closes here.
            self.popen = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE if self.pipe_stdio else subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.pipe_stdio else log,
                stderr=log if self.pipe_stdio else subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self.preexec_fn,
            )

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    @property
    def stdin(self) -> IO[bytes] | None:
        return None if self.popen is None else self.popen.stdin

    @property
    def stdout(self) -> IO[bytes] | None:
        return None if self.popen is None else self.popen.stdout

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:  # exited between poll and kill
                pass

    def wait(self, timeout: float) -> int:
        """The exit code; raises ``subprocess.TimeoutExpired`` if still running."""
        return 0 if self.popen is None else self.popen.wait(timeout)

    def kill(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGKILL: no shutdown code runs."""
        self.signal(signal.SIGKILL)
        self.wait(timeout)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM (twistd shuts down cleanly), SIGKILL if it will not exit
        within ``timeout``; close our pipes; the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(timeout)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()
        return self.popen.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        text = self.log_text()
        return "\n".join(text.splitlines()[-lines:]) if text else "(no log)"
