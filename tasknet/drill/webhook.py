"""A webhook receiver for drills: records every notification the site POSTs
(its ``X-Tasknet-Notification`` id and JSON body).

It runs in its own thread (stdlib ``ThreadingHTTPServer``) on a loopback
port, so D7 can compare what the site's outbox says it delivered with what a
receiver actually got.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookSink:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.received: list[Any] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - stdlib hook name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = {"undecodable": raw.decode("utf-8", errors="replace")}
                notification = self.headers.get("X-Tasknet-Notification")
                with sink._lock:
                    sink.received.append({"id": notification, "body": body})
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # keep drill output clean

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> WebhookSink:
        self._thread.start()
        return self

    def bodies(self) -> list[Any]:
        with self._lock:
            return list(self.received)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
