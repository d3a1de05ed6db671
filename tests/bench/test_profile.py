"""``bench.profile.summarize``: the writer thread's samples are attributed to
the write transaction they fell in, shared (group commit) or lone.

The stacks are shaped as py-spy 0.3 records the site's writer thread
(``py-spy record --threads --format raw``): the same frames, fewer of them.
"""

from __future__ import annotations

from pathlib import Path

from bench.profile import format_summary, summarize

DB = "tasknet/site/storage/engine/database.py"
WRITER = (
    "thread (1001): PoolThread-writer;Thread._bootstrap (threading.py:995);"
    "ThreadPool._worker (twisted/python/threadpool.py:281);"
    "ConnectionPool._runWithConnection (twisted/enterprise/adbapi.py:283);"
    f"Database._run_queued ({DB}:314)"
)
BODY = f"Database.write.<locals>.<lambda> ({DB}:284)"
STACKS = {
    # A report batch group-committed with others, through a wrapper lambda.
    f"{WRITER};_run_together ({DB}:184);{BODY};"
    "ReportProcessor._flush.<locals>.<lambda> (tasknet/site/report_pipeline.py:200);"
    "apply_batch (tasknet/site/storage/reports.py:480);"
    "_apply_one (tasknet/site/storage/reports.py:505)": 60,
    f"{WRITER};_run_together ({DB}:193)": 20,  # the shared COMMIT
    f"{WRITER};_run_together ({DB}:184);{BODY}": 2,  # calling the body
    f"{WRITER};_run_alone ({DB}:161);run_write ({DB}:110);{BODY};"
    "persist_submitted (tasknet/site/storage/create.py:300)": 15,
    f"{WRITER};_run_alone ({DB}:161);run_write ({DB}:111)": 3,  # the lone COMMIT
    f"{WRITER};Condition.wait (threading.py:320)": 100,  # idle
    "thread (1002): PoolThread-reader;"
    "ConnectionPool._runWithConnection (twisted/enterprise/adbapi.py:283);"
    f"run_read ({DB}:125);Database.read.<locals>.<lambda>.<locals>.<lambda> ({DB}:350);"
    "pending_rows (tasknet/site/storage/delivery.py:47)": 7,
    f"thread (994): MainThread;Database._deliver ({DB}:325)": 10,
}


def test_writer_samples_are_attributed_to_shared_and_lone_transactions(tmp_path: Path) -> None:
    collapsed = tmp_path / "site.collapsed"
    collapsed.write_text("".join(f"{stack} {n}\n" for stack, n in STACKS.items()))
    summary = summarize(collapsed)
    assert dict(summary["writes"]) == {
        "shared: apply_batch (tasknet/site/storage/reports.py)": 60,
        f"shared: BEGIN/COMMIT _run_together ({DB}:193)": 20,
        f"shared: Database.write.<locals>.<lambda> ({DB})": 2,
        "lone: persist_submitted (tasknet/site/storage/create.py)": 15,
        f"lone: BEGIN/COMMIT run_write ({DB}:111)": 3,
    }
    assert summary["write_kinds"] == {"shared": 82, "lone": 18}
    assert summary["threads"]["PoolThread-writer"] == {"samples": 200, "busy": 100}
    lines = format_summary(summary)
    header = next(line for line in lines if line.startswith("writer thread"))
    assert "lone 18%, shared 82%" in header
    assert any(
        line.strip() == "60.0%  shared: apply_batch (tasknet/site/storage/reports.py)"
        for line in lines
    )
