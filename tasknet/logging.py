"""Structured logs through ``twisted.logger``, as text or as JSON lines.

Code logs with ``twisted.logger.Logger`` and keyword fields, e.g.
``log.info("report {report_id} applied", report_id=rid, gid=gid)``; every
field reaches the JSON output, so log events are queryable, not just text.

Choosing the output (docs/operations.md, "Logs"):

* every role's twistd plugin takes ``--log-format text|json`` and
  ``--log-level debug|info|warn|error`` (:class:`LogOptions`, applied by
  :func:`use_for_twistd` from the role's ``postOptions``).  twistd's own
  options cannot be extended, but a plugin's are parsed before twistd builds
  its logger, so the plugin makes twistd use :func:`observer` (its
  ``--logger``) writing where twistd would have: stdout under ``-n``, else
  ``--logfile`` (``twistd.log`` for a daemon), reopened on SIGUSR1 as
  twistd's own, on the reactor the role's ``makeService`` gives
  :func:`rotate_on` (twistd builds the service before its logger).  That
  file rotates at ``--log-max-size`` (default 10 MB) and keeps
  ``--log-keep`` rotated files (default 9), removing older ones: the log
  takes at most (keep + 1) × max-size of disk, whatever arrives (twistd's
  own kept every rotated file: issue 38's flood left 99 of them).
  twistd's ``--syslog`` or a ``--logger`` of another's is left alone;
* without the options the environment decides: ``TASKNET_LOG_FORMAT=json``
  (or the older ``TASKNET_LOG_JSON=1``) and ``TASKNET_LOG_LEVEL=debug``;
  the default is text at info.  ``--logger tasknet.logging.observer``
  (:func:`twistd_logger_args`, what the demo and the drills give their
  children) reads the same.

Routine lines are debug events (HTTP access lines, a report ACKed
``APPLIED``, the steps of a login): at the default level a log shows state
changes, warnings and errors.

A JSON line is one object: ``time`` (ISO 8601, UTC), ``level``,
``namespace``, ``message`` (the formatted text), ``failure`` (traceback
text, when the event carries one), then the event's own fields; a value JSON
cannot encode is written as its ``repr``.

Secrets (INTERFACES.md, "Nothing secret in logs").  Code never logs a token,
a session id or a password; :func:`redact_secrets` is the net under that
rule, applied to every line this module writes (the message, the string
fields, the traceback) and to the site's HTTP access log
(``tasknet.site.web.http``): the password of a URL (``scheme://user:PW@``)
and the value of a ``password=``, ``token=``, ``secret=`` or session
parameter (a query string, libpq's ``key=value`` connection string, a
cookie) become ``***``.  What a driver says about one particular ``--db``
target goes through ``tasknet.site.storage.engine.database.redact``, which also removes
that target's own password wherever it appears (libpq repeats a bad URI's
pieces in its message).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import (
    FileLogObserver,
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
    formatEventAsClassicLogText,
)
from zope.interface import provider

from tasknet.units import parse_size

JSON_ENV = "TASKNET_LOG_JSON"
FORMAT_ENV = "TASKNET_LOG_FORMAT"
LEVEL_ENV = "TASKNET_LOG_LEVEL"
_TRUE = {"1", "true", "yes", "on"}
#: ``--log-format`` / ``TASKNET_LOG_FORMAT`` values.
FORMATS = ("text", "json")
#: ``--log-level`` / ``TASKNET_LOG_LEVEL`` values.
LEVELS: dict[str, LogLevel] = {
    "debug": LogLevel.debug,
    "info": LogLevel.info,
    "warn": LogLevel.warn,
    "warning": LogLevel.warn,
    "error": LogLevel.error,
    "critical": LogLevel.critical,
}
#: What twistd's ``--logger`` names to use :func:`observer`.
OBSERVER = "tasknet.logging.observer"


@dataclass
class _Chosen:
    """What the role's options chose (None: the environment decides)."""

    format: str | None = None
    level: str | None = None
    #: twistd's log file when :func:`observer` writes it (None: stdout).
    path: str | None = None
    #: The reactor a SIGUSR1 rotates that file on (:func:`rotate_on`).
    reactor: IReactorFromThreads | None = None
    #: Bytes at which that file rotates, and how many rotated files are kept.
    max_size: int = 0
    keep: int = 0


#: ``--log-max-size`` and ``--log-keep`` by default: at most 100 MB of log.
DEFAULT_LOG_MAX_SIZE = "10MB"
DEFAULT_LOG_KEEP = 9


_chosen = _Chosen()

#: What replaces a secret.
REDACTED = "***"

# ``scheme://user:PASSWORD@host``: the password runs to the last ``@`` of
# the URL (an unescaped ``@`` in a password is still the password's).
_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://[^\s/?#@:\"'<>]*:)[^\s\"'<>]*@")
# ``password=...`` / ``token=...`` / ``tasknet_session=...``, in a query
# string, a cookie or libpq's ``key=value`` form (quoted or not; libpq also
# allows spaces around its ``=``, so the password keys do too, the others
# not: ``token = new_token()`` in a traceback's source line is no secret).
_SECRET_PARAMETER = re.compile(
    r"(?i)(\b(?:(?:password|passwd|pwd)\s*=\s*|"
    r"(?:secret|[a-z_]*token|tasknet_session|session(?:_?id)?)=))"
    r"('(?:[^'\\]|\\.)*'|[^\s&;,\"'<>]+)"
)


def redact_secrets(text: str) -> str:
    """``text`` with URL passwords and the values of secret parameters
    replaced by :data:`REDACTED`."""
    if "=" not in text and "@" not in text:
        return text
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", text)
    return _SECRET_PARAMETER.sub(lambda m: m.group(1) + REDACTED, text)


def json_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TASKNET_LOG_JSON`` asks for JSON lines."""
    env = os.environ if environ is None else environ
    return env.get(JSON_ENV, "").strip().lower() in _TRUE


def log_format(environ: Mapping[str, str] | None = None) -> str:
    """``text`` or ``json``: ``--log-format``, else ``TASKNET_LOG_FORMAT``,
    else ``TASKNET_LOG_JSON``, else text (an unknown value counts as unset)."""
    if _chosen.format is not None:
        return _chosen.format
    env = os.environ if environ is None else environ
    value = env.get(FORMAT_ENV, "").strip().lower()
    if value in FORMATS:
        return value
    return "json" if json_requested(env) else "text"


def log_level(environ: Mapping[str, str] | None = None) -> LogLevel:
    """The lowest level written: ``--log-level``, else ``TASKNET_LOG_LEVEL``, else info."""
    if _chosen.level is not None:
        return LEVELS[_chosen.level]
    env = os.environ if environ is None else environ
    return LEVELS.get(env.get(LEVEL_ENV, "").strip().lower(), LogLevel.info)


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
        "message": redact_secrets(formatEvent(dict(event))),
    }
    failure = event.get("log_failure")
    if failure is not None:
        record["failure"] = redact_secrets(failure.getTraceback())
    for key, value in event.items():
        # log_* keys are twisted's bookkeeping; legacy twisted.python.log
        # events add "message", "format", "isError", "system", "time" too.
        if key.startswith("log_") or key in record or key in {"format", "isError", "system"}:
            continue
        value = _jsonable(value)
        record[key] = redact_secrets(value) if isinstance(value, str) else value
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def json_observer(stream: IO[str]) -> ILogObserver:
    """An observer writing one JSON line per event to ``stream``."""

    @provider(ILogObserver)
    def write(event: Mapping[str, Any]) -> None:
        stream.write(event_as_json_line(event))
        stream.flush()

    return write


def _redacted_text(event: Mapping[str, Any]) -> str | None:
    text = formatEventAsClassicLogText(dict(event))
    return None if text is None else redact_secrets(text)


def text_observer(stream: IO[str]) -> ILogObserver:
    """twisted's classic text lines (as ``textFileLogObserver``), redacted."""
    return FileLogObserver(stream, _redacted_text)


def observer(stream: IO[str] | None = None, level: LogLevel | None = None) -> ILogObserver:
    """The tasknet log observer: JSON lines or text (:func:`log_format`),
    ``level`` (default :func:`log_level`) and above, to ``stream`` (default:
    twistd's log file when :func:`use_for_twistd` chose one, else stdout).

    This is the factory for ``twistd --logger tasknet.logging.observer``.
    """
    out = stream if stream is not None else _destination()
    inner = json_observer(out) if log_format() == "json" else text_observer(out)
    wanted = log_level() if level is None else level
    return FilteringLogObserver(inner, [LogLevelFilterPredicate(defaultLogLevel=wanted)])


def _destination() -> IO[str]:
    if _chosen.path is None:
        return sys.stdout
    from twisted.python.logfile import LogFile

    log_file = LogFile.fromFullPath(
        _chosen.path,
        rotateLength=_chosen.max_size or parse_size(DEFAULT_LOG_MAX_SIZE),
        maxRotatedFiles=_chosen.keep or DEFAULT_LOG_KEEP,
    )
    # As twistd's own log file: SIGUSR1 rotates it (unless a handler is set),
    # on the role's reactor, between two of its writes.
    reactor = _chosen.reactor
    if reactor is not None and not signal.getsignal(signal.SIGUSR1):

        def rotate(signum: int, frame: Any) -> None:
            reactor.callFromThread(log_file.rotate)

        signal.signal(signal.SIGUSR1, rotate)
    return log_file  # type: ignore[return-value]


def rotate_on(reactor: IReactorFromThreads | None) -> None:
    """Record the reactor twistd's log file is rotated on (SIGUSR1).

    Called by each role's ``makeService``, which twistd runs before it
    builds its logger (:func:`observer`), with the reactor the role runs
    on.  Without one (no role's service built, or a reactor without
    ``callFromThread``: a test's) SIGUSR1 is left alone."""
    _chosen.reactor = reactor


class LogOptions:
    """The log options of a role's twistd plugin (mixed into its
    ``usage.Options``; the role's ``postOptions`` calls :func:`use_for_twistd`)."""

    optParameters: list[list[Any]] = [
        [
            "log-format",
            None,
            None,
            "text, or json (one JSON object a line: time, level, namespace, message and "
            f"the event's fields, for log shippers). Default: ${FORMAT_ENV}, else text.",
        ],
        [
            "log-level",
            None,
            None,
            "The lowest level logged: debug (adds HTTP access lines, report ACKs, login "
            f"steps), info, warn or error. Default: ${LEVEL_ENV}, else info.",
        ],
        [
            "log-max-size",
            None,
            DEFAULT_LOG_MAX_SIZE,
            "Size at which twistd's --logfile is rotated (e.g. 10MB, 1GiB).",
        ],
        [
            "log-keep",
            None,
            str(DEFAULT_LOG_KEEP),
            "Rotated log files kept (FILE.1 .. FILE.N); older ones are removed, so the "
            "log takes at most (N + 1) x --log-max-size.",
        ],
    ]


def use_for_twistd(options: Any) -> None:
    """Apply :class:`LogOptions` from a role's ``postOptions``.

    Checks the values (``usage.UsageError``), records them for
    :func:`observer`, and, when the plugin runs under twistd (``options.parent``
    is twistd's ``ServerOptions``) without ``--syslog`` or a ``--logger`` of
    its own, makes twistd use :func:`observer`, writing where twistd would
    have written (the module doc).  Outside twistd (a test parsing the
    options) nothing but the check and the record happens."""
    from twisted.python import usage

    fmt = options.get("log-format")
    level = options.get("log-level")
    if fmt is not None:
        fmt = fmt.strip().lower()
        if fmt not in FORMATS:
            raise usage.UsageError(f"--log-format must be text or json, got {fmt!r}")
    if level is not None:
        level = level.strip().lower()
        if level not in LEVELS:
            raise usage.UsageError(f"--log-level must be debug, info, warn or error, got {level!r}")
    max_size, keep = _rotation(options)
    parent = getattr(options, "parent", None)
    if parent is None:
        return
    _chosen.format, _chosen.level = fmt, level
    _chosen.max_size, _chosen.keep = max_size, keep
    logger = parent.get("logger")
    if parent.get("syslog") or logger not in (None, OBSERVER):
        if fmt is not None or level is not None:
            other = "--syslog" if parent.get("syslog") else f"--logger {logger}"
            raise usage.UsageError(
                f"--log-format and --log-level choose tasknet's own log lines; twistd's"
                f" {other} replaces them: give one or the other"
            )
        return
    logfile = parent.get("logfile") or None
    nodaemon = bool(parent.get("nodaemon"))
    if logfile == "-":
        if not nodaemon:
            raise usage.UsageError("a daemon cannot log to stdout (--logfile -): add -n")
        logfile = None
    elif logfile is None and not nodaemon:
        logfile = "twistd.log"
    _chosen.path = logfile
    parent["logger"] = OBSERVER


#: Below this a log file would rotate on every few lines.
MIN_LOG_MAX_SIZE = 10_000


def _rotation(options: Any) -> tuple[int, int]:
    """``(--log-max-size in bytes, --log-keep)``, checked (``UsageError``)."""
    from twisted.python import usage

    size_text = options.get("log-max-size") or DEFAULT_LOG_MAX_SIZE
    keep_text = options.get("log-keep") or str(DEFAULT_LOG_KEEP)
    try:
        max_size = parse_size(str(size_text))
    except ValueError as e:
        raise usage.UsageError(f"--log-max-size: {e}") from None
    if max_size < MIN_LOG_MAX_SIZE:
        raise usage.UsageError(
            f"--log-max-size must be at least {MIN_LOG_MAX_SIZE} bytes, got {size_text!r}"
        )
    try:
        keep = int(str(keep_text))
    except ValueError:
        keep = 0
    if not 1 <= keep <= 1000:
        raise usage.UsageError(f"--log-keep must be a whole number 1..1000, got {keep_text!r}")
    return max_size, keep


def twistd_logger_args() -> list[str]:
    """``twistd`` arguments that route a child's logs through :func:`observer`.

    The child inherits the environment, so ``TASKNET_LOG_FORMAT`` and
    ``TASKNET_LOG_LEVEL`` decide its format and level too.
    """
    return ["--logger", OBSERVER]
