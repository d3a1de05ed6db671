"""tasknet.node.sendfile: the kernel's sendfile on plain TCP, blocks read
and written under TLS; both hash right, keep the connection usable, and let
go of the file and the slot when the client goes away mid-body."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_twisted

from tasknet.node import sendfile
from tests.eventually import eventually
from tests.node.test_serve_support import (
    content_of,
    open_files_of,
    parse_answers,
    request_bytes,
    serving,
)

GID = 9090
#: Larger than any socket buffer on loopback: the sender meets EAGAIN.
BIG = 24 * 1024 * 1024


@pytest.fixture
def sendfile_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes moved by each ``os.sendfile`` call (the real call, counted)."""
    calls: list[int] = []
    real: Callable[[int, int, int | None, int], int] = os.sendfile

    def counted(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        sent = real(out_fd, in_fd, offset, count)
        calls.append(sent)
        return sent

    monkeypatch.setattr(sendfile.os, "sendfile", counted)
    return calls


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest_twisted.ensureDeferred
async def test_whole_files_and_ranges_hash_right(
    tmp_path: Path, tls: bool, sendfile_calls: list[int]
) -> None:
    async with serving(tmp_path, tls=tls) as served:
        archive = await served.hold(GID, content_of(BIG))
        link = served.link(GID)
        whole = await served.get(link.path)
        assert whole.status == 200
        assert hashlib.sha256(whole.body).hexdigest() == archive.sha256
        for first, last in ((0, 0), (1, 65_536), (BIG - 1_000_001, BIG - 2), (7, BIG - 1)):
            part = await served.get(link.path, headers={"Range": f"bytes={first}-{last}"})
            assert part.status == 206
            assert part.body == archive.content[first : last + 1], (first, last)
        # One connection, two answers: the sender hands the connection back.
        both = request_bytes(link.path, headers={"Range": "bytes=10-99"}, close=False)
        both += request_bytes(link.path)
        first_answer, second_answer = await served.exchange(both)
        assert (first_answer.status, first_answer.body) == (206, archive.content[10:100])
        assert second_answer.status == 200
        assert hashlib.sha256(second_answer.body).hexdigest() == archive.sha256
        if tls:
            assert sendfile_calls == []
        else:
            # Every body byte went through the kernel.
            bodies = BIG + 1 + 65_536 + 1_000_000 + (BIG - 7) + 90 + BIG
            assert sum(sendfile_calls) == bodies
        assert served.server.transfers == 0
        assert served.server.completed == 7
        assert open_files_of(served.data.archive_file(archive.row)) == 0


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest_twisted.ensureDeferred
async def test_a_client_gone_mid_body_frees_the_slot_and_the_file(
    tmp_path: Path, tls: bool
) -> None:
    async with serving(tmp_path, tls=tls) as served:
        archive = await served.hold(GID, content_of(BIG))
        path = served.data.archive_file(archive.row)
        client = await served.client(request_bytes(served.link(GID).path), read_at_most=1024 * 1024)
        received = await client.closed
        assert 1024 * 1024 <= len(received) < BIG
        assert (
            parse_answers(received[: received.index(b"\r\n\r\n") + 4], head=True)[0].status == 200
        )
        await eventually(lambda: served.server.transfers == 0, what="the slot freed")
        await eventually(lambda: open_files_of(path) == 0, what="the file closed")
        assert served.server.completed == 0
        row = await served.store.archive(GID, archive.operation_id)
        assert row is not None and row.served_at is None  # not a transfer that happened
        # And the next client is served whole.
        again = await served.get(served.link(GID).path)
        assert hashlib.sha256(again.body).hexdigest() == archive.sha256


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest_twisted.ensureDeferred
async def test_a_file_shortened_while_sent_is_cut_and_set_aside(tmp_path: Path, tls: bool) -> None:
    async with serving(tmp_path, tls=tls) as served:
        size = 64 * 1024 * 1024
        archive = await served.hold(GID, content_of(size))
        path = served.data.archive_file(archive.row)
        client = await served.client(request_bytes(served.link(GID).path), pause_at=1)
        await eventually(lambda: served.server.bytes_sent > 0, what="the transfer under way")
        os.truncate(path, size // 2)  # far past what the buffers took so far
        assert served.server.bytes_sent < size // 2
        client.reading(True)
        received = await client.closed
        assert len(received) < size  # the client sees a short body, never a whole one
        await eventually(lambda: served.server.transfers == 0, what="the slot freed")
        assert served.server.completed == 0
        assert await served.store.archive(GID, archive.operation_id) is None
        assert (served.data.corrupt / path.name).stat().st_size == size // 2
        assert open_files_of(served.data.corrupt / path.name) == 0
