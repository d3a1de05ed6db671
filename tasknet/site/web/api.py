"""The site HTTP API (INTERFACES.md, "Site HTTP API"), with klein.

Every endpoint reads its input strictly (bad JSON, wrong types, a bool where
an int belongs, a gid outside 1..2^31, a NUL in any JSON string: ``400
invalid_request``; a body over :data:`MAX_BODY`: ``413``), authenticates the
caller (a bearer token or a browser session: ``web/auth.py``, which also
holds the same-origin rule for cookie writes), and then calls one lifecycle
chain or one storage transaction: no SQL here.

A JSON body must say so (``Content-Type: application/json``, charset UTF-8
if one is named) on ``POST /api/session`` and on every request
authenticated by the session cookie: a form or ``text/plain`` body, which a
page of another site can send without asking, is ``400`` and changes
nothing.  A bearer-token request may leave the type out (programs).

Decisions the spec leaves open:

* Another user's task answers exactly like a missing one (``404``), for
  read, delete and favorite alike, so task existence is not leaked.  Admins
  see and delete every task.
* A gallery the upstream does not have (``prepare`` answers 404) is a
  ``404 not_found``; the reservation is released as for any prepare failure.
* Favorites: ``PUT``/``DELETE /api/favorites/{gid}`` answer
  ``{"gid": g, "favorite": true|false}`` (idempotent), ``GET /api/favorites``
  answers ``{"tasks": [...]}``.
* ``GET /api/tasks`` (filter, search, order, keyset cursor),
  ``/api/tasks/counts`` and ``/api/stats`` read their parameters with
  ``web/task_queries.py``, which lists the decisions made for them.
* The contract is the OpenAPI 3.1 document of ``web/openapi.py``, served
  at ``GET /api/openapi.json`` (public) and checked against these routes.
  As it says: a method a path lacks is ``405`` with ``Allow`` (``/api/...``
  paths too, and ``DELETE /api/tasks/counts``); ``/api/events`` without a
  WebSocket handshake is ``426 upgrade_required`` (not autobahn's page);
  a gid in a body is a JSON integer (``431.0`` is ``431``); fields a body
  does not need are ignored.
* The API's collaborators (the lifecycle, the database, ``/api/events``,
  the admin node view, health, the create limiter, the clock) come in one
  :class:`~tasknet.site.web.interfaces.WebDependencies`, complete when the
  composition root builds it: no route ever answers "not wired".
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, NotRequired, TypedDict, cast
from urllib.parse import unquote

import orjson
from klein import Klein
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from twisted.web.server import Request
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule

from tasknet.deferreds import shield
from tasknet.json_types import JsonObject, JsonValue
from tasknet.site import metrics
from tasknet.site.storage import (
    archives,
    delete,
    favorites,
    reconcile,
    sessions,
    stats,
    task_history,
    usage,
    users,
)
from tasknet.site.storage.engine.errors import DatabaseBusy, TaskError
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.instances import LeaseLost
from tasknet.site.storage.users import User
from tasknet.site.storage.views import (
    GID_MAX,
    GID_MIN,
    QUEUED,
    TaskView,
    count_by_status,
    downloads_not_reaching,
    list_tasks,
    matching_tasks,
    visible_task,
)
from tasknet.site.web import admin_nodes, admin_users, openapi
from tasknet.site.web.archives import MAX_LINKS, IssuedLink, aria2_input
from tasknet.site.web.auth import own_origin, request_credentials, require_admin
from tasknet.site.web.errors import STATUS, ApiError, write_api_error, write_error, write_json
from tasknet.site.web.http import StaticFiles
from tasknet.site.web.interfaces import WebDependencies
from tasknet.site.web.task_queries import bulk_filter, search_text, stats_window, task_query
from tasknet.status import TaskStatus

log = Logger()

MAX_BODY = 1024 * 1024
MAX_JSON_DEPTH = 64
MAX_TOKEN = 512
MAX_NAME = 256
MAX_NOTE = 2000
STATIC_DIR = Path(__file__).parent / "static"

_GID_TEXT = re.compile(r"[0-9]{1,10}")

Reply = tuple[int, Any]
Handler = Callable[..., Awaitable[Reply]]


@dataclass(frozen=True)
class PlainText:
    """A reply's document that is text, not JSON (an aria2 input file)."""

    text: str


#: A reply's document when the route has answered by itself (a stream).
STREAMED = object()


def _create_outcome(status: int, code: str | None) -> str:
    if status == 201:
        return "created"
    if status == 202:
        return "unknown"
    return {
        "conflict": "conflict",
        "already_completed": "conflict",
        "charge_confirmation_required": "conflict",
        "upstream_rejected": "rejected",
        "quota_exceeded": "quota_exceeded",
        "rate_limited": "rate_limited",
        "upstream_unavailable": "upstream_unavailable",
        "invalid_request": "invalid",
        "payload_too_large": "invalid",
    }.get(code or "", "error")


async def answer(request: Request, reply: Awaitable[Reply]) -> tuple[bytes, str | None]:
    """Await ``reply`` (``(status, document)``) and write it as JSON; the
    body, and the error code it answered (``None``: no error).
    :class:`ApiError` and :class:`TaskError` become their error answers, any
    other exception a logged ``500 internal``."""
    try:
        status, document = await reply
        if document is STREAMED:
            return b"", None
        if isinstance(document, PlainText):
            request.setResponseCode(status)
            request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            request.setHeader(b"Cache-Control", b"no-store")
            return document.text.encode("utf-8"), None
        # An error answered with a document of its own (a quota_exceeded with
        # its numbers, a verdict too early with its notBefore).
        error = document.get("error") if status >= 400 and isinstance(document, dict) else None
        return write_json(request, status, document), (
            error.get("code") if isinstance(error, dict) else None
        )
    except CancelledError:
        raise  # the client went away; nothing to answer
    except ApiError as e:
        if e.code == "unavailable" and e.retry_after is None:
            request.setHeader(b"Retry-After", b"5")
        return write_api_error(request, e), e.code
    except TaskError as e:
        if e.code == "unavailable":
            request.setHeader(b"Retry-After", b"5")
        return write_error(request, e.code, e.message), e.code
    except (DatabaseBusy, LeaseLost) as e:
        # Busy, unreachable or fenced: nothing changed; try again
        # (here, or through another site).
        request.setHeader(b"Retry-After", b"5")
        return write_error(request, "unavailable", f"the site cannot act now: {e}"), "unavailable"
    except Exception:
        log.failure("{method} {path} failed", method=request.method, path=request.path)
        return write_error(request, "internal", "internal error (logged)"), "internal"


def endpoint(fn: Handler) -> Callable[..., Deferred[bytes]]:
    """Run ``fn`` (async, returning ``(status, document)``) and answer JSON
    (:func:`answer`)."""

    @functools.wraps(fn)
    # Klein passes the route's path segments, as text.
    def wrapper(self: SiteApi, request: Request, *args: str, **kw: str) -> Deferred[bytes]:
        async def run() -> bytes:
            body, _ = await answer(request, fn(self, request, *args, **kw))
            return body

        return Deferred.fromCoroutine(run())

    return wrapper


# -- input ---------------------------------------------------------------------


def parse_gid(text: JsonValue) -> int:
    """A gid from the path (decimal digits) or a JSON body (an integer; a
    number with no fraction, such as ``431.0``, is one in JSON)."""
    if isinstance(text, float) and text.is_integer():
        text = int(text)
    if isinstance(text, str):
        if not _GID_TEXT.fullmatch(text):
            raise ApiError("invalid_request", f"gid must be an integer in {GID_MIN}..{GID_MAX}")
        text = int(text)
    if isinstance(text, bool) or not isinstance(text, int) or not GID_MIN <= text <= GID_MAX:
        raise ApiError("invalid_request", f"gid must be an integer in {GID_MIN}..{GID_MAX}")
    return text


def _path_gid(request: Request, text: str) -> int:
    """The gid of a ``.../<gid>`` path.  A path that names another route
    (``DELETE /api/tasks/counts``) is ``405`` with that route's methods,
    not a bad gid."""
    if not (text.isascii() and text.isdigit()):
        allowed = allowed_methods(unquote(request.path.decode("utf-8", "replace")))
        if allowed:
            methods = ", ".join(sorted(allowed))
            request.setHeader(b"Allow", methods.encode("ascii"))
            raise ApiError(
                "method_not_allowed",
                f"{request.method.decode()} is not allowed here ({methods})",
            )
    return parse_gid(text)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _check_json(value: JsonValue, depth: int = 1) -> None:
    """``400`` for JSON nested deeper than :data:`MAX_JSON_DEPTH` or holding
    a string that is not Unicode text (a lone surrogate escape such as
    ``"\\ud800"``: SQLite and every encoder would fail on it later) or that
    holds a NUL (``"\\u0000"``: PostgreSQL's text cannot store one, and no
    name, token or note has one), in a value or a key."""
    if depth > MAX_JSON_DEPTH:
        raise ApiError("invalid_request", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError("invalid_request", "a JSON string holds a lone surrogate") from None
        if "\x00" in value:
            raise ApiError("invalid_request", "a JSON string holds a NUL (\\u0000)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, depth)
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)


def _is_json_type(request: Request) -> bool:
    """``Content-Type: application/json`` (charset UTF-8, if named)."""
    values = request.requestHeaders.getRawHeaders(b"content-type")
    if not values or len(values) != 1:
        return False
    media, *parameters = values[0].decode("latin-1").split(";")
    if media.strip().lower() != "application/json":
        return False
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


def json_body(request: Request, *, json_only: bool | None = None) -> JsonObject:
    """The request body as a JSON object.  ``json_only`` (default: when the
    request authenticates with the session cookie): the body must be typed
    ``application/json``.  The HTTP layer (``web.http``) already refused a
    body over ``--max-body`` with ``413``, before reading it; this re-checks
    for a resource served without that layer."""
    if json_only is None:
        credentials = request_credentials(request)
        json_only = credentials is not None and credentials.source == "cookie"
    if json_only and not _is_json_type(request):
        raise ApiError(
            "invalid_request", "the body must be JSON, sent as 'Content-Type: application/json'"
        )
    limit = getattr(getattr(request, "site", None), "max_body", MAX_BODY)
    assert request.content is not None
    request.content.seek(0)
    raw = request.content.read(limit + 1)
    if len(raw) > limit:
        raise ApiError("payload_too_large", f"the body is limited to {limit} bytes")
    try:
        document: JsonValue = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise ApiError("invalid_request", f"the body is not valid JSON: {e}") from e
    except RecursionError:
        # The C decoder gives up on very deep nesting; the bound is lower.
        raise ApiError(
            "invalid_request", f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    _check_json(document)
    if not isinstance(document, dict):
        raise ApiError("invalid_request", "the body must be a JSON object")
    return document


def string_field(
    document: JsonObject, name: str, *, required: bool, limit: int, default: str = ""
) -> str:
    if name not in document:
        if required:
            raise ApiError("invalid_request", f"{name!r} is required")
        return default
    value = document[name]
    if not isinstance(value, str):
        raise ApiError("invalid_request", f"{name!r} must be a string")
    if required and not value:
        raise ApiError("invalid_request", f"{name!r} must not be empty")
    if len(value) > limit:
        raise ApiError("invalid_request", f"{name!r} is limited to {limit} characters")
    return value


#: ``POST /api/tasks/bulk``'s actions, and how many gids one call takes.
BULK_ACTIONS = ("delete", "retry")
MAX_BULK = 500
#: The gids a ``filter`` answer names per reason, at most.
BULK_REASON_GIDS = 100


class BulkResult(TypedDict):
    """One gid's answer in ``POST /api/tasks/bulk``."""

    gid: int
    status: int
    error: NotRequired[dict[str, str]]
    task: NotRequired[TaskView | None]


class BulkReason(TypedDict):
    """Why some tasks of a bulk ``filter`` were not done: how many, and
    the first of their gids."""

    count: int
    gids: list[int]


class BulkMatched(TypedDict):
    """``POST /api/tasks/bulk``'s answer to a ``filter``."""

    matched: int
    done: int
    notDone: int
    notApplicable: int
    reasons: dict[str, BulkReason]


class MissingLink(TypedDict):
    """A gid ``POST /api/tasks/archive-links`` gives no link for, and why."""

    gid: int
    code: str


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


def _me(user: User) -> dict[str, str | bool]:
    return {"name": user.name, "admin": user.is_admin}


def _scope(user: User) -> int | None:
    """Whose tasks ``user`` may see and touch: their own, or all (admin: None)."""
    return None if user.is_admin else user.id


# -- the API ---------------------------------------------------------------------


class SiteApi:
    app = Klein()

    def __init__(self, deps: WebDependencies) -> None:
        self.deps = deps
        self.db = deps.db
        self.lifecycle = deps.lifecycle
        self.clock = deps.clock
        self.auth = deps.auth

    async def _user(self, request: Request) -> User:
        return await self.auth.authenticate(request)

    # tasks

    @app.route("/api/tasks", methods=["POST"])
    def create_task(self, request: Request) -> Deferred[bytes]:
        async def run() -> bytes:
            body, code = await answer(request, self._create_task(request))
            if request.code != 401:  # counted by what it answered, not by reading it back
                metrics.CREATES.labels(outcome=_create_outcome(request.code, code)).inc()
            return body

        return Deferred.fromCoroutine(run())

    async def _create_task(self, request: Request) -> Reply:
        closed = self.lifecycle.closed
        if closed is not None:
            # Fenced or stopping: answered now, before any read (its
            # database may be gone); nothing is sent for a create from here on.
            raise ApiError("unavailable", f"nothing was submitted: {closed}; try again")
        user = await self._user(request)
        # Per-user rate limit (tasknet.site.ratelimit) before anything is
        # read or written: a refused create leaves no trace.
        limiter = self.deps.create_limiter
        wait = limiter.take(user.id) if limiter is not None else 0.0
        if wait > 0:
            request.setHeader(b"Retry-After", str(max(1, math.ceil(wait))).encode("ascii"))
            raise ApiError("rate_limited", f"too many creates: retry in {wait:.2f} s")
        document = json_body(request)
        if "gid" not in document:
            raise ApiError("invalid_request", "'gid' is required")
        gid = parse_gid(document["gid"])
        if isinstance(document["gid"], str):
            raise ApiError("invalid_request", "'gid' must be a JSON integer")
        token = string_field(document, "token", required=True, limit=MAX_TOKEN)
        name = string_field(document, "name", required=False, limit=MAX_NAME)
        # DELIVERY.md "Getting it again": fetching a gone archive again is a new charge.
        confirm = document.get("confirmCharge", False)
        if not isinstance(confirm, bool):
            raise ApiError("invalid_request", "'confirmCharge' must be true or false")
        try:
            created = await shield(
                self.lifecycle.create(user.id, gid, token, name, confirm_charge=confirm)
            )
        except TaskError as e:
            if e.code == "charge_confirmation_required":
                return STATUS[e.code], {
                    "error": {"code": e.code, "message": e.message, **e.details}
                }
            if e.code != "quota_exceeded":
                raise
            return STATUS[e.code], {"error": await self._quota_error(user, e)}
        return created.status, {"task": created.task}

    async def _quota_error(self, user: User, refusal: TaskError) -> dict[str, int | str]:
        """A ``quota_exceeded`` envelope with the numbers a person needs:
        this week's ``used`` and ``quota`` (as ``GET /api/usage``), the
        ``cost`` of the refused task, and ``unsettled``: the cost of the
        user's unmetered ``UNKNOWN`` and in-flight submissions, which the
        check counts too (``used + unsettled + cost > quota``)."""
        error: dict[str, int | str] = {"code": "quota_exceeded", "message": refusal.message}
        error.update(refusal.details)
        try:
            week = await self.db.read(usage.usage, user.id)
            unsettled = await self.db.read(usage.in_flight_cost, user.id)
        except Exception:
            log.failure("reading the usage for a quota_exceeded answer failed")
            return error  # the refusal stands; only its numbers are missing
        error.update(week=week["week"], used=week["used"], quota=week["quota"])
        error["unsettled"] = unsettled
        return error

    @app.route("/api/tasks", methods=["GET"])
    @endpoint
    async def list_tasks(self, request: Request) -> Reply:
        user = await self._user(request)
        query = task_query(request, _scope(user), user.id)
        views, following, total = await self.db.read(list_tasks, query)
        return 200, {"tasks": views, "next": following, "total": total}

    @app.route("/api/tasks/bulk", methods=["POST"])
    @endpoint
    async def bulk_tasks(self, request: Request) -> Reply:
        """Delete or retry many tasks: each gid as its single operation
        would answer, in the order first given (``results``); a repeated gid
        is acted on once (one command to its node), and ``duplicates`` says
        how many repeats were dropped."""
        user = await self._user(request)
        document = json_body(request)
        action = document.get("action")
        if action not in BULK_ACTIONS:
            raise ApiError("invalid_request", f"'action' must be one of {list(BULK_ACTIONS)}")
        if "filter" in document:
            if "gids" in document:
                raise ApiError("invalid_request", "give 'gids' or 'filter', not both")
            return 200, await self._bulk_matching(user, action, document)
        gids = document.get("gids")
        if not isinstance(gids, list):
            raise ApiError("invalid_request", "'gids' must be an array of gids")
        if len(gids) > MAX_BULK:
            raise ApiError("invalid_request", f"'gids' is limited to {MAX_BULK} gids")
        numbers = []
        for gid in gids:
            if isinstance(gid, str):
                raise ApiError("invalid_request", "each of 'gids' must be a JSON integer")
            numbers.append(parse_gid(gid))
        distinct = list(dict.fromkeys(numbers))
        results = [await self._bulk_one(user, action, number) for number in distinct]
        return 200, {"results": results, "duplicates": len(numbers) - len(distinct)}

    async def _bulk_matching(self, user: User, action: str, document: JsonObject) -> BulkMatched:
        """``POST /api/tasks/bulk`` with a ``filter`` ("select all N
        matching"): the tasks the list's filters match (the caller's, an
        admin's everyone's), counted and read in one transaction; refused
        unchanged when they are not ``expect`` (``409 count_changed``) or
        more than the bound (``413 too_many_tasks``); else each acted on as
        with ``gids`` (``retry``: only the failed deletes among them), and
        answered as a summary: ``matched``, ``done``, ``notDone``,
        ``notApplicable`` and, per reason, ``count`` and the first gids."""
        query = bulk_filter(document["filter"], _scope(user), user.id)
        expect = document.get("expect")
        if isinstance(expect, bool) or not isinstance(expect, int) or expect < 0:
            raise ApiError(
                "invalid_request",
                "'expect' must be a whole number from 0: how many tasks the person confirmed",
            )
        bound = self.deps.max_bulk_matching
        count, tasks = await self.db.read(matching_tasks, query, bound)
        if count > bound:
            raise ApiError(
                "too_many_tasks",
                f"{count:,} tasks match; at most {bound:,} are acted on at once: narrow the filter",
                count=count,
                max=bound,
            )
        if count != expect:
            raise ApiError(
                "count_changed",
                f"{count:,} tasks match now, not {expect:,}: nothing was done; confirm again",
                count=count,
            )
        failed = TaskStatus.DELETE_FAILED.value
        targets = [gid for gid, key in tasks if action == "delete" or key == failed]
        reasons: dict[str, BulkReason] = {}

        def note(code: str, gid: int) -> None:
            reason = reasons.setdefault(code, {"count": 0, "gids": []})
            reason["count"] += 1
            if len(reason["gids"]) < BULK_REASON_GIDS:
                reason["gids"].append(gid)

        for gid, key in tasks:
            if action == "retry" and key != failed:
                note("not_retryable", gid)
        done = 0
        for gid in targets:
            result = await self._bulk_one(user, action, gid)
            if "error" in result:
                note(result["error"]["code"], gid)
            else:
                done += 1
        log.info(
            "bulk {action} of the {count} tasks matching a filter, by {user}: {done} done",
            action=action,
            count=count,
            user=user.name,
            done=done,
        )
        return {
            "matched": count,
            "done": done,
            "notDone": len(targets) - done,
            "notApplicable": len(tasks) - len(targets),
            "reasons": reasons,
        }

    async def _bulk_one(self, user: User, action: str, gid: int) -> BulkResult:
        """One gid of ``POST /api/tasks/bulk``: the status and body its
        single operation would answer (``retry``: delete again, only a
        ``DELETE_FAILED`` task; anything else is ``409``)."""
        try:
            if action == "retry":
                view = await self.db.read(visible_task, gid, _scope(user))
                if view["status"] != TaskStatus.DELETE_FAILED.value:
                    raise ApiError(
                        "conflict",
                        f"task {gid} is {view['status']}: only a DELETE_FAILED task is retried",
                    )
            outcome = await shield(self.lifecycle.delete(_scope(user), gid))
        except CancelledError:
            raise
        except (ApiError, TaskError) as e:
            return {"gid": gid, "status": STATUS[e.code], "error": _error(e.code, e.message)}
        except (DatabaseBusy, LeaseLost) as e:
            message = f"the site cannot act now: {e}"
            return {"gid": gid, "status": 503, "error": _error("unavailable", message)}
        except Exception:
            log.failure("bulk {action} of {gid} failed", action=action, gid=gid)
            return {
                "gid": gid,
                "status": 500,
                "error": _error("internal", "internal error (logged)"),
            }
        if outcome.completed:
            return {"gid": gid, "status": 200}
        return {"gid": gid, "status": 202, "task": outcome.task}

    @app.route("/api/tasks/counts", methods=["GET"])
    @endpoint
    async def task_counts(self, request: Request) -> Reply:
        user = await self._user(request)
        counts = await self.db.read(count_by_status, _scope(user), search_text(request), True)
        # QUEUED is a part of SUBMITTED: not counted twice.
        total = sum(n for key, n in counts.items() if key != QUEUED)
        return 200, {"counts": counts, "total": total}

    @app.route("/api/upstream", methods=["GET"])
    @endpoint
    async def upstream(self, request: Request) -> Reply:
        """Whether the upstream is reached, site-wide (issue 36, item 9): this
        site's own calls (``since``: failing since then, ``reason``), and how
        many of the caller's downloads (an admin: everyone's) wait to try
        again because their node could not reach it."""
        user = await self._user(request)
        downloads = await self.db.read(downloads_not_reaching, _scope(user))
        reach = self.deps.upstream_reach
        since = None if reach is None else reach.failing_since
        return 200, {
            "upstream": {
                "reachable": since is None and downloads == 0,
                "since": None if since is None else iso(since),
                "reason": None if reach is None or since is None else reach.reason,
                "downloadsNotReaching": downloads,
            }
        }

    @app.route("/api/stats", methods=["GET"])
    @endpoint
    async def stats(self, request: Request) -> Reply:
        user = await self._user(request)
        window = stats_window(request)
        now = self.clock.seconds()
        answer = await self.db.read(stats.stats, user.id, _scope(user), window, now)
        return 200, answer

    @app.route("/api/tasks/<gid>", methods=["GET"])
    @endpoint
    async def get_task(self, request: Request, gid: str) -> Reply:
        user = await self._user(request)
        view = await self.db.read(visible_task, _path_gid(request, gid), _scope(user))
        return 200, {"task": view}

    @app.route("/api/tasks/<gid>/details", methods=["GET"])
    @endpoint
    async def task_details(self, request: Request, gid: str) -> Reply:
        """One task's ids, cost, evidence and history (issue 36, item 5):
        its owner or an admin; anyone else gets ``not_found``."""
        user = await self._user(request)
        number = _path_gid(request, gid)
        return 200, await self.db.read(task_history.task_details, number, _scope(user))

    @app.route("/api/tasks/<gid>", methods=["DELETE"])
    @endpoint
    async def delete_task(self, request: Request, gid: str) -> Reply:
        user = await self._user(request)
        number = _path_gid(request, gid)
        outcome = await shield(self.lifecycle.delete(_scope(user), number))
        if outcome.completed:
            return 200, {"deleted": outcome.gid}
        return 202, {"task": outcome.task}

    # archives (DELIVERY.md "Getting an archive (site)"; web/archives.py)

    @app.route("/api/tasks/<gid>/archive", methods=["GET", "HEAD"])
    @endpoint
    async def task_archive(self, request: Request, gid: str) -> Reply:
        """A 303 to the node's link, the archive streamed through the site,
        or (``Accept: application/json``) the link as JSON."""
        user = await self._user(request)
        number = parse_gid(gid)
        task = await self.db.read(archives.archive_of, number, _scope(user))
        delivery = self.deps.archives
        site_url = f"{self._site_origin(request)}/api/tasks/{number}/archive"
        link = delivery.issue(task, user.id, site_url)
        if _accepts(request, "application/json"):
            delivery.count(link)
            return 200, link.document()
        if link.via == "node":
            delivery.count(link)
            request.setHeader(b"Location", link.url.encode("utf-8"))
            return 303, {"url": link.url, "expiresAt": link.expires_at}
        with delivery.streams.slot(user.id):
            delivery.count(link)
            await delivery.streams.relay(request, link.node_url)
        return 200, STREAMED

    @app.route("/api/tasks/archive-links", methods=["POST"])
    @endpoint
    async def archive_links(self, request: Request) -> Reply:
        """Links for many tasks: JSON, or (``Accept: text/plain``) an aria2
        input file."""
        user = await self._user(request)
        gids = _link_gids(json_body(request))
        tasks = await self.db.read(archives.archives_of, gids, _scope(user))
        delivery = self.deps.archives
        origin = self._site_origin(request)
        links: list[IssuedLink] = []
        missing: list[MissingLink] = []
        for gid in gids:
            task = tasks.get(gid)
            if task is None:
                missing.append({"gid": gid, "code": "not_found"})
                continue
            try:
                link = delivery.issue(task, user.id, f"{origin}/api/tasks/{gid}/archive")
            except ApiError as e:
                missing.append({"gid": gid, "code": e.code})
                continue
            delivery.count(link)
            links.append(link)
        if _prefers_text(request):
            credentials = request_credentials(request)
            bearer = credentials.secret if credentials and credentials.source == "header" else None
            lines = [f"# gid {m['gid']}: {m['code']}\n" for m in missing]
            return 200, PlainText("".join(lines) + aria2_input(links, bearer))
        return 200, {"links": [link.entry() for link in links], "missing": missing}

    def _site_origin(self, request: Request) -> str:
        """The site's own origin, which a ``via: site`` link's URL starts
        with (``""``: an unusable ``Host``, the URL is then a path)."""
        origin = own_origin(request, self.auth.settings)
        return "" if origin is None else str(origin)

    # favorites

    @app.route("/api/favorites/<gid>", methods=["PUT"])
    @endpoint
    async def add_favorite(self, request: Request, gid: str) -> Reply:
        user = await self._user(request)
        number = parse_gid(gid)
        await self.db.write(favorites.add_favorite, user.id, number, user.is_admin)
        return 200, {"gid": number, "favorite": True}

    @app.route("/api/favorites/<gid>", methods=["DELETE"])
    @endpoint
    async def remove_favorite(self, request: Request, gid: str) -> Reply:
        user = await self._user(request)
        number = parse_gid(gid)
        await self.db.write(favorites.remove_favorite, user.id, number, user.is_admin)
        return 200, {"gid": number, "favorite": False}

    @app.route("/api/favorites", methods=["GET"])
    @endpoint
    async def list_favorites(self, request: Request) -> Reply:
        user = await self._user(request)
        return 200, {"tasks": await self.db.read(favorites.list_favorites, user.id)}

    # the web UI's session: a server-side session, its id in an HttpOnly cookie

    @app.route("/api/session", methods=["POST"])
    @endpoint
    async def sign_in(self, request: Request) -> Reply:
        self.auth.check_origin(request)
        document = json_body(request, json_only=True)
        token = string_field(document, "token", required=True, limit=MAX_TOKEN)
        user = await self.auth.sign_in(request, token)
        return 200, {"user": _me(user)}

    @app.route("/api/session", methods=["GET"])
    @endpoint
    async def sign_in_page(self, request: Request) -> Reply:
        # Public: what the sign-in page says before anyone signs in (the
        # demo token only on a site started with --demo).
        return 200, {"demo": self.deps.demo}

    @app.route("/api/session", methods=["DELETE"])
    @endpoint
    async def sign_out(self, request: Request) -> Reply:
        await self.auth.sign_out(request)
        return 200, {"user": None}

    @app.route("/api/me", methods=["GET"])
    @endpoint
    async def me(self, request: Request) -> Reply:
        # upstreamTimeout: how long a create may wait for the upstream (the
        # UI's "the site waits up to 30 s" while a slow create is out).
        return 200, {
            "user": _me(await self._user(request)),
            "site": self.deps.site_name,
            "upstreamTimeout": self.lifecycle.upstream_timeout,
        }

    # usage

    @app.route("/api/usage", methods=["GET"])
    @endpoint
    async def usage(self, request: Request) -> Reply:
        user = await self._user(request)
        return 200, await self.db.read(usage.usage, user.id)

    # admin

    @app.route("/api/admin/unknown", methods=["GET"])
    @endpoint
    async def unknown(self, request: Request) -> Reply:
        require_admin(await self._user(request))
        return 200, {"tasks": await self.lifecycle.unknown_with_evidence()}

    @app.route("/api/admin/tasks/<gid>/resolve", methods=["POST"])
    @endpoint
    async def resolve(self, request: Request, gid: str) -> Reply:
        user = await self._user(request)
        require_admin(user)
        number = parse_gid(gid)
        document = json_body(request)
        # Which verdicts there are is the lifecycle's one check.
        verdict = string_field(document, "verdict", required=True, limit=32)
        note = string_field(document, "note", required=False, limit=MAX_NOTE)
        try:
            view = await shield(self.lifecycle.resolve(number, verdict, user.name, note))
        except reconcile.VerdictTooEarly as early:
            # SCALE.md "Fencing" 2: when it becomes possible, in the body and the header.
            request.setHeader(b"Retry-After", str(early.retry_after).encode("ascii"))
            error = {"code": early.code, "message": early.message, "notBefore": early.not_before}
            return STATUS[early.code], {"error": error}
        return 200, {"task": view}

    @app.route("/api/admin/tasks/<gid>/force-delete", methods=["POST"])
    @endpoint
    async def force_delete(self, request: Request, gid: str) -> Reply:
        """Complete a stuck DELETE_PENDING (its node is gone for good);
        audited; a repeat on the tombstone it left answers the same."""
        user = await self._user(request)
        require_admin(user)
        number = parse_gid(gid)
        note = string_field(json_body(request), "note", required=True, limit=MAX_NOTE)
        forced = await shield(self.db.write(delete.force_delete, number, user.name, note))
        if not forced.repeated:
            self.deps.wake_outbox()
        return 200, forced.view()

    @app.route("/api/admin/nodes", methods=["GET"])
    @endpoint
    async def nodes(self, request: Request) -> Reply:
        require_admin(await self._user(request))
        # The engine's text as it is (parsing it back would cost what it saved).
        return 200, {"nodes": orjson.Fragment(await self.deps.admin_nodes())}

    @app.route("/api/admin/nodes/<node>/reassign", methods=["POST"])
    @endpoint
    async def reassign_node(self, request: Request, node: str) -> Reply:
        """Move the node's unfinished tasks to connected nodes now (audited)."""
        user = await self._user(request)
        require_admin(user)
        note = string_field(json_body(request), "note", required=False, limit=MAX_NOTE)
        action = self.deps.reassign_node
        return 200, await shield(
            Deferred.fromCoroutine(admin_nodes.reassign_answer(action, node, user.name, note))
        )

    @app.route("/api/admin/nodes/<node>/retire", methods=["POST"])
    @endpoint
    async def retire_node(self, request: Request, node: str) -> Reply:
        """Retire the node: its tasks move, its archives are gone, its key goes (audited)."""
        user = await self._user(request)
        require_admin(user)
        note = string_field(json_body(request), "note", required=False, limit=MAX_NOTE)
        action = self.deps.retire_node
        return 200, await shield(
            Deferred.fromCoroutine(admin_nodes.retire_answer(action, node, user.name, note))
        )

    @app.route("/api/admin/nodes/<node>/control", methods=["POST"])
    @endpoint
    async def control_node(self, request: Request, node: str) -> Reply:
        """Drain, pause or resume the node and set its download limit."""
        user = await self._user(request)
        require_admin(user)
        document = json_body(request)
        note = string_field(document, "note", required=False, limit=MAX_NOTE)
        action = self.deps.control_node
        return 200, await shield(
            Deferred.fromCoroutine(
                admin_nodes.control_answer(action, node, document, user.name, note)
            )
        )

    # admin: users (the admin UI's Users section; web/admin_users.py)

    @app.route("/api/admin/users", methods=["GET"])
    @endpoint
    async def list_users(self, request: Request) -> Reply:
        require_admin(await self._user(request))
        listed = await self.db.read(users.list_users_with_sessions, self.clock.seconds())
        return 200, {"users": [admin_users.user_view(user, count) for user, count in listed]}

    @app.route("/api/admin/users", methods=["POST"])
    @endpoint
    async def add_user(self, request: Request) -> Reply:
        actor = await self._user(request)
        require_admin(actor)
        document = json_body(request)
        name = admin_users.user_name(string_field(document, "name", required=True, limit=64))
        admin = document.get("admin", False)
        if not isinstance(admin, bool):
            raise ApiError("invalid_request", "'admin' must be true or false")
        quota = admin_users.quota_field(document, required=False)

        async def create() -> tuple[User, str]:
            chosen = quota if quota is not None else await self.db.read(users.default_quota)
            return await self.db.write(users.create_user, name, admin=admin, quota=chosen)

        user, token = await admin_users.guarded(create)
        log.info("admin {actor} added user {name}", actor=actor.name, name=user.name)
        return 201, {"user": admin_users.user_view(user, 0), "token": token}

    @app.route("/api/admin/users/<name>/quota", methods=["PUT"])
    @endpoint
    async def set_user_quota(self, request: Request, name: str) -> Reply:
        require_admin(await self._user(request))
        admin_users.user_name(name)
        quota = admin_users.required_quota(json_body(request))
        user = await admin_users.guarded(lambda: self.db.write(users.set_quota, name, quota))
        return 200, {"user": admin_users.user_view(user)}

    @app.route("/api/admin/users/<name>/disable", methods=["POST"])
    @endpoint
    async def disable_user(self, request: Request, name: str) -> Reply:
        actor = await self._user(request)
        require_admin(actor)
        admin_users.user_name(name)
        if name == actor.name:
            raise ApiError("conflict", "you cannot disable your own account")
        user, ended = await admin_users.guarded(lambda: self.db.write(users.disable_user, name))
        log.info("admin {actor} disabled user {name}", actor=actor.name, name=name)
        return 200, {
            "user": admin_users.user_view(user),
            "changed": ended is not None,
            "sessionsEnded": ended or 0,
        }

    @app.route("/api/admin/users/<name>/enable", methods=["POST"])
    @endpoint
    async def enable_user(self, request: Request, name: str) -> Reply:
        actor = await self._user(request)
        require_admin(actor)
        admin_users.user_name(name)
        user, changed = await admin_users.guarded(lambda: self.db.write(users.enable_user, name))
        log.info("admin {actor} enabled user {name}", actor=actor.name, name=name)
        return 200, {"user": admin_users.user_view(user), "changed": changed}

    @app.route("/api/admin/users/<name>/token", methods=["POST"])
    @endpoint
    async def rotate_user_token(self, request: Request, name: str) -> Reply:
        """A new API token for the user (shown once); the old one and its sessions stop."""
        actor = await self._user(request)
        require_admin(actor)
        admin_users.user_name(name)
        if name == actor.name:
            # It would end the very session asking (and lock out a script's token).
            raise ApiError(
                "conflict",
                f"you cannot replace your own token here: tasknet-admin user token {name}",
            )
        token = await admin_users.guarded(lambda: self.db.write(users.rotate_token, name))
        log.info("admin {actor} rotated the token of {name}", actor=actor.name, name=name)
        return 200, {"name": name, "token": token}

    @app.route("/api/admin/users/<name>/sessions", methods=["DELETE"])
    @endpoint
    async def end_user_sessions(self, request: Request, name: str) -> Reply:
        actor = await self._user(request)
        require_admin(actor)
        admin_users.user_name(name)
        why = f"ended by {actor.name}"
        ended = await admin_users.guarded(
            lambda: self.db.write(sessions.end_sessions_of, name, why, self.clock.seconds())
        )
        return 200, {"name": name, "sessionsEnded": ended}

    @app.route("/api/events", methods=["GET"])
    async def events(self, request: Request) -> IResource | bytes:
        # Refused here, an opening handshake gets the error envelope and the
        # security headers (autobahn looks the credentials up again as it
        # accepts).  Made with the cookie, it needs the site's own Origin,
        # as a write does.
        try:
            await self.auth.authenticate(request, allow_query=True, writes=True)
        except ApiError as e:
            return write_error(request, e.code, e.message)
        refused = _handshake_refusal(request)
        if refused is not None:
            # The envelope, not autobahn's own answers (an HTML page naming
            # its version, or an empty 400 without the security headers).
            return write_error(request, *refused)
        return self.deps.events

    # health, metrics, UI

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: Request) -> Deferred[bytes]:
        # 503 while the database does not answer: a load balancer stops
        # sending creates here (SCALE.md "Fencing" 4).
        def answer(document: dict[str, str]) -> bytes:
            ok = document.get("database") == "ok"
            return write_json(request, 200 if ok else 503, document)

        return self.deps.health().addCallback(answer)

    @app.route("/api/openapi.json", methods=["GET"])
    def openapi_document(self, request: Request) -> bytes:
        # Public, like /healthz: the contract of this API (web/openapi.py).
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        return openapi.document_bytes()

    @app.route("/metrics", methods=["GET"])
    def metrics_page(self, request: Request) -> IResource:
        return metrics.metrics_resource(self._refresh_metrics)

    def _refresh_metrics(self) -> Deferred[None]:
        def sample(database_ok: bool) -> Deferred[None] | None:
            if not database_ok:  # not answering: serve the last sample, now
                return None
            return self.db.read(stats.metrics_sample).addCallback(metrics.set_sampled)

        return self.deps.health().addCallback(metrics.set_health).addCallback(sample)

    @app.route("/api/<path:rest>")
    def api_not_found(self, request: Request, rest: str) -> bytes:
        # This catch-all takes any method: a path that has routes, asked
        # with a method none of them takes, is 405 as elsewhere.
        allowed = allowed_methods(f"/api/{rest}")
        if allowed:
            return _method_not_allowed(request, allowed)
        return write_error(request, "not_found", f"no API endpoint /api/{rest}")

    @app.route("/", branch=True, methods=["GET", "HEAD"])
    def ui(self, request: Request) -> IResource:
        return cast(IResource, StaticFiles(str(STATIC_DIR)))

    @app.handle_errors(NotFound)
    def not_found(self, request: IRequest, failure: Failure) -> bytes:
        return write_error(request, "not_found", "no such resource")

    @app.handle_errors(MethodNotAllowed)
    def method_not_allowed(self, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        allowed = error.valid_methods if isinstance(error, MethodNotAllowed) else None
        return _method_not_allowed(request, allowed or [])


def _link_gids(document: JsonObject) -> list[int]:
    """``POST /api/tasks/archive-links``' gids: 1 to :data:`MAX_LINKS` JSON
    integers, each a gid; repeats answered once, in the order first given."""
    gids = document.get("gids")
    if not isinstance(gids, list) or not 1 <= len(gids) <= MAX_LINKS:
        raise ApiError("invalid_request", f"'gids' must be an array of 1 to {MAX_LINKS} gids")
    numbers = []
    for gid in gids:
        if isinstance(gid, str):
            raise ApiError("invalid_request", "each of 'gids' must be a JSON integer")
        numbers.append(parse_gid(gid))
    return list(dict.fromkeys(numbers))


def _accepted(request: Request) -> list[str]:
    """The media types of ``Accept`` the client takes (``q`` above 0), in order."""
    types = []
    for value in request.requestHeaders.getRawHeaders(b"accept") or []:
        for item in value.decode("latin-1").split(","):
            media, *parameters = item.split(";")
            refused = any(
                p.strip().lower().replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000")
                for p in parameters
            )
            if media.strip() and not refused:
                types.append(media.strip().lower())
    return types


def _accepts(request: Request, media: str) -> bool:
    """The client named ``media`` in ``Accept`` (not by a wildcard)."""
    return media in _accepted(request)


def _prefers_text(request: Request) -> bool:
    """``Accept`` names ``text/plain`` before (or without) ``application/json``."""
    accepted = _accepted(request)
    if "text/plain" not in accepted:
        return False
    return "application/json" not in accepted or (
        accepted.index("text/plain") < accepted.index("application/json")
    )


def _header_tokens(request: Request, name: bytes) -> set[bytes]:
    values = request.requestHeaders.getRawHeaders(name) or []
    return {token.strip().lower() for value in values for token in value.split(b",")}


def _handshake_refusal(request: Request) -> tuple[str, str] | None:
    """Why ``request`` is not a WebSocket opening handshake the site takes
    (RFC 6455, 4.2.1), as ``(code, message)``, or None.  No ``Upgrade:
    websocket``: ``426`` (with ``Upgrade``); a version other than 13:
    ``426`` (with ``Sec-WebSocket-Version: 13``); no ``Connection: Upgrade``
    or a key that is not 16 bytes in base64: ``400``."""
    if b"websocket" not in _header_tokens(request, b"upgrade"):
        request.setHeader(b"Upgrade", b"websocket")
        return "upgrade_required", "/api/events is a WebSocket: open it with a handshake"
    if request.requestHeaders.getRawHeaders(b"sec-websocket-version") != [b"13"]:
        request.setHeader(b"Upgrade", b"websocket")
        request.setHeader(b"Sec-WebSocket-Version", b"13")
        return "upgrade_required", "the WebSocket version must be 13"
    if b"upgrade" not in _header_tokens(request, b"connection"):
        return "invalid_request", "a WebSocket handshake needs 'Connection: Upgrade'"
    keys = request.requestHeaders.getRawHeaders(b"sec-websocket-key") or []
    try:
        key = base64.b64decode(keys[0].strip(), validate=True) if len(keys) == 1 else b""
    except ValueError:
        key = b""
    if len(key) != 16:
        return "invalid_request", "Sec-WebSocket-Key must be 16 bytes in base64"
    return None


def _method_not_allowed(request: IRequest, allowed: Iterable[str]) -> bytes:
    """``405`` with the ``Allow`` header RFC 9110 requires."""
    methods = ", ".join(sorted(set(allowed)))
    request.setHeader(b"Allow", methods.encode("ascii"))
    return write_error(
        request, "method_not_allowed", f"{request.method.decode()} is not allowed here ({methods})"
    )


@functools.cache
def _routes() -> Map:
    """The routes of :class:`SiteApi` that name their paths (not the
    ``/api/...`` catch-all, not the static files below ``/``)."""
    return Map(
        [
            # A gid is digits: /api/tasks/counts is not /api/tasks/<gid>.
            Rule(
                rule.rule.replace("<gid>", "<int:gid>"),
                methods=rule.methods,
                endpoint=rule.endpoint,
            )
            for rule in SiteApi.app.url_map.iter_rules()
            if rule.endpoint not in ("api_not_found", "ui_branch")
        ]
    )


def allowed_methods(path: str) -> list[str]:
    """The methods the routes of ``path`` take (none: no route has it)."""
    return list(_routes().bind("localhost").allowed_methods(path))


def make_web_resource(deps: WebDependencies) -> IResource:
    """The root resource of the site's HTTP port."""
    return cast(IResource, SiteApi(deps).app.resource())
