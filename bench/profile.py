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
    """Per thread: samples and busy samples (not waiting in epoll or on a
    condition); over busy samples: the lines with the most self time and the
    tasknet functions with the most total time; in the writer thread: the
    samples per write transaction body, shared or lone (:func:`_transaction`)."""
    threads: dict[str, list[int]] = {}
    writes: Counter[str] = Counter()
    write_kinds: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    total_time: Counter[str] = Counter()
    samples = busy = 0
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
            frames = frames[1:]
        counts = threads.setdefault(thread, [0, 0])
        counts[0] += count
        if not frames or _is_idle(frames[-1]):
            continue
        counts[1] += count
        busy += count
        self_time[frames[-1]] += count
        for f in {_function(f) for f in frames if "tasknet/" in f}:
            total_time[f] += count
        transaction = _transaction(frames)
        if transaction is not None:
            writes[transaction] += count
            write_kinds[transaction.split(":", 1)[0]] += count
    return {
        "samples": samples,
        "busy_samples": busy,
        "threads": {t: {"samples": n, "busy": b} for t, (n, b) in threads.items()},
        "writes": writes.most_common(top),
        "write_kinds": dict(write_kinds),
        "self": self_time.most_common(top),
        "total": total_time.most_common(top),
        "file": str(collapsed),
    }


# The writer thread (tasknet/site/storage/engine/: the pool in database.py,
# group commit in group_commit.py, one transaction in transactions.py): a
# batch of writes runs in ``_run_together`` (one shared transaction, a
# savepoint per write), a write queued alone in ``_run_alone`` ->
# ``write_once``, a tool's in ``run_write``.  Each write's body is called
# through a lambda of the engine's.
_ENGINE = "tasknet/site/storage/engine/"
_SHARED = "_run_together"
_LONE = ("_run_alone", "run_write")


def _name(frame: str) -> str:
    """``Class.method (file:line)`` -> ``method``; a lambda stays ``<lambda>``."""
    return frame.split(" (", 1)[0].rsplit(".", 1)[-1]


def _transaction(frames: list[str]) -> str | None:
    """Which write transaction a stack is in, ``shared: <body>`` (group
    committed with others) or ``lone: <body>``; the body is the storage
    function the write runs (under any wrapper), or ``BEGIN/COMMIT <line>``
    for the transaction's own statements (BEGIN, SAVEPOINT, RELEASE, COMMIT).
    None: not a write transaction."""
    names = [_name(f) for f in frames]
    if _SHARED in names:
        kind, start = "shared", names.index(_SHARED)
    elif any(n in names for n in _LONE):
        kind, start = "lone", min(names.index(n) for n in _LONE if n in names)
    else:
        return None
    calls = [
        n for n in range(start, len(frames)) if names[n] == "<lambda>" and _ENGINE in frames[n]
    ]
    if not calls:
        return f"{kind}: BEGIN/COMMIT {frames[-1]}"
    body = frames[calls[-1] + 1 :]
    if not body:
        return f"{kind}: {_function(frames[calls[-1]])}"  # calling the body
    # Prefer the storage function under any wrapper (timing, batching).
    storage = [f for f in body if "tasknet/site/storage/" in f and _ENGINE not in f]
    return f"{kind}: {_function(storage[0] if storage else body[0])}"


def _function(frame: str) -> str:
    """``name (file:line)`` -> ``name (file)``: total time is per function."""
    return re.sub(r":\d+\)$", ")", frame)


def _is_idle(frame: str) -> bool:
    # The reactor waiting in epoll, a pool thread waiting for work.
    return frame.startswith(("EPollReactor.doPoll", "Condition.wait", "Event.wait", "select "))


def format_summary(summary: dict[str, Any]) -> list[str]:
    """Readable lines for the notes of a row and bench/README.md."""
    if "error" in summary:
        return [f"profile failed: {summary['error']}"]
    busy = summary["busy_samples"] or 1
    lines = [f"py-spy: {summary['samples']} samples, stacks in {summary['file']}"]
    lines.append(
        "threads busy: "
        + ", ".join(
            f"{name} {100 * t['busy'] / max(t['samples'], 1):.0f}%"
            for name, t in sorted(summary["threads"].items(), key=lambda kv: -kv[1]["busy"])
            if t["busy"] >= 0.01 * max(t["samples"], 1)
        )
    )
    kinds = summary.get("write_kinds") or {}
    if kinds:
        in_writes = sum(kinds.values())
        lines.append(
            "writer thread, by transaction (share of its samples in transactions; "
            + ", ".join(f"{k} {100 * n / in_writes:.0f}%" for k, n in sorted(kinds.items()))
            + "):"
        )
        lines.extend(f"  {100 * n / in_writes:5.1f}%  {f}" for f, n in summary["writes"])
    lines.append("busy samples by line (self):")
    lines.extend(f"  {100 * n / busy:5.1f}%  {f}" for f, n in summary["self"])
    lines.append("busy samples by tasknet function (total):")
    lines.extend(f"  {100 * n / busy:5.1f}%  {f}" for f, n in summary["total"])
    return lines
