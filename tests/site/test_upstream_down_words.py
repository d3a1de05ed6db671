"""The upstream is down (issue 36, item 9): the API's message says so in
words with numbers, never an exception's text ("ConnectionRefusedError:
Connection was refused by other side: 111: ..."), and nothing is changed.
A real site on both backends, its upstream a loopback port nobody listens on."""

from __future__ import annotations

import json
import socket

import pytest_twisted

from tasknet.failures import plain_words
from tests.site.helpers import add_user, one, running_site, site_options
from tests.site.test_session_cookie import _call, _json


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest_twisted.ensureDeferred
async def test_a_create_while_the_upstream_is_down_says_so_in_words(db_target):
    upstream = f"http://127.0.0.1:{_closed_port()}"
    async with running_site(site_options(db_target, upstream)) as site:
        _, token = add_user(db_target, "alice")
        port = site.service.http_port.getHost().port
        answer = await _call(
            port, "POST", "/api/tasks", bearer=token, body=_json({"gid": 31, "token": "t"})
        )
        assert answer.status == 502, answer.body
        error = json.loads(answer.body)["error"]
        assert error["code"] == "upstream_unavailable"
        assert error["message"] == (
            "the upstream could not be asked about gid 31 (the connection was refused (nothing"
            " answers at that address)); nothing was submitted"
        )
        assert "Error" not in error["message"] and "111" not in error["message"]
    assert one(db_target, "SELECT COUNT(*) FROM gallery WHERE gid = 31")[0] == 0


def test_network_failures_in_words() -> None:
    from twisted.internet import error as twisted_errors

    assert plain_words(twisted_errors.ConnectionRefusedError("111: Connection refused")) == (
        "the connection was refused (nothing answers at that address)"
    )
    assert plain_words(twisted_errors.DNSLookupError("x")) == (
        "the host name is not known (DNS lookup failed)"
    )
    assert plain_words(OSError(28, "No space left on device")) == (
        "no space left on the disk (errno 28)"
    )
    assert plain_words(ValueError("HTTP 503")) is None
    # The node's DownloadError raised from treq's failure says its words
    # (a task's detail: "retrying in 8 s: the connection was refused ...").
    from tasknet.node.download import DownloadError

    try:
        try:
            raise twisted_errors.ConnectionRefusedError("111: Connection refused")
        except twisted_errors.ConnectionRefusedError as refused:
            raise DownloadError(f"GET http://upstream/x: {refused}") from refused
    except DownloadError as failed:
        assert plain_words(failed) == (
            "the connection was refused (nothing answers at that address)"
        )
    assert plain_words(DownloadError("GET http://upstream/x: HTTP 503")) is None
