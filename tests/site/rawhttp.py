"""A raw HTTP/1.1 client over real loopback TCP, for requests no HTTP
library will send (bad bytes in headers and paths, a body that never ends,
a request that never completes)."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

TIMEOUT = 10.0


class RawClient(Protocol):
    def __init__(self) -> None:
        self.received = bytearray()
        self.closed: Deferred[None] = Deferred()
        self.got_data: Deferred[None] | None = None

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if self.got_data is not None and not self.got_data.called:
            waiting, self.got_data = self.got_data, None
            waiting.callback(None)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if not self.closed.called:
            self.closed.callback(None)
        if self.got_data is not None and not self.got_data.called:
            self.got_data.callback(None)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def response(self, timeout: float = TIMEOUT) -> Answer:
        """Wait until a whole answer is in (by Content-Length) or the
        connection closed; parse it."""
        while not (answer := parse(bytes(self.received))) or not answer.complete:
            if self.closed.called:
                break
            self.got_data = Deferred()
            await self.got_data.addTimeout(timeout, reactor)
        answer = parse(bytes(self.received))
        assert answer is not None, f"no answer; got {bytes(self.received)[:200]!r}"
        return answer

    def abort(self) -> None:
        if self.transport is not None and not self.closed.called:
            self.transport.abortConnection()


@dataclass
class Answer:
    status: int
    headers: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


def parse(data: bytes) -> Answer | None:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    if status in (101, 204, 304):  # no body
        return Answer(status, headers, b"", True)
    if "chunked" in headers.get("transfer-encoding", []):
        body, complete = _dechunk(body)
        return Answer(status, headers, body, complete)
    length = headers.get("content-length")
    complete = length is not None and len(body) >= int(length[0])
    if length is not None:
        body = body[: int(length[0])]
    return Answer(status, headers, body, complete)


def _dechunk(data: bytes) -> tuple[bytes, bool]:
    out = bytearray()
    while True:
        size_line, sep, rest = data.partition(b"\r\n")
        if not sep:
            return bytes(out), False
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return bytes(out), rest.startswith(b"\r\n") or b"\r\n\r\n" in rest
        if len(rest) < size + 2:
            return bytes(out), False
        out += rest[:size]
        data = rest[size + 2 :]


async def connect(port: int) -> RawClient:
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    return await connectProtocol(endpoint, RawClient())


async def exchange(port: int, data: bytes) -> tuple[Answer, RawClient]:
    """Send ``data`` on a new connection; the answer and the client."""
    client = await connect(port)
    client.send(data)
    try:
        return await client.response(), client
    except BaseException:
        client.abort()
        raise


def request_bytes(
    method: str,
    path: bytes | str,
    headers: dict[str, bytes | str] | None = None,
    body: bytes = b"",
    *,
    close: bool = True,
) -> bytes:
    """One request; ``Connection: close`` unless ``close`` is false (so the
    site closes the connection once it answered)."""
    target = path.encode("latin-1") if isinstance(path, str) else path
    lines = [method.encode("ascii") + b" " + target + b" HTTP/1.1"]
    if not any(name.lower() == "host" for name in headers or {}):
        lines.append(b"Host: 127.0.0.1")
    if close:
        lines.append(b"Connection: close")
    for name, value in (headers or {}).items():
        raw_value = value.encode("latin-1") if isinstance(value, str) else value
        lines.append(name.encode("ascii") + b": " + raw_value)
    if body and not any(
        n.lower() in ("content-length", "transfer-encoding") for n in headers or {}
    ):
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def websocket_upgrade(token: str, *, close: bool = True) -> bytes:
    """The WebSocket opening handshake for ``/api/events?token=...``, with a
    fresh key; ``close`` as for :func:`request_bytes`."""
    key = base64.b64encode(os.urandom(16)).decode()
    headers: dict[str, bytes | str] = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Version": "13",
    }
    return request_bytes("GET", f"/api/events?token={token}", headers, close=close)


async def open_websocket(port: int, token: str) -> tuple[RawClient, Answer]:
    """A raw client whose WebSocket handshake was answered 101, and that answer."""
    client = await connect(port)
    client.send(websocket_upgrade(token, close=False))
    answer = await client.response()
    assert answer.status == 101
    return client, answer
