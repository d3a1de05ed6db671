"""The OpenAPI 3.1 document of the site's HTTP API: the one source of truth.

:func:`document` builds it (served as ``GET /api/openapi.json``, public);
:func:`render_markdown` renders it as ``docs/api.md``.  Tests keep the three
honest: ``tests/site/test_openapi.py`` checks the document against the klein
routes of :class:`~tasknet.site.web.api.SiteApi` both ways (no route missing,
none extra, the same methods), the error codes against
:data:`~tasknet.site.web.errors.STATUS`, and ``docs/api.md`` against the
rendering; ``tests/site/test_schemathesis.py`` runs schemathesis against a
real site (real processes) with it.

Regenerate ``docs/api.md`` after a change here::

    python -m tasknet.site.web.openapi --markdown > docs/api.md

What the document says beyond INTERFACES.md is what the code does
(``web/api.py``, ``web/auth.py``, ``web/http.py``, ``web/errors.py``):

* every status an operation can answer is listed, with the error codes each
  error status can carry (the ``code`` of the envelope is an ``enum`` per
  response, so a wrong code fails the schema check);
* ``408`` and ``413`` come from the HTTP layer, before any route runs, so
  every operation lists them; a method a path does not have is ``405``
  ``method_not_allowed`` with an ``Allow`` header, and a path no route has
  is ``404`` (neither is an operation of its own);
* ``503 unavailable`` (with ``Retry-After``) is the answer of any operation
  that reads the database when the database is busy or unreachable, or the
  site is fenced: nothing changed, try again;
* ``500 internal`` is documented only where the site answers it on purpose
  (a create whose outcome could not be recorded); anywhere else it is a bug.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
from collections.abc import Iterable
from typing import Any

from tasknet import __version__
from tasknet.site.storage.custody import GONE_REASONS
from tasknet.site.storage.throughput import TOP_NODES
from tasknet.site.storage.views import CURSOR_KEY_MAX, CURSOR_KEY_MIN, GID_MAX, GID_MIN
from tasknet.site.web.admin_users import MAX_QUOTA
from tasknet.site.web.errors import STATUS
from tasknet.status import OperationState, TaskStatus

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"

#: Bounds of the request fields, as ``web/api.py`` enforces them.
MAX_TOKEN = 512
MAX_NAME = 256
MAX_NOTE = 2000
MAX_SEARCH = 256
MAX_PAGE = 500
MIN_WINDOW = 60
MAX_WINDOW = 86400
MAX_NODE_ID = 128
MAX_BULK = 500
#: ``page × limit`` at most (``task_queries.MAX_PAGE_REACH``) and the default
#: ``--max-bulk-matching`` (``task_queries.MAX_BULK_MATCHING``).
MAX_PAGE_REACH = 100_000
MAX_BULK_MATCHING = 10_000
MAX_ARCHIVE_LINKS = 1000
#: ``GET /api/tasks``' orders and the ``QUEUED`` and ``SUBMITTED_NOT_QUEUED``
#: filter keys (``storage.views``).
ORDERS = ["newest", "oldest", "gid", "size", "progress", "status"]
QUEUED = "QUEUED"
SUBMITTED_NOT_QUEUED = "SUBMITTED_NOT_QUEUED"
#: ``after`` of ``GET /api/tasks``: the union of every order's cursor shape
#: (``views.parse_cursor`` takes one of them per order).
AFTER_PATTERN = "^([^~\\u0000-\\u001f]{1,64}~[0-9]{1,10}|[0-9]{1,10})$"

Schema = dict[str, Any]

_REASONS = {
    101: "Switching Protocols",
    200: "OK",
    201: "Created",
    202: "Accepted",
    206: "Partial Content",
    303: "See Other",
    304: "Not Modified",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    413: "Content Too Large",
    416: "Range Not Satisfiable",
    422: "Unprocessable Content",
    426: "Upgrade Required",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}

# A JSON string the site accepts: no NUL (any NUL in a request's JSON is 400).
_NO_NUL = "^[^\\u0000]*$"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    """``schema`` or ``null`` (OpenAPI 3.1: a type list, or ``oneOf``)."""
    if "$ref" in schema:
        return {"oneOf": [schema, {"type": "null"}]}
    out = dict(schema)
    kind = out.get("type")
    if isinstance(kind, str):
        out["type"] = [kind, "null"]
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    return out


def _object(
    properties: dict[str, Schema],
    *,
    required: Iterable[str] | None = None,
    description: str | None = None,
    additional: bool | Schema | None = None,
) -> Schema:
    schema: Schema = {"type": "object"}
    if description:
        schema["description"] = description
    schema["properties"] = properties
    names = list(properties) if required is None else list(required)
    if names:
        schema["required"] = names
    if additional is not None:
        schema["additionalProperties"] = additional
    return schema


def _string(description: str | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "string", **extra}
    if description:
        schema["description"] = description
    return schema


def _integer(description: str | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "integer", **extra}
    if description:
        schema["description"] = description
    return schema


def _codes(status: int) -> list[str]:
    return [code for code, value in STATUS.items() if value == status]


# -- responses --------------------------------------------------------------------


def _json_response(description: str, schema: Schema, headers: Schema | None = None) -> Schema:
    response: Schema = {"description": description, "content": {JSON: {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


_RETRY_AFTER = {
    "Retry-After": {
        "description": "Whole seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 0},
    }
}


def _error(status: int, description: str, *codes: str, headers: Schema | None = None) -> Schema:
    """An error answer: the envelope, its ``code`` one of ``codes``."""
    if not codes:
        codes = tuple(_codes(status))
        if len(codes) != 1:
            raise ValueError(f"name the codes of {status}: one of {codes}")
    for code in codes:
        if STATUS[code] != status:
            raise ValueError(f"{code} is {STATUS[code]}, not {status}")
    schema: Schema = {
        "allOf": [
            _ref("Error"),
            {"properties": {"error": {"properties": {"code": {"enum": list(codes)}}}}},
        ]
    }
    return _json_response(description, schema, headers)


def _unauthorized() -> Schema:
    return _error(
        401,
        "No credentials, an unknown token, an ended or expired session, or an "
        "`Authorization` header or session cookie that is not UTF-8.",
        "unauthorized",
        headers={
            "WWW-Authenticate": {
                "description": 'Always `Bearer realm="tasknet"`.',
                "required": True,
                "schema": {"type": "string"},
            }
        },
    )


_COMMON_RESPONSES: dict[str, Schema] = {
    "RequestTimeout": _error(
        408,
        "No complete request (headers and body) within 30 s: answered by the HTTP "
        "layer before any route runs, and the connection is closed.",
        "request_timeout",
    ),
    "PayloadTooLarge": _error(
        413,
        "The body is over `--max-body` (default 1 MiB), by `Content-Length` or the "
        "running total of a chunked body: answered by the HTTP layer before the body "
        "is read or the caller authenticated, and the connection is closed.",
        "payload_too_large",
    ),
    "MethodNotAllowed": _error(
        405,
        "A method the path does not have (no operation of its own: any path with "
        "operations answers it for the other methods).",
        "method_not_allowed",
        headers={
            "Allow": {
                "description": "The path's methods, e.g. `GET, HEAD, POST`.",
                "required": True,
                "schema": {"type": "string"},
            }
        },
    ),
    "Unauthorized": _unauthorized(),
    "RateLimited": _error(
        429,
        "Too many wrong tokens from the caller's address (bearer header, `?token=` or a "
        "sign-in's body): until `Retry-After` no token from that address is looked up, a "
        "right one included. By default 1,000 wrong tokens at once, then ten a second "
        "(`--auth-burst`, `--auth-rate`).",
        "rate_limited",
        headers={**_RETRY_AFTER},
    ),
    "Unavailable": _error(
        503,
        "This site cannot act now: its database is busy or unreachable, or the site "
        "is fenced (its lease is stale or lost). Nothing changed; try again, here or "
        "through another site.",
        "unavailable",
        headers={**_RETRY_AFTER},
    ),
}


def _common(name: str) -> Schema:
    return {"$ref": f"#/components/responses/{name}"}


def _bad_request(description: str) -> Schema:
    return _error(400, description, "invalid_request")


_BAD_BODY = (
    "The body is not a JSON object (not JSON, invalid UTF-8, a lone surrogate, a NUL "
    "in any string or key, nested deeper than 64 levels), a field is missing, of the "
    "wrong type or out of bounds, or (a request authenticated by the session cookie) "
    "the body is not typed `application/json`."
)
_BAD_GID = f"The gid in the path is not an integer in {GID_MIN}..{GID_MAX}."
_COOKIE_FORBIDDEN = (
    "A request authenticated by the session cookie without an `Origin` header equal "
    "to the site's own (a bearer-token request needs none)."
)
_ADMIN_FORBIDDEN = "The caller is not an admin."


def _responses(ok: dict[str, Schema], *errors: tuple[int, Schema], db: bool = True) -> Schema:
    """``ok`` and ``errors``, then the HTTP layer's 408/413 and, for an
    operation that reads the database, 503."""
    responses: Schema = dict(ok)
    for status, response in errors:
        responses[str(status)] = response
    responses["408"] = _common("RequestTimeout")
    responses.setdefault("413", _common("PayloadTooLarge"))
    if db:
        responses.setdefault("503", _common("Unavailable"))
    return dict(sorted(responses.items()))


# -- schemas ----------------------------------------------------------------------

_STATUS_KEYS = [status.value for status in TaskStatus]
_FILTER_KEYS = [*_STATUS_KEYS, QUEUED]
# The list also takes the rest of SUBMITTED; the counts leave it out
# (SUBMITTED minus QUEUED), so their shape is unchanged.
_LIST_FILTER_KEYS = [*_FILTER_KEYS, SUBMITTED_NOT_QUEUED]
_STATES = [state.value for state in OperationState]
_TIME = _string("ISO 8601 UTC, e.g. `2026-12-01T08:17:28.120Z`.")


def _task_schema() -> Schema:
    return _object(
        {
            "gid": _integer(minimum=GID_MIN, maximum=GID_MAX),
            "name": _string("The upstream's title (from `prepare`) or the name given at create."),
            "state": _nullable(
                _string(
                    "The `task_operation.state`; `null` for a legacy row (or a gone task "
                    "released before it was recorded).",
                    enum=_STATES,
                )
            ),
            "status": _nullable(
                _string(
                    "The display key; `null` for a task that is gone (the client drops it).",
                    enum=_STATUS_KEYS,
                )
            ),
            "statusText": _nullable(_string("The display label (Chinese).")),
            "progress": {"type": "number", "minimum": 0, "maximum": 1},
            "operationId": _nullable(_string()),
            "deleteOperationId": _nullable(_string()),
            "node": _nullable(_string("The node the task is assigned to.")),
            "cost": _nullable(_integer("Cost units (known after `prepare`).")),
            "createdAt": _nullable(_TIME),
            "updatedAt": _nullable(_TIME),
            "owner": _nullable(_string("The owning user's name.")),
            "size": _nullable(_integer("Archive bytes, from `prepare`.", minimum=0)),
            "bytesDone": _nullable(_integer(minimum=0)),
            "speed": _nullable(
                {
                    "type": "number",
                    "minimum": 0,
                    "description": "Bytes/s, smoothed; `null` when not moving.",
                }
            ),
            "eta": _nullable(_integer("Seconds left at `speed`.", minimum=0)),
            "completedAt": _nullable(_TIME),
            "archiveSize": _nullable(
                _integer(
                    "Archive bytes as the node wrote them, reported with the completion; "
                    "`null` when unknown (not completed, or a legacy node).",
                    minimum=0,
                )
            ),
            "archiveSha256": _nullable(
                _string(
                    "The archive's SHA-256 (64 lowercase hex), reported with the completion; "
                    "`null` when unknown (not completed, or a legacy node).",
                    pattern="^[0-9a-f]{64}$",
                )
            ),
            "archiveGone": _nullable(
                _object(
                    {
                        "reason": _string(
                            "Why no node holds the archive any more: released by its node "
                            "(`EXPIRED`, `DISK_BUDGET`, `CORRUPT`, `MISSING`, `CANCELLED`), "
                            "missing from its node's inventory (`MISSING`), or its node "
                            "retired (`NODE_RETIRED`).",
                            enum=sorted(GONE_REASONS),
                        ),
                        "at": _TIME,
                        "node": _string("The node that held it."),
                    },
                    required=["reason", "at", "node"],
                    description="Set when `status` is `ARCHIVE_GONE` (归档已失效): the task "
                    "was completed and its archive is held by no node any more; creating the "
                    'gid again is a new charge (`"confirmCharge": true`).',
                )
            ),
            "queued": {
                "type": "boolean",
                "description": "Its node holds it but has not started it (`status` is "
                "`SUBMITTED`, 已提交).",
            },
            "detail": _nullable(
                _string(
                    "What the node says of the task (retrying, upstream unreachable, disk "
                    "full), at most 256 characters; `null`: nothing.",
                    maxLength=256,
                )
            ),
            "nodeConnected": _nullable(
                {
                    "type": "boolean",
                    "description": "Whether the task's node is connected to a site of the "
                    "database; `null` for a task without a node. While `false`, `speed` and "
                    "`eta` are `null` (a `DELETE_PENDING` task then waits for the node).",
                }
            ),
            "stalledSince": _nullable(
                _string(
                    "ISO 8601 UTC: a `DOWNLOADING`/`COMPRESSING` task whose progress has not "
                    "moved for 60 s or more, since when (`speed` and `eta` are then `null`)."
                )
            ),
            "warning": _string(
                "Only in a resolve answer: a task resolved `submitted` with no archive URL "
                "known (it is never dispatched)."
            ),
        },
        required=[
            "gid",
            "name",
            "state",
            "status",
            "statusText",
            "progress",
            "operationId",
            "deleteOperationId",
            "node",
            "cost",
            "createdAt",
            "updatedAt",
            "owner",
            "size",
            "bytesDone",
            "speed",
            "eta",
            "completedAt",
            "archiveSize",
            "archiveSha256",
            "archiveGone",
            "queued",
            "detail",
            "nodeConnected",
            "stalledSince",
        ],
        description="A task (INTERFACES.md, the task object).",
    )


def _evidence_schema() -> Schema:
    return _object(
        {
            "operationId": _string(),
            "step": _nullable(_string("`submit`, `persist`, `recovery`, ...")),
            "unknownAt": _nullable(_TIME),
            "error": _nullable(_string()),
            "archiveUrl": _nullable(_string()),
            "archiveUrlSource": _nullable(_string(enum=["submit", "audit"])),
            "notBefore": _nullable(_string("The end of the verdict wait (a reaped submission).")),
            "verdictWaitSeconds": _integer(minimum=0),
            "upstream": _object(
                {
                    "available": {"type": "boolean"},
                    "audit": {"type": "object", "description": "The upstream's audit answer."},
                    "error": _string(),
                },
                required=["available"],
                description="The upstream's read-only audit, fetched now.",
            ),
            "contradictions": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "By verdict, why the audit contradicts it (it then needs a note).",
            },
            "warning": _string(),
        },
        required=[
            "operationId",
            "step",
            "unknownAt",
            "error",
            "archiveUrl",
            "archiveUrlSource",
            "notBefore",
            "verdictWaitSeconds",
            "upstream",
            "contradictions",
        ],
        description="What is known of an `UNKNOWN` operation (docs/operations.md, "
        '"Reconcile UNKNOWN operations").',
    )


def _node_schema() -> Schema:
    return _object(
        {
            "id": _string(),
            "connected": {"type": "boolean"},
            "site": _nullable(_string("The `--name` of the site holding it.")),
            "protocol": _nullable({"type": "integer", "enum": [1, 2]}),
            "features": {"type": "array", "items": {"type": "string"}},
            "lastRevision": _nullable(_integer()),
            "assigned": _integer(minimum=0),
            "activeTasks": _integer(minimum=0),
            "runningTasks": _integer(
                "Of `activeTasks`: downloading (not queued), waiting for compression or "
                "compressing.",
                minimum=0,
            ),
            "queuedTasks": _integer(
                "Of `activeTasks`: held by the node, not started (`queued`).", minimum=0
            ),
            "connectedAt": _nullable(_TIME),
            "lastSeenAt": _nullable(_TIME),
            "lastReportAt": _nullable(_TIME),
            "bytesPerSecond": {
                "type": "number",
                "minimum": 0,
                "description": "The node's bytes over the last full minute / 60, to a tenth "
                "(a half rounded up): the same bytes as that minute's bucket of `/api/stats` "
                "(an hour's window) has for it in `byNode`, or in `other` when it is not among "
                "the top nodes.",
            },
            "droppedEntries": {"type": "object", "additionalProperties": {"type": "integer"}},
            "archiveUrl": _string(
                "The base URL users reach the node's archive endpoint at, from its Hello once "
                'proven; `""` when none, and for a node not connected to this site.'
            ),
            "serveUrl": _string(
                "The base URL the site reaches the node's archive endpoint at, from its Hello "
                'once proven; `""` when it does not serve, and for a node not connected to '
                "this site."
            ),
            "orphans": {
                "type": "array",
                "description": "Archives the node's last inventory listed that the site has no "
                "live generation for on it and no delete to remove them with (an unknown gid, "
                "an older generation, or another node's task), by gid: the first 100.",
                "items": _object(
                    {
                        "gid": _integer(minimum=1),
                        "operationId": _string(),
                        "size": _integer(minimum=0),
                        "sha256": _string(pattern="^[0-9a-f]{64}$"),
                        "foundAt": _TIME,
                    }
                ),
            },
            "inventory": _nullable(
                _object(
                    {
                        "inventoryId": _string(),
                        "archives": _integer(minimum=0),
                        "bytes": _integer(minimum=0),
                        "missing": _integer(
                            "Completed tasks that inventory found not held as recorded "
                            "(`MISSING` or `CORRUPT`).",
                            minimum=0,
                        ),
                        "orphans": _integer(minimum=0),
                        "judgedAt": _TIME,
                    },
                    description="The node's last judged archive inventory; null before its first.",
                )
            ),
            "disk": _nullable(
                _object(
                    {
                        "archives": _nullable(_integer("Archives the node holds.", minimum=0)),
                        "bytes": _nullable(_integer("Their bytes.", minimum=0)),
                        "free": _nullable(
                            _integer("Free bytes on the disk of its `--data`.", minimum=0)
                        ),
                        "budget": _nullable(
                            _integer("Its `--disk-budget`; null when none.", minimum=0)
                        ),
                        "at": _TIME,
                    },
                    description="What a node connected to this site with a `serveUrl` last "
                    "said of its disk on its serve endpoint's `/healthz` (read at most every "
                    "10 s when this list is asked for, forgotten after 5 minutes); a figure it "
                    "did not give is null; null when unknown.",
                )
            ),
        },
        description="A node connected to any site of the database, or seen in the last 7 days.",
    )


def _schemas() -> dict[str, Schema]:
    user = _object({"name": _string(), "admin": {"type": "boolean"}})
    return {
        "Error": _object(
            {
                "error": _object(
                    {
                        "code": _string(enum=list(STATUS)),
                        "message": _string(minLength=1),
                        "notBefore": _string("Only with `verdict_too_early`."),
                        "cost": _integer(
                            "With `quota_exceeded`: the refused task's cost. With "
                            "`charge_confirmation_required`: what the task's last generation "
                            "cost (fetching it again is a new charge).",
                            minimum=0,
                        ),
                        **{
                            name: _integer(f"Only with `quota_exceeded`: {what}", minimum=0)
                            for name, what in (
                                ("used", "this ISO week's metered usage (as `GET /api/usage`)."),
                                ("quota", "the weekly quota."),
                                (
                                    "unsettled",
                                    "the cost of the caller's unmetered `UNKNOWN` and "
                                    "in-flight submissions, which the check counts too "
                                    "(`used + unsettled + cost > quota`).",
                                ),
                            )
                        },
                        "week": _string("Only with `quota_exceeded`: the ISO week checked."),
                        "status": _string(
                            "Only with `archive_not_ready` and `archive_gone`: the task's status.",
                            enum=_STATUS_KEYS,
                        ),
                        "reason": _string(
                            "Only with `archive_gone`: why no node holds the archive any more "
                            "(the task's `archiveGone.reason`).",
                            enum=sorted(GONE_REASONS),
                        ),
                        "at": _string(
                            "Only with `archive_gone`: since when (the task's `archiveGone.at`)."
                        ),
                        "node": _nullable(
                            _string(
                                "Only with `node_offline` and `archive_not_served`: the node "
                                "that holds the archive."
                            )
                        ),
                    },
                    required=["code", "message"],
                )
            },
            description="The error envelope of every error answer.",
        ),
        "JsonValue": {
            "description": "Any JSON value with no NUL in any string or key (a request "
            "holding one is `400`), nested at most 64 levels.",
            "anyOf": [
                {"type": "string", "pattern": _NO_NUL},
                {"type": ["number", "boolean", "null"]},
                {"type": "array", "items": _ref("JsonValue")},
                {
                    "type": "object",
                    "propertyNames": {"pattern": _NO_NUL},
                    "additionalProperties": _ref("JsonValue"),
                },
            ],
        },
        "Task": _task_schema(),
        "TaskAnswer": _object({"task": _ref("Task")}),
        "TaskDetails": _task_details_schema(),
        "TaskList": _object(
            {
                "tasks": {"type": "array", "items": _ref("Task")},
                "next": {
                    "type": ["string", "integer", "null"],
                    "description": "The `after` of the next page (a gid for `order=gid`); "
                    "`null` on the last page.",
                },
                "total": _integer(
                    "How many tasks match the filters (the cursor aside).", minimum=0
                ),
            }
        ),
        "BulkResults": _object(
            {
                "results": {
                    "type": "array",
                    "items": _object(
                        {
                            "gid": _integer(minimum=GID_MIN, maximum=GID_MAX),
                            "status": _integer(
                                "The HTTP status the single operation would answer.",
                                minimum=100,
                                maximum=599,
                            ),
                            "task": _ref("Task"),
                            "error": _object(
                                {"code": _string(enum=list(STATUS)), "message": _string()},
                                required=["code", "message"],
                            ),
                        },
                        required=["gid", "status"],
                    ),
                },
                "duplicates": _integer(
                    "How many gids of the request repeated an earlier one: each gid is "
                    "acted on and answered once, where it first appears.",
                    minimum=0,
                    maximum=MAX_BULK - 1,
                ),
            },
            required=["results", "duplicates"],
        ),
        "BulkSummary": _object(
            {
                "matched": _integer("Tasks the filter matched (`expect`).", minimum=0),
                "done": _integer("Acted on (`200` or `202` as single operations).", minimum=0),
                "notDone": _integer("Acted on and refused (see `reasons`).", minimum=0),
                "notApplicable": _integer(
                    "`retry`: matched and not a failed delete (`reasons.not_retryable`).",
                    minimum=0,
                ),
                "reasons": _object(
                    {},
                    required=[],
                    additional=_object(
                        {
                            "count": _integer(minimum=1),
                            "gids": {
                                "type": "array",
                                "items": _integer(minimum=GID_MIN, maximum=GID_MAX),
                                "maxItems": 100,
                                "description": "The first 100 of them, by gid.",
                            },
                        }
                    ),
                    description="Per error code (or `not_retryable`), the tasks not done.",
                ),
            }
        ),
        "Counts": _object(
            {
                "counts": _object(
                    {key: _integer(minimum=0) for key in _FILTER_KEYS},
                    description="Every display key, zeros included, and `QUEUED`: the "
                    "`SUBMITTED` tasks queued on a node (a part of `SUBMITTED`, not of "
                    "`total`).",
                ),
                "total": _integer(minimum=0),
            }
        ),
        "Stats": _object(
            {
                "window": _integer(minimum=MIN_WINDOW, maximum=MAX_WINDOW),
                "bucketSeconds": _integer(
                    "60 for a window up to an hour, 900 beyond.",
                    minimum=1,
                ),
                "nodes": {
                    "type": "array",
                    "items": _string(),
                    "maxItems": TOP_NODES,
                    "description": f"The (at most {TOP_NODES}) nodes with the most bytes over "
                    "the window, most first: the keys of every bucket's `byNode`.",
                },
                "nodeLimit": _integer(
                    f"How many nodes `nodes` names at most ({TOP_NODES}).", minimum=1
                ),
                "otherNodes": _integer(
                    "How many more nodes downloaded in the window: their bytes are each "
                    "bucket's `other`.",
                    minimum=0,
                ),
                "buckets": {
                    "type": "array",
                    "description": "One per `bucketSeconds` (aligned on multiples of it), "
                    "oldest first, zeros included; the last holds the current moment.",
                    "items": _object(
                        {
                            "start": _TIME,
                            "completed": _integer(minimum=0),
                            "bytes": _integer("`other` plus the sum of `byNode`.", minimum=0),
                            "byNode": {
                                "type": "object",
                                "description": "The bytes of each node of `nodes` (zeros "
                                "included).",
                                "additionalProperties": {"type": "integer", "minimum": 0},
                            },
                            "other": _integer("The bytes of every node not in `nodes`.", minimum=0),
                        }
                    ),
                },
                "usage": _object(
                    {
                        "quota": _integer(minimum=0),
                        "weeks": {
                            "type": "array",
                            "items": _object({"week": _string(), "used": _integer(minimum=0)}),
                        },
                    },
                    description="The caller's own usage, the last 8 ISO weeks.",
                ),
            }
        ),
        "Usage": _object(
            {
                "week": _string("ISO week, e.g. `2026-W49`.", pattern="^[0-9]{4}-W[0-9]{2}$"),
                "used": _integer(minimum=0),
                "quota": _integer(minimum=0),
            }
        ),
        "Favorite": _object(
            {"gid": _integer(minimum=GID_MIN, maximum=GID_MAX), "favorite": {"type": "boolean"}}
        ),
        "UpstreamAnswer": _object(
            {
                "upstream": _object(
                    {
                        "reachable": {
                            "type": "boolean",
                            "description": "`false` while `since` is set or a download "
                            "cannot reach the upstream.",
                        },
                        "since": _nullable(
                            _string(
                                "When this site's calls to the upstream began to find "
                                "nothing there (refused, no route, unknown host, no answer "
                                "in time); `null` once one is answered.",
                                format="date-time",
                            )
                        ),
                        "reason": _nullable(
                            _string("What the first of those calls found, in words.")
                        ),
                        "downloadsNotReaching": _integer(
                            "The caller's downloads (an admin: everyone's) waiting to try "
                            "again because their node could not reach the upstream.",
                            minimum=0,
                        ),
                    }
                )
            }
        ),
        "User": user,
        "UserAnswer": _object({"user": _nullable(_ref("User"))}),
        "MeAnswer": _object(
            {
                "user": _ref("User"),
                "site": _string("The site's `--name` (which site this is, with several)."),
                "upstreamTimeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "The site's `--upstream-timeout` in seconds: how long a "
                    "create waits for the upstream before its outcome is `UNKNOWN`.",
                },
            },
            required=["user", "site", "upstreamTimeout"],
        ),
        "UnknownTask": {
            "allOf": [_ref("Task"), _object({"evidence": _ref("Evidence")})],
            "description": "A task in `UNKNOWN`, with its evidence.",
        },
        "Evidence": _evidence_schema(),
        "Node": _node_schema(),
        "ForcedDelete": _object(
            {
                "gid": _integer(minimum=GID_MIN, maximum=GID_MAX),
                "state": _string(enum=["DELETED"]),
                "forced": _object(
                    {
                        "actor": _string(),
                        "note": _string(),
                        "at": _nullable(_TIME),
                        "node": _nullable(_string()),
                        "deleteOperationId": _nullable(_string()),
                    }
                ),
            }
        ),
        "Health": _object(
            {
                "site": _string("The site's `--name`."),
                "backend": _string(enum=["sqlite", "postgresql"]),
                "recovery": _string(enum=["pending", "done", "failed"]),
                "dispatch": _string(enum=["enabled", "disabled"]),
                "database": _string(
                    "`ok`, or `failing since <time>`.", pattern="^(ok|failing since .+)$"
                ),
                "replication": _string(
                    "Whether commits wait for a PostgreSQL standby (the lease's check, "
                    "docs/operations.md): `sync`, `async since <time>` (a standby is "
                    "configured but none is in sync), `unknown since <time>` (the site's "
                    "role may not read the standbys' state), `none` (no standby) or `n/a` "
                    "(SQLite).",
                    pattern="^(sync|none|n/a|(async|unknown) since .+)$",
                ),
            }
        ),
    }


# -- operations -------------------------------------------------------------------

_AUTH: list[Schema] = [{"bearer": []}, {"session": []}]
_GID_PARAMETER: Schema = {
    "name": "gid",
    "in": "path",
    "required": True,
    "schema": _integer(minimum=GID_MIN, maximum=GID_MAX),
}


_NODE_PARAMETER: Schema = {
    "name": "node",
    "in": "path",
    "required": True,
    "description": "A node's id, as it logs in.",
    "schema": _string(pattern="^[A-Za-z0-9_.-]{1,64}$"),
}


def _query(name: str, schema: Schema, description: str, **extra: Any) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
        **extra,
    }


def _header(name: str, schema: Schema) -> Schema:
    """A header of the WebSocket opening handshake (RFC 6455)."""
    return {"name": name, "in": "header", "required": True, "schema": schema}


def _body(schema: Schema, description: str | None = None) -> Schema:
    """A JSON object body; fields the site does not know are ignored (any
    JSON value, as long as no string or key of it holds a NUL), unless
    ``schema`` says ``additionalProperties: false`` (the body is refused)."""
    schema = {
        "additionalProperties": _ref("JsonValue"),
        **schema,
        "propertyNames": {"pattern": _NO_NUL},
    }
    body: Schema = {"required": True, "content": {JSON: {"schema": schema}}}
    if description:
        body["description"] = description
    return body


def _links(*pairs: tuple[str, str, str]) -> Schema:
    """``(name, operationId, gid expression)``: links that pass a gid on."""
    return {
        name: {"operationId": operation, "parameters": {"gid": expression}}
        for name, operation, expression in pairs
    }


def _with_links(response: Schema, links: Schema) -> Schema:
    out = copy.deepcopy(response)
    out["links"] = links
    return out


_TASK_GID = "$response.body#/task/gid"


def _task_links(expression: str) -> Schema:
    return _links(
        ("GetTask", "getTask", expression),
        ("DeleteTask", "deleteTask", expression),
        ("AddFavorite", "addFavorite", expression),
        ("RemoveFavorite", "removeFavorite", expression),
    )


def _operation(
    operation_id: str,
    summary: str,
    description: str,
    responses: Schema,
    *,
    tag: str,
    parameters: list[Schema] | None = None,
    body: Schema | None = None,
    security: list[Schema] | None = None,
) -> Schema:
    operation: Schema = {
        "operationId": operation_id,
        "tags": [tag],
        "summary": summary,
        "description": description,
    }
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = body
    operation["security"] = _AUTH if security is None else security
    if _checks_a_token(operation["security"]) and "429" not in responses:
        # Every token presented is counted against the caller's address.
        responses = dict(sorted({**responses, "429": _common("RateLimited")}.items()))
    operation["responses"] = responses
    return operation


def _checks_a_token(security: list[Schema]) -> bool:
    return any("bearer" in scheme or "query" in scheme for scheme in security)


def _task_details_schema() -> Schema:
    text = _nullable(_string())
    entry = _object(
        {
            "at": _string("When (UTC, ISO 8601)."),
            "kind": _string(
                "`created`: the generation was reserved; `status`: the task reached a status "
                "(`source`: `record`, from the task's own rows, or `outbox`, a pushed change "
                "while the outbox keeps it); `verdict`: an admin reconciled it; `forceDelete`: "
                "an admin force-deleted it.",
                enum=["created", "status", "verdict", "forceDelete"],
            ),
        },
        description="One entry of the history; the other fields depend on `kind`: `cost` "
        "(created); `status`, `state`, `node`, `detail`, `archiveGone`, `source` (status); "
        "`verdict`, `actor`, `note` (verdict); `node`, `actor`, `note` (forceDelete).",
        additional=_ref("JsonValue"),
    )
    operation = _object(
        {
            "operationId": _string(),
            "state": _string(),
            "cost": _nullable(_integer(minimum=0)),
            "metered": {"type": "boolean"},
            "meteredWeek": text,
            "step": _nullable(_string("The last lifecycle step reached.")),
            "error": _nullable(_string("Why it became `UNKNOWN`.")),
            "unknownAt": text,
            "archiveUrl": text,
            "legacy": {"type": "boolean"},
            "deleteOperationId": text,
            "deleteResult": text,
            "deleteReason": text,
            "createdAt": _string(),
            "updatedAt": _string(),
        },
        description="The current generation's operation row.",
    )
    return _object(
        {
            "task": _ref("Task"),
            "operation": _nullable(operation),
            "evidence": _nullable(
                _object(
                    {},
                    required=[],
                    description="The evidence the last verdict was taken on (the upstream's "
                    "audit among it), as stored.",
                    additional=_ref("JsonValue"),
                )
            ),
            "history": {"type": "array", "items": entry},
            "historyFrom": _nullable(
                _string("The first recorded change kept (older outbox rows are pruned).")
            ),
            "historyTruncated": {
                "type": "boolean",
                "description": "Only the newest 2,000 recorded changes were read.",
            },
        },
        description="One task's details: its current generation only.",
    )


def _task_operations() -> dict[str, Schema]:
    task_answer = _ref("TaskAnswer")
    create = _operation(
        "createTask",
        "Create a task",
        "Runs the lifecycle's create chain: reserve, the upstream's read-only `prepare`, the "
        "quota check with the known cost, then the one archive POST. Refused creates leave "
        "nothing behind. A per-user rate limit runs first.",
        _responses(
            {
                "201": _with_links(
                    _json_response("Created: the task is `SUBMITTED`.", task_answer),
                    _task_links(_TASK_GID),
                ),
                "202": _with_links(
                    _json_response(
                        "The upstream may or may not have acted: the task is `UNKNOWN` "
                        "(`SUBMIT_UNKNOWN`), for an admin to reconcile; do not create it again. "
                        "Also when the POST may have gone out and the site could not record "
                        "the outcome (its database failed or went away, its lease was lost in "
                        "a failover): the task is then the one it will be once settled (by the "
                        "site's retry, a reap or the recovery on the surviving database), "
                        "with `createdAt`, `updatedAt` and `owner` `null`.",
                        task_answer,
                    ),
                    {
                        **_task_links(_TASK_GID),
                        **_links(("ResolveTask", "resolveTask", _TASK_GID)),
                    },
                ),
            },
            (400, _bad_request(_BAD_BODY)),
            (401, _common("Unauthorized")),
            (403, _error(403, _COOKIE_FORBIDDEN, "forbidden")),
            (404, _error(404, "The upstream has no such gallery (nothing was charged).")),
            (
                409,
                _error(
                    409,
                    "`conflict`: the gid already has a task (or changed while being created). "
                    "`already_completed`: the caller's task is `COMPLETED` and its archive is "
                    "held: fetch it, nothing is charged. `charge_confirmation_required`: the "
                    "caller's task is `ARCHIVE_GONE`; fetching it again is a new generation and "
                    'a new charge, so the body must say `"confirmCharge": true`; the envelope '
                    "adds `cost`, what its last generation cost.",
                    "conflict",
                    "already_completed",
                    "charge_confirmation_required",
                ),
            ),
            (422, _error(422, "The upstream definitely refused; nothing was charged.")),
            (
                429,
                _error(
                    429,
                    "`quota_exceeded`: this ISO week's quota would be exceeded (the cost is "
                    "known after `prepare`; unmetered `UNKNOWN` operations count); the "
                    "envelope adds the numbers: `cost`, `used`, `quota`, `unsettled` (the "
                    "unmetered operations counted) and `week`. "
                    "`rate_limited`: too many creates, or too many wrong tokens from the "
                    "caller's address; `Retry-After` says when to try again.",
                    "quota_exceeded",
                    "rate_limited",
                    headers={
                        "Retry-After": {
                            **_RETRY_AFTER["Retry-After"],
                            "description": "With `rate_limited`: whole seconds to wait.",
                        }
                    },
                ),
            ),
            (
                500,
                _error(
                    500,
                    "A failure the site did not expect (logged), such as its database "
                    "refusing the reservation. Never for an outcome the site could not "
                    "record (that is `202`), nor for a create that sent nothing because the "
                    "database is busy or gone or the site is fenced or stopping (that is "
                    "`503` with `Retry-After`: try again, here or through another site).",
                    "internal",
                ),
            ),
            (
                502,
                _error(
                    502,
                    "`prepare` failed before any POST; the reservation was released.",
                    "upstream_unavailable",
                ),
            ),
        ),
        tag="tasks",
        body=_body(
            _object(
                {
                    "gid": _integer(minimum=GID_MIN, maximum=GID_MAX),
                    "token": _string(
                        "The user's upstream token for this gallery.",
                        minLength=1,
                        maxLength=MAX_TOKEN,
                        pattern=_NO_NUL,
                    ),
                    "name": _string(
                        "A name for the task (default: the upstream's title).",
                        maxLength=MAX_NAME,
                        pattern=_NO_NUL,
                    ),
                    "confirmCharge": {
                        "type": "boolean",
                        "default": False,
                        "description": "`true` accepts a new charge to fetch again the "
                        "archive of the caller's `ARCHIVE_GONE` task (a new generation: a new "
                        "`operationId`, a new POST, counted by the quota); without it such a "
                        "create is `409 charge_confirmation_required`. No effect on any other "
                        "gid.",
                    },
                },
                required=["gid", "token"],
            )
        ),
    )
    listing = _operation(
        "listTasks",
        "List tasks",
        "The caller's tasks (an admin's: everyone's), one keyset page: tasks created while "
        "someone pages do not shift later pages.",
        _responses(
            {
                "200": _with_links(
                    _json_response("One page.", _ref("TaskList")),
                    _links(("GetFirstTask", "getTask", "$response.body#/tasks/0/gid")),
                )
            },
            (
                400,
                _bad_request(
                    "An unknown status key or order, a malformed cursor, a bad limit or `q`; "
                    f"a `page` that is not an integer from 1, or with `page × limit` over "
                    f"{MAX_PAGE_REACH:,}; `page` and `after` together."
                ),
            ),
            (401, _common("Unauthorized")),
        ),
        tag="tasks",
        parameters=[
            _query(
                "status",
                {"type": "array", "items": _string(enum=_LIST_FILTER_KEYS), "minItems": 1},
                "Display keys, comma-separated (any of them); `QUEUED`: the `SUBMITTED` "
                "tasks queued on a node; `SUBMITTED_NOT_QUEUED`: the other `SUBMITTED` "
                "tasks (sent, not known to be queued).",
                style="form",
                explode=False,
            ),
            _query(
                "q",
                _string(maxLength=MAX_SEARCH, pattern="^[^\\u0000-\\u001f]*$"),
                "A name containing it (ASCII case-insensitive) or a gid containing it "
                "(`1777` finds 101777).",
            ),
            _query(
                "favorite",
                _string(enum=["1", "0"]),
                "`1`: only the caller's favourites (an admin's too); `0`: no filter.",
            ),
            _query(
                "node",
                _string(minLength=1, maxLength=MAX_NODE_ID, pattern="^[^\\u0000-\\u001f\\u007f]*$"),
                "Only the tasks assigned to this node.",
            ),
            _query(
                "order",
                _string(enum=ORDERS, default="newest"),
                "Newest first by default; `size` largest first (unknown last), `progress` "
                "furthest first, `status` in lifecycle order; ties by gid, highest first.",
            ),
            _query(
                "limit",
                _integer(minimum=1, maximum=MAX_PAGE, default=50),
                "Tasks per page.",
            ),
            _query(
                "after",
                _string(pattern=AFTER_PATTERN),
                "The `next` of the previous page, verbatim, with the same `order`. Its shape "
                "depends on `order` (a pattern cannot tie the two, so the pattern is the union "
                "of the shapes; another order's shape is `400`): `order=gid`: a gid "
                "(`[0-9]{1,10}`); `size`, `status`: `KEY~GID` with `KEY` an integer from "
                f"{CURSOR_KEY_MIN} to {CURSOR_KEY_MAX} (a signed 64-bit integer; outside is "
                "`400`); `progress`: `KEY~GID` with `KEY` a finite decimal number; `newest`, "
                "`oldest`: `CREATEDAT~GID`, opaque (up to 64 characters before the `~`, no "
                "`~` or control character). `GID` is `[0-9]{1,10}`.",
            ),
            _query(
                "page",
                _integer(minimum=1, maximum=MAX_PAGE_REACH, default=1),
                "A page by its number (1 is the first): the rows after the first "
                "`(page - 1) × limit` of the order, the same rows the cursor reaches after "
                f"`page - 1` turns; `page × limit` at most {MAX_PAGE_REACH:,} (a later row is "
                "reached with `after`). Its `next` is the cursor as on any page; not with "
                "`after`. A page past the last is empty.",
            ),
        ],
    )
    counts = _operation(
        "countTasks",
        "Count tasks by status",
        "Every display key (zeros included) and the total, over the caller's tasks (an "
        "admin's: everyone's), with the same `q` as the list.",
        _responses(
            {"200": _json_response("The counts.", _ref("Counts"))},
            (400, _bad_request("A bad `q`.")),
            (401, _common("Unauthorized")),
        ),
        tag="tasks",
        parameters=[
            _query(
                "q",
                _string(maxLength=MAX_SEARCH, pattern="^[^\\u0000-\\u001f]*$"),
                "As for the list.",
            )
        ],
    )
    stats = _operation(
        "getStats",
        "Throughput and usage over a window",
        "Buckets over the window for the caller's tasks (an admin's: everyone's): one minute "
        "up to a 1 h window, 15 minutes beyond (6 h: 24 buckets, 24 h: 96); in "
        "each, tasks completed, bytes downloaded, and the bytes of each of the top "
        f"{TOP_NODES} nodes of the window and of all the others together (`other`); plus "
        "the caller's usage for the last 8 ISO weeks with the quota.",
        _responses(
            {"200": _json_response("The buckets.", _ref("Stats"))},
            (400, _bad_request(f"`window` is not an integer in {MIN_WINDOW}..{MAX_WINDOW}.")),
            (401, _common("Unauthorized")),
        ),
        tag="tasks",
        parameters=[
            _query(
                "window",
                _integer(minimum=MIN_WINDOW, maximum=MAX_WINDOW, default=3600),
                "Seconds.",
            )
        ],
    )
    get = _operation(
        "getTask",
        "Get a task",
        "Another user's task answers exactly like a missing one.",
        _responses(
            {"200": _json_response("The task.", task_answer)},
            (400, _bad_request(_BAD_GID)),
            (401, _common("Unauthorized")),
            (404, _error(404, "No such task (or not the caller's).")),
        ),
        tag="tasks",
        parameters=[_GID_PARAMETER],
    )
    details = _operation(
        "getTaskDetails",
        "Get a task's details",
        "The task, its operation row (ids, cost, metering, the step reached and why it became "
        "`UNKNOWN`), the evidence of its last verdict and its history, oldest first: each "
        "change with when and why, each verdict and force-delete with who and the note. "
        "Its owner or an admin; another user's task answers exactly like a missing one.",
        _responses(
            {"200": _json_response("The details.", _ref("TaskDetails"))},
            (400, _bad_request(_BAD_GID)),
            (401, _common("Unauthorized")),
            (404, _error(404, "No such task (or not the caller's).")),
        ),
        tag="tasks",
        parameters=[_GID_PARAMETER],
    )
    delete = _operation(
        "deleteTask",
        "Delete a task",
        "Starts (or retries) the delete. A task no node holds is deleted at once (`200`; then "
        "`GET` answers `404`). Otherwise the delete is asynchronous: `202` with the task in "
        "`DELETE_PENDING`, and the task stays (`GET` answers it, `DELETE_PENDING`; a second "
        "`DELETE` answers `202` again) until the node holding the archive confirms it deleted "
        "the file; only then is the task gone (`404`). A node that reports failure leaves it "
        "`DELETE_FAILED` (`DELETE` again retries; an admin may force-delete).",
        _responses(
            {
                "200": _json_response(
                    "Deleted at once.",
                    _object({"deleted": _integer(minimum=GID_MIN, maximum=GID_MAX)}),
                ),
                "202": _with_links(
                    _json_response(
                        "The delete is pending: the task, `DELETE_PENDING`, stays until its "
                        "node confirms (not gone yet: reading it is no use after free).",
                        task_answer,
                    ),
                    _links(
                        ("GetTask", "getTask", _TASK_GID),
                        ("ForceDelete", "forceDeleteTask", _TASK_GID),
                    ),
                ),
            },
            (400, _bad_request(_BAD_GID)),
            (401, _common("Unauthorized")),
            (403, _error(403, _COOKIE_FORBIDDEN, "forbidden")),
            (404, _error(404, "No such task (or not the caller's).")),
            (
                409,
                _error(
                    409,
                    "The task cannot be deleted now (e.g. it is `UNKNOWN` or still being "
                    "submitted).",
                    "conflict",
                ),
            ),
        ),
        tag="tasks",
        parameters=[_GID_PARAMETER],
    )
    bulk = _operation(
        "bulkTasks",
        "Delete or retry many tasks",
        f"With `gids`: at most {MAX_BULK} gids, each handled as its single operation would be "
        "and answered in order with the HTTP status that operation would give (a repeated gid "
        "once, where it first appears; `duplicates` counts the repeats dropped): `delete` as "
        "`DELETE /api/tasks/{gid}` (`200` deleted at once, `202` with the pending `task`, or "
        "its error), `retry` the same for a `DELETE_FAILED` task and `409` for any other. "
        'With `filter` and `expect` instead ("select all N matching"): every task the '
        "list's filters match (the caller's; an admin's: everyone's), counted and read at "
        "once; `409 count_changed` (with the current `count`) when they are not `expect`, "
        f"`413 too_many_tasks` (with `count` and `max`) when more than `--max-bulk-matching` "
        f"(default {MAX_BULK_MATCHING:,}), and nothing is done; else each is acted on as with "
        "`gids` (`retry`: the failed deletes among them; the others are not applicable) and "
        "the answer is a summary (`BulkSummary`), not one result per task. "
        "An admin acts on any task, as with the single routes.",
        _responses(
            {
                "200": _json_response(
                    "With `gids`: one result per distinct gid, in the order first given; "
                    "with `filter`: the summary.",
                    {"oneOf": [_ref("BulkResults"), _ref("BulkSummary")]},
                )
            },
            (
                400,
                _bad_request(
                    "Not a JSON object; `action` not `delete` or `retry`; `gids` not an array "
                    f"of at most {MAX_BULK} gids; `filter` not an object of the list's "
                    "filters (`status` an array of status keys, `q`, `node`, `favorite` a "
                    "boolean) or `expect` not an integer from 0; `gids` and `filter` together."
                ),
            ),
            (401, _common("Unauthorized")),
            (403, _error(403, _COOKIE_FORBIDDEN, "forbidden")),
            (
                409,
                _error(
                    409,
                    "`filter`: it matches another number of tasks than `expect` now "
                    "(`count`); nothing was done.",
                    "count_changed",
                ),
            ),
            (
                413,
                _error(
                    413,
                    "`filter`: it matches more tasks than `--max-bulk-matching` (`count`, "
                    "`max`), nothing was done; or the body is over `--max-body`.",
                    "too_many_tasks",
                    "payload_too_large",
                ),
            ),
        ),
        tag="tasks",
        body=_body(
            _object(
                {
                    "action": _string(enum=["delete", "retry"]),
                    "gids": {
                        "type": "array",
                        "items": _integer(minimum=GID_MIN, maximum=GID_MAX),
                        "maxItems": MAX_BULK,
                    },
                    "filter": _object(
                        {
                            "status": {
                                "type": "array",
                                "items": _string(enum=_FILTER_KEYS),
                                "description": "Display keys (any of them); empty: every status.",
                            },
                            "q": _string(maxLength=MAX_SEARCH, pattern="^[^\\u0000-\\u001f]*$"),
                            "node": _string(
                                minLength=1,
                                maxLength=MAX_NODE_ID,
                                pattern="^[^\\u0000-\\u001f\\u007f]*$",
                            ),
                            "favorite": {"type": "boolean"},
                        },
                        required=[],
                        additional=False,
                        description="`GET /api/tasks`'s filters, as JSON.",
                    ),
                    "expect": _integer(
                        "How many tasks the person confirmed (the list's `total`).", minimum=0
                    ),
                },
                required=["action"],
            )
            | {
                "oneOf": [
                    {"required": ["gids"], "not": {"required": ["filter"]}},
                    {"required": ["filter", "expect"], "not": {"required": ["gids"]}},
                ]
            }
        ),
    )
    return {
        "create": create,
        "list": listing,
        "counts": counts,
        "stats": stats,
        "get": get,
        "details": details,
        "delete": delete,
        "bulk": bulk,
    }


def _archive_operations() -> dict[str, Schema]:
    """``GET /api/tasks/{gid}/archive`` and ``POST /api/tasks/archive-links``
    (DELIVERY.md "Getting an archive (site)"; ``web/archives.py``)."""
    sha256 = _nullable(_string("The archive's SHA-256 (64 lowercase hex) as its node reported it."))
    size = _nullable(_integer("The archive's bytes as its node reported them.", minimum=0))
    expires = _string(
        "When the link stops working (ISO 8601 UTC): `--link-ttl` (default 10 minutes) after "
        "it was issued."
    )
    name = _string(
        "The file to save it as: the task's name made safe for a file system (no `/`, `\\`, "
        "control characters or leading dots), `.zip` added; the gid when nothing is left."
    )
    url = _string(
        "Where to fetch the archive: a signed link to the node (`via: node`: it names the user "
        "it was issued to and expires), or the site's own `/api/tasks/{gid}/archive` (`via: "
        "site`: fetched with the caller's own credentials)."
    )
    link = _object(
        {
            "url": url,
            "expiresAt": expires,
            "size": size,
            "sha256": sha256,
            "name": name,
            "node": _string("The node that holds the archive."),
            "via": _string(
                "`node`: the link goes to the node's public URL; `site`: the site streams it "
                "from the node.",
                enum=["node", "site"],
            ),
        }
    )
    not_found = _error(404, "No such task (or not the caller's).")
    not_ready = _error(
        409,
        "The task is not `COMPLETED` (`archive_not_ready`: the error object's `status` is its "
        "status), or its node is connected but serves no archives (`archive_not_served`: a "
        "legacy node, or one without `--serve`).",
        "archive_not_ready",
        "archive_not_served",
    )
    gone = _error(
        410,
        "The task was completed and its archive is held by no node any more (`ARCHIVE_GONE`: "
        "the error's `reason` and `at` say why and since when). Creating the gid again fetches "
        'it again, at a new charge (`"confirmCharge": true`).',
        "archive_gone",
    )
    offline = _error(
        503,
        "`node_offline`: the node holding the archive is not connected to this site; "
        "`node_busy`: it serves as many transfers as it may (`--serve-max`); `unavailable`: "
        "the site's database does not answer. Try again after `Retry-After`.",
        "node_offline",
        "node_busy",
        "unavailable",
        headers={**_RETRY_AFTER},
    )
    node_failed = _error(
        502,
        "The site streams the archive and its node could not be reached or sent no headers in "
        "time (`node_unreachable`, with `Retry-After`), or refused the site's link "
        "(`node_error`, naming its status).",
        "node_unreachable",
        "node_error",
    )
    archive_headers = {
        name: {"description": text, "schema": {"type": "string"}}
        for name, text in (
            ("Content-Length", "The bytes of this answer's body."),
            ("Content-Range", "`bytes FIRST-LAST/SIZE` (206), `bytes */SIZE` (416)."),
            ("Accept-Ranges", "`bytes`."),
            ("ETag", '`"sha256-HEX"`: `If-Range` and `If-None-Match` take it.'),
            (
                "Content-Disposition",
                "`attachment; filename=\"ASCII\"; filename*=UTF-8''NAME` (RFC 6266).",
            ),
        )
    }
    zip_body = {"application/zip": {"schema": {"type": "string", "format": "binary"}}}
    get = _operation(
        "getTaskArchive",
        "Get a task's archive",
        "The archive of a `COMPLETED` task, for its owner or an admin. With `Accept: "
        "application/json`: the link as JSON (`200`). Otherwise, when the node holding it has a "
        "public URL (`--public-url`): `303` to a signed link to the node, valid for "
        "`--link-ttl`; else the site streams it from the node (`200`, or `206` for a `Range`; "
        "`Range`, `If-Range` and `If-None-Match` are passed to the node, and its `Content-"
        "Length`, `Content-Range`, `Accept-Ranges`, `ETag`, `Content-Type`, `Content-"
        "Disposition` and `Last-Modified` back). At most `--archive-streams-per-user` (default "
        "4) streams through the site at once per user (`429 too_many_streams`). A transfer the "
        "node breaks off after the headers ends the connection early: resume it with `Range`. "
        "`HEAD` answers the same headers without the body.",
        _responses(
            {
                "200": {
                    "description": "The link (`Accept: application/json`), or the whole "
                    "archive streamed by the site.",
                    "headers": archive_headers,
                    "content": {JSON: {"schema": link}, **zip_body},
                },
                "206": {
                    "description": "The `Range` asked for, streamed by the site.",
                    "headers": archive_headers,
                    "content": zip_body,
                },
                "303": _json_response(
                    "Go to the node: `Location` is the signed link (also in the body).",
                    _object({"url": url, "expiresAt": expires}),
                    headers={
                        "Location": {
                            "description": "The signed link to the node.",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    },
                ),
                "304": {"description": "`If-None-Match` named the archive's `ETag`."},
                "416": {
                    "description": "The `Range` is past the archive's end: `Content-Range: "
                    "bytes */SIZE`.",
                    "headers": {"Content-Range": archive_headers["Content-Range"]},
                },
            },
            (400, _bad_request(_BAD_GID)),
            (401, _common("Unauthorized")),
            (404, not_found),
            (409, not_ready),
            (410, gone),
            (
                429,
                _error(
                    429,
                    "`too_many_streams`: the caller already has `--archive-streams-per-user` "
                    "archives streaming through the site. `rate_limited`: too many wrong "
                    "tokens from the caller's address.",
                    "too_many_streams",
                    "rate_limited",
                    headers={**_RETRY_AFTER},
                ),
            ),
            (502, node_failed),
            (503, offline),
        ),
        tag="tasks",
        parameters=[_GID_PARAMETER],
    )
    links = _operation(
        "getArchiveLinks",
        "Links for many archives",
        f"One to {MAX_ARCHIVE_LINKS} gids (a gid given twice is answered once, where first "
        "given): a link for each `COMPLETED` task of the caller's (an admin's: any) whose node "
        "can serve it, as `GET /api/tasks/{gid}/archive` would give it; every other gid in "
        "`missing` with the error code that route would answer (`not_found`, "
        "`archive_not_ready`, `archive_not_served`, `archive_gone`, `node_offline`). With "
        "`Accept: text/plain`: an aria2 input file (`aria2c -i FILE` fetches and verifies "
        "every archive): each link's URL on a line, then `  out=NAME` and `  "
        "checksum=sha-256=HEX` (when the digest is known); a missing gid is a `# gid G: CODE` "
        "comment. A link through the site (`via: site`) needs the caller's credentials: the "
        "file carries `  header=Authorization: Bearer TOKEN` when the request itself was made "
        "with that bearer token, never for a browser session. An aria2 user whose file has no "
        "such line (it was fetched with the session cookie) asks again with `Authorization: "
        "Bearer TOKEN`, or passes `--header='Authorization: Bearer TOKEN'` to aria2c.",
        _responses(
            {
                "200": {
                    "description": "The links and the gids without one.",
                    "content": {
                        JSON: {
                            "schema": _object(
                                {
                                    "links": {
                                        "type": "array",
                                        "items": _object(
                                            {
                                                "gid": _integer(minimum=GID_MIN, maximum=GID_MAX),
                                                "url": url,
                                                "expiresAt": expires,
                                                "size": size,
                                                "sha256": sha256,
                                                "name": name,
                                            }
                                        ),
                                    },
                                    "missing": {
                                        "type": "array",
                                        "items": _object(
                                            {
                                                "gid": _integer(minimum=GID_MIN, maximum=GID_MAX),
                                                "code": _string(
                                                    "Why there is no link (the error code of "
                                                    "`GET /api/tasks/{gid}/archive`)."
                                                ),
                                            }
                                        ),
                                    },
                                }
                            )
                        },
                        "text/plain": {
                            "schema": _string("An aria2 input file (`Accept: text/plain`).")
                        },
                    },
                },
            },
            (
                400,
                _bad_request(
                    f"Not a JSON object; `gids` not an array of 1 to {MAX_ARCHIVE_LINKS} gids "
                    "(JSON integers)."
                ),
            ),
            (401, _common("Unauthorized")),
            (403, _error(403, _COOKIE_FORBIDDEN, "forbidden")),
        ),
        tag="tasks",
        body=_body(
            _object(
                {
                    "gids": {
                        "type": "array",
                        "items": _integer(minimum=GID_MIN, maximum=GID_MAX),
                        "minItems": 1,
                        "maxItems": MAX_ARCHIVE_LINKS,
                    }
                },
                required=["gids"],
            )
        ),
    )
    return {"get": get, "links": links}


def _favorite_operations() -> dict[str, Schema]:
    def change(operation_id: str, summary: str, favorite: bool) -> Schema:
        return _operation(
            operation_id,
            summary,
            "Idempotent. Only a task the caller may see.",
            _responses(
                {
                    "200": _json_response(
                        f'`"favorite": {str(favorite).lower()}`.', _ref("Favorite")
                    )
                },
                (400, _bad_request(_BAD_GID)),
                (401, _common("Unauthorized")),
                (403, _error(403, _COOKIE_FORBIDDEN, "forbidden")),
                (404, _error(404, "No such task (or not the caller's).")),
            ),
            tag="favorites",
            parameters=[_GID_PARAMETER],
        )

    return {
        "add": change("addFavorite", "Mark a favorite", True),
        "remove": change("removeFavorite", "Unmark a favorite", False),
        "list": _operation(
            "listFavorites",
            "List favorites",
            "The caller's favorite tasks, in gid order.",
            _responses(
                {
                    "200": _json_response(
                        "The tasks.", _object({"tasks": {"type": "array", "items": _ref("Task")}})
                    )
                },
                (401, _common("Unauthorized")),
            ),
            tag="favorites",
        ),
    }


def _session_operations() -> dict[str, Schema]:
    set_cookie = {
        "Set-Cookie": {
            "description": "`tasknet_session=ID; HttpOnly; SameSite=Strict; Path=/` (plus "
            "`Secure` over TLS or with `--cookie-secure`); on sign-out, its removal.",
            "schema": {"type": "string"},
        }
    }
    origin_forbidden = _error(
        403,
        "No `Origin` header equal to the site's own (`--public-url`, else the `Host` "
        "header's scheme, host and port): a browser always sends one.",
        "forbidden",
    )
    return {
        "create": _operation(
            "signIn",
            "Sign in (browser session)",
            "Trades the API token for a server-side session; the cookie holds the session's "
            "random id, never the token. The one credential is the body's `token` (an "
            "`Authorization` header or a session cookie does not sign anyone in; a cookie "
            "sent along names the session this one replaces, which ends). Needs the site's own "
            "`Origin` and a JSON body typed `application/json`. A wrong token counts against "
            "the caller's address (`429 rate_limited` past the limit).",
            _responses(
                {"200": _json_response("Signed in.", _ref("UserAnswer"), headers=set_cookie)},
                (
                    400,
                    _bad_request(
                        _BAD_BODY + " Here the body must always be typed `application/json`."
                    ),
                ),
                (401, _error(401, "The body's token is unknown.")),
                (
                    403,
                    _error(
                        403,
                        "No `Origin` header equal to the site's own (`forbidden`), or the "
                        "token of a user an admin disabled (`account_disabled`).",
                        "forbidden",
                        "account_disabled",
                    ),
                ),
                (429, _common("RateLimited")),
            ),
            tag="session",
            security=[],
            body=_body(
                _object(
                    {
                        "token": _string(
                            "The API token.", minLength=1, maxLength=MAX_TOKEN, pattern=_NO_NUL
                        )
                    }
                )
            ),
        ),
        "delete": _operation(
            "signOut",
            "Sign out",
            "Ends the session the cookie names on the server (if any: without a cookie, or "
            "with one of an ended session, it still answers `200`) and clears the cookie. The "
            "session cookie is the only credential it reads (a bearer token is ignored: a "
            "token has no session to end). There is no CSRF token: like every cookie request, "
            "it needs the site's own `Origin` (else `403`).",
            _responses(
                {
                    "200": _json_response(
                        '`{"user": null}`.', _ref("UserAnswer"), headers=set_cookie
                    )
                },
                (401, _error(401, "The session cookie is not UTF-8.", "unauthorized")),
                (403, origin_forbidden),
            ),
            tag="session",
            # The cookie is optional: without one there is nothing to end.
            security=[{"session": []}, {}],
        ),
        "page": _operation(
            "getSignInPage",
            "What the sign-in page says",
            "Public: whether this site runs with `--demo` (then, and only then, the sign-in "
            "page names the demo token).",
            _responses(
                {
                    "200": _json_response(
                        "The sign-in page's facts.",
                        _object({"demo": {"type": "boolean"}}, required=["demo"]),
                    )
                },
                db=False,
            ),
            tag="session",
            security=[],
        ),
        "me": _operation(
            "getMe",
            "Who is signed in",
            "The caller (token or session).",
            _responses(
                {"200": _json_response("The caller, and this site's name.", _ref("MeAnswer"))},
                (401, _common("Unauthorized")),
            ),
            tag="session",
        ),
    }


def _user_operations() -> dict[str, Schema]:
    """The admin UI's Users section (issue 36, item 8; web/admin_users.py)."""
    admin_forbidden = _error(403, _ADMIN_FORBIDDEN + " Or: " + _COOKIE_FORBIDDEN, "forbidden")
    name = {
        "name": "name",
        "in": "path",
        "required": True,
        "description": "A user's name.",
        "schema": _string(pattern="^[A-Za-z0-9_.-]{1,64}$"),
    }
    quota = _integer("Weekly quota (cost units).", minimum=0, maximum=MAX_QUOTA)
    user = _object(
        {
            "name": _string(),
            "admin": {"type": "boolean"},
            "quota": quota,
            "createdAt": _TIME,
            "disabledAt": _nullable(_TIME),
            "sessions": _integer("Browser sessions usable now.", minimum=0),
        },
        required=["name", "admin", "quota", "createdAt", "disabledAt"],
    )
    no_user = (404, _error(404, "No such user."))
    token = _string("The new API token: shown this once (only its hash is kept).")

    def acting(
        operation_id: str,
        summary: str,
        description: str,
        answer: Schema,
        *refusals: tuple[int, Schema],
        **extra: Any,
    ) -> Schema:
        return _operation(
            operation_id,
            summary,
            description,
            _responses(
                {"200": _json_response("Done.", answer)},
                (400, _bad_request("A malformed name." + " Or: " + _BAD_BODY)),
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
                no_user,
                *refusals,
            ),
            tag="admin",
            parameters=[name],
            **extra,
        )

    return {
        "list": _operation(
            "listUsers",
            "List users",
            "Every user, oldest first, with its quota, whether it is disabled and how many "
            "browser sessions it has usable now.",
            _responses(
                {
                    "200": _json_response(
                        "The users.", _object({"users": {"type": "array", "items": user}})
                    )
                },
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
            ),
            tag="admin",
        ),
        "add": _operation(
            "addUser",
            "Add a user",
            "Creates the user (quota: the body's, else the site's `--default-quota`) and "
            "answers its API token, once.",
            _responses(
                {
                    "201": _json_response(
                        "Created.",
                        _object({"user": user, "token": token}, required=["user", "token"]),
                    )
                },
                (400, _bad_request("A malformed name, `admin` or `quota`. Or: " + _BAD_BODY)),
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
                (409, _error(409, "A user of that name exists.", "conflict")),
            ),
            tag="admin",
            body=_body(
                _object(
                    {
                        "name": _string(pattern="^[A-Za-z0-9_.-]{1,64}$"),
                        "admin": {"type": "boolean"},
                        "quota": quota,
                    },
                    required=["name"],
                )
            ),
        ),
        "quota": acting(
            "setUserQuota",
            "Set a user's weekly quota",
            "The new quota applies to the creates that follow.",
            _object({"user": user}),
            body=_body(_object({"quota": quota}, required=["quota"])),
        ),
        "disable": acting(
            "disableUser",
            "Disable a user",
            "Its token and browser sessions stop working at once (its sessions end); its "
            "tasks stay and go on. A sign-in with its token is told `account_disabled`. An "
            "admin cannot disable their own account (`409`).",
            _object(
                {
                    "user": user,
                    "changed": {"type": "boolean", "description": "false: it was disabled."},
                    "sessionsEnded": _integer(minimum=0),
                }
            ),
            (409, _error(409, "The caller's own account.", "conflict")),
        ),
        "enable": acting(
            "enableUser",
            "Enable a user again",
            "Its token works again (sessions ended by the disable stay ended).",
            _object({"user": user, "changed": {"type": "boolean"}}),
        ),
        "token": acting(
            "rotateUserToken",
            "Give a user a new API token",
            "The old token and every browser session of the user stop working. An admin's "
            "own token is replaced with `tasknet-admin user token` (`409` here).",
            _object({"name": _string(), "token": token}),
            (409, _error(409, "The caller's own token.", "conflict")),
        ),
        "sessions": acting(
            "endUserSessions",
            "End a user's browser sessions",
            "Every open session of the user ends (its token still works).",
            _object({"name": _string(), "sessionsEnded": _integer(minimum=0)}),
        ),
    }


def _admin_operations() -> dict[str, Schema]:
    admin_forbidden = _error(403, _ADMIN_FORBIDDEN + " Or: " + _COOKIE_FORBIDDEN, "forbidden")
    verdict_too_early = (
        "`verdict_too_early`: `not_submitted` inside a reaped submission's verdict wait "
        "(the envelope's `error.notBefore` and `Retry-After` say when it becomes possible)"
    )
    return {
        "unknown": _operation(
            "listUnknown",
            "List UNKNOWN operations with evidence",
            "Every `UNKNOWN` task with its evidence, including the upstream's read-only audit "
            "answer fetched now.",
            _responses(
                {
                    "200": _with_links(
                        _json_response(
                            "The operations.",
                            _object({"tasks": {"type": "array", "items": _ref("UnknownTask")}}),
                        ),
                        _links(
                            ("ResolveFirstUnknown", "resolveTask", "$response.body#/tasks/0/gid")
                        ),
                    )
                },
                (401, _common("Unauthorized")),
                (403, _error(403, _ADMIN_FORBIDDEN, "forbidden")),
            ),
            tag="admin",
        ),
        "resolve": _operation(
            "resolveTask",
            "Reconcile an UNKNOWN operation",
            "Never POSTs upstream. `submitted`: the task becomes `SUBMITTED`, metered once, "
            "dispatched if an archive URL is known; `not_submitted`: the task and its intent "
            'are removed (`{"task": null}`). The same verdict again answers the same.',
            _responses(
                {
                    "200": _json_response(
                        "Resolved (or the same verdict again).",
                        _object({"task": _nullable(_ref("Task"))}),
                    )
                },
                (
                    400,
                    _bad_request(_BAD_GID + " Or: " + _BAD_BODY + " Or a verdict not in the list."),
                ),
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
                (404, _error(404, "No such task.")),
                (
                    409,
                    _error(
                        409,
                        "Nothing changed. `conflict`: the task is no longer `UNKNOWN` (and the "
                        f"verdict is not the one it got); {verdict_too_early}; `note_required`: "
                        "the upstream's audit contradicts the verdict and no note was given.",
                        "conflict",
                        "verdict_too_early",
                        "note_required",
                        headers={
                            "Retry-After": {
                                **_RETRY_AFTER["Retry-After"],
                                "description": "With `verdict_too_early`: whole seconds, "
                                "rounded up.",
                            }
                        },
                    ),
                ),
            ),
            tag="admin",
            parameters=[_GID_PARAMETER],
            body=_body(
                _object(
                    {
                        "verdict": _string(enum=["submitted", "not_submitted"]),
                        "note": _string(
                            "Required when the audit contradicts the verdict.",
                            maxLength=MAX_NOTE,
                            pattern=_NO_NUL,
                        ),
                    },
                    required=["verdict"],
                )
            ),
        ),
        "force": _operation(
            "forceDeleteTask",
            "Force a stuck delete",
            "Completes a `DELETE_PENDING` whose node is gone for good: tombstone and audit row "
            "with the note; the node's late confirmation is ignored. A repeat on the tombstone "
            "it left answers the same.",
            _responses(
                {"200": _json_response("Deleted (or already forced).", _ref("ForcedDelete"))},
                (400, _bad_request(_BAD_GID + " Or: " + _BAD_BODY)),
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
                (404, _error(404, "No such task.")),
                (
                    409,
                    _error(
                        409,
                        "The task is not `DELETE_PENDING` (or its node confirmed the delete).",
                        "conflict",
                    ),
                ),
            ),
            tag="admin",
            parameters=[_GID_PARAMETER],
            body=_body(
                _object(
                    {
                        "note": _string(
                            "Why (kept in the audit row).",
                            minLength=1,
                            maxLength=MAX_NOTE,
                            pattern=_NO_NUL,
                        )
                    }
                )
            ),
        ),
        "reassign": _operation(
            "reassignNode",
            "Reassign a node's unfinished tasks now",
            "Whatever `--reassign-after` says: every `SUBMITTED` task of the node not yet "
            "completed (and not being deleted) moves, with the same operationId (nothing is "
            "POSTed or charged again; only the download is repeated), to the least loaded node "
            "connected to this site, or back to waiting for a node when there is none. The "
            "node's later reports about them are dropped (`not_owner`); a `CANCEL` of each is "
            "sent to it now if it is connected here over v2, else when it next logs in. "
            "Audited (`node_custody_audit`: actor, note, tasks).",
            _responses(
                {
                    "200": _json_response(
                        "What moved.",
                        _object(
                            {
                                "node": _string(),
                                "tasks": _integer("Tasks moved off the node.", minimum=0),
                                "sent": _integer("Of them, sent to a connected node.", minimum=0),
                                "waiting": _integer("Of them, waiting for a node.", minimum=0),
                                "cancels": _integer("CANCELs owed to the node.", minimum=0),
                            },
                            required=["node", "tasks", "sent", "waiting", "cancels"],
                        ),
                    )
                },
                (400, _bad_request(_BAD_BODY)),
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
                (404, _error(404, "No such node: never logged in, no key, no task.")),
            ),
            tag="admin",
            parameters=[_NODE_PARAMETER],
            body=_body(
                _object(
                    {
                        "note": _string(
                            "Why (kept in the audit row).", maxLength=MAX_NOTE, pattern=_NO_NUL
                        )
                    },
                    required=[],
                )
            ),
        ),
        "retire": _operation(
            "retireNode",
            "Retire a node",
            "The node is gone for good: its unfinished tasks move now (as `reassignNode`), "
            "every task it completed shows `ARCHIVE_GONE` (`NODE_RETIRED`), its key is removed "
            "(its next Login fails; a key given with `--node-key` stays while the option does) "
            "and its connection to this site is closed. Audited (actor, note, tasks, archives).",
            _responses(
                {
                    "200": _json_response(
                        "What was done.",
                        _object(
                            {
                                "node": _string(),
                                "tasks": _integer("Tasks moved off the node.", minimum=0),
                                "sent": _integer("Of them, sent to a connected node.", minimum=0),
                                "waiting": _integer("Of them, waiting for a node.", minimum=0),
                                "archives": _integer(
                                    "Completed tasks now `ARCHIVE_GONE`.", minimum=0
                                ),
                                "keyRemoved": {
                                    "type": "boolean",
                                    "description": "Whether the node had a key in the database.",
                                },
                            },
                            required=["node", "tasks", "sent", "waiting", "archives", "keyRemoved"],
                        ),
                    )
                },
                (400, _bad_request(_BAD_BODY)),
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
                (404, _error(404, "No such node: never logged in, no key, no task.")),
            ),
            tag="admin",
            parameters=[_NODE_PARAMETER],
            body=_body(
                _object(
                    {
                        "note": _string(
                            "Why (kept in the audit row).", maxLength=MAX_NOTE, pattern=_NO_NUL
                        )
                    },
                    required=[],
                )
            ),
        ),
        "control": _operation(
            "controlNode",
            "Drain, pause or resume a node; set its download limit",
            "`mode`: `DRAINING` (no new task goes to the node; what it holds finishes, then it "
            "is drained), `PAUSED` (no new task until resumed) or `ACTIVE` (resume). "
            "`downloadLimit`: at most this many of its tasks not yet completed at a time "
            "(`null`: no bound); the site's dispatcher obeys it by assigning less, since the "
            "wire has no message for a limit, so a v2 node and a legacy one alike are "
            "dispatched less, and tasks it held before stay with it. Nothing stops a download "
            "a node already has. Kept across restarts (`node_control`); at least one of the "
            "two fields. A field it does not know is refused (`400 invalid_request`), not "
            "ignored: a misspelt `downloadLimit` must not pause a node without its limit.",
            _responses(
                {
                    "200": _json_response(
                        "The node's control now.",
                        _object(
                            {
                                "node": _string(),
                                "mode": _string(enum=["ACTIVE", "DRAINING", "PAUSED"]),
                                "downloadLimit": {
                                    "type": ["integer", "null"],
                                    "minimum": 1,
                                    "description": "At most this many open tasks; null: none.",
                                },
                                "actor": _string("Who set it last (empty when never set)."),
                                "note": _string(),
                                "changedAt": {
                                    "type": ["string", "null"],
                                    "description": "When (ISO 8601 UTC); null when never set.",
                                },
                            },
                            required=["node", "mode", "downloadLimit"],
                        ),
                    )
                },
                (400, _bad_request(_BAD_BODY)),
                (401, _common("Unauthorized")),
                (403, admin_forbidden),
                (404, _error(404, "No such node: never logged in, no key, no task.")),
            ),
            tag="admin",
            parameters=[_NODE_PARAMETER],
            body=_body(
                _object(
                    {
                        "mode": _string(enum=["ACTIVE", "DRAINING", "PAUSED"]),
                        "downloadLimit": {
                            "type": ["integer", "null"],
                            "minimum": 1,
                            "maximum": 100000,
                        },
                        "note": _string(
                            "Why (kept with the control).", maxLength=MAX_NOTE, pattern=_NO_NUL
                        ),
                    },
                    required=[],
                    additional=False,
                )
                | {"anyOf": [{"required": ["mode"]}, {"required": ["downloadLimit"]}]}
            ),
        ),
        "nodes": _operation(
            "listNodes",
            "List nodes",
            "Connected nodes first (to any site of the database, each once), then those seen "
            'in the last 7 days (`"connected": false`).',
            _responses(
                {
                    "200": _json_response(
                        "The nodes.", _object({"nodes": {"type": "array", "items": _ref("Node")}})
                    )
                },
                (401, _common("Unauthorized")),
                (403, _error(403, _ADMIN_FORBIDDEN, "forbidden")),
            ),
            tag="admin",
        ),
    }


def _other_operations() -> dict[str, Schema]:
    text = {"type": "string"}
    return {
        "events": _operation(
            "openEvents",
            "Live task changes (WebSocket)",
            'A WebSocket: after each commit the site pushes `{"type": "task", "task": '
            "{...}}` for the tasks the caller may see. The token may be given as `?token=` (a "
            "browser cannot set the header); a handshake made with the session cookie needs "
            "the site's own `Origin`. A socket closes (code 4001) within 5 s of its token or "
            "session ending.",
            _responses(
                {
                    "101": {"description": "The WebSocket is open."},
                },
                (
                    400,
                    _bad_request(
                        "No `Connection: Upgrade`, or a `Sec-WebSocket-Key` that is not 16 "
                        "bytes in base64."
                    ),
                ),
                (401, _common("Unauthorized")),
                (403, _error(403, _COOKIE_FORBIDDEN, "forbidden")),
                (
                    426,
                    _error(
                        426,
                        "Not a WebSocket handshake (no `Upgrade: websocket`), or one of "
                        "another version than 13 (then with `Sec-WebSocket-Version: 13`).",
                        headers={
                            "Upgrade": {
                                "description": "`websocket`.",
                                "required": True,
                                "schema": {"type": "string"},
                            }
                        },
                    ),
                ),
            ),
            tag="events",
            parameters=[
                _query("token", _string(), "The API token (instead of the header)."),
                _header("Upgrade", _string(enum=["websocket"])),
                _header("Connection", _string(enum=["Upgrade"])),
                _header(
                    "Sec-WebSocket-Key",
                    _string("16 random bytes, base64.", pattern="^[A-Za-z0-9+/]{21}[AQgw]==$"),
                ),
                _header("Sec-WebSocket-Version", _string(enum=["13"])),
            ],
            security=[*_AUTH, {"query": []}],
        ),
        "health": _operation(
            "getHealth",
            "Health",
            "No auth. `503` while the database does not answer (within 2 s), so a load "
            "balancer stops sending requests here.",
            _responses(
                {
                    "200": _json_response("The site works.", _ref("Health")),
                    "503": _json_response(
                        "The database does not answer (`database` says since when).",
                        _ref("Health"),
                    ),
                },
                db=False,
            ),
            tag="operations",
            security=[],
        ),
        "metrics": _operation(
            "getMetrics",
            "Prometheus metrics",
            'No auth. Prometheus text format (docs/operations.md, "Read metrics").',
            _responses(
                {
                    "200": {
                        "description": "The metrics.",
                        "content": {"text/plain": {"schema": text}},
                    }
                },
                db=False,
            ),
            tag="operations",
            security=[],
        ),
        "openapi": _operation(
            "getOpenApi",
            "This document",
            "No auth. The OpenAPI 3.1 document of this API.",
            _responses(
                {"200": _json_response("The document.", {"type": "object"})},
                db=False,
            ),
            tag="operations",
            security=[],
        ),
        "ui": _operation(
            "getUi",
            "The web UI",
            "No auth. The UI's page; its static files are served below `/` (a missing one is "
            "the `404` envelope).",
            _responses(
                {
                    "200": {
                        "description": "The page.",
                        "content": {"text/html": {"schema": text}},
                    }
                },
                db=False,
            ),
            tag="ui",
            security=[],
        ),
    }


@functools.cache
def _document() -> str:
    tasks = _task_operations()
    favorites = _favorite_operations()
    session = _session_operations()
    admin = _admin_operations()
    people = _user_operations()
    other = _other_operations()
    archives = _archive_operations()
    paths = {
        "/api/tasks": {"get": tasks["list"], "post": tasks["create"]},
        "/api/tasks/counts": {"get": tasks["counts"]},
        "/api/tasks/bulk": {"post": tasks["bulk"]},
        "/api/tasks/{gid}": {"get": tasks["get"], "delete": tasks["delete"]},
        "/api/tasks/{gid}/details": {"get": tasks["details"]},
        "/api/tasks/{gid}/archive": {"get": archives["get"]},
        "/api/tasks/archive-links": {"post": archives["links"]},
        "/api/stats": {"get": tasks["stats"]},
        "/api/favorites": {"get": favorites["list"]},
        "/api/favorites/{gid}": {"put": favorites["add"], "delete": favorites["remove"]},
        "/api/session": {
            "get": session["page"],
            "post": session["create"],
            "delete": session["delete"],
        },
        "/api/me": {"get": session["me"]},
        "/api/upstream": {
            "get": _operation(
                "getUpstream",
                "Is the upstream reached",
                "Site-wide: whether this site's own upstream calls are answered, and how "
                "many of the caller's downloads cannot reach it (the web UI's banner).",
                _responses(
                    {"200": _json_response("The upstream's reach.", _ref("UpstreamAnswer"))},
                    (401, _common("Unauthorized")),
                ),
                tag="tasks",
            )
        },
        "/api/usage": {
            "get": _operation(
                "getUsage",
                "This week's usage",
                "The caller's usage of this ISO week and the quota.",
                _responses(
                    {"200": _json_response("The usage.", _ref("Usage"))},
                    (401, _common("Unauthorized")),
                ),
                tag="tasks",
            )
        },
        "/api/admin/unknown": {"get": admin["unknown"]},
        "/api/admin/tasks/{gid}/resolve": {"post": admin["resolve"]},
        "/api/admin/tasks/{gid}/force-delete": {"post": admin["force"]},
        "/api/admin/nodes": {"get": admin["nodes"]},
        "/api/admin/nodes/{node}/reassign": {"post": admin["reassign"]},
        "/api/admin/nodes/{node}/retire": {"post": admin["retire"]},
        "/api/admin/nodes/{node}/control": {"post": admin["control"]},
        "/api/admin/users": {"get": people["list"], "post": people["add"]},
        "/api/admin/users/{name}/quota": {"put": people["quota"]},
        "/api/admin/users/{name}/disable": {"post": people["disable"]},
        "/api/admin/users/{name}/enable": {"post": people["enable"]},
        "/api/admin/users/{name}/token": {"post": people["token"]},
        "/api/admin/users/{name}/sessions": {"delete": people["sessions"]},
        "/api/events": {"get": other["events"]},
        "/api/openapi.json": {"get": other["openapi"]},
        "/healthz": {"get": other["health"]},
        "/metrics": {"get": other["metrics"]},
        "/": {"get": other["ui"]},
    }
    document = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "tasknet site HTTP API",
            "version": __version__,
            "description": (
                "Archive download tasks across a main site and storage nodes "
                '(INTERFACES.md, "Site HTTP API"). JSON in and out; every error answer is '
                '`{"error": {"code", "message"}}`. Authenticate with `Authorization: Bearer '
                "TOKEN`, or the browser session cookie from `POST /api/session` (then every "
                "write needs the site's own `Origin` and a body typed `application/json`). "
                "Besides each operation's answers: a method a path does not have is `405 "
                "method_not_allowed` with an `Allow` header; a path no route has, or one "
                "holding NUL, a control character or invalid UTF-8, is `404 not_found`; a "
                "malformed request line, header or chunk is `400 invalid_request` and the "
                "connection is closed. Every answer carries the security headers "
                '(docs/operations.md, "HTTP limits, sessions and headers").'
            ),
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "tags": [
            {"name": "tasks", "description": "Tasks, their views and the caller's usage."},
            {"name": "favorites", "description": "A user's favorite tasks."},
            {"name": "session", "description": "Browser sessions (the web UI's sign-in)."},
            {"name": "admin", "description": "Admin only: reconcile, stuck deletes, nodes."},
            {"name": "events", "description": "Live updates."},
            {"name": "operations", "description": "Health, metrics and this document (no auth)."},
            {"name": "ui", "description": "The web UI."},
        ],
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "responses": _COMMON_RESPONSES,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (`tasknet-admin user add|token`; "
                    "`demo` with `--demo`).",
                },
                "session": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "tasknet_session",
                    "description": "The browser session's id (`POST /api/session`).",
                },
                "query": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "token",
                    "description": "The API token as `?token=` (only `/api/events`).",
                },
            },
        },
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def document() -> dict[str, Any]:
    """The OpenAPI document (a fresh copy: callers may change it)."""
    result: dict[str, Any] = json.loads(_document())
    return result


def document_bytes() -> bytes:
    """The document as served (UTF-8 JSON)."""
    return _document().encode("utf-8")


def operations(doc: dict[str, Any] | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """``(METHOD, path, operation)`` for every operation, in document order."""
    doc = document() if doc is None else doc
    return [
        (method.upper(), path, operation)
        for path, item in doc["paths"].items()
        for method, operation in item.items()
    ]


# -- docs/api.md --------------------------------------------------------------------


def _resolve(doc: dict[str, Any], node: Any) -> Any:
    if isinstance(node, dict) and "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return target
    return node


def _type_text(schema: Schema) -> str:
    """A short text of a schema: ``Task``, ``integer 1..2147483647``, ``[Task]``."""
    if "$ref" in schema:
        return f"[{schema['$ref'].rsplit('/', 1)[1]}](#{schema['$ref'].rsplit('/', 1)[1].lower()})"
    if "oneOf" in schema:
        return " \\| ".join(_type_text(s) for s in schema["oneOf"])
    if "allOf" in schema:
        return " + ".join(_type_text(s) for s in schema["allOf"])
    kind = schema.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    text = " \\| ".join(str(k) for k in kinds if k != "null" or "enum" not in schema)
    if "enum" in schema:
        text = " \\| ".join(
            "null" if v is None else f"`{json.dumps(v, ensure_ascii=False)}`"
            for v in schema["enum"]
        )
    if kinds[0] == "array" and "items" in schema:
        text = f"[{_type_text(schema['items'])}]" + (" \\| null" if "null" in kinds else "")
    if kinds[0] == "object" and schema.get("properties"):
        fields = ", ".join(f"`{k}`: {_type_text(v)}" for k, v in schema["properties"].items())
        text = "{" + fields + "}"
    if kinds[0] == "object" and isinstance(schema.get("additionalProperties"), dict):
        text = "{string: " + _type_text(schema["additionalProperties"]) + "}"
    bounds = []
    if "minimum" in schema or "maximum" in schema:
        bounds.append(f"{schema.get('minimum', '')}..{schema.get('maximum', '')}")
    if "minLength" in schema or "maxLength" in schema:
        bounds.append(f"length {schema.get('minLength', 0)}..{schema.get('maxLength', '')}")
    if bounds:
        text += " (" + ", ".join(bounds) + ")"
    return text


def _fields_table(schema: Schema) -> list[str]:
    required = set(schema.get("required", []))
    lines = ["| field | type | required | meaning |", "|---|---|---|---|"]
    for name, field in schema.get("properties", {}).items():
        meaning = field.get("description", "").replace("\n", " ")
        mark = "yes" if name in required else ""
        lines.append(f"| `{name}` | {_type_text(field)} | {mark} | {meaning} |")
    return lines


def _error_codes(doc: dict[str, Any], response: Schema) -> str:
    response = _resolve(doc, response)
    schema = response.get("content", {}).get(JSON, {}).get("schema", {})
    for part in schema.get("allOf", []):
        code = part.get("properties", {}).get("error", {}).get("properties", {}).get("code")
        if code:
            return ", ".join(f"`{c}`" for c in code["enum"])
    return ""


def _response_body(doc: dict[str, Any], response: Schema) -> str:
    response = _resolve(doc, response)
    content = response.get("content", {})
    if not content:
        return ""
    media, body = next(iter(content.items()))
    schema = body.get("schema", {})
    if "allOf" in schema and schema["allOf"][0] == _ref("Error"):
        return "[Error](#error)"
    return f"{_type_text(schema)}" + ("" if media == JSON else f" (`{media}`)")


def render_markdown(doc: dict[str, Any] | None = None) -> str:
    """``docs/api.md``: the document as a page to read."""
    doc = document() if doc is None else doc
    out = [
        "# The site's HTTP API",
        "",
        "<!-- Generated from tasknet/site/web/openapi.py: do not edit; regenerate with",
        "     python -m tasknet.site.web.openapi --markdown > docs/api.md -->",
        "",
        f"OpenAPI {doc['openapi']}, served by every site at `GET /api/openapi.json` (no auth).",
        "",
        doc["info"]["description"],
        "",
        "Authentication: "
        + "; ".join(
            f"`{name}`: {scheme['description'].rstrip('.')}"
            for name, scheme in doc["components"]["securitySchemes"].items()
        ),
        "",
        "Every operation also answers `408 request_timeout` (no complete request within 30 s) "
        "and `413 payload_too_large` (a body over `--max-body`) from the HTTP layer; "
        "those marked *db* answer `503 unavailable` with `Retry-After` when the database is "
        "busy or unreachable or the site is fenced.",
        "",
        "Tested with schemathesis against a real site: `tests/site/test_schemathesis.py`, "
        "and for a longer run `TASKNET_SCHEMATHESIS_EXAMPLES` (docs/operations.md, "
        '"The API contract").',
        "",
        "## Operations",
        "",
        "| method, path | operation | auth |",
        "|---|---|---|",
    ]
    for method, path, operation in operations(doc):
        auth = (
            "admin"
            if operation["tags"] == ["admin"]
            else ("yes" if operation["security"] else "no")
        )
        anchor = operation["operationId"].lower()
        out.append(f"| `{method} {path}` | [{operation['summary']}](#{anchor}) | {auth} |")
    for method, path, operation in operations(doc):
        out += [
            "",
            f"### {operation['operationId']}",
            "",
            f"`{method} {path}`: {operation['summary']}.",
            "",
        ]
        out += [operation["description"], ""]
        if not operation["security"]:
            out += ["No authentication.", ""]
        for parameter in operation.get("parameters", []):
            schema = parameter["schema"]
            note = parameter.get("description", "")
            line = f"- `{parameter['name']}` ({parameter['in']}): {_type_text(schema)}. {note}"
            out.append(line.rstrip())
        if operation.get("parameters"):
            out.append("")
        body = operation.get("requestBody")
        if body is not None:
            out += ["Request body (`application/json`):", ""]
            out += _fields_table(body["content"][JSON]["schema"])
            out.append("")
        out += ["| status | body | error codes | when |", "|---|---|---|---|"]
        responses = operation["responses"]
        for status, response in responses.items():
            if status in ("408", "413") and "$ref" in response:
                continue
            if status == "503" and "$ref" in response:
                continue
            resolved = _resolve(doc, response)
            when = resolved["description"].replace("\n", " ")
            headers = ", ".join(f"`{h}`" for h in resolved.get("headers", {}))
            if headers:
                when += f" Headers: {headers}."
            body_text = _response_body(doc, response)
            out.append(f"| {status} | {body_text} | {_error_codes(doc, response)} | {when} |")
        if "503" in responses and "$ref" in responses["503"]:
            out += ["", "*db*: `503 unavailable` when the database cannot answer."]
        links = [
            (name, link)
            for response in responses.values()
            for name, link in _resolve(doc, response).get("links", {}).items()
        ]
        if links:
            seen = sorted({f"`{link['operationId']}`" for _, link in links})
            out += ["", "Links (the gid of the answer): " + ", ".join(seen) + "."]
    out += ["", "## Schemas"]
    for name, schema in doc["components"]["schemas"].items():
        out += ["", f"### {name}", ""]
        if schema.get("description"):
            out += [schema["description"], ""]
        if "anyOf" in schema:
            out.append("One of: " + "; ".join(_type_text(part) for part in schema["anyOf"]) + ".")
        elif "allOf" in schema:
            parts = [
                _type_text(p)
                if "$ref" in p
                else "{"
                + ", ".join(f"`{k}`: {_type_text(v)}" for k, v in p["properties"].items())
                + "}"
                for p in schema["allOf"]
            ]
            out.append(" + ".join(parts))
        else:
            out += _fields_table(schema)
    out += ["", "## Error codes", "", "| code | status |", "|---|---|"]
    out += [f"| `{code}` | {status} {_REASONS[status]} |" for code, status in STATUS.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--markdown"]:
        sys.stdout.write(render_markdown())
    elif not args:
        sys.stdout.write(json.dumps(document(), ensure_ascii=False, indent=2) + "\n")
    else:
        print("usage: python -m tasknet.site.web.openapi [--markdown]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
