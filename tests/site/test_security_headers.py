"""Security headers on every answer of the site's HTTP port: the UI, its
static files, the API (success and errors), health, metrics, the errors
written before a request is routed, and the WebSocket handshake."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest_twisted

from tasknet.site.web.api import STATIC_DIR
from tasknet.site.web.http import CONTENT_SECURITY_POLICY
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import add_user, running_site, site_options
from tests.site.rawhttp import exchange, open_websocket, request_bytes, websocket_upgrade

EXPECTED = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def test_the_policy_is_strict():
    directives = dict(
        part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";") if part.strip()
    )
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval
    assert directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["base-uri"] == "'none'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY


def _assert_headers(answer, what):
    for name, value in EXPECTED.items():
        assert answer.headers.get(name) == [value], (what, name, answer.headers.get(name))


@pytest_twisted.ensureDeferred
async def test_every_kind_of_answer_carries_the_headers(db_target):
    upstream = await start_upstream()
    path = db_target
    try:
        async with running_site(
            site_options(path, upstream.base_url, "--demo", "--max-body", "100")
        ) as site:
            _, token = add_user(path, "alice")
            port = site.service.http_port.getHost().port
            auth = {"Authorization": f"Bearer {token}"}
            requests = {
                "UI": (request_bytes("GET", "/"), 200),
                "index.html": (request_bytes("GET", "/index.html"), 200),
                "app.js": (request_bytes("GET", "/app.js"), 200),
                "style.css": (request_bytes("GET", "/style.css"), 200),
                "missing static": (request_bytes("GET", "/nope.js"), 404),
                "API 200": (request_bytes("GET", "/api/tasks", auth), 200),
                "API 401": (request_bytes("GET", "/api/tasks"), 401),
                "API 403": (request_bytes("GET", "/api/admin/unknown", auth), 403),
                "API 404": (request_bytes("GET", "/api/nothing", auth), 404),
                "UI 405": (request_bytes("PATCH", "/index.html"), 405),
                "healthz": (request_bytes("GET", "/healthz"), 200),
                "metrics": (request_bytes("GET", "/metrics"), 200),
                "NUL path": (request_bytes("GET", "/%00"), 404),
                "413 before routing": (
                    request_bytes("POST", "/api/tasks", {"Content-Length": "101"}),
                    413,
                ),
                "400 from the parser": (b"NONSENSE\r\n\r\n", 400),
            }
            for what, (raw, status) in requests.items():
                answer, _ = await exchange(port, raw)
                assert answer.status == status, (what, answer.status, answer.body[:200])
                _assert_headers(answer, what)

            # The WebSocket opening handshake (101) too.
            client, answer = await open_websocket(port, token)
            _assert_headers(answer, "WebSocket 101")
            client.abort()
            await client.closed
            # A refused handshake is the JSON envelope, with the headers.
            answer, _ = await exchange(port, websocket_upgrade("wrong"))
            assert answer.status == 401
            assert answer.json()["error"]["code"] == "unauthorized"
            _assert_headers(answer, "WebSocket 401")
    finally:
        await upstream.stop()


class _InlineFinder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script_without_src = False

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        for name, _ in attrs:
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...> inline handler")
            if name == "style":
                self.problems.append(f"<{tag} style=...> inline style")
        if tag == "style":
            self.problems.append("<style> element")
        if tag == "script" and not names.get("src"):
            self.problems.append("inline <script>")
        for name in ("href", "src", "action"):
            if (names.get(name) or "").strip().lower().startswith("javascript:"):
                self.problems.append(f"javascript: URL in <{tag} {name}>")


def test_the_ui_page_has_no_inline_script_style_or_handler():
    finder = _InlineFinder()
    finder.feed((STATIC_DIR / "index.html").read_text(encoding="utf-8"))
    assert finder.problems == []
