"""A scripted v2 node over a real socket, for faults no real node would make.

Drill S12 needs "a late report for the old generation": a TaskReport naming
an operationId the site has since tombstoned.  A real node never sends that
on cue, so this peer logs in with a node's credentials (v2 handshake: Hello
before Login), sends exactly the report it is given and returns the ACK.
It uses the project's codec, blocking sockets and a hard timeout.
"""

from __future__ import annotations

import socket
import time
import uuid

from tasknet.protocol.messages import (
    HEADER,
    Identity,
    Login,
    LoginResult,
    Message,
    ProtocolHello,
    TaskEntry,
    TaskReport,
    TaskReportAck,
    decode,
    encode,
    sign_login,
)


class PeerError(Exception):
    pass


class ScriptedPeer:
    def __init__(self, host: str, port: int, node_id: str, secret: str, timeout: float = 10):
        self.node_id = node_id
        self.secret = secret
        self.deadline = time.monotonic() + timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self._buf = b""

    def _recv_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            if time.monotonic() > self.deadline:
                raise PeerError("scripted peer: timed out waiting for the site")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise PeerError("scripted peer: the site closed the connection")
            self._buf += chunk
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def receive(self) -> Message | None:
        """The next frame the peer understands (unknown types skipped: None)."""
        type_, length = HEADER.unpack(self._recv_exact(HEADER.size))
        payload = self._recv_exact(length)
        try:
            return decode(type_, payload)
        except Exception:  # noqa: BLE001 - an unknown type is not our business here
            return None

    def expect(self, kind: type) -> Message:
        while True:
            message = self.receive()
            if message is not None and isinstance(message, kind):
                return message

    def send(self, message: Message) -> None:
        self.sock.sendall(encode(message))

    def login(self) -> None:
        identity = self.expect(Identity)
        assert isinstance(identity, Identity)
        self.send(ProtocolHello())
        self.send(Login(self.node_id, sign_login(self.secret, identity.nonce, self.node_id)))
        result = self.expect(LoginResult)
        assert isinstance(result, LoginResult)
        if not result.accepted:
            raise PeerError(f"scripted peer: login refused: {result.reason}")

    def report(self, gid: int, operation_id: str, status: int, progress: float) -> TaskReportAck:
        """Send one TaskReport for ``gid`` (generation ``operation_id``); return the ACK."""
        report = TaskReport(
            report_id=f"drill-late-{uuid.uuid4().hex[:12]}",
            revision=int(time.time() * 1000) + 10_000,
            gallery_tasks=(TaskEntry(gid, status, progress),),
            operation_ids={gid: operation_id},
        )
        self.send(report)
        while True:
            ack = self.expect(TaskReportAck)
            assert isinstance(ack, TaskReportAck)
            if ack.report_id == report.report_id:
                return ack

    def close(self) -> None:
        self.sock.close()


def send_late_report(
    host: str, port: int, node_id: str, secret: str, gid: int, operation_id: str
) -> TaskReportAck:
    """Log in as ``node_id`` and report ``gid`` of ``operation_id`` as downloading."""
    peer = ScriptedPeer(host, port, node_id, secret)
    try:
        peer.login()
        return peer.report(gid, operation_id, status=1, progress=0.5)
    finally:
        peer.close()
