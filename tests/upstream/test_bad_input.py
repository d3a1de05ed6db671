"""Bad inputs get a clear error and change nothing."""

from __future__ import annotations

import json

import pytest
import pytest_twisted

from tasknet.upstream.testing import RunningUpstream
from tests.upstream.conftest import Client


@pytest.mark.parametrize(
    ("path", "code", "error"),
    [
        ("/api/galleries/abc", 400, "invalid_request"),
        ("/api/galleries/-3", 400, "invalid_request"),
        ("/api/galleries/1.5", 400, "invalid_request"),
        ("/api/galleries/0", 404, "not_found"),
        ("/api/galleries/2147483649", 404, "not_found"),
        ("/api/galleries/9999999999999", 400, "invalid_request"),
        ("/files/nothing.bin", 404, "not_found"),
        ("/files/42-0.bin", 404, "not_found"),
        ("/files/0-1.bin", 404, "not_found"),
        ("/no/such/route", 404, "not_found"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_gets_give_json_errors(client: Client, path: str, code: int, error: str) -> None:
    got, body = await client.json("GET", path)
    assert (got, body["error"]["code"]) == (code, error)
    assert body["error"]["message"]


@pytest.mark.parametrize("gid", ["abc", "0", "2147483649"])
@pytest_twisted.ensureDeferred
async def test_bad_post_charges_nothing(client: Client, gid: str) -> None:
    code, body = await client.json("POST", f"/api/galleries/{gid}/archive")
    assert code in (400, 404) and "error" in body
    stats = await client.stats()
    assert stats["posts"] == {} and stats["charged"] == 0
    assert (await client.journal())["entries"] == []


@pytest_twisted.ensureDeferred
async def test_wrong_method_is_405(client: Client) -> None:
    code, body = await client.json("DELETE", "/api/galleries/5")
    assert (code, body["error"]["code"]) == (405, "method_not_allowed")


GOOD_RULE = {"method": "POST", "path": "/api/galleries/*/archive", "fault": "timeout"}


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", '{"rules"'),
        (b'{"rules": {}}', "must be a list"),
        (b'{"rules": [], "extra": 1}', '{"rules"'),
        (json.dumps({"rules": [GOOD_RULE, {"fault": "explode"}]}).encode(), "rules[1].fault"),
        (json.dumps({"rules": [{"fault": "latency"}]}).encode(), "params.ms is required"),
        (json.dumps({"rules": [{"fault": "latency", "params": {"ms": -1}}]}).encode(), "ms"),
        (json.dumps({"rules": [{"fault": "error", "params": {"status": 200}}]}).encode(), "status"),
        (
            json.dumps({"rules": [{"fault": "reject", "params": {"status": 500}}]}).encode(),
            "status",
        ),
        (
            json.dumps({"rules": [{"fault": "error", "params": {"charged": "yes"}}]}).encode(),
            "charged",
        ),
        (
            json.dumps({"rules": [{"fault": "timeout", "params": {"ms": 1}}]}).encode(),
            "unknown keys",
        ),
        (json.dumps({"rules": [{"fault": "timeout", "probability": 2}]}).encode(), "probability"),
        (json.dumps({"rules": [{"fault": "timeout", "times": -1}]}).encode(), "times"),
        (json.dumps({"rules": [{"fault": "timeout", "times": 1.5}]}).encode(), "times"),
        (json.dumps({"rules": [{"fault": "timeout", "path": 3}]}).encode(), "path"),
        (json.dumps({"rules": [{"fault": "timeout", "method": "PO ST"}]}).encode(), "method"),
        (json.dumps({"rules": [{"fault": "timeout", "when": "now"}]}).encode(), "unknown keys"),
        (json.dumps({"rules": ["timeout"]}).encode(), "rules[0] must be an object"),
        (
            json.dumps({"rules": [{"fault": "slow_body", "params": {"bytes_per_s": 0}}]}).encode(),
            "bytes_per_s",
        ),
        (
            json.dumps({"rules": [{"fault": "reset_mid_body", "params": {}}]}).encode(),
            "after_bytes",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_fault_documents_are_400_and_keep_the_rules(
    client: Client, upstream: RunningUpstream, document: bytes, fragment: str
) -> None:
    code, _ = await client.put_faults([GOOD_RULE])
    assert code == 200
    before = (await client.json("GET", "/_drill/faults"))[1]
    code, body = await client.json("PUT", "/_drill/faults", data=document)
    assert code == 400
    assert body["error"]["code"] == "invalid_request"
    assert fragment in body["error"]["message"]
    assert (await client.json("GET", "/_drill/faults"))[1] == before
    assert [r.fault for r in upstream.app.faults.rules] == ["timeout"]
