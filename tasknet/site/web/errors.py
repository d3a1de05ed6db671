"""Error answers of the site HTTP API: ``{"error": {"code", "message"}}``
with the codes and statuses of INTERFACES.md."""

from __future__ import annotations

from typing import Any

import orjson
from twisted.web.iweb import IRequest

from tasknet.json_types import JsonValue

STATUS: dict[str, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    # The right token of a user an admin disabled (tasknet-admin user disable,
    # the admin UI's Users section): told so, not "unknown token".
    "account_disabled": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,  # no complete request in time (web.http)
    "conflict": 409,
    # POST /api/tasks (DELIVERY.md "Getting it again"): the caller's task is
    # ARCHIVE_GONE and the body has no "confirmCharge": true (with the last
    # generation's cost); the caller's task is COMPLETED with its archive held.
    "charge_confirmation_required": 409,
    "already_completed": 409,
    # GET /api/tasks/{gid}/archive and POST /api/tasks/archive-links
    # (DELIVERY.md "Getting an archive (site)", web/archives.py): the task is
    # not COMPLETED (with its status); its node is connected but serves
    # nothing (a legacy node, or one without --serve); the archive is gone
    # (with the reason); the node is not connected to this site, cannot be
    # reached, is at its --serve-max or refused the site's link (with
    # Retry-After where waiting helps); the user's streams through the site
    # are all taken.
    "archive_not_ready": 409,
    "archive_not_served": 409,
    "archive_gone": 410,
    "too_many_streams": 429,
    "node_unreachable": 502,
    "node_error": 502,
    "node_offline": 503,
    "node_busy": 503,
    # POST /api/admin/tasks/{gid}/resolve (docs/operations.md, "Reconcile UNKNOWN operations"):
    # "not_submitted" inside a reaped submission's verdict wait (with notBefore
    # and Retry-After), and a verdict the upstream's audit contradicts, without a note.
    "verdict_too_early": 409,
    "note_required": 409,
    # POST /api/tasks/bulk with a "filter" (issue 36): the filter matches
    # another number of tasks than "expect" (with the current "count"), or
    # more than the site acts on at once (with "count" and "max").
    "count_changed": 409,
    "too_many_tasks": 413,
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
    """Answer with ``code`` (and its status) and ``message``; ``details``
    are more fields of the error object (an archive's task ``status``),
    ``retry_after`` the seconds of a ``Retry-After`` header."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retry_after: int | None = None,
        **details: JsonValue,
    ) -> None:
        if code not in STATUS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.details = details

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


def write_error(request: IRequest, code: str, message: str, **details: JsonValue) -> bytes:
    if code == "unauthorized":
        request.setHeader(b"WWW-Authenticate", b'Bearer realm="tasknet"')
    error = {"code": code, "message": message, **details}
    return write_json(request, STATUS[code], {"error": error})


def write_api_error(request: IRequest, error: ApiError) -> bytes:
    """:func:`write_error` of ``error``, with its ``Retry-After``."""
    if error.retry_after is not None:
        request.setHeader(b"Retry-After", str(error.retry_after).encode("ascii"))
    return write_error(request, error.code, error.message, **error.details)
