"""What every benchmark shares: the result row, the run context, the table and the JSON file."""

from __future__ import annotations

import json
import math
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.machine import cpu_model, filesystem_of
from bench.pg_baseline import BenchPostgres, server_version

RESULTS_PATH = Path(__file__).with_name("results.json")

SQLITE = "sqlite"
POSTGRES = "postgresql"
#: PostgreSQL as a primary with a synchronous standby (pg_auto_failover on
#: loopback): B1 and B2 measure what not losing a commit costs.
POSTGRES_HA = "postgresql-ha"
#: Where seeded databases are kept between runs (``--cache``).
CACHE_ENV = "TASKNET_BENCH_CACHE"


def default_cache() -> Path:
    """``$TASKNET_BENCH_CACHE``, else ``~/.cache/tasknet-bench``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tasknet-bench"


def _no_postgres_yet() -> BenchPostgres:
    return BenchPostgres()


def _no_failover_cluster_yet() -> BenchPostgres:
    return BenchPostgres(standby=True)


@dataclass
class Context:
    """How a benchmark should run: size (``quick``), where to put its files,
    whether to sample the site with py-spy while it is under load
    (``profile``), and the site's database backend (``backend``: B1, B2, B9
    run on either; ``pg`` is the run's one PostgreSQL server, shared by the
    contexts of one run and started when first needed).  ``cache``: where
    seeded databases are kept between runs of the same size (None: seed
    afresh every time)."""

    quick: bool
    workdir: Path
    profile: bool = False
    backend: str = SQLITE
    pg: BenchPostgres = field(default_factory=_no_postgres_yet)
    cache: Path | None = None
    #: The run's failover cluster (``--db postgres-ha``), started when first needed.
    pg_ha: BenchPostgres = field(default_factory=_no_failover_cluster_yet)

    @property
    def on_postgres(self) -> bool:
        """On PostgreSQL: one server, or a primary with a synchronous standby."""
        return self.backend in (POSTGRES, POSTGRES_HA)

    @property
    def postgres(self) -> BenchPostgres:
        """This context's PostgreSQL: the single server or the failover cluster."""
        return self.pg_ha if self.backend == POSTGRES_HA else self.pg

    def scratch(self, name: str) -> Path:
        """A fresh directory for one benchmark's databases, logs and files."""
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def database(self, directory: Path, name: str) -> str:
        """A fresh database target of this context's backend: the SQLite file
        ``directory/name.sqlite`` (removed first if a kept work directory has
        it) or a new PostgreSQL database's URL."""
        if self.on_postgres:
            return self.postgres.database(name)
        path = directory / f"{name}.sqlite"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return str(path)


@dataclass
class Row:
    """One line of the table: our figure next to the same-run baseline.

    A figure with a baseline is a rate (higher is better: the ratio is
    ``figure / baseline``) unless ``lower_is_better`` (a latency: the ratio
    is ``baseline / figure``, so above 1 is still better than the baseline).
    ``ratio_note`` is printed beside the ratio (B1: its ceiling and the
    site's share of it).  ``met`` is None when the benchmark could not run.
    """

    bench: str
    title: str
    unit: str
    figure: float | None = None
    baseline: float | None = None
    baseline_label: str = ""
    p50_ms: float | None = None
    p99_ms: float | None = None
    target: str = ""
    met: bool | None = None
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    lower_is_better: bool = False
    ratio_note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.figure is None or not self.baseline:
            return None
        if self.lower_is_better:
            return self.baseline / self.figure if self.figure else None
        return self.figure / self.baseline

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def human(value: float | None) -> str:
    """Three significant figures with a k/M suffix: rates span five orders of magnitude."""
    if value is None:
        return "-"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _versions() -> dict[str, str]:
    import twisted

    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "twisted": twisted.__version__,
    }


def machine_facts(workdir: Path) -> dict[str, Any]:
    """What a reader needs to compare two result files."""
    from bench.sqlite_baseline import site_synchronous

    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "loadavg_at_start": list(os.getloadavg()),
        "workdir_filesystem": filesystem_of(workdir),
        "synchronous": site_synchronous(workdir / "synchronous-probe.sqlite"),
        # The binaries' version; what the server runs with is added as
        # "postgresql_server" once a benchmark has started it.
        "postgresql": server_version() or "not installed",
    }
    facts.update(_versions())
    return facts


def format_table(rows: Iterable[Row]) -> str:
    """The table printed at the end of a run."""
    header = ("id", "benchmark", "figure", "baseline", "ratio", "p50 ms", "p99 ms", "target", "met")
    lines = [header]
    for r in rows:
        if r.error is not None:
            lines.append((r.bench, r.title, "ERROR", "-", "-", "-", "-", r.target, "no"))
            continue
        figure = f"{human(r.figure)} {r.unit}" if r.figure is not None else "-"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        if r.ratio_note:
            ratio = f"{ratio} {r.ratio_note}"
        met = {True: "yes", False: "NO", None: "-"}[r.met]
        lines.append(
            (
                r.bench,
                r.title,
                figure,
                human(r.baseline),
                ratio,
                f"{r.p50_ms:.1f}" if r.p50_ms is not None else "-",
                f"{r.p99_ms:.1f}" if r.p99_ms is not None else "-",
                r.target,
                met,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_notes(rows: Iterable[Row]) -> str:
    """Baselines spelled out, notes and errors, one block per row."""
    out = []
    for r in rows:
        extra = []
        if r.baseline_label:
            extra.append(f"baseline: {r.baseline_label}")
        extra.extend(r.notes)
        if r.error is not None:
            extra.append(f"error: {r.error}")
        if extra:
            out.append(f"{r.bench} {r.title}:")
            out.extend(f"  - {line}" for line in extra)
    return "\n".join(out)


def write_results(
    path: Path, rows: Sequence[Row], machine: dict[str, Any], quick: bool, started: float
) -> None:
    """``bench/results.json``: the rows plus the machine they ran on."""
    document = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 2),
        "quick": quick,
        "argv": sys.argv[1:],
        "machine": machine,
        "rows": [r.to_json() for r in rows],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)
