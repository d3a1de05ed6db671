"""``tasknet.cli.jsonhttp``: the blocking JSON-over-HTTP helper of the demo
and the drill, against a real loopback HTTP server (stdlib, in a thread: the
helper blocks, so no reactor is involved)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tasknet.cli.jsonhttp import Reply, request


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/text":
            self._answer(200, b"not json")
        elif self.path == "/empty":
            self._answer(204, b"")
        else:
            self._answer(404, b'{"error":"no such thing"}')

    def do_PUT(self) -> None:
        sent = self.rfile.read(int(self.headers["Content-Length"]))
        echo = {
            "body": json.loads(sent),
            "type": self.headers["Content-Type"],
            "auth": self.headers["Authorization"],
        }
        self._answer(200, json.dumps(echo).encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_json_body_and_token_go_out_and_the_json_answer_comes_back(base: str) -> None:
    reply = request("PUT", f"{base}/echo", {"rules": [1, "ü"]}, token="t0k")
    assert reply.ok and reply.status == 200
    assert reply.body == {
        "body": {"rules": [1, "ü"]},
        "type": "application/json",
        "auth": "Bearer t0k",
    }


def test_an_error_status_is_an_answer_with_its_body(base: str) -> None:
    reply = request("GET", f"{base}/missing")
    assert (reply.status, reply.ok, reply.body) == (404, False, {"error": "no such thing"})
    assert reply.brief() == '404 {"error":"no such thing"}'


def test_a_body_that_is_not_json_keeps_its_text(base: str) -> None:
    assert request("GET", f"{base}/text") == Reply(200, None, "not json")
    assert request("GET", f"{base}/empty") == Reply(204, None, "")


def test_no_answer_is_status_zero_not_an_exception() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        reply = request("GET", f"http://127.0.0.1:{port}/", timeout=2)
    assert (reply.status, reply.ok, reply.body) == (0, False, None)
    assert "Connection refused" in reply.error and reply.brief().startswith("no answer (")
