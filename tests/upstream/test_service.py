"""The twistd plugin (Options, makeService, a real process) and the test helper."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.python import usage
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from tasknet.upstream.service import DEFAULT_HTTP, Options, makeService
from tasknet.upstream.testing import RunningUpstream, running_upstream, start_upstream
from tests.eventually import eventually
from tests.upstream.conftest import Client

TWISTD = Path(sys.executable).with_name("twistd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_options_defaults() -> None:
    options = Options()
    options.parseOptions([])
    assert options["http"] == DEFAULT_HTTP == "tcp:7200:interface=127.0.0.1"
    assert options["bandwidth"] is None
    assert options["seed"] == 0


def test_options_parse_bandwidth() -> None:
    options = Options()
    options.parseOptions(["--bandwidth", "250000", "--http", "tcp:0", "--seed", "7"])
    assert (options["bandwidth"], options["http"], options["seed"]) == (250000.0, "tcp:0", 7)


@pytest.mark.parametrize("value", ["0", "-5", "fast"])
def test_options_refuse_bad_bandwidth(value: str) -> None:
    with pytest.raises(usage.UsageError, match="--bandwidth"):
        Options().parseOptions(["--bandwidth", value])


@pytest_twisted.ensureDeferred
async def test_stopping_the_service_drops_hung_requests() -> None:
    port = free_port()
    options = Options()
    options.parseOptions(["--http", f"tcp:{port}:interface=127.0.0.1"])
    service: Any = makeService(options)
    service.startService()
    client = Client(f"http://127.0.0.1:{port}")
    try:
        await client.put_faults([{"path": "/api/galleries/*", "fault": "timeout"}])
        pending = client.request("GET", "/api/galleries/5")
        await eventually(lambda: len(service.app._hung) == 1)
    finally:
        await service.stopService()
    with pytest.raises((ResponseNeverReceived, ResponseFailed)):
        await pending


@pytest.mark.slow
def test_twistd_runs_the_plugin_as_a_real_process(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            str(TWISTD),
            "-n",
            "--pidfile=",
            "tasknet-upstream",
            "--http",
            f"tcp:{port}:interface=127.0.0.1",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/galleries/42", timeout=2) as response:
                    assert json.load(response)["gid"] == 42
                break
            except OSError:
                assert process.poll() is None, process.stdout.read()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "twistd did not answer in time"
                time.sleep(0.05)
        request = urllib.request.Request(f"{base}/api/galleries/42/archive", method="POST")
        with urllib.request.urlopen(request, timeout=2) as response:
            assert json.load(response)["archiveUrl"] == f"{base}/files/42-1.bin"
        with urllib.request.urlopen(f"{base}/_drill/stats", timeout=2) as response:
            assert json.load(response)["posts"] == {"42": 1}
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=10)[0].decode()
    # twistd re-raises the SIGTERM it handled once it has shut down cleanly
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Server Shut Down." in output
    assert f"tasknet-upstream listening on tcp:{port}:interface=127.0.0.1" in output


@pytest_twisted.inlineCallbacks
def test_start_upstream_works_from_inline_callbacks() -> Any:
    up: RunningUpstream = yield start_upstream()
    assert up.base_url == f"http://127.0.0.1:{up.port}"
    assert up.file_url(5, 2) == f"{up.base_url}/files/5-2.bin"
    yield up.stop()


@pytest_twisted.ensureDeferred
async def test_running_upstream_helpers_act_in_process() -> None:
    async with running_upstream(seed=3) as up:
        client = Client(up.base_url)
        up.set_faults([{"method": "POST", "path": "/api/galleries/*/archive", "fault": "reject"}])
        assert (await client.json("POST", "/api/galleries/1/archive"))[0] == 403
        up.clear_faults()
        assert (await client.json("POST", "/api/galleries/1/archive"))[0] == 200
        assert up.stats()["posts"] == {"1": 1}
        over_http = await client.stats()
        assert {k: v for k, v in over_http.items() if k != "hung"} == up.stats()
        assert [e["gid"] for e in up.journal()["entries"]] == [1]
        up.reset()
        assert up.stats()["posts"] == {}
    assert up.app.site().open_connections == 0
