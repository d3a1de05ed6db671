"""A tiny blocking JSON-over-HTTP client (stdlib only) for the command-line
tools: ``tasknet-demo`` waits for its children with it and the drill
(``tasknet.drill``) drives the site and the mock upstream with it.

It lives here rather than in the drill because nothing may import the drill.
Plain sequential code with a blocking client keeps those tools readable.
Connection errors are returned as a :class:`Reply` with ``status == 0``
rather than raised: "the site is down (yet)" is an expected observation there,
not a bug.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    """An HTTP answer; ``status == 0`` means no answer (refused, reset, timeout)."""

    status: int
    body: Any
    text: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def brief(self) -> str:
        """One line for evidence: status and (truncated) body."""
        if self.status == 0:
            return f"no answer ({self.error})"
        return f"{self.status} {self.text[:300]}"


def request(
    method: str,
    url: str,
    body: Any = None,
    *,
    token: str | None = None,
    timeout: float = 10.0,
) -> Reply:
    """Send one request (``body`` as JSON, ``token`` as a Bearer token);
    decode a JSON answer when there is one (``body`` None otherwise)."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return _reply(resp.status, resp.read())
    except urllib.error.HTTPError as err:
        return _reply(err.code, err.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
        return Reply(0, None, "", error=f"{type(err).__name__}: {err}")


def _reply(status: int, raw: bytes) -> Reply:
    text = raw.decode("utf-8", errors="replace")
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = None
    return Reply(status, body, text)
