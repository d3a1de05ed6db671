"""Signed, expiring archive links (DELIVERY.md, "Serving (node)").

The site signs a link for a user; the node that holds the archive checks it.
Both know the node's secret, but the secret itself never signs a link: the
**link key** is HMAC-SHA256(key = secret, message = ``"tasknet archive link
v1"``), and a link's ``sig`` is the lowercase hex HMAC-SHA256, under that key,
of ``"GET:" + gid + ":" + operationId + ":" + exp + ":" + user``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import quote

__all__ = [
    "LINK_KEY_LABEL",
    "ArchiveLink",
    "link_key",
    "sign_link",
    "verify_link",
]

LINK_KEY_LABEL = b"tasknet archive link v1"


def link_key(secret: str) -> bytes:
    """The key archive links are signed with, derived from the node's secret."""
    return hmac.new(secret.encode("utf-8"), LINK_KEY_LABEL, hashlib.sha256).digest()


def _message(gid: int, operation_id: str, exp: int, user: int) -> bytes:
    return f"GET:{gid}:{operation_id}:{exp}:{user}".encode()


def sign_link(key: bytes, gid: int, operation_id: str, exp: int, user: int) -> str:
    """The hex signature of one link (``key`` from :func:`link_key`)."""
    return hmac.new(key, _message(gid, operation_id, exp, user), hashlib.sha256).hexdigest()


def verify_link(key: bytes, gid: int, operation_id: str, exp: int, user: int, sig: str) -> bool:
    """Constant-time check of a link's signature (not of its expiry)."""
    expected = sign_link(key, gid, operation_id, exp, user)
    return hmac.compare_digest(expected.encode("ascii"), sig.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class ArchiveLink:
    """One signed link: its path and query under a node's base URL."""

    gid: int
    operation_id: str
    exp: int
    user: int
    sig: str

    @classmethod
    def sign(cls, key: bytes, gid: int, operation_id: str, exp: int, user: int) -> ArchiveLink:
        return cls(gid, operation_id, exp, user, sign_link(key, gid, operation_id, exp, user))

    @property
    def path(self) -> str:
        """``/archives/{gid}/{operationId}?exp=E&user=U&sig=S`` (operationId quoted)."""
        return (
            f"/archives/{self.gid}/{quote(self.operation_id, safe='')}"
            f"?exp={self.exp}&user={self.user}&sig={self.sig}"
        )

    def url(self, base: str) -> str:
        """The link under ``base`` (a node's ``archiveUrl`` or ``serveUrl``)."""
        return base.rstrip("/") + self.path
