"""Sampling the site under load with py-spy (every thread: reactor and SQLite writer).

``python -m bench B1 --profile`` records the site process during the measured
window and leaves ``<workdir>/<name>.collapsed`` (flamegraph input) plus a
summary of where the samples fell, per thread and per function.  py-spy is a
test extra; without it the row says the profile was skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def py_spy() -> str | None:
    sibling = Path(sys.executable).with_name("py-spy")
    return str(sibling) if sibling.exists() else shutil.which("py-spy")


class Recorder:
    """``py-spy record --pid PID --format raw`` for ``seconds`` (started at once)."""

    def __init__(self, pid: int, seconds: float, out: Path) -> None:
        exe = py_spy()
        if exe is None:
            raise FileNotFoundError("py-spy is not installed (pip install -e '.[test]')")
        self.out = out
        self.popen = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, round(seconds))),
                "--rate",
                "200",
                "--threads",
                "--idle",
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        _, err = self.popen.communicate(timeout=timeout)
        if self.popen.returncode != 0 or not self.out.exists():
            return {"error": err.decode(errors="replace")[-500:]}
        return summarize(self.out)


# py-spy --threads puts "thread (TID): NAME" as the first frame of a stack.
_THREAD = re.compile(r"^thread \((\w+)\)(?:: (.*))?$")


def summarize(collapsed: Path, top: int = 12) -> dict[str, Any]:
    """Samples per thread, and the functions with the most samples (self and total)."""
    per_thread: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    total_time: Counter[str] = Counter()
    idle = 0
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        samples += count
        frames = stack.split(";")
        thread = frames[0]
        match = _THREAD.match(thread)
        if match:
            thread = match.group(2) or match.group(1)
        per_thread[thread] += count
        functions = [f for f in frames if f.endswith(")") and "(" in f]
        if not functions:
            continue
        leaf = functions[-1]
        if _is_idle(leaf):
            idle += count
        self_time[leaf] += count
        for f in set(functions):
            total_time[f] += count
    return {
        "samples": samples,
        "idle_samples": idle,
        "threads": dict(per_thread.most_common()),
        "self": [(f, n) for f, n in self_time.most_common(top)],
        "total": [(f, n) for f, n in total_time.most_common(top * 2)],
        "file": str(collapsed),
    }


def _is_idle(frame: str) -> bool:
    return any(word in frame for word in ("poll (", "epoll", "select (", "wait (", "_wait ("))


def format_summary(summary: dict[str, Any]) -> list[str]:
    """Readable lines for the notes of a row and bench/README.md."""
    if "error" in summary:
        return [f"profile failed: {summary['error']}"]
    samples = summary["samples"] or 1
    lines = [f"py-spy samples: {summary['samples']} (collapsed stacks: {summary['file']})"]
    lines.append(
        "threads: "
        + ", ".join(f"{t} {100 * n / samples:.0f}%" for t, n in summary["threads"].items())
    )
    lines.append("self time:")
    lines.extend(f"  {100 * n / samples:5.1f}%  {f}" for f, n in summary["self"])
    return lines
