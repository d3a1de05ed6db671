"""Structured logs: JSON lines carry the event's fields; twistd picks the observer."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from twisted.logger import Logger, LogPublisher

from tasknet import logging as tlog


def _publish(json_on: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(tlog.JSON_ENV, "1" if json_on else "0")
    out = io.StringIO()
    publisher = LogPublisher(tlog.observer(out))
    log = Logger(namespace="tasknet.test", observer=publisher)  # type: ignore[arg-type]
    log.info("report {report_id} applied", report_id="r-1", gid=42, odd={1, 2})
    log.debug("hidden at the default level")
    try:
        raise ValueError("boom")
    except ValueError:
        log.failure("apply failed for {gid}", gid=7)
    return out.getvalue()


def test_json_lines_have_message_level_and_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _publish(True, monkeypatch).splitlines()
    assert len(lines) == 2, lines  # the debug event is filtered out
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "report r-1 applied"
    assert first["level"] == "info"
    assert first["namespace"] == "tasknet.test"
    assert first["gid"] == 42 and first["report_id"] == "r-1"
    assert first["odd"] == repr({1, 2})  # not JSON-encodable: written as repr
    assert first["time"].endswith("+00:00")
    assert second["level"] == "critical"
    assert "ValueError: boom" in second["failure"]
    assert second["gid"] == 7


def test_text_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _publish(False, monkeypatch)
    assert "report r-1 applied" in text
    assert not text.lstrip().startswith("{")


def test_json_requested_values() -> None:
    assert tlog.json_requested({"TASKNET_LOG_JSON": "1"})
    assert tlog.json_requested({"TASKNET_LOG_JSON": "true"})
    assert not tlog.json_requested({"TASKNET_LOG_JSON": "0"})
    assert not tlog.json_requested({})


def test_twistd_child_logs_json_lines(tmp_path: Path) -> None:
    """A real ``twistd -n`` with our --logger writes parseable JSON lines."""
    twistd = Path(sys.executable).with_name("twistd")
    env = dict(os.environ, TASKNET_LOG_JSON="1")
    proc = subprocess.Popen(
        [
            str(twistd),
            "-n",
            "--pidfile=",
            *tlog.twistd_logger_args(),
            "web",
            "--listen",
            "tcp:0:interface=127.0.0.1",
            "--path",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + 30
        records = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            records.append(json.loads(line))
            if "Site starting" in records[-1]["message"]:
                break
        assert any("Site starting" in r["message"] for r in records), records
        assert all({"time", "level", "namespace", "message"} <= r.keys() for r in records)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
