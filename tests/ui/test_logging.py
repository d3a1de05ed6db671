"""Structured logs: JSON lines carry the event's fields; twistd picks the observer."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.logger import Logger, LogLevel, LogPublisher, formatEvent, globalLogPublisher

from tasknet import logging as tlog
from tasknet.cli.jsonhttp import request
from tasknet.process import free_port
from tasknet.runtime import SeededEntropy


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


SECRETS = {
    "postgresql://tasknet:hunter2@db.example/tasknet": "hunter2",
    "GET /api/events?token=tok-123 HTTP/1.1": "tok-123",
    "Cookie: tasknet_session=sess-456": "sess-456",
    "host=db password='two words' user=x": "two words",
    "postgresql://u@h/db?sslmode=require&password=pw-789": "pw-789",
}


def test_redact_secrets_removes_url_passwords_and_secret_parameters() -> None:
    for text, secret in SECRETS.items():
        redacted = tlog.redact_secrets(text)
        assert secret not in redacted, text
        assert tlog.REDACTED in redacted, text
    assert tlog.redact_secrets("nothing to hide: gid=5") == "nothing to hide: gid=5"
    assert (
        tlog.redact_secrets("postgresql://tasknet:hunter2@db.example/tasknet")
        == "postgresql://tasknet:***@db.example/tasknet"
    )


@pytest.mark.parametrize("json_on", [True, False], ids=["json", "text"])
def test_the_observer_redacts_messages_fields_and_tracebacks(
    monkeypatch: pytest.MonkeyPatch, json_on: bool
) -> None:
    monkeypatch.setenv(tlog.JSON_ENV, "1" if json_on else "0")
    out = io.StringIO()
    publisher = LogPublisher(tlog.observer(out))
    log = Logger(namespace="tasknet.test", observer=publisher)  # type: ignore[arg-type]
    log.info("connecting to {url}", url="postgresql://tasknet:hunter2@db.example/tasknet")
    log.info("handshake {uri}", uri="/api/events?token=tok-123")
    try:
        raise RuntimeError("bad URI postgresql://u@h/db?password=pw-789")
    except RuntimeError:
        log.failure("failed")
    text = out.getvalue()
    for secret in ("hunter2", "tok-123", "pw-789"):
        assert secret not in text
    assert "postgresql://tasknet:***@db.example/tasknet" in text


# -- issue 21, item 9: logs a person can read ---------------------------------------


@pytest.fixture
def chosen(monkeypatch: pytest.MonkeyPatch) -> tlog._Chosen:
    """A fresh record of the roles' log options (the module keeps one per process)."""
    fresh = tlog._Chosen()
    monkeypatch.setattr(tlog, "_chosen", fresh)
    for name in (tlog.FORMAT_ENV, tlog.JSON_ENV, tlog.LEVEL_ENV):
        monkeypatch.delenv(name, raising=False)
    return fresh


def test_format_and_level_come_from_the_environment(chosen: tlog._Chosen) -> None:
    assert tlog.log_format({}) == "text"
    assert tlog.log_format({"TASKNET_LOG_FORMAT": "json"}) == "json"
    assert tlog.log_format({"TASKNET_LOG_FORMAT": " JSON "}) == "json"
    assert tlog.log_format({"TASKNET_LOG_JSON": "1"}) == "json"  # the older spelling
    assert tlog.log_format({"TASKNET_LOG_FORMAT": "text", "TASKNET_LOG_JSON": "1"}) == "text"
    assert tlog.log_format({"TASKNET_LOG_FORMAT": "xml"}) == "text"
    assert tlog.log_level({}) == LogLevel.info
    assert tlog.log_level({"TASKNET_LOG_LEVEL": "debug"}) == LogLevel.debug
    assert tlog.log_level({"TASKNET_LOG_LEVEL": "nonsense"}) == LogLevel.info
    chosen.format, chosen.level = "json", "warn"  # the options win over the environment
    assert tlog.log_format({"TASKNET_LOG_FORMAT": "text"}) == "json"
    assert tlog.log_level({"TASKNET_LOG_LEVEL": "debug"}) == LogLevel.warn


def test_the_level_from_the_environment_shows_debug_events(
    chosen: tlog._Chosen, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tlog.LEVEL_ENV, "debug")
    monkeypatch.setenv(tlog.FORMAT_ENV, "json")
    out = io.StringIO()
    log = Logger(namespace="tasknet.test", observer=LogPublisher(tlog.observer(out)))  # type: ignore[arg-type]
    log.debug("routine {n}", n=1)
    [record] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert record["level"] == "debug" and record["message"] == "routine 1"
    assert {"time", "level", "namespace", "message"} <= record.keys()


def _twistd_options(argv: list[str]) -> Any:
    from twisted.scripts.twistd import ServerOptions

    config = ServerOptions()
    config.parseOptions(argv)
    return config


def test_the_roles_make_twistd_use_the_tasknet_observer(chosen: tlog._Chosen) -> None:
    config = _twistd_options(["-n", "tasknet-upstream"])
    assert config["logger"] is tlog.observer and chosen.path is None  # stdout under -n
    config = _twistd_options(
        ["-n", "--logfile", "up.log", "tasknet-upstream", "--log-format", "json"]
    )
    assert config["logger"] is tlog.observer
    assert (chosen.path, chosen.format) == ("up.log", "json")
    _twistd_options(["tasknet-node", "--log-level", "DEBUG", "--node-id", "n1", "--secret", "s"])
    assert chosen.path == "twistd.log" and chosen.level == "debug"  # a daemon's file
    # An explicit --logger of ours is the same observer, with the options.
    config = _twistd_options(
        ["-n", "--logger", tlog.OBSERVER, "tasknet-upstream", "--log-format", "text"]
    )
    assert config["logger"] is tlog.observer and chosen.format == "text"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "tasknet-upstream", "--log-format", "xml"], "--log-format must be text or json"),
        (["-n", "tasknet-upstream", "--log-level", "loud"], "--log-level must be debug"),
        (
            ["-n", "--syslog", "tasknet-upstream", "--log-format", "json"],
            "twistd's --syslog replaces them",
        ),
        (
            [
                "-n",
                "--logger",
                "twisted.logger.jsonFileLogObserver",
                "tasknet-upstream",
                "--log-level",
                "debug",
            ],
            "twistd's --logger twisted.logger.jsonFileLogObserver replaces them",
        ),
    ],
)
def test_log_options_that_cannot_apply_are_refused(
    chosen: tlog._Chosen, argv: list[str], message: str
) -> None:
    from twisted.python.usage import UsageError

    with pytest.raises(UsageError) as refused:
        _twistd_options(argv)
    assert message in str(refused.value)


def test_twistd_log_format_json_without_logger(tmp_path: Path) -> None:
    """``--log-format json`` alone (no twistd ``--logger``): JSON lines; the
    upstream's access lines are not among them at the default level, and
    are debug events at ``--log-level debug``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKNET_LOG")}
    for level, access_expected in (("info", False), ("debug", True)):
        port = free_port()
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("twistd")),
                "-n",
                "--pidfile=",
                "tasknet-upstream",
                "--http",
                f"tcp:{port}:interface=127.0.0.1",
                "--log-format",
                "json",
                "--log-level",
                level,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        try:
            records = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                records.append(json.loads(line))
                if "listening on" in records[-1]["message"]:
                    break
            reply = request("GET", f"http://127.0.0.1:{port}/_drill/stats")
            assert reply.ok
        finally:
            proc.terminate()
            rest, _ = proc.communicate(timeout=30)
        records += [json.loads(line) for line in rest.splitlines() if line.strip()]
        access = [r for r in records if r["namespace"] == "tasknet.access"]
        assert bool(access) is access_expected, records
        if access:
            assert access[0]["level"] == "debug" and "GET /_drill/stats" in access[0]["message"]
        messages = " ".join(r["message"] for r in records)
        assert "Starting factory" not in messages


def test_access_lines_are_debug_events_unless_a_file_is_given(tmp_path: Path) -> None:
    from twisted.web.resource import Resource

    from tasknet.weblog import ACCESS_NAMESPACE, QuietSite

    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        site = QuietSite(Resource())
        site.startFactory()
        site.logFile.write('"127.0.0.1" - - [x] "GET /{odd} HTTP/1.1" 200 1 "-" "-"\n')
        site.stopFactory()
    finally:
        globalLogPublisher.removeObserver(events.append)
    [event] = [e for e in events if e.get("log_namespace") == ACCESS_NAMESPACE]
    assert event["log_level"] == LogLevel.debug
    assert formatEvent(event) == '"127.0.0.1" - - [x] "GET /{odd} HTTP/1.1" 200 1 "-" "-"'
    assert QuietSite.noisy is False

    path = tmp_path / "access.log"
    site = QuietSite(Resource(), logPath=str(path))
    site.startFactory()
    site.logFile.write("a line\n")
    site.stopFactory()
    assert path.read_text() == "a line\n"


def test_access_lines_carry_the_clock_s_date_and_no_timer_runs(tmp_path: Path) -> None:
    """The date is formatted as a line is written, on the site's clock:
    no once-a-second timer wakes the server."""
    from twisted.internet.task import Clock
    from twisted.web.resource import Resource
    from twisted.web.test.requesthelper import DummyRequest

    from tasknet.weblog import QuietSite

    clock = Clock()
    clock.advance(86400 * 365)  # 1971-01-01
    path = tmp_path / "access.log"
    site = QuietSite(Resource(), logPath=str(path), reactor=clock)
    site.startFactory()
    assert clock.getDelayedCalls() == []
    clock.advance(3600.5)
    request = DummyRequest([b""])
    request.method = b"GET"
    request.code, request.sentLength = 200, 0
    site.log(request)
    site.stopFactory()
    assert "[01/Jan/1971:01:00:00 +0000]" in path.read_text()


def test_outgoing_http_is_quiet_and_dials_ip_literals_without_the_resolver() -> None:
    from twisted.internet import reactor
    from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint
    from twisted.web.client import URI

    from tasknet import netclient

    pool = netclient.quiet_pool(reactor, persistent=False)
    assert pool._factory.noisy is False
    assert isinstance(netclient.tcp_endpoint(reactor, "127.0.0.1", 80), TCP4ClientEndpoint)
    assert isinstance(netclient.tcp_endpoint(reactor, b"::1", 80), TCP4ClientEndpoint)
    assert isinstance(netclient.tcp_endpoint(reactor, "upstream.example", 80), HostnameEndpoint)
    endpoints = netclient.DirectEndpoints(reactor)
    first = endpoints.endpointForURI(URI.fromBytes(b"http://127.0.0.1:7200/files/x"))
    assert isinstance(first, TCP4ClientEndpoint)
    assert endpoints.endpointForURI(URI.fromBytes(b"http://127.0.0.1:7200/y")) is first


def test_the_reconnect_delay_is_rounded() -> None:
    from tasknet.node.link import login_backoff

    class Factory:
        failed_logins = 0

    delay = login_backoff(lambda attempt: 3.927322703320021, Factory())  # type: ignore[arg-type]
    assert delay(1) == 3.9
    assert login_backoff(lambda attempt: 0.05, Factory())(1) == 0.05  # a test's quick retry


def _captured(events: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [e for e in events if text in formatEvent(e)]


def test_a_legacy_node_ignores_the_v2_hello_without_a_line_at_info() -> None:
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from tasknet.node.link import SiteLinkFactory
    from tasknet.protocol.messages import ProtocolHello

    factory = SiteLinkFactory(
        "n1",
        "secret",
        handler=None,  # type: ignore[arg-type]
        protocol=1,
        clock=Clock(),
        entropy=SeededEntropy(0),
    )
    link = factory.buildProtocol(None)
    link.makeConnection(StringTransport())
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        link.frameReceived(ProtocolHello.TYPE, b'{"protocolVersion": 2, "features": []}')
        link.authenticated = True  # after login an unknown type is news: info
        link.frameReceived(99, b"{}")
    finally:
        globalLogPublisher.removeObserver(events.append)
        link.connectionLost(None)
    hello, other = _captured(events, "ignoring a frame of unknown type")
    assert hello["log_level"] == LogLevel.debug and hello["type"] == ProtocolHello.TYPE
    assert other["log_level"] == LogLevel.info and other["type"] == 99


@pytest_twisted.ensureDeferred
async def test_a_routine_ack_is_a_debug_line_and_a_duplicate_is_not(tmp_path: Path) -> None:
    from tasknet.protocol.messages import TaskReport, TaskReportAck
    from tests.node.test_reporter_clock import DEBOUNCE, advance, on_clock

    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        async with on_clock(tmp_path) as (store, clock, reporter, link):
            await advance(clock, reporter, DEBOUNCE)
            [first] = link.sent
            assert isinstance(first, TaskReport)
            await reporter.ack_received(TaskReportAck(first.report_id, "APPLIED"))
            await store.set_progress(7, "op-7", 0.5, 100)
            reporter.changed()
            await advance(clock, reporter, DEBOUNCE)
            second = link.sent[-1]
            await reporter.ack_received(TaskReportAck(second.report_id, "DUPLICATE"))
    finally:
        globalLogPublisher.removeObserver(events.append)
    applied, duplicate = _captured(events, "ACKed:")
    assert applied["log_level"] == LogLevel.debug and applied["result"] == "APPLIED"
    assert duplicate["log_level"] == LogLevel.info and duplicate["result"] == "DUPLICATE"
