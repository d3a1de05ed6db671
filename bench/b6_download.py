"""B6 download: node archive throughput (download + compress) from the mock upstream.

Ours: the node's ``Worker`` (treq download with fsync, zip in its compression
thread, every step recorded in the node's SQLite store) over N archives, with
the node's default concurrency (4 downloads, 1 compressor), in its own
process, against ``twistd -n tasknet-upstream``.
Baseline: for each file, ``curl`` of the same URL then ``zip -6`` of it, one
after another; with no curl or zip on the machine, ``urllib`` + ``zipfile``
(and the row says so).  Figure: archive input bytes per second.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

from bench.harness import Context, Row
from bench.procs import REPO_ROOT, BenchError
from bench.services import http_json, start_upstream

TARGET_RATIO = 0.8
MIN_FILE_SIZE = 900 * 1024


def pick_gids(count: int) -> list[int]:
    """The first ``count`` gids whose archive is near the mock's maximum (~1 MiB)."""
    from tasknet.upstream.catalog import gallery

    gids: list[int] = []
    gid = 1
    while len(gids) < count:
        if gallery(gid).size >= MIN_FILE_SIZE:
            gids.append(gid)
        gid += 1
    return gids


def run_node(directory: Path, jobs: list[tuple[int, str]], downloads: int = 4) -> dict[str, float]:
    data = directory / "node-data"
    shutil.rmtree(data, ignore_errors=True)
    argv = [sys.executable, "-m", "bench.nodeworker", f"--data={data}", f"--downloads={downloads}"]
    argv += [f"{gid}={url}" for gid, url in jobs]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise BenchError(f"node pipeline failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["files"] != len(jobs):
        raise BenchError(f"node built {result['files']} archives of {len(jobs)}")
    return result


def run_tools(directory: Path, jobs: list[tuple[int, str]], use_tools: bool) -> float:
    """Seconds for curl + zip of every file, one after another."""
    work = directory / "baseline"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.perf_counter()
    for gid, url in jobs:
        raw, archive = work / f"{gid}.bin", work / f"{gid}.zip"
        if use_tools:
            subprocess.run(["curl", "-sSf", "-o", str(raw), url], check=True)
            subprocess.run(["zip", "-q", "-6", "-j", str(archive), str(raw)], check=True)
        else:
            with urllib.request.urlopen(url, timeout=60) as response, open(raw, "wb") as f:
                shutil.copyfileobj(response, f)
            with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
                zf.write(raw, raw.name)
    return time.perf_counter() - started


def run(ctx: Context) -> Row:
    directory = ctx.scratch("b6")
    files, rounds = (3, 1) if ctx.quick else (24, 3)
    use_tools = shutil.which("curl") is not None and shutil.which("zip") is not None
    upstream = start_upstream(directory)
    try:
        gids = pick_gids(files)
        jobs, total = [], 0
        for gid in gids:
            meta = http_json("GET", f"{upstream.base_url}/api/galleries/{gid}?token=bench")
            submitted = http_json("POST", f"{upstream.base_url}/api/galleries/{gid}/archive", {})
            jobs.append((gid, submitted["archiveUrl"]))
            total += int(meta["size"])
        best_ours = best_base = float("inf")
        archive_bytes = 0
        for _ in range(rounds):  # alternate, keep each side's best round
            node = run_node(directory, jobs)
            best_ours = min(best_ours, node["seconds"])
            archive_bytes = int(node["archive_bytes"])
            best_base = min(best_base, run_tools(directory, jobs, use_tools))
        # Like for like with the sequential baseline: one download at a time.
        serial = run_node(directory, jobs, downloads=1)["seconds"]
    finally:
        upstream.proc.stop()

    mib = 1024 * 1024
    row = Row(
        bench="B6",
        title="download",
        unit="MiB/s",
        figure=total / best_ours / mib,
        baseline=total / best_base / mib,
        baseline_label=(
            "curl of each file then zip -6 of it, one after another"
            if use_tools
            else "urllib download + zipfile (curl or zip not installed)"
        ),
        target=f">= {TARGET_RATIO}x",
    )
    row.met = (row.ratio or 0) >= TARGET_RATIO
    row.notes.append(
        f"{files} archives, {total / mib:.1f} MiB from twistd tasknet-upstream; "
        f"node Worker with 4 downloads / 1 compressor, fsync of part and archive; "
        f"best of {rounds} round(s)"
    )
    row.notes.append(
        f"node with 1 download slot (sequential like the baseline): "
        f"{total / serial / mib:.1f} MiB/s = {best_base / serial:.2f}x the baseline"
    )
    row.details = {
        "node_serial_seconds": serial,
        "files": files,
        "bytes": total,
        "archive_bytes": archive_bytes,
        "node_seconds": best_ours,
        "baseline_seconds": best_base,
        "baseline_tools": use_tools,
    }
    return row
