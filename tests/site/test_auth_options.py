"""The site's options for the limits of issue 38's hardening:
``--auth-burst``/``--auth-rate`` (wrong tokens per client address),
``--node-auth-burst``/``--node-auth-rate`` (failed node Logins per
address) and ``--max-sessions-per-user``: their defaults, out-of-range
values refused, and each reaching the running site (HTTP and the node port
on loopback, either backend)."""

from __future__ import annotations

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory
from twisted.python import usage

from tasknet.protocol.messages import Identity, Login, LoginResult, Message, sign_login
from tasknet.site.node_listener import (
    DEFAULT_NODE_LOGIN_FAILURE_RATE,
    DEFAULT_NODE_LOGIN_FAILURES,
)
from tasknet.site.ratelimit import DEFAULT_AUTH_FAILURE_RATE, DEFAULT_AUTH_FAILURES
from tasknet.site.storage.sessions import DEFAULT_MAX_LIVE
from tasknet.upstream.testing import start_upstream
from tests.protocol.peers import RawPeer
from tests.site.helpers import RunningSite, running_site, site_options


def test_defaults() -> None:
    options = site_options("x.sqlite", "http://127.0.0.1:1")
    assert (options["auth-burst"], options["auth-rate"]) == (1000, 10.0)
    assert (options["auth-burst"], options["auth-rate"]) == (
        DEFAULT_AUTH_FAILURES,
        DEFAULT_AUTH_FAILURE_RATE,
    )
    assert (options["node-auth-burst"], options["node-auth-rate"]) == (100, 1.0)
    assert (options["node-auth-burst"], options["node-auth-rate"]) == (
        DEFAULT_NODE_LOGIN_FAILURES,
        DEFAULT_NODE_LOGIN_FAILURE_RATE,
    )
    assert options["max-sessions-per-user"] == DEFAULT_MAX_LIVE == 20


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--auth-burst", "0", "--auth-burst must be 1 to 1,000,000"),
        ("--auth-burst", "1000001", "--auth-burst must be 1 to 1,000,000"),
        ("--auth-burst", "-5", "--auth-burst must be 1 to 1,000,000"),
        ("--auth-burst", "many", "invalid literal"),
        ("--auth-rate", "0", "--auth-rate must be > 0 and at most 10,000"),
        ("--auth-rate", "-1", "--auth-rate must be > 0"),
        ("--auth-rate", "nan", "--auth-rate must be > 0"),
        ("--auth-rate", "inf", "--auth-rate must be > 0"),
        ("--auth-rate", "10001", "--auth-rate must be > 0 and at most 10,000"),
        ("--node-auth-burst", "0", "--node-auth-burst must be 1 to 1,000,000"),
        ("--node-auth-rate", "0", "--node-auth-rate must be > 0"),
        ("--node-auth-rate", "nan", "--node-auth-rate must be > 0"),
        ("--max-sessions-per-user", "0", "--max-sessions-per-user must be 1 to 10,000"),
        ("--max-sessions-per-user", "10001", "--max-sessions-per-user must be 1 to 10,000"),
        ("--max-sessions-per-user", "2.5", "invalid literal"),
    ],
)
def test_out_of_range_values_are_refused(option: str, value: str, says: str) -> None:
    with pytest.raises(usage.UsageError, match=says.replace(".", r"\.").replace("+", r"\+")):
        site_options("x.sqlite", "http://127.0.0.1:1", option, value)


def test_the_bounds_themselves_are_accepted() -> None:
    options = site_options(
        "x.sqlite",
        "http://127.0.0.1:1",
        "--auth-burst",
        "1000000",
        "--auth-rate",
        "10000",
        "--node-auth-burst",
        "1",
        "--node-auth-rate",
        "0.001",
        "--max-sessions-per-user",
        "10000",
    )
    assert options["auth-burst"] == 1_000_000 and options["node-auth-rate"] == 0.001


class Guesser(RawPeer):
    def frame_received(self, type_: int, message: Message | None) -> None:
        if isinstance(message, Identity):
            self.send(Login("node-x", sign_login("a guess", message.nonce, "node-x")))


async def node_guess(site: RunningSite) -> str:
    peer = Guesser()
    port = site.service.nodes_port.getHost().port
    await TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(
        Factory.forProtocol(lambda: peer)  # type: ignore[arg-type, return-value]
    )
    await peer.closed
    [result] = peer.of_type(LoginResult)
    return str(result.reason)


async def sign_in(site: RunningSite, token: str) -> tuple[int, str]:
    response = await treq.post(
        f"{site.base_url}/api/session",
        json={"token": token},
        headers={"Origin": [site.base_url]},
        pool=site.pool,
    )
    await treq.content(response)
    cookies = response.headers.getRawHeaders("Set-Cookie") or [""]
    return response.code, cookies[0].split(";", 1)[0]


@pytest_twisted.ensureDeferred
async def test_the_options_reach_the_running_site(db_target: str) -> None:
    upstream = await start_upstream()
    options = site_options(
        db_target,
        upstream.base_url,
        "--demo",
        "--auth-burst",
        "3",
        "--auth-rate",
        "0.01",
        "--node-auth-burst",
        "2",
        "--node-auth-rate",
        "0.01",
        "--max-sessions-per-user",
        "2",
    )
    try:
        async with running_site(options) as site:
            # Two sessions at most: a third sign-in ends the first.
            cookies = [await sign_in(site, "demo") for _ in range(3)]
            assert [code for code, _ in cookies] == [200] * 3
            codes = []
            for _, cookie in cookies:
                response = await treq.get(
                    f"{site.base_url}/api/me", headers={"Cookie": [cookie]}, pool=site.pool
                )
                await treq.content(response)
                codes.append(response.code)
            assert codes == [401, 200, 200]
            # Three wrong tokens, then refused unlooked-up.
            statuses = [
                (await site.request("GET", "/api/me", token=f"guess-{n}"))[0] for n in range(5)
            ]
            assert statuses == [401, 401, 401, 429, 429]
            # Two failed node Logins, then refused unjudged.
            reasons = [await node_guess(site) for _ in range(3)]
            assert reasons[:2] == ["unknown node", "unknown node"]
            assert reasons[2].startswith("too many failed logins from this address")
    finally:
        await upstream.stop()
