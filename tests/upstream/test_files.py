"""Archive files: Range (206/416), bandwidth, slow_body and reset_mid_body."""

from __future__ import annotations

import time

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults
from twisted.web.client import ResponseFailed

from tasknet.upstream import catalog
from tasknet.upstream.testing import RunningUpstream, start_upstream
from tests.eventually import eventually
from tests.upstream.conftest import Client

GID = 42
SIZE = catalog.gallery(GID).size
DATA = catalog.archive_bytes(GID)
FILE = f"/files/{GID}-1.bin"


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=100-199", 100, 200),
        ("bytes=0-0", 0, 1),
        (f"bytes={SIZE - 10}-", SIZE - 10, SIZE),
        ("bytes=70000-", 70000, SIZE),
        ("bytes=-500", SIZE - 500, SIZE),
        (f"bytes=5-{SIZE + 1000}", 5, SIZE),
        (f"bytes=-{SIZE + 1000}", 0, SIZE),
    ],
)
@pytest_twisted.ensureDeferred
async def test_range_gives_206_with_the_right_slice(
    client: Client, header: str, start: int, end: int
) -> None:
    response, body, failure = await client.raw("GET", FILE, {"Range": header})
    assert (response.code, failure) == (206, None)
    assert response.headers.getRawHeaders("content-range") == [f"bytes {start}-{end - 1}/{SIZE}"]
    assert response.length == end - start
    assert body == DATA[start:end]
    stats = await client.stats()
    assert stats["rangedGets"] == {f"{GID}-1.bin": 1}
    assert stats["fileGets"] == {f"{GID}-1.bin": 1}


@pytest.mark.parametrize("header", [f"bytes={SIZE}-", f"bytes={SIZE + 5}-{SIZE + 10}", "bytes=-0"])
@pytest_twisted.ensureDeferred
async def test_unsatisfiable_range_is_416(client: Client, header: str) -> None:
    response, body, _ = await client.raw("GET", FILE, {"Range": header})
    assert response.code == 416
    assert response.headers.getRawHeaders("content-range") == [f"bytes */{SIZE}"]
    assert b"range_not_satisfiable" in body


@pytest.mark.parametrize("header", ["bytes=1-2,5-6", "items=0-5", "bytes=9-3", "bytes=x-"])
@pytest_twisted.ensureDeferred
async def test_unusable_range_is_ignored_and_the_whole_file_sent(
    client: Client, header: str
) -> None:
    response, body, failure = await client.raw("GET", FILE, {"Range": header})
    assert (response.code, failure) == (200, None)
    assert body == DATA


@pytest_twisted.ensureDeferred
async def test_resume_by_range_reassembles_the_file(client: Client) -> None:
    _, head, _ = await client.raw("GET", FILE, {"Range": "bytes=0-99999"})
    _, tail, _ = await client.raw("GET", FILE, {"Range": "bytes=100000-"})
    assert head + tail == DATA


@pytest_twisted.ensureDeferred
async def test_any_submission_number_serves_the_same_bytes(client: Client) -> None:
    _, body, _ = await client.raw("GET", f"/files/{GID}-7.bin")
    assert body == DATA


@pytest_twisted.ensureDeferred
async def test_bandwidth_throttles_file_bodies_only() -> None:
    length = 200_000
    bandwidth = 400_000
    throttled = await start_upstream(bandwidth=bandwidth)
    unthrottled = await start_upstream()
    try:
        timings = {}
        for name, up in (("slow", throttled), ("fast", unthrottled)):
            client = Client(up.base_url)
            started = time.monotonic()
            response, body, _ = await client.raw("GET", FILE, {"Range": f"bytes=0-{length - 1}"})
            timings[name] = time.monotonic() - started
            assert body == DATA[:length]
        assert timings["slow"] >= length / bandwidth * 0.5
        assert timings["fast"] < timings["slow"]
        # JSON answers are not throttled: a POST is quick even at 1 byte/s
        tiny = await start_upstream(bandwidth=1)
        try:
            started = time.monotonic()
            code, _ = await Client(tiny.base_url).json("POST", f"/api/galleries/{GID}/archive")
            assert code == 200 and time.monotonic() - started < 5.0  # 60 s if throttled
        finally:
            await tiny.stop()
    finally:
        await throttled.stop()
        await unthrottled.stop()


@pytest_twisted.ensureDeferred
async def test_slow_body_fault_slows_a_file(client: Client) -> None:
    await client.put_faults(
        [{"path": "/files/*", "fault": "slow_body", "params": {"bytes_per_s": 400_000}}]
    )
    started = time.monotonic()
    _, body, failure = await client.raw("GET", FILE, {"Range": "bytes=0-99999"})
    assert time.monotonic() - started >= 100_000 / 400_000 * 0.5
    assert (body, failure) == (DATA[:100_000], None)


@pytest.mark.parametrize("after", [0, 1, 70_000, SIZE - 1])
@pytest_twisted.ensureDeferred
async def test_reset_mid_body_gives_a_short_body(client: Client, after: int) -> None:
    await client.put_faults(
        [{"path": "/files/*", "fault": "reset_mid_body", "params": {"after_bytes": after}}]
    )
    response, body, failure = await client.raw("GET", FILE)
    assert response.code == 200 and response.length == SIZE
    assert failure is not None and failure.check(ResponseFailed)
    assert body == DATA[:after]


@pytest_twisted.ensureDeferred
async def test_reset_mid_body_past_the_end_sends_everything(client: Client) -> None:
    await client.put_faults(
        [{"path": "/files/*", "fault": "reset_mid_body", "params": {"after_bytes": SIZE}}]
    )
    _, body, failure = await client.raw("GET", FILE)
    assert (body == DATA, failure) == (True, None)


@pytest_twisted.ensureDeferred
async def test_stop_during_a_slow_download_aborts_it_cleanly() -> None:
    up = await start_upstream(bandwidth=50_000)
    client = Client(up.base_url)
    pending = client.request("GET", FILE)
    await eventually(lambda: up.app.journal.file_gets[f"{GID}-1.bin"] == 1)
    response = await pending
    await up.stop()
    with pytest.raises(ResponseFailed):
        await response.content()


@pytest_twisted.ensureDeferred
async def test_parallel_downloads_each_get_their_bytes(upstream: RunningUpstream) -> None:
    client = Client(upstream.base_url)
    downloads = [
        Deferred.fromCoroutine(client.raw("GET", FILE, {"Range": f"bytes={i * 1000}-"}))
        for i in range(4)
    ]
    results = await gatherResults(downloads)
    for i, (_, body, failure) in enumerate(results):
        assert (failure, body == DATA[i * 1000 :]) == (None, True)
    assert (await client.stats())["rangedGets"] == {f"{GID}-1.bin": 4}
