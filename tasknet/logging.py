"""Structured logs through ``twisted.logger``, as text or as JSON lines.

Code logs with ``twisted.logger.Logger`` and keyword fields, e.g.
``log.info("report {report_id} applied", report_id=rid, gid=gid)``; every
field reaches the JSON output, so log events are queryable, not just text.

Choosing the output:

* under ``twistd``: pass ``--logger tasknet.logging.observer`` (see
  :func:`twistd_logger_args`); :func:`observer` writes JSON lines to stdout
  when the environment has ``TASKNET_LOG_JSON=1``, readable text otherwise.

A JSON line is one object: ``time`` (ISO 8601, UTC), ``level``,
``namespace``, ``message`` (the formatted text), ``failure`` (traceback
text, when the event carries one), then the event's own fields; a value JSON
cannot encode is written as its ``repr``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import IO, Any

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
    textFileLogObserver,
)
from zope.interface import provider

JSON_ENV = "TASKNET_LOG_JSON"
_TRUE = {"1", "true", "yes", "on"}


def json_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TASKNET_LOG_JSON`` asks for JSON lines."""
    env = os.environ if environ is None else environ
    return env.get(JSON_ENV, "").strip().lower() in _TRUE


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def event_as_json_line(event: Mapping[str, Any]) -> str:
    """One log event as a compact JSON object followed by a newline."""
    level = event.get("log_level")
    record: dict[str, Any] = {
        "time": datetime.fromtimestamp(event.get("log_time", 0.0), UTC).isoformat(),
        "level": getattr(level, "name", str(level)),
        "namespace": event.get("log_namespace", ""),
        "message": formatEvent(dict(event)),
    }
    failure = event.get("log_failure")
    if failure is not None:
        record["failure"] = failure.getTraceback()
    for key, value in event.items():
        # log_* keys are twisted's bookkeeping; legacy twisted.python.log
        # events add "message", "format", "isError", "system", "time" too.
        if key.startswith("log_") or key in record or key in {"format", "isError", "system"}:
            continue
        record[key] = _jsonable(value)
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def json_observer(stream: IO[str]) -> ILogObserver:
    """An observer writing one JSON line per event to ``stream``."""

    @provider(ILogObserver)
    def write(event: Mapping[str, Any]) -> None:
        stream.write(event_as_json_line(event))
        stream.flush()

    return write


def observer(stream: IO[str] | None = None, level: LogLevel = LogLevel.info) -> ILogObserver:
    """The tasknet log observer: JSON lines if requested, else text; ``level`` and above.

    This is the factory for ``twistd --logger tasknet.logging.observer``.
    """
    out = sys.stdout if stream is None else stream
    inner = json_observer(out) if json_requested() else textFileLogObserver(out)
    return FilteringLogObserver(inner, [LogLevelFilterPredicate(defaultLogLevel=level)])


def twistd_logger_args() -> list[str]:
    """``twistd`` arguments that route a child's logs through :func:`observer`.

    The child inherits the environment, so ``TASKNET_LOG_JSON`` decides its
    format too.
    """
    return ["--logger", "tasknet.logging.observer"]
