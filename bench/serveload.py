"""B11's HTTP client: N concurrent downloaders of one URL, in a process of its own.

``python -m bench.serveload --url URL --clients N --mode whole|ranges
--size BYTES --seconds S [--header 'Name: value']...`` prints one JSON line:
bytes of bodies received, the seconds measured, requests done, their
latencies (ranges: p50/p99 in ms) and the answers that were not 200/206.

Efficient enough not to be what is measured: one thread, non-blocking
sockets under ``selectors``, every body read with ``recv_into`` into one
reused 1 MiB buffer and thrown away (nothing is copied, parsed or hashed but
the header block).  ``whole``: each client asks for the whole file on a
connection, then again on a new one, until the time is up (a 1 GiB file at
64 clients is seldom finished inside the window: the rate is of the bytes
that arrived in it).  ``ranges``: each client keeps one connection alive and
asks for random 1 MiB ``Range`` after ``Range`` on it.
"""

from __future__ import annotations

import argparse
import json
import random
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

RANGE = 1024 * 1024
BUFFER = 1024 * 1024
HEADERS_MAX = 64 * 1024


@dataclass
class Target:
    host: str
    port: int
    path: str
    headers: list[str]


@dataclass
class Tally:
    bytes: int = 0
    requests: int = 0
    latencies: list[float] = field(default_factory=list)
    bad: dict[str, int] = field(default_factory=dict)


class Client:
    """One downloader: a connection, the request on it, the answer's progress."""

    def __init__(
        self, target: Target, mode: str, size: int, rng: random.Random, tally: Tally
    ) -> None:
        self.target, self.mode, self.size, self.rng, self.tally = target, mode, size, rng, tally
        self.sock: socket.socket | None = None
        self.header = bytearray()
        self.remaining = -1  # -1: reading the header block
        self.keep_alive = False
        self.started = 0.0

    def _request(self) -> bytes:
        lines = [f"GET {self.target.path} HTTP/1.1", f"Host: {self.target.host}"]
        if self.mode == "ranges":
            start = self.rng.randrange(0, max(1, self.size - RANGE + 1))
            end = min(self.size, start + RANGE) - 1
            lines.append(f"Range: bytes={start}-{end}")
        else:
            lines.append("Connection: close")
        lines += self.target.headers
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def connect(self, selector: selectors.BaseSelector) -> None:
        sock = socket.create_connection((self.target.host, self.target.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.send(selector, register=True)

    def send(self, selector: selectors.BaseSelector, register: bool = False) -> None:
        assert self.sock is not None
        self.sock.setblocking(True)  # a request is a few hundred bytes
        self.sock.sendall(self._request())
        self.sock.setblocking(False)
        self.header.clear()
        self.remaining = -1
        self.started = time.perf_counter()
        if register:
            selector.register(self.sock, selectors.EVENT_READ, self)

    def close(self, selector: selectors.BaseSelector) -> None:
        if self.sock is not None:
            selector.unregister(self.sock)
            self.sock.close()
            self.sock = None

    def readable(self, selector: selectors.BaseSelector, buffer: memoryview) -> None:
        assert self.sock is not None
        try:
            n = self.sock.recv_into(buffer)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionError:
            n = 0
        if n == 0:  # closed by the server: a new connection, a new request
            if self.remaining > 0 or self.remaining == -1:
                self._bad("closed early")
            self.close(selector)
            self.connect(selector)
            return
        if self.remaining == -1:
            self.header += buffer[:n]
            end = self.header.find(b"\r\n\r\n")
            if end < 0:
                if len(self.header) > HEADERS_MAX:
                    raise SystemExit("a header block over 64 KiB")
                return
            self._parse(bytes(self.header[:end]))
            body = len(self.header) - end - 4
        else:
            body = n
        self.tally.bytes += body
        self.remaining -= body
        if self.remaining <= 0:
            self.tally.requests += 1
            self.tally.latencies.append(time.perf_counter() - self.started)
            if self.keep_alive:
                self.send(selector)
            else:
                self.close(selector)
                self.connect(selector)

    def _parse(self, block: bytes) -> None:
        lines = block.decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)[1] if " " in lines[0] else "?"
        if status not in ("200", "206"):
            self._bad(status)
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            if key == "content-length":
                length = int(value.strip())
            elif key == "connection" and value.strip().lower() == "close":
                close = True
        self.remaining = length
        self.keep_alive = self.mode == "ranges" and not close

    def _bad(self, what: str) -> None:
        self.tally.bad[what] = self.tally.bad.get(what, 0) + 1


def run(target: Target, clients: int, mode: str, size: int, seconds: float, seed: int) -> dict:
    selector = selectors.DefaultSelector()
    tally = Tally()
    rng = random.Random(seed)
    everyone = [Client(target, mode, size, rng, tally) for _ in range(clients)]
    buffer = memoryview(bytearray(BUFFER))
    started = time.perf_counter()
    for client in everyone:
        client.connect(selector)
    deadline = started + seconds
    while (now := time.perf_counter()) < deadline:
        for key, _ in selector.select(timeout=deadline - now):
            key.data.readable(selector, buffer)
    elapsed = time.perf_counter() - started
    for client in everyone:
        client.close(selector)
    ordered = sorted(tally.latencies)

    def pick(q: float) -> float | None:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else None

    return {
        "bytes": tally.bytes,
        "seconds": elapsed,
        "requests": tally.requests,
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "bad": tally.bad,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serveload")
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--mode", choices=("whole", "ranges"), required=True)
    parser.add_argument("--size", type=int, required=True, help="the file's size in bytes")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    args = parser.parse_args(argv)
    url = urlsplit(args.url)
    if url.scheme != "http" or not url.hostname:
        parser.error("--url must be http://HOST:PORT/PATH")
    path = url.path + (f"?{url.query}" if url.query else "")
    target = Target(url.hostname, url.port or 80, path, args.header)
    result = run(target, args.clients, args.mode, args.size, args.seconds, args.seed)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
