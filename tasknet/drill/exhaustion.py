"""The hostile clients of drill S19 (resource exhaustion), over real sockets.

One thread runs them all on a selector, so hundreds of peers cost the drill
little: node-port peers that never log in (each holds a partial pre-login
frame), anonymous uploads announcing 300 MB, HTTP clients that trickle a
header line every few seconds and never finish, and a WebSocket client that
completes its handshake and never reads again.  Each records when the site
closed it and what the site answered, for the scenario to judge against the
bounds of PROTOCOL.md and INTERFACES.md.
"""

from __future__ import annotations

import base64
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from tasknet.protocol.messages import HEADER, ProtocolHello

TICK = 0.2
_TCP_ESTABLISHED = 1
_ZEROS = memoryview(bytes(64 * 1024))


@dataclass
class Attacker:
    kind: str  # "node" / "upload" / "slow" / "websocket"
    sock: socket.socket
    started: float
    closed_at: float | None = None
    status: int | None = None  # the HTTP status the site answered, if any
    sent: int = 0
    received: bytearray = field(default_factory=bytearray)
    to_send: int = 0  # uploads: body bytes still to send
    next_trickle: float = 0.0
    trickles: int = 0

    @property
    def open(self) -> bool:
        return self.closed_at is None

    def lifetime(self) -> float | None:
        return None if self.closed_at is None else self.closed_at - self.started


def rss_kib(pid: int) -> int:
    """The resident set size of process ``pid`` (Linux ``/proc``), in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _status_of(data: bytes) -> int | None:
    if b"\r\n" not in data:
        return None
    parts = data.split(b"\r\n", 1)[0].split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


class Swarm:
    """All S19 attackers.  :meth:`run` (blocking: give it a thread) connects
    them, sets :attr:`ready`, and drives them until each is closed or
    :meth:`stop` is called."""

    def __init__(
        self,
        http: tuple[str, int],
        nodes: tuple[str, int],
        *,
        node_peers: int = 200,
        uploads: int = 20,
        upload_size: int = 300 * 1024 * 1024,
        slow_clients: int = 50,
        trickle_every: float = 5.0,
        websocket_token: str | None = "demo",
        declared_frame: int = 60 * 1024,
        sent_frame: int = 30 * 1024,
    ) -> None:
        self.http = http
        self.nodes = nodes
        self.counts = (node_peers, uploads, slow_clients)
        self.upload_size = upload_size
        self.trickle_every = trickle_every
        self.websocket_token = websocket_token
        self.declared_frame = declared_frame
        self.sent_frame = sent_frame
        self.attackers: list[Attacker] = []
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()

    def of(self, kind: str) -> list[Attacker]:
        return [a for a in self.attackers if a.kind == kind]

    def stop(self) -> None:
        self._stop.set()

    def all_closed(self) -> bool:
        return self.ready.is_set() and all(not a.open for a in self.attackers)

    # -- connecting ---------------------------------------------------------------

    def _connect(self, kind: str, address: tuple[str, int], rcvbuf: int = 0) -> Attacker:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(10)
        sock.connect(address)
        attacker = Attacker(kind, sock, time.monotonic())
        self.attackers.append(attacker)
        return attacker

    def _start_node_peer(self) -> None:
        a = self._connect("node", self.nodes)
        # A ProtocolHello frame header announcing a payload under the
        # pre-login cap, then only part of it: the site must not wait for
        # the rest past the login deadline.
        a.sock.sendall(HEADER.pack(ProtocolHello.TYPE, self.declared_frame))
        a.sock.sendall(b" " * self.sent_frame)
        a.sent = HEADER.size + self.sent_frame
        a.sock.setblocking(False)
        self._selector.register(a.sock, selectors.EVENT_READ, a)

    def _start_upload(self) -> None:
        a = self._connect("upload", self.http)
        a.sock.sendall(
            b"POST /api/tasks HTTP/1.1\r\nHost: drill\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % self.upload_size
        )
        a.to_send = self.upload_size
        a.sock.setblocking(False)
        self._selector.register(a.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, a)

    def _start_slow_client(self) -> None:
        a = self._connect("slow", self.http)
        a.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: drill\r\n")
        a.next_trickle = a.started + self.trickle_every
        a.sock.setblocking(False)
        self._selector.register(a.sock, selectors.EVENT_READ, a)

    def _start_silent_websocket(self, token: str) -> None:
        # A small receive buffer, and after the handshake no read ever again.
        a = self._connect("websocket", self.http, rcvbuf=4096)
        key = base64.b64encode(os.urandom(16))
        a.sock.sendall(
            b"GET /api/events?token=%s HTTP/1.1\r\nHost: drill\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (token.encode(), key)
        )
        while b"\r\n\r\n" not in a.received:
            chunk = a.sock.recv(4096)
            if not chunk:
                break
            a.received += chunk
        a.status = _status_of(bytes(a.received))
        if a.status != 101:
            a.closed_at = time.monotonic()

    # -- driving --------------------------------------------------------------------

    def run(self) -> None:
        try:
            node_peers, uploads, slow = self.counts
            for _ in range(node_peers):
                self._start_node_peer()
            for _ in range(slow):
                self._start_slow_client()
            if self.websocket_token is not None:
                self._start_silent_websocket(self.websocket_token)
            for _ in range(uploads):
                self._start_upload()
        except BaseException as err:
            self.error = err
            self.ready.set()
            self._close_all()
            return
        self.ready.set()
        try:
            while not self._stop.is_set() and not self.all_closed():
                for key, events in self._selector.select(TICK):
                    self._event(key.data, events)
                self._tick(time.monotonic())
        finally:
            self._close_all()

    def _closed(self, a: Attacker) -> None:
        if a.closed_at is None:
            a.closed_at = time.monotonic()
        try:
            self._selector.unregister(a.sock)
        except (KeyError, ValueError):
            pass

    def _event(self, a: Attacker, events: int) -> None:
        if events & selectors.EVENT_READ:
            try:
                chunk = a.sock.recv(65536)
            except BlockingIOError:
                chunk = None
            except OSError:
                self._closed(a)
                return
            if chunk == b"":
                self._closed(a)
                return
            if chunk:
                if len(a.received) < 65536:
                    a.received += chunk
                if a.status is None and a.kind != "node":
                    a.status = _status_of(bytes(a.received))
                    if a.status is not None and a.kind == "upload":
                        # Answered: stop sending, wait for the site to close.
                        self._selector.modify(a.sock, selectors.EVENT_READ, a)
                        return
        if events & selectors.EVENT_WRITE and a.kind == "upload" and a.to_send > 0:
            try:
                n = a.sock.send(_ZEROS[: min(len(_ZEROS), a.to_send)])
            except BlockingIOError:
                return
            except OSError:
                self._closed(a)
                return
            a.sent += n
            a.to_send -= n
            if a.to_send == 0:
                self._selector.modify(a.sock, selectors.EVENT_READ, a)

    def _tick(self, now: float) -> None:
        for a in self.attackers:
            if not a.open:
                continue
            if a.kind == "slow" and now >= a.next_trickle:
                a.next_trickle = now + self.trickle_every
                a.trickles += 1
                try:
                    a.sock.send(b"X-Slow-%d: 1\r\n" % a.trickles)
                except BlockingIOError:
                    pass
                except OSError:
                    self._closed(a)
            elif a.kind == "websocket" and not _established(a.sock):
                a.closed_at = now

    def _close_all(self) -> None:
        for a in self.attackers:
            try:
                self._selector.unregister(a.sock)
            except (KeyError, ValueError):
                pass
            a.sock.close()
        self._selector.close()


def _established(sock: socket.socket) -> bool:
    """Whether the kernel still holds the connection ESTABLISHED (a client
    that never reads cannot see the site's FIN or RST any other way)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return bool(struct.unpack_from("B", info)[0] == _TCP_ESTABLISHED)
