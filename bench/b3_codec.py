"""B3 codec: frames/s encode+decode of a 100-entry TaskReport.

Ours: ``messages.encode(report)`` then ``messages.decode(12, payload)`` (the
tolerant reader with every field type-checked, as the site runs it).
Baseline: ``json.dumps`` of the same wire object plus the ``struct`` header,
then ``struct.unpack`` plus ``json.loads``: the floor any JSON codec stands on.
Rounds alternate between the two and each side keeps its best round, which is
the least noisy estimate on a shared machine (as ``timeit`` does).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from typing import Any

from bench.harness import Context, Row

ENTRIES = 100
TARGET_RATIO = 1.0


def sample_report() -> Any:
    from tasknet.protocol import messages as m

    gids = range(1_000_000, 1_000_000 + ENTRIES)
    return m.TaskReport(
        report_id="bench-node-0001-000000000042",
        revision=1_760_000_000_123,
        gallery_tasks=tuple(m.TaskEntry(g, 1 + g % 4, (g % 997) / 997) for g in gids),
        operation_ids={g: f"0f8e2c4a-{g:012d}" for g in gids},
        deleted=(),
    )


def wire_object(report: Any) -> dict[str, Any]:
    """The same JSON object the codec writes, built once for the baseline."""
    return {
        "reportId": report.report_id,
        "revision": report.revision,
        "galleryTasks": [
            {"gid": e.gid, "status": e.status, "progress": e.progress} for e in report.gallery_tasks
        ],
        "operationIds": {str(k): v for k, v in report.operation_ids.items()},
        "deleted": [],
    }


def _ours(report: Any) -> Callable[[], None]:
    from tasknet.protocol.messages import HEADER, decode, encode

    unpack = HEADER.unpack_from
    size = HEADER.size

    def once() -> None:
        frame = encode(report)
        type_, length = unpack(frame)
        decode(type_, frame[size : size + length])

    return once


def _baseline(obj: dict[str, Any]) -> Callable[[], None]:
    header = struct.Struct(">BI")

    def once() -> None:
        payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        frame = header.pack(12, len(payload)) + payload
        type_, length = header.unpack_from(frame)
        json.loads(frame[header.size : header.size + length])

    return once


def _calibrate(fn: Callable[[], None], seconds: float) -> int:
    """Iterations that take about ``seconds``."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds / 4:
            return max(1, int(n * seconds / elapsed))
        n *= 2


def _best_rate(fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def run(ctx: Context) -> Row:
    from tasknet.protocol.messages import HEADER, decode, encode

    report = sample_report()
    frame = encode(report)
    # Correctness first: a fast codec that loses data is not a result.
    if decode(12, frame[HEADER.size :]) != report:
        raise AssertionError("codec round trip changed the report")
    if json.loads(frame[HEADER.size :]) != wire_object(report):
        raise AssertionError("codec output differs from the baseline's JSON object")

    ours, base = _ours(report), _baseline(wire_object(report))
    rounds, seconds = (3, 0.05) if ctx.quick else (9, 0.4)
    n_ours, n_base = _calibrate(ours, seconds), _calibrate(base, seconds)
    best_ours = best_base = 0.0
    for _ in range(rounds):
        best_ours = max(best_ours, _best_rate(ours, n_ours))
        best_base = max(best_base, _best_rate(base, n_base))

    row = Row(
        bench="B3",
        title="codec",
        unit="frames/s",
        figure=best_ours,
        baseline=best_base,
        baseline_label="json.dumps/json.loads + struct header of the same object",
        target=f">= {TARGET_RATIO}x",
    )
    row.met = (row.ratio or 0) >= TARGET_RATIO
    row.notes.append(
        f"{ENTRIES}-entry TaskReport, frame {len(frame)} bytes; best of {rounds} rounds each"
    )
    row.details = {"frame_bytes": len(frame), "rounds": rounds, "iterations": [n_ours, n_base]}
    return row
