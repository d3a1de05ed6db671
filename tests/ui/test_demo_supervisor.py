"""The demo's :class:`~tasknet.cli.demo.Supervisor` on fake children and a
fake clock: a death is reported once in one line, nothing is restarted by
default, ``--restart-children`` restarts with a doubling backoff that starts
again once a child has stayed up; the PostgreSQL server is watched too.
(test_demo.py has the real processes.)"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path

from tasknet.cli.demo import Supervisor, exit_status


@dataclass
class FakeChild:
    name: str
    pid: int = 100
    returncode: int | None = None
    starts: list[str] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.returncode is None

    @property
    def log_path(self) -> Path:
        return Path(f"/data/logs/{self.name}.log")

    def die(self, code: int) -> None:
        self.returncode = code

    def start(self, banner: str | None = None) -> None:
        self.starts.append(banner or "")
        self.pid += 1
        self.returncode = None


@dataclass
class FakeServer:
    pid: int = 500
    running: bool = True
    restarts: int = 0

    def restart(self) -> None:
        self.restarts += 1
        self.pid += 1
        self.running = True


@dataclass
class FakeStack:
    children: list[FakeChild]
    server: FakeServer | None = None
    postgres_dir: Path = Path("/data/postgres")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _supervisor(stack: FakeStack, restart: bool) -> tuple[Supervisor, list[str], Clock]:
    said: list[str] = []
    clock = Clock()
    supervisor = Supervisor(stack, restart=restart, say=said.append, clock=clock)  # type: ignore[arg-type]
    return supervisor, said, clock


def test_a_death_is_one_line_and_nothing_is_restarted_by_default() -> None:
    node = FakeChild("node-1")
    site = FakeChild("site", pid=200)
    supervisor, said, clock = _supervisor(FakeStack([site, node]), restart=False)
    supervisor.poll()
    assert said == []
    node.die(-signal.SIGTERM)
    for _ in range(5):
        clock.now += 10
        supervisor.poll()
    assert said == [
        "tasknet-demo: node-1 exited (killed by SIGTERM); the rest keeps running, nothing is"
        " restarted (--restart-children would); its log: /data/logs/node-1.log"
    ]
    assert node.starts == [] and site.alive


def test_restart_children_backs_off_and_says_so() -> None:
    node = FakeChild("node-2")
    supervisor, said, clock = _supervisor(FakeStack([node]), restart=True)
    delays = []
    for _ in range(7):
        node.die(1)
        supervisor.poll()
        assert said[-1].startswith("tasknet-demo: node-2 exited (exit status 1); restarting it in")
        delay = float(said[-1].split("restarting it in ")[1].split(" s")[0])
        delays.append(delay)
        clock.now += delay - 0.01
        supervisor.poll()
        assert not node.alive  # not yet
        clock.now += 0.01
        supervisor.poll()
        assert node.alive and said[-1] == f"tasknet-demo: node-2 restarted (pid {node.pid})"
        clock.now += 1  # up a moment, then dies again
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert all("--restart-children" in banner for banner in node.starts)

    clock.now += 60  # up for a minute: the next death starts the backoff again
    supervisor.poll()
    node.die(1)
    supervisor.poll()
    assert "restarting it in 1 s (restart 1)" in said[-1]


def test_the_postgres_server_is_watched_too() -> None:
    server = FakeServer()
    stack = FakeStack([], server=server)
    supervisor, said, clock = _supervisor(stack, restart=False)
    server.running = False
    supervisor.poll()
    supervisor.poll()
    assert said == [
        "tasknet-demo: the PostgreSQL server exited; the rest keeps running, nothing is"
        " restarted (--restart-children would); its log: /data/postgres/server.log"
    ]
    supervisor, said, clock = _supervisor(FakeStack([], server=FakeServer(running=False)), True)
    supervisor.poll()
    clock.now += 1
    supervisor.poll()
    assert said[-1] == "tasknet-demo: postgres restarted (pid 501)"


def test_exit_status_words() -> None:
    assert exit_status(0) == "exit status 0"
    assert exit_status(1) == "exit status 1"
    assert exit_status(-9) == "killed by SIGKILL"
    assert exit_status(None) == "no exit status"
