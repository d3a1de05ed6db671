"""A scripted stand-in for the site's archive API and a node's serve
endpoint, over real HTTP on loopback (DELIVERY.md's shapes), for
``tasknet-get``'s tests.

Two servers, so two origins: the *site* (``POST /api/tasks/archive-links``,
``GET /api/tasks/{gid}/archive``, ``GET /api/me``, ``GET /api/tasks``) and
the *node* (``GET /archives/{gid}/{operationId}?exp&user&sig``).  Each runs
``http.server`` in a thread of its own (the client under test is blocking
code, run in this process or as a child).  The script is plain data the test
sets: which archives exist, what the site says is missing, where a transfer
stalls, which links come back expired.  Every request is recorded with its
headers.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: How long a stalled or gated transfer waits at most (a bound on a failing
#: test, not a pace: the test releases it).
HOLD_LIMIT = 30.0


@dataclass
class Archive:
    gid: int
    name: str
    data: bytes
    #: What the site recorded; ``None`` for a legacy node's completion.
    sha256: str | None = "auto"  # type: ignore[assignment]
    size: int | None = -1
    #: What the node actually sends, when it is not ``data`` (a corrupt file).
    served: bytes | None = None

    def __post_init__(self) -> None:
        if self.sha256 == "auto":
            self.sha256 = hashlib.sha256(self.data).hexdigest()
        if self.size == -1:
            self.size = len(self.data)

    @property
    def etag(self) -> str:
        return f'"sha256-{hashlib.sha256(self.data).hexdigest()}"'


@dataclass
class Seen:
    server: str
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Script:
    token: str
    archives: dict[int, Archive] = field(default_factory=dict)
    #: gid -> the error object of a ``missing`` entry (``{"code": ...}``).
    missing: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: ``node``: links are the node's signed ones; ``site``: the site's own URL.
    via: str = "node"
    #: gid -> stop after this many bytes of the file, hold, then close.
    stall_at: dict[int, int] = field(default_factory=dict)
    #: gids whose next node request answers 403 link_expired (once each).
    expire_next: set[int] = field(default_factory=set)
    #: ...and keep answering it (a link the node never takes).
    expire_always: bool = False
    #: gid -> how many node requests answer 503 with ``Retry-After: 0`` first.
    busy: dict[int, int] = field(default_factory=dict)
    #: gid -> a status every node request answers (an error page, no envelope).
    broken: dict[int, int] = field(default_factory=dict)
    #: gids whose node ignores Range (answers 200 with the whole file).
    ignore_range: set[int] = field(default_factory=set)
    #: While clear, the node holds every answer before its body.
    gate: threading.Event = field(default_factory=threading.Event)
    #: The completed tasks ``GET /api/tasks`` lists (pages of two).
    listed: list[dict[str, Any]] = field(default_factory=list)
    user: str = "alice"
    link_ttl: float = 600.0

    def __post_init__(self) -> None:
        self.gate.set()


class ArchivePeer:
    """The two servers and what they saw."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[Seen] = []
        self.active = 0
        self.most_active = 0
        self.released = threading.Event()
        self._lock = threading.Lock()
        self.site = _server(self, "site")
        self.node = _server(self, "node")

    @property
    def site_url(self) -> str:
        return f"http://127.0.0.1:{self.site.server_address[1]}/"

    @property
    def node_url(self) -> str:
        return f"http://127.0.0.1:{self.node.server_address[1]}/"

    def requests(self, server: str, path_prefix: str = "") -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.server == server and s.path.startswith(path_prefix)]

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def enter(self) -> None:
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)

    def leave(self) -> None:
        with self._lock:
            self.active -= 1


def _server(peer: ArchivePeer, role: str) -> ThreadingHTTPServer:
    handler = type(f"{role}Handler", (_Handler,), {"peer": peer, "role": role})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server


@contextmanager
def running_peer(script: Script) -> Iterator[ArchivePeer]:
    peer = ArchivePeer(script)
    threads = [
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        for server in (peer.site, peer.node)
    ]
    for thread in threads:
        thread.start()
    try:
        yield peer
    finally:
        peer.released.set()
        script.gate.set()
        for server in (peer.site, peer.node):
            server.shutdown()
            server.server_close()


class _Handler(BaseHTTPRequestHandler):
    peer: ArchivePeer
    role: str
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # quiet: the test reads peer.seen

    # -- plumbing

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)

    def _error(
        self, status: int, code: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        error = {"code": code, "message": code.replace("_", " "), **extra}
        self._json(status, {"error": error}, headers)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.peer.script.token}":
            return True
        self._error(401, "unauthorized")
        return False

    def _record(self) -> None:
        self.peer.record(Seen(self.role, self.command, self.path, dict(self.headers.items())))

    # -- routes

    def do_GET(self) -> None:
        self._record()
        path = urlsplit(self.path).path
        if self.role == "node":
            match = re.fullmatch(r"/archives/(\d+)/([\w-]+)", path)
            if not match:
                self._error(404, "not_found")
                return
            gid = int(match.group(1))
            if gid in self.peer.script.expire_next:
                if not self.peer.script.expire_always:
                    self.peer.script.expire_next.discard(gid)
                self._error(403, "link_expired")
                return
            if self.peer.script.busy.get(gid):
                self.peer.script.busy[gid] -= 1
                self._error(503, "busy", headers={"Retry-After": "0"})
                return
            if gid in self.peer.script.broken:
                self.send_response(self.peer.script.broken[gid])
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", "6")
                self.end_headers()
                self.wfile.write(b"<html>")
                return
            self._serve(gid)
            return
        if not self._authorized():
            return
        if match := re.fullmatch(r"/api/tasks/(\d+)/archive", path):
            self._serve(int(match.group(1)))
        elif path == "/api/me":
            self._json(200, {"user": {"name": self.peer.script.user, "admin": False}})
        elif path == "/api/tasks":
            self._list()
        else:
            self._error(404, "not_found")

    def do_POST(self) -> None:
        self._record()
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        if self.role != "site" or urlsplit(self.path).path != "/api/tasks/archive-links":
            self._error(404, "not_found")
            return
        if not self._authorized():
            return
        script = self.peer.script
        links, missing = [], []
        for gid in body["gids"]:
            if gid in script.missing:
                missing.append({"gid": gid, **script.missing[gid]})
            elif gid in script.archives:
                links.append(self._link(script.archives[gid]))
            else:
                missing.append({"gid": gid, "code": "not_found"})
        self._json(200, {"links": links, "missing": missing})

    def _link(self, archive: Archive) -> dict[str, Any]:
        script = self.peer.script
        expires = time.time() + script.link_ttl
        if script.via == "node":
            query = f"exp={int(expires)}&user=1&sig=ab12"
            url = f"{self.peer.node_url}archives/{archive.gid}/op-{archive.gid}?{query}"
        else:
            url = f"{self.peer.site_url}api/tasks/{archive.gid}/archive"
        return {
            "gid": archive.gid,
            "url": url,
            "expiresAt": datetime.fromtimestamp(expires, UTC).isoformat().replace("+00:00", "Z"),
            "size": archive.size,
            "sha256": archive.sha256,
            "name": f"{archive.name}.zip",  # as the site names it
        }

    def _list(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        assert query["status"] == ["COMPLETED"], query
        start = int(query.get("after", ["0"])[0])
        tasks = self.peer.script.listed[start : start + 2]
        more = start + 2 < len(self.peer.script.listed)
        self._json(200, {"tasks": tasks, "next": str(start + 2) if more else None, "total": 0})

    def _serve(self, gid: int) -> None:
        script = self.peer.script
        archive = script.archives.get(gid)
        if archive is None:
            self._error(404, "not_found")
            return
        data = archive.served if archive.served is not None else archive.data
        start = 0
        ranged = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if ranged and gid not in script.ignore_range and if_range in (None, archive.etag):
            match = re.fullmatch(r"bytes=(\d+)-", ranged)
            assert match, ranged
            start = int(match.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.peer.enter()
        try:
            script.gate.wait(HOLD_LIMIT)
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Type", "application/zip")
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", archive.etag)
            self.end_headers()
            stall = script.stall_at.get(gid)
            if stall is not None and start < stall:
                self.wfile.write(data[start:stall])
                self.wfile.flush()
                self.peer.released.wait(HOLD_LIMIT)
                self.close_connection = True
                return
            self.wfile.write(data[start:])
        finally:
            self.peer.leave()
