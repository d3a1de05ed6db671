"""Issue 38, Build 4: the OpenAPI document says what schemathesis'
``--checks all`` run (another seed than CI's) tripped on.

Before: ``after`` was documented by one pattern with no word on its bounds
(``order=size&after=99999999999999999999~1`` was a 500 on SQLite);
``POST /api/session`` and ``DELETE /api/session`` did not say which
credentials they read; no link led to ``POST /api/admin/tasks/{gid}/resolve``
from the list of ``UNKNOWN`` tasks; ``429 rate_limited`` (a wrong-token
limit per address) was not documented where a token is checked; the
asynchronous delete was one line.  The WebSocket's ``101`` was already
declared (kept here)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tasknet.site.storage.views import CURSOR_KEY_MAX, CURSOR_KEY_MIN, Order, parse_cursor
from tasknet.site.web import openapi


def _operation(path: str, method: str) -> Any:
    return openapi.document()["paths"][path][method]


def _codes(response: Any, document: Any) -> set[str]:
    if "$ref" in response:
        response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema = response["content"]["application/json"]["schema"]
    return set(schema["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"])


def test_the_websocket_upgrade_is_declared() -> None:
    assert "101" in _operation("/api/events", "get")["responses"]


def test_after_says_its_shape_per_order_with_the_bounds() -> None:
    (after,) = [p for p in _operation("/api/tasks", "get")["parameters"] if p["name"] == "after"]
    assert after["schema"]["pattern"] == openapi.AFTER_PATTERN
    for order in Order:
        assert (
            f"`{order.value}`" in after["description"]
            or f"order={order.value}" in (after["description"])
        )
    assert str(CURSOR_KEY_MIN) in after["description"]
    assert str(CURSOR_KEY_MAX) in after["description"]


@pytest.mark.parametrize(
    ("order", "after"),
    [
        (Order.GID, "101777"),
        (Order.SIZE, f"{CURSOR_KEY_MAX}~5"),
        (Order.STATUS, f"{CURSOR_KEY_MIN}~5"),
        (Order.PROGRESS, "0.5~5"),
        (Order.NEWEST, "2026-12-01T08:17:28.120Z~101777"),
        (Order.OLDEST, "2026-12-01T08:17:28.120Z~101777"),
    ],
)
def test_every_orders_cursor_matches_the_pattern(order: Order, after: str) -> None:
    parse_cursor(order, after)  # the site takes it
    assert re.fullmatch(openapi.AFTER_PATTERN.strip("^$"), after)


def test_the_session_operations_say_which_credentials_they_read() -> None:
    sign_in = _operation("/api/session", "post")
    assert sign_in["security"] == []  # the body's token is the credential
    assert "body's `token`" in sign_in["description"]
    assert sign_in["requestBody"]["content"]["application/json"]["schema"]["properties"]["token"]
    sign_out = _operation("/api/session", "delete")
    assert sign_out["security"] == [{"session": []}, {}]  # the cookie, optional
    assert "bearer token is ignored" in sign_out["description"]


def test_a_link_leads_from_the_unknown_tasks_to_resolve() -> None:
    links = _operation("/api/admin/unknown", "get")["responses"]["200"]["links"]
    assert {link["operationId"] for link in links.values()} == {"resolveTask"}
    (link,) = links.values()
    assert link["parameters"] == {"gid": "$response.body#/tasks/0/gid"}


def test_every_operation_that_checks_a_token_documents_rate_limited() -> None:
    document = openapi.document()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            schemes = {name for scheme in operation["security"] for name in scheme}
            checks_a_token = bool(schemes & {"bearer", "query"}) or operation["operationId"] == (
                "signIn"
            )
            if not checks_a_token:
                continue
            response = operation["responses"].get("429")
            assert response is not None, (method, path)
            assert "rate_limited" in _codes(response, document), (method, path)
            if "$ref" in response:
                response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
            assert "Retry-After" in response["headers"], (method, path)


def test_the_asynchronous_delete_is_described() -> None:
    delete = _operation("/api/tasks/{gid}", "delete")
    assert "DELETE_PENDING" in delete["description"]
    assert "until the node holding the archive confirms" in delete["description"]
    pending = delete["responses"]["202"]
    assert "stays until its node confirms" in pending["description"]
    assert pending["links"]["GetTask"]["operationId"] == "getTask"


def test_bulk_answers_say_how_many_duplicates_were_dropped() -> None:
    results = openapi.document()["components"]["schemas"]["BulkResults"]
    assert "duplicates" in results["required"]
    assert results["properties"]["duplicates"]["minimum"] == 0
