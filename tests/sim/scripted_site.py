"""A scripted v2 site for a real node in the simulated world.

It speaks the wire with the project's codec and none of the site's logic
(as ``tests/node/site_peer.py`` does over real TCP, on whichever reactor it
is given): Identity and ProtocolHello on accept, the Login signature
checked, the SiteProof a node asks for, every frame recorded, TaskReports
ACKed; ``on_login(connection)`` may send commands.  Its nonces come from
the ``random.Random`` it is given, so a run is the same for the same seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from twisted.internet.protocol import Factory, Protocol

from tasknet.protocol.messages import (
    FEATURE_SITE_PROOF,
    HEADER,
    Identity,
    Login,
    LoginResult,
    Message,
    NodeChallenge,
    ProtocolHello,
    SiteProof,
    TaskCommand,
    TaskReport,
    TaskReportAck,
    decode,
    encode,
    sign_site_proof,
    verify_login,
)


class SiteConnection(Protocol):
    factory: ScriptedSite

    def __init__(self, nonce: str) -> None:
        self.buffer = b""
        self.nonce = nonce
        self.node_id = ""
        self.node_features: tuple[str, ...] = ()
        self.logged_in = False

    def connectionMade(self) -> None:
        self.factory.connections.append(self)
        self.send(Identity(self.factory.name, self.nonce))
        self.send(ProtocolHello())

    def send(self, message: Message) -> None:
        assert self.transport is not None
        self.transport.write(encode(message))

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= HEADER.size:
            type_, length = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + length:
                return
            payload = self.buffer[HEADER.size : HEADER.size + length]
            self.buffer = self.buffer[HEADER.size + length :]
            self.frame(decode(type_, payload))

    def frame(self, message: Message) -> None:
        site = self.factory
        site.received.append(message)
        if isinstance(message, ProtocolHello):
            self.node_features = message.features
        elif isinstance(message, Login):
            ok = verify_login(site.secret, self.nonce, message.node_id, message.signature)
            self.node_id = message.node_id
            self.send(LoginResult(ok, "" if ok else "bad signature"))
            if ok and FEATURE_SITE_PROOF not in self.node_features:
                self._logged_in()
        elif isinstance(message, NodeChallenge):
            self.send(
                SiteProof(sign_site_proof(site.secret, message.nonce, self.nonce, self.node_id))
            )
            self._logged_in()
        elif isinstance(message, TaskReport):
            self.send(TaskReportAck(message.report_id, "APPLIED"))
            site.acked.append(message.report_id)

    def _logged_in(self) -> None:
        self.logged_in = True
        self.factory.logins += 1
        if self.factory.on_login is not None:
            self.factory.on_login(self)

    def download(self, operation_id: str, gid: int, url: str, size: int = 0) -> None:
        self.send(TaskCommand(operation_id, "DOWNLOAD", gid, f"g{gid}", url, size))

    def connectionLost(self, reason: Any = None) -> None:
        if self in self.factory.connections:
            self.factory.connections.remove(self)


class ScriptedSite(Factory):
    def __init__(
        self,
        secret: str,
        rng: random.Random,
        on_login: Callable[[SiteConnection], None] | None = None,
    ) -> None:
        self.secret = secret
        self.rng = rng
        self.on_login = on_login
        self.name = "scripted-site"
        self.connections: list[SiteConnection] = []
        self.received: list[Message] = []
        self.acked: list[str] = []
        self.logins = 0

    def buildProtocol(self, addr: Any) -> SiteConnection:
        connection = SiteConnection(f"{self.rng.getrandbits(128):032x}")
        connection.factory = self
        return connection

    def reports(self) -> list[TaskReport]:
        return [m for m in self.received if isinstance(m, TaskReport)]

    def latest_status(self, gid: int) -> int | None:
        for report in reversed(self.reports()):
            for entry in report.gallery_tasks:
                if entry.gid == gid:
                    return entry.status
        return None
