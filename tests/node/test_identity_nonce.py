"""The node signs only an ``Identity.nonce`` of 32 hex characters
(PROTOCOL.md; issue 38: a fake site sent ``"site:0123:" + 32 × "e"`` and got
a Login signature equal to a SiteProof for challenge ``0123``).

A real NodeService dials a scripted site over loopback TCP whose Identity
carries the forged nonce: the node answers ``Error{bad_message}``, closes,
and never sends a Login.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted

from tasknet.node.link import SITE_NONCE
from tasknet.protocol.messages import Error, Login
from tests.eventually import eventually
from tests.node.harness import SECRET, start_node
from tests.node.site_peer import ScriptedSite, SiteConnection

FORGED = "site:0123:" + 32 * "e"


class ForgedNonceConnection(SiteConnection):
    def __init__(self) -> None:
        super().__init__()
        self.nonce = FORGED


class ForgedNonceSite(ScriptedSite):
    protocol = ForgedNonceConnection  # type: ignore[assignment]


@pytest_twisted.ensureDeferred
async def test_a_forged_nonce_gets_no_login_signature(tmp_path: Path) -> None:
    site = ForgedNonceSite(SECRET)
    await site.listen()
    try:
        node = await start_node(site, tmp_path / "node")
        try:
            # The node retries (quickly, in the harness): several refusals.
            await eventually(lambda: len(site.of_type(Error)) >= 2, what="two refusals")
            assert site.of_type(Login) == []
            error = site.of_type(Error)[0]
            assert error.code == "bad_message"
            assert "Identity.nonce must be 32 hex characters" in error.message
            assert site.logins == 0
        finally:
            await node.stopService()
    finally:
        await site.stop()


@pytest.mark.parametrize(
    "nonce",
    [
        FORGED,
        "",
        "e" * 31,
        "e" * 33,
        "g" * 32,
        "e" * 32 + "\n",
        "０" * 32,
        "e" * 16 + ":" + "e" * 15,
    ],
)
def test_only_32_hex_characters_are_a_nonce(nonce: str) -> None:
    assert SITE_NONCE.fullmatch(nonce) is None


def test_a_real_nonce_is_one() -> None:
    assert SITE_NONCE.fullmatch("00112233445566778899aabbccddeeff")
    assert SITE_NONCE.fullmatch("00112233445566778899AABBCCDDEEFF")
