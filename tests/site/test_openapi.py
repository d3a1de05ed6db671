"""The OpenAPI document (``tasknet/site/web/openapi.py``) is the API's one
source of truth: it matches the klein routes both ways, names every error
code at its status, is valid OpenAPI 3.1, is served at
``GET /api/openapi.json`` without auth, and ``docs/api.md`` is its
rendering.  Also the answers schemathesis made the site give as
documented: ``405`` with ``Allow`` (``/api/...`` paths included) and
``426`` for a plain ``GET /api/events``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest_twisted
import schemathesis
import treq

from tasknet.site.web import openapi
from tasknet.site.web.api import SiteApi
from tasknet.site.web.errors import STATUS
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import running_site, site_options
from tests.site.rawhttp import exchange, request_bytes

REPO = Path(__file__).resolve().parents[2]
#: Klein rules that are no operation of their own: the ``/api/...``
#: catch-all (404, or 405 for a path that has routes) and the UI's static
#: files below ``/`` (the branch of ``GET /``).
NOT_OPERATIONS = {"api_not_found", "ui_branch"}
HANDSHAKE: dict[str, bytes | str] = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
}


def _routes() -> set[tuple[str, str]]:
    found = set()
    for rule in SiteApi.app.url_map.iter_rules():
        if rule.endpoint in NOT_OPERATIONS:
            continue
        assert rule.methods, f"{rule.rule} takes every method: name them"
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        # werkzeug adds HEAD to every GET route; the document leaves it implied.
        found |= {(method, path) for method in rule.methods if method != "HEAD"}
    return found


def test_the_document_and_the_routes_match_both_ways() -> None:
    documented = {(method, path) for method, path, _ in openapi.operations()}
    routes = _routes()
    assert routes - documented == set(), "routes the document does not have"
    assert documented - routes == set(), "operations no route serves"


def test_every_operation_is_complete() -> None:
    ids = set()
    for method, path, operation in openapi.operations():
        label = f"{method} {path}"
        assert operation["operationId"] not in ids, label
        ids.add(operation["operationId"])
        assert operation["summary"] and operation["description"], label
        responses = operation["responses"]
        assert "408" in responses and "413" in responses, label  # the HTTP layer's
        for parameter in re.findall(r"{([a-z_]+)}", path):
            names = [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
            assert parameter in names, label
        if operation["security"]:
            assert "401" in responses, label
        if operation["tags"] == ["admin"]:
            assert "403" in responses, label


def _error_codes(node: Any, status: str | None = None) -> list[tuple[str, str]]:
    """``(status, code)`` of every error response's code enum under ``node``."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = key if re.fullmatch(r"[1-5][0-9][0-9]", str(key)) else status
            if key == "error" and isinstance(value, dict) and "code" in value.get("properties", {}):
                found += [(status or "", code) for code in value["properties"]["code"]["enum"]]
            found += _error_codes(value, here)
    elif isinstance(node, list):
        for value in node:
            found += _error_codes(value, status)
    return found


def test_every_error_code_is_documented_at_its_status() -> None:
    document = openapi.document()
    responses = document["components"]["responses"]
    # Where a component response is used: its status is the key it is used under.
    pairs = _error_codes(document["paths"])
    for name, response in responses.items():
        statuses = {
            status
            for _, _, operation in openapi.operations(document)
            for status, used in operation["responses"].items()
            if used == {"$ref": f"#/components/responses/{name}"}
        } or {str(STATUS[_error_codes(response)[0][1]])}
        pairs += [(status, code) for status in statuses for _, code in _error_codes(response)]
    for status, code in pairs:
        assert STATUS[code] == int(status), (code, status)
    assert {code for _, code in pairs} == set(STATUS)


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi.document()
    assert document["openapi"].startswith("3.1.")
    schemathesis.openapi.from_dict(document).validate()
    # Served as built: the bytes are the document.
    assert json.loads(openapi.document_bytes()) == document


def test_docs_api_md_is_the_rendering_of_the_document() -> None:
    committed = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert committed == openapi.render_markdown(), (
        "docs/api.md is stale: python -m tasknet.site.web.openapi --markdown > docs/api.md"
    )


async def _get(url: str, method: str = "GET", **kw: Any) -> tuple[Any, bytes]:
    response = await treq.request(method, url, persistent=False, **kw)
    return response, await treq.content(response)


@pytest_twisted.ensureDeferred
async def test_served_without_auth_and_the_answers_schemathesis_asked_for(tmp_path) -> None:
    upstream = await start_upstream()
    try:
        options = site_options(str(tmp_path / "site.sqlite"), upstream.base_url, "--demo")
        async with running_site(options) as site:
            response, body = await _get(site.base_url + "/api/openapi.json")
            assert response.code == 200
            assert response.headers.getRawHeaders("content-type")[0].startswith("application/json")
            assert json.loads(body) == openapi.document()

            # 405 with Allow, for a path of the catch-all too.
            for method, path, allow in (
                ("PATCH", "/api/tasks", "GET, HEAD, POST"),
                ("DELETE", "/api/tasks/counts", "GET, HEAD"),
                ("POST", "/healthz", "GET, HEAD"),
                ("PUT", "/api/events", "GET, HEAD"),
            ):
                headers = {"Authorization": ["Bearer demo"]}
                response, body = await _get(site.base_url + path, method, headers=headers)
                assert response.code == 405, (method, path, body)
                assert response.headers.getRawHeaders("allow") == [allow], (method, path)
                assert json.loads(body)["error"]["code"] == "method_not_allowed"
            response, body = await _get(site.base_url + "/api/nothing", "PATCH")
            assert response.code == 404 and json.loads(body)["error"]["code"] == "not_found"

            # A plain GET of the WebSocket: the envelope, not autobahn's page.
            port = site.service.http_port.getHost().port
            auth: dict[str, bytes | str] = {"Authorization": "Bearer demo"}
            answer, _ = await exchange(port, request_bytes("GET", "/api/events", auth))
            assert answer.status == 426, answer.body
            assert answer.header("upgrade") == "websocket"
            assert answer.json()["error"]["code"] == "upgrade_required"
            assert b"Autobahn" not in answer.body
            old = request_bytes(
                "GET", "/api/events", {**auth, **HANDSHAKE, "Sec-WebSocket-Version": "8"}
            )
            answer, _ = await exchange(port, old)
            assert answer.status == 426 and answer.header("sec-websocket-version") == "13"
            no_key = {**auth, **HANDSHAKE, "Sec-WebSocket-Key": "c2hvcnQ="}
            answer, _ = await exchange(port, request_bytes("GET", "/api/events", no_key))
            assert answer.status == 400 and answer.json()["error"]["code"] == "invalid_request"
            answer, _ = await exchange(port, request_bytes("GET", "/api/events"))
            assert answer.status == 401  # credentials first, as before

            # A gid with no fraction is an integer in JSON.
            response, body = await _get(
                site.base_url + "/api/tasks",
                "POST",
                headers={"Authorization": ["Bearer demo"]},
                data=b'{"gid": 431.0, "token": "t"}',
            )
            assert response.code == 201, body
            assert json.loads(body)["task"]["gid"] == 431
    finally:
        await upstream.stop()
