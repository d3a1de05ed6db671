"""Nothing secret in the site's logs (INTERFACES.md, "Sessions and
downloads"): tokens, session ids and ``?token=`` never reach a log event
(twisted.web's access line included), and under ``twistd`` the log file
(``--logfile``) and every file the site creates are ``0600``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.logger import formatEvent, globalLogPublisher

from tasknet.process import free_port
from tasknet.site.web.http import access_log_line
from tasknet.startup import twistd_log_file
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, running_site, site_options
from tests.site.rawhttp import exchange, request_bytes, websocket_upgrade

TWISTD = str(Path(sys.executable).with_name("twistd"))


def _text(event: dict) -> str:
    """Everything an observer could write of ``event``."""
    parts = [formatEvent(event)]
    parts += [repr(value) for key, value in event.items() if key != "log_logger"]
    failure = event.get("log_failure")
    if failure is not None:
        parts.append(failure.getTraceback())
    return "\n".join(parts)


@pytest_twisted.ensureDeferred
async def test_no_token_or_session_id_reaches_a_log_event(db_target):
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    upstream = await start_upstream()
    try:
        async with running_site(site_options(db_target, upstream.base_url)) as site:
            _, token = add_user(db_target, "alice")
            port = site.service.http_port.getHost().port
            host = f"127.0.0.1:{port}"
            origin = f"http://{host}"
            # A sign-in; its session id is the secret to look for.
            answer, _ = await exchange(
                port,
                request_bytes(
                    "POST",
                    "/api/session",
                    {"Host": host, "Origin": origin, "Content-Type": "application/json"},
                    json.dumps({"token": token}).encode(),
                ),
            )
            session_id = answer.headers["set-cookie"][0].split(";")[0].partition("=")[2]
            cookie = f"tasknet_session={session_id}"
            requests = [
                # The WebSocket handshake refused with 403 (a cookie from
                # another origin) and 401, both with a token in the URL.
                request_bytes(
                    "GET",
                    f"/api/events?token={token}",
                    {"Host": host, "Cookie": cookie, "Origin": "http://evil.example"},
                ),
                websocket_upgrade(f"{token}x"),
                request_bytes("GET", f"/api/tasks?token={token}", {"Host": host}),
                request_bytes(
                    "GET",
                    "/api/me",
                    {"Host": host, "Cookie": cookie, "Referer": f"{origin}/?token={token}"},
                ),
                request_bytes("GET", "/api/me", {"Authorization": f"Bearer {token}"}),
                request_bytes(
                    "POST",
                    "/api/tasks",
                    {"Host": host, "Cookie": cookie, "Content-Type": "application/json"},
                    json.dumps({"gid": 5, "token": "upstream-secret"}).encode(),
                ),
                request_bytes("DELETE", "/api/session", {"Host": host, "Cookie": cookie}),
            ]
            statuses = []
            for raw in requests:
                answer, _ = await exchange(port, raw)
                statuses.append(answer.status)
            assert statuses == [403, 401, 401, 200, 200, 403, 403]
    finally:
        await upstream.stop()
        globalLogPublisher.removeObserver(events.append)
    text = "\n".join(_text(event) for event in events)
    assert "/api/events?token=***" in text  # the access log saw the handshake
    assert 'HTTP/1.1" 403' in text
    for secret in (token, session_id):
        assert secret not in text


def test_the_access_log_line_redacts_every_secret_parameter():
    from twisted.web.test.requesthelper import DummyRequest

    request = DummyRequest([b"api", b"events"])
    request.uri = b"/api/events?a=1&token=s3cr3t&session_id=abc&password=pw"
    request.code, request.sentLength, request.clientproto = 403, 0, b"HTTP/1.1"
    request.requestHeaders.setRawHeaders(b"referer", [b"http://x/?access_token=t0k"])
    line = access_log_line("[01/Jan/2026:00:00:00 +0000]", request)
    assert "token=***" in line and "session_id=***" in line and "password=***" in line
    assert "access_token=***" in line and "a=1" in line
    for secret in ("s3cr3t", "abc", "pw&", "t0k"):
        assert secret not in line


# -- files under twistd ------------------------------------------------------------


def test_twistd_log_file_is_read_from_twistds_own_options():
    assert twistd_log_file("tasknet-site", ["-n", "--logfile=a.log", "tasknet-site"]) == "a.log"
    assert twistd_log_file("tasknet-site", ["-n", "-l", "b.log", "tasknet-site", "--db", "x"]) == (
        "b.log"
    )
    assert twistd_log_file("tasknet-site", ["-n", "--logf", "c.log", "tasknet-site"]) == "c.log"
    assert twistd_log_file("tasknet-site", ["tasknet-site"]) == "twistd.log"  # a daemon's
    assert twistd_log_file("tasknet-site", ["-n", "tasknet-site"]) is None  # stdout
    assert twistd_log_file("tasknet-site", ["-n", "-l", "-", "tasknet-site"]) is None
    assert twistd_log_file("tasknet-site", ["-n", "--logger", "x.y", "tasknet-site"]) is None
    assert twistd_log_file("tasknet-site", ["-n", "--logfile=a.log", "web"]) is None
    assert twistd_log_file("tasknet-site", ["-q", "tests/site"]) is None  # pytest's argv


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _run_site_until_up(tmp_path: Path, logfile: Path, token_url: bool = True) -> str:
    """``twistd -n --logfile`` a real site, ask it a few things, stop it;
    the log's text."""
    http_port, nodes_port = free_port(), free_port()
    db = tmp_path / "site.sqlite"
    proc = subprocess.Popen(
        [
            TWISTD,
            "-n",
            f"--pidfile={tmp_path / 'site.pid'}",
            f"--logfile={logfile}",
            "tasknet-site",
            "--db",
            str(db),
            "--demo",
            "--http",
            f"tcp:{http_port}:interface=127.0.0.1",
            "--nodes",
            f"tcp:{nodes_port}:interface=127.0.0.1",
            "--upstream",
            "http://127.0.0.1:1",
            # Access lines are debug events: shown at this level, in --logfile.
            "--log-level",
            "debug",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(  # noqa: S310 -- loopback
                    f"http://127.0.0.1:{http_port}/healthz", timeout=2
                ):
                    break
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = logfile.read_text() if logfile.exists() else ""
                    raise AssertionError(f"site did not start: {e}; {log}") from e
                time.sleep(0.2)
        try:
            urllib.request.urlopen(  # noqa: S310 -- loopback
                f"http://127.0.0.1:{http_port}/api/events?token=demo-secret-token", timeout=5
            )
        except urllib.error.HTTPError as e:
            assert e.code == 401
        assert _mode(db) == 0o600
        assert _mode(tmp_path / "site.pid") == 0o600
        assert _mode(logfile) == 0o600
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return logfile.read_text()


def test_under_twistd_the_log_file_and_every_file_the_site_creates_are_0600(tmp_path):
    logfile = tmp_path / "site.log"
    text = _run_site_until_up(tmp_path, logfile)
    assert "/api/events?token=***" in text  # the access line, redacted
    assert "demo-secret-token" not in text
    assert _mode(logfile) == 0o600
    created = [p for p in tmp_path.iterdir() if p.is_file()]
    assert {p.name for p in created} >= {"site.sqlite", "site.log"}
    for path in created:
        assert _mode(path) == 0o600, path.name


def test_an_existing_log_file_is_tightened_to_0600(tmp_path):
    logfile = tmp_path / "site.log"
    logfile.write_text("an old line\n")
    logfile.chmod(0o644)
    text = _run_site_until_up(tmp_path, logfile)
    assert text.startswith("an old line\n")
    assert _mode(logfile) == 0o600


@pytest.mark.parametrize(
    "url, password",
    [
        ("postgresql://tasknet:pw-in-userinfo@127.0.0.1:1/tasknet", "pw-in-userinfo"),
        ("postgresql://tasknet@127.0.0.1:1/tasknet?password=pw-in-query", "pw-in-query"),
        # libpq's parse error repeats the bad token (the password) as written.
        ("postgresql://tasknet:pw%zz-bad@127.0.0.1:1/tasknet", "pw%zz-bad"),
        ("postgresql://tasknet:pw-in-bad-uri@[::1/tasknet", "pw-in-bad-uri"),
    ],
)
def test_a_start_up_failure_names_the_database_without_its_password(tmp_path, url, password):
    result = subprocess.run(
        [
            TWISTD,
            "-n",
            f"--pidfile={tmp_path / 'site.pid'}",
            "tasknet-site",
            "--db",
            url,
            "--http",
            "tcp:0:interface=127.0.0.1",
            "--nodes",
            "tcp:0:interface=127.0.0.1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "tasknet-site could not start: database postgresql://tasknet" in output, output
    assert password not in output
    assert password.split("%")[0] not in output
