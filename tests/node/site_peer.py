"""A scripted site over real TCP, for driving a node in tests.

It speaks the wire with the project's codec but none of the site's logic:
on accept it sends Identity (and ProtocolHello unless ``legacy``), checks the
Login signature, answers LoginResult, answers a NodeChallenge with the
SiteProof (``proof="good"``; ``"wrong"`` sends a wrong one, ``"none"`` none:
a listener that is not the site), records every frame the node sends, and
ACKs TaskReports and ArchiveInventory parts automatically unless told to
withhold them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol

from tasknet.protocol.messages import (
    FEATURE_SITE_PROOF,
    HEADER,
    ArchiveInventory,
    ArchiveInventoryAck,
    DeleteGallery,
    DownloadPost,
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
from tests.eventually import eventually


class SiteConnection(Protocol):
    factory: ScriptedSite

    def __init__(self) -> None:
        self.buffer = b""
        self.logged_in = False
        self.nonce = secrets.token_hex(16)
        self.node_id = ""
        self.node_features: tuple[str, ...] = ()
        self.closed: Deferred[None] = Deferred()

    @property
    def transport_(self) -> Any:
        return self.transport

    def connectionMade(self) -> None:
        self.factory.connections.append(self)
        self.send(Identity(self.factory.name, self.nonce))
        if not self.factory.legacy:
            self.send(ProtocolHello())

    def send(self, message: Message) -> None:
        self.transport_.write(encode(message))

    def send_raw(self, type_: int, payload: bytes) -> None:
        self.transport_.write(HEADER.pack(type_, len(payload)) + payload)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= HEADER.size:
            type_, length = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + length:
                return
            payload = self.buffer[HEADER.size : HEADER.size + length]
            self.buffer = self.buffer[HEADER.size + length :]
            self.frame(type_, payload)

    def frame(self, type_: int, payload: bytes) -> None:
        site = self.factory
        site.frame_types.append(type_)
        message = decode(type_, payload)
        site.received.append(message)
        if isinstance(message, ProtocolHello):
            self.node_features = message.features
        elif isinstance(message, Login):
            # A listener that is not the site cannot check the signature: it says yes.
            ok = site.accept_any or verify_login(
                site.secret, self.nonce, message.node_id, message.signature
            )
            self.node_id = message.node_id
            self.send(LoginResult(ok, "" if ok else "bad signature"))
            site.accepted_logins += int(ok)
            # A node that asked for a proof is logged in (commands may go)
            # only once the proof has gone out.
            if ok and (site.legacy or FEATURE_SITE_PROOF not in self.node_features):
                self._logged_in()
        elif isinstance(message, NodeChallenge):
            site.challenges += 1
            if site.proof == "good":
                proof = sign_site_proof(site.secret, message.nonce, self.nonce, self.node_id)
                self.send(SiteProof(proof))
                self._logged_in()
            elif site.proof == "wrong":
                wrong = sign_site_proof("not the secret", message.nonce, self.nonce, self.node_id)
                self.send(SiteProof(wrong))
        elif isinstance(message, TaskReport) and site.auto_ack:
            self.send(TaskReportAck(message.report_id, "APPLIED"))
            site.acked.append(message.report_id)
        elif isinstance(message, ArchiveInventory) and site.auto_ack:
            self.send(ArchiveInventoryAck(message.inventory_id, message.part))

    def _logged_in(self) -> None:
        self.logged_in = True
        self.factory.logins += 1
        if self.factory.on_login is not None:
            self.factory.on_login(self)

    def connectionLost(self, reason: Any = None) -> None:
        if self in self.factory.connections:
            self.factory.connections.remove(self)
        self.closed.callback(None)


class ScriptedSite(Factory):
    protocol = SiteConnection  # type: ignore[assignment]

    def __init__(
        self,
        secret: str,
        *,
        legacy: bool = False,
        auto_ack: bool = True,
        proof: str = "good",
        accept_any: bool = False,
        on_login: Callable[[SiteConnection], None] | None = None,
    ) -> None:
        assert proof in ("good", "wrong", "none")
        self.secret = secret
        self.legacy = legacy
        self.auto_ack = auto_ack
        self.proof = proof
        self.accept_any = accept_any
        #: Called once a connection is logged in (commands sent at once, in
        #: the LoginResult's own write when no proof was asked for).
        self.on_login = on_login
        self.challenges = 0
        #: LoginResult{true} sent (``logins``: and, to a node that asked, the proof).
        self.accepted_logins = 0
        self.name = "scripted-site"
        self.connections: list[SiteConnection] = []
        self.received: list[Message] = []
        self.frame_types: list[int] = []
        self.acked: list[str] = []
        self.logins = 0
        self.port: Any = None

    async def listen(self) -> int:
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self)
        return int(self.port.getHost().port)

    @property
    def endpoint(self) -> str:
        return f"tcp:127.0.0.1:{self.port.getHost().port}"

    async def stop(self) -> None:
        if self.port is not None:
            await self.port.stopListening()
        await self.drop_connections()

    async def drop_connections(self) -> None:
        waits = [c.closed for c in self.connections]
        for c in list(self.connections):
            c.transport_.abortConnection()
        for d in waits:
            await d

    # what the node sent ---------------------------------------------------------
    def of_type(self, kind: type) -> list[Any]:
        return [m for m in self.received if isinstance(m, kind)]

    def reports(self) -> list[TaskReport]:
        return self.of_type(TaskReport)

    def latest_entry(self, gid: int) -> Any:
        for report in reversed(self.reports()):
            for entry in report.gallery_tasks:
                if entry.gid == gid:
                    return entry
        return None

    async def logged_in(self, count: int = 1) -> SiteConnection:
        await eventually(lambda: self.logins >= count, what=f"login #{count}")
        return self.connections[-1]

    # commands ---------------------------------------------------------------------
    def current(self) -> SiteConnection:
        live = [c for c in self.connections if c.logged_in]
        assert live, "no node logged in"
        return live[-1]

    def download(
        self, operation_id: str, gid: int, url: str, name: str = "", size: int = 0
    ) -> None:
        self.current().send(
            TaskCommand(operation_id, "DOWNLOAD", gid, name or f"g{gid}", url, size)
        )

    def delete(self, operation_id: str, gid: int) -> None:
        self.current().send(TaskCommand(operation_id, "DELETE", gid, f"g{gid}", ""))

    def cancel(self, operation_id: str, gid: int) -> None:
        self.current().send(TaskCommand(operation_id, "CANCEL", gid, f"g{gid}", ""))

    def legacy_download(self, gid: int, url: str) -> None:
        self.current().send(DownloadPost(gid, "token", f"g{gid}", url))

    def legacy_delete(self, gid: int) -> None:
        self.current().send(DeleteGallery(gid))

    def ack(self, report_id: str) -> None:
        self.current().send(TaskReportAck(report_id, "APPLIED"))
        self.acked.append(report_id)
