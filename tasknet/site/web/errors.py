"""Error answers of the site HTTP API: ``{"error": {"code", "message"}}``
with the codes and statuses of INTERFACES.md."""

from __future__ import annotations

from typing import Any

import orjson
from twisted.web.iweb import IRequest

STATUS: dict[str, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,  # no complete request in time (web.http)
    "conflict": 409,
    # POST /api/admin/tasks/{gid}/resolve (docs/operations.md, "Reconcile UNKNOWN operations"):
    # "not_submitted" inside a reaped submission's verdict wait (with notBefore
    # and Retry-After), and a verdict the upstream's audit contradicts, without a note.
    "verdict_too_early": 409,
    "note_required": 409,
    "payload_too_large": 413,
    "upstream_rejected": 422,
    # GET /api/events without a WebSocket handshake (``Upgrade: websocket``), with ``Upgrade``.
    "upgrade_required": 426,
    "quota_exceeded": 429,
    "rate_limited": 429,  # per-user create rate (tasknet.site.ratelimit), with Retry-After
    "internal": 500,
    "upstream_unavailable": 502,
    # This site cannot act now: its database is busy or unreachable, or it
    # is fenced (its lease is stale or lost).  Nothing was changed; retry,
    # or use another site.  With Retry-After.
    "unavailable": 503,
}


class ApiError(Exception):
    """Answer with ``code`` (and its status) and ``message``."""

    def __init__(self, code: str, message: str) -> None:
        if code not in STATUS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.code]


def json_bytes(document: Any) -> bytes:
    """Compact UTF-8 JSON, by orjson (C): a 300 kB node panel or a page of
    100 tasks was milliseconds of the reactor's time with the standard
    library (B9).  Integer keys are written as strings, as ``json`` does; a
    float that is not finite is ``null`` (``json`` wrote ``NaN``, which is
    not JSON)."""
    return orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS)


def write_json(request: IRequest, status: int, document: Any) -> bytes:
    """Set status and JSON headers; return the body to write."""
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
    request.setHeader(b"Cache-Control", b"no-store")
    return json_bytes(document)


def write_error(request: IRequest, code: str, message: str) -> bytes:
    if code == "unauthorized":
        request.setHeader(b"WWW-Authenticate", b'Bearer realm="tasknet"')
    return write_json(request, STATUS[code], {"error": {"code": code, "message": message}})
