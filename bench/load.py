"""Driving load-node processes from the bench (the parent side of bench.loadnode)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.procs import BenchError, Proc


class LoadProcess:
    """One ``python -m bench.loadnode`` child, its JSON events collected by a thread."""

    def __init__(self, name: str, directory: Path, args: list[str]) -> None:
        argv = [sys.executable, "-m", "bench.loadnode", *args]
        self.proc = Proc(name, argv, directory / f"{name}.log", cwd=directory, pipe_stdio=True)
        self.events: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.changed:
                self.events.append(event)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def last(self, kind: str) -> dict[str, Any] | None:
        with self.changed:
            for event in reversed(self.events):
                if event.get("event") == kind:
                    return event
        return None

    def wait_event(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for event in self.events:
                    if event.get("event") == kind:
                        return event
                if not self.proc.alive and not self.reader.is_alive():
                    raise self.proc.died(f"waiting for its {kind!r} event")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{self.proc.name}: no {kind!r} event after {timeout:.0f}s")
                self.changed.wait(min(left, 0.5))

    def command(self, line: str) -> None:
        stdin = self.proc.stdin
        if stdin is not None and self.proc.alive:
            stdin.write(line.encode() + b"\n")
            stdin.flush()

    def stop(self) -> None:
        self.proc.stop(timeout=5)


class LoadFleet:
    """Several load processes sharing one measured window.

    ``port`` is the site's node port; with ``ports`` (several sites) process
    ``n`` connects to ``ports[n % len(ports)]``, so ``processes`` equal to
    the number of sites splits the nodes evenly between them."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int = 0,
        ports: Sequence[int] = (),
        nodes: int,
        processes: int,
        mode: str,
        tasks: Path | None = None,
        changing: int = 4,
        heartbeat: float = 15.0,
        retry_for: float = 0.0,
        reconnect: bool = False,
        report_every: float = 0.0,
        backoff_scale: float = 1.0,
    ) -> None:
        """``reconnect``, ``report_every``, ``backoff_scale``: see
        ``bench.loadnode`` (B10).  The first logins are paced so that all
        processes together keep at most ``MAX_PENDING_LOGINS`` of them
        between connect and LoginResult."""
        from bench.loadnode import MAX_PENDING_LOGINS

        self.processes: list[LoadProcess] = []
        ports = tuple(ports) or (port,)
        per, extra = divmod(nodes, processes)
        pending = max(4, MAX_PENDING_LOGINS // processes)
        first = 0
        for n in range(processes):
            count = per + (1 if n < extra else 0)
            args = [
                f"--port={ports[n % len(ports)]}",
                f"--first={first}",
                f"--count={count}",
                f"--mode={mode}",
                f"--heartbeat={heartbeat}",
                f"--retry-for={retry_for}",
                f"--changing={changing}",
                f"--max-pending={pending}",
                f"--report-every={report_every}",
                f"--backoff-scale={backoff_scale}",
            ]
            if reconnect:
                args.append("--reconnect")
            if tasks is not None:
                args.append(f"--tasks={tasks}")
            self.processes.append(LoadProcess(f"load-{mode}-{n}", directory, args))
            first += count

    def wait_ready(self, timeout: float) -> list[dict[str, Any]]:
        return [p.wait_event("ready", timeout) for p in self.processes]

    def broadcast(self, line: str) -> None:
        for p in self.processes:
            p.command(line)

    def results(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """``stop`` to every process, then their result events."""
        self.broadcast("stop")
        return [p.wait_event("result", timeout) for p in self.processes]

    def total(self, kind: str, key: str) -> int:
        total = 0
        for p in self.processes:
            event = p.last(kind)
            if event is not None:
                total += int(event[key])
        return total

    def close(self) -> None:
        for p in self.processes:
            p.stop()

    def __enter__(self) -> LoadFleet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
