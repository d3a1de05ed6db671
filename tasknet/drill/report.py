"""Drill output: a live progress line, the scenario × invariant table, the
evidence of every FAIL, and the JSON report."""

from __future__ import annotations

import json
import platform
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from tasknet.drill.invariants import FAIL, INVARIANTS, NA, PASS, Verdict

COLUMNS = ("E", *INVARIANTS)
CELL = {PASS: "PASS", FAIL: "FAIL", NA: "–"}
MAX_EVIDENCE_CHARS = 1500


@dataclass
class RunResult:
    scenario: str
    title: str
    run: int
    verdicts: list[Verdict]
    seconds: float
    directory: str | None = None
    database: str | None = None  # the site database of a kept run
    logs: dict[str, str] = field(default_factory=dict)
    proxies: dict[str, Any] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(v.status == FAIL for v in self.verdicts)

    def cell(self, column: str) -> str:
        for v in self.verdicts:
            if v.invariant == column:
                return CELL.get(v.status, v.status)
        return CELL[NA]

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "title": self.title,
            "run": self.run,
            "result": FAIL if self.failed else PASS,
            "seconds": round(self.seconds, 2),
            "verdicts": {v.invariant: v.to_json() for v in self.verdicts},
            "directory": self.directory,
            "database": self.database,
            "logs": self.logs,
            "proxies": self.proxies,
            "ledger": self.ledger,
        }


class Progress:
    """One live line per scenario run: rewritten in place on a terminal,
    plain appended lines otherwise (CI logs)."""

    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._label = ""
        self._started = 0.0

    def begin(self, label: str) -> None:
        self._label = label
        self._started = time.monotonic()
        self.update("starting")

    def update(self, text: str) -> None:
        elapsed = time.monotonic() - self._started
        line = f"{self._label:<10} {elapsed:5.1f}s  {text}"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line[:160])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self, result: RunResult) -> None:
        cells = " ".join(f"{c}:{result.cell(c)}" for c in COLUMNS)
        verdict = "FAIL" if result.failed else "ok"
        line = f"{self._label:<10} {result.seconds:5.1f}s  {verdict:<4}  {cells}"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + "\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def table(results: list[RunResult]) -> str:
    """The scenario × invariant table (E = the scenario's own expectations)."""
    header = ["scenario", "run", *COLUMNS, "time"]
    rows = [
        [r.scenario, str(r.run), *(r.cell(c) for c in COLUMNS), f"{r.seconds:.1f}s"]
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    passed = sum(not r.failed for r in results)
    lines.append("")
    lines.append(f"{passed}/{len(results)} run(s) passed; E = the scenario's expected outcome,")
    span = f"{INVARIANTS[0]}–{INVARIANTS[-1]}"
    lines.append(f"{span} = DRILLS.md invariants, – = not exercised by the scenario.")
    return "\n".join(lines)


def _evidence_text(evidence: Any) -> str:
    text = json.dumps(evidence, ensure_ascii=False, default=str, indent=1)
    if len(text) > MAX_EVIDENCE_CHARS:
        text = text[:MAX_EVIDENCE_CHARS] + f"\n... ({len(text)} chars; full evidence in --report)"
    return text


def failures(results: list[RunResult]) -> str:
    """The evidence of each FAIL, ready to read without opening a database."""
    out: list[str] = []
    for r in results:
        for v in r.verdicts:
            if v.status != FAIL:
                continue
            out.append(f"FAIL {r.scenario} run {r.run} {v.invariant}: {v.detail}")
            for item in v.evidence[:3]:
                out.append("  " + _evidence_text(item).replace("\n", "\n  "))
            if len(v.evidence) > 3:
                out.append(f"  ... {len(v.evidence) - 3} more")
        if r.failed and r.directory:
            out.append(f"  logs and databases of {r.scenario} run {r.run}: {r.directory}")
        if r.failed and r.database and "://" in r.database:  # SQLite's is in the directory
            out.append(f"  site database of {r.scenario} run {r.run}: {r.database}")
    return "\n".join(out)


def machine() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "nproc": os.cpu_count(),
    }


def to_json(results: list[RunResult], started: float, argv: list[str]) -> dict[str, Any]:
    return {
        "started": started,
        "finished": time.time(),
        "argv": argv,
        "machine": machine(),
        "passed": all(not r.failed for r in results),
        "summary": {
            "runs": len(results),
            "failed": sum(r.failed for r in results),
            "table": {f"{r.scenario}#{r.run}": {c: r.cell(c) for c in COLUMNS} for r in results},
        },
        "runs": [r.to_json() for r in results],
    }
