"""The site HTTP API (INTERFACES.md, "Site HTTP API"), with klein.

Every endpoint reads its input strictly (bad JSON, wrong types, a bool where
an int belongs, a gid outside 1..2^31: ``400 invalid_request``; a body over
:data:`MAX_BODY`: ``413``), authenticates the bearer token, and then calls one
lifecycle chain or one storage transaction: no SQL here.

Decisions the spec leaves open:

* Another user's task answers exactly like a missing one (``404``), for
  read, delete and favorite alike, so task existence is not leaked.  Admins
  see and delete every task.
* A gallery the upstream does not have (``prepare`` answers 404) is a
  ``404 not_found``; the reservation is released as for any prepare failure.
* Favorites: ``PUT``/``DELETE /api/favorites/{gid}`` answer
  ``{"gid": g, "favorite": true|false}`` (idempotent), ``GET /api/favorites``
  answers ``{"tasks": [...]}``.
* ``/api/events`` and ``/api/admin/nodes`` are served by the resources the
  reports/notify wiring puts in the :class:`Site`; while a slot is empty they
  answer ``503 unavailable``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from klein import Klein
from twisted.internet.defer import CancelledError, Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.web.resource import IResource
from twisted.web.server import Request
from twisted.web.static import File
from werkzeug.exceptions import MethodNotAllowed, NotFound

from tasknet.deferreds import shield
from tasknet.site import metrics
from tasknet.site.storage import favorites, reconcile, usage
from tasknet.site.storage.errors import TaskError
from tasknet.site.storage.rows import GID_MAX, GID_MIN
from tasknet.site.storage.users import User
from tasknet.site.storage.views import count_by_state, list_tasks, visible_task
from tasknet.site.web.auth import authenticate, require_admin
from tasknet.site.web.errors import ApiError, write_error, write_json

if TYPE_CHECKING:
    from tasknet.site.service import Site

log = Logger()

MAX_BODY = 1024 * 1024
MAX_TOKEN = 512
MAX_NAME = 256
MAX_NOTE = 2000
DEFAULT_PAGE = 50
MAX_PAGE = 500
STATIC_DIR = Path(__file__).parent / "static"

_GID_TEXT = re.compile(r"[0-9]{1,10}")

Reply = tuple[int, Any]
Handler = Callable[..., Awaitable[Reply]]


def _create_outcome(status: int, code: str | None) -> str:
    if status == 201:
        return "created"
    if status == 202:
        return "unknown"
    return {
        "conflict": "conflict",
        "upstream_rejected": "rejected",
        "quota_exceeded": "quota_exceeded",
        "upstream_unavailable": "upstream_unavailable",
        "invalid_request": "invalid",
        "payload_too_large": "invalid",
    }.get(code or "", "error")


def endpoint(fn: Handler) -> Callable[..., Deferred[bytes]]:
    """Run ``fn`` (async, returning ``(status, document)``) and answer JSON;
    :class:`ApiError` and :class:`TaskError` become their error answers, any
    other exception a logged ``500 internal``."""

    @functools.wraps(fn)
    def wrapper(self: SiteApi, request: Request, *args: Any, **kw: Any) -> Deferred[bytes]:
        async def run() -> bytes:
            try:
                status, document = await fn(self, request, *args, **kw)
                return write_json(request, status, document)
            except CancelledError:
                raise  # the client went away; nothing to answer
            except (ApiError, TaskError) as e:
                return write_error(request, e.code, e.message)
            except Exception:
                log.failure("{method} {path} failed", method=request.method, path=request.path)
                return write_error(request, "internal", "internal error (logged)")

        return Deferred.fromCoroutine(run())

    return wrapper


# -- input ---------------------------------------------------------------------


def parse_gid(text: str | int) -> int:
    if isinstance(text, str):
        if not _GID_TEXT.fullmatch(text):
            raise ApiError("invalid_request", f"gid must be an integer in {GID_MIN}..{GID_MAX}")
        text = int(text)
    if isinstance(text, bool) or not isinstance(text, int) or not GID_MIN <= text <= GID_MAX:
        raise ApiError("invalid_request", f"gid must be an integer in {GID_MIN}..{GID_MAX}")
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def json_body(request: Request) -> dict[str, Any]:
    """The request body as a JSON object (``413`` over :data:`MAX_BODY`)."""
    length = request.getHeader("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise ApiError("payload_too_large", f"the body is limited to {MAX_BODY} bytes")
    assert request.content is not None
    request.content.seek(0)
    raw = request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise ApiError("payload_too_large", f"the body is limited to {MAX_BODY} bytes")
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise ApiError("invalid_request", f"the body is not valid JSON: {e}") from e
    if not isinstance(document, dict):
        raise ApiError("invalid_request", "the body must be a JSON object")
    return document


def string_field(
    document: dict[str, Any], name: str, *, required: bool, limit: int, default: str = ""
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


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    values = request.args.get(name.encode("ascii"))
    if not values:
        return default
    text = values[0].decode("ascii", "replace")
    if not re.fullmatch(r"[0-9]{1,12}", text) or not low <= int(text) <= high:
        raise ApiError("invalid_request", f"{name!r} must be an integer in {low}..{high}")
    return int(text)


def _scope(user: User) -> int | None:
    """Whose tasks ``user`` may see and touch: their own, or all (admin: None)."""
    return None if user.is_admin else user.id


# -- the API ---------------------------------------------------------------------


class SiteApi:
    app = Klein()

    def __init__(self, site: Site) -> None:
        self.site = site
        self.db = site.db
        self.lifecycle = site.lifecycle

    async def _user(self, request: Request) -> User:
        return await authenticate(self.db, request)

    # tasks

    @app.route("/api/tasks", methods=["POST"])
    def create_task(self, request: Request) -> Deferred[bytes]:
        d = self._create_task(request)

        def count(body: bytes) -> bytes:
            code = None
            if request.code >= 400:
                try:
                    code = json.loads(body)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = None
            if request.code != 401:
                metrics.CREATES.labels(outcome=_create_outcome(request.code, code)).inc()
            return body

        return d.addCallback(count)

    @endpoint
    async def _create_task(self, request: Request) -> Reply:
        user = await self._user(request)
        document = json_body(request)
        if "gid" not in document:
            raise ApiError("invalid_request", "'gid' is required")
        gid = parse_gid(document["gid"])
        if isinstance(document["gid"], str):
            raise ApiError("invalid_request", "'gid' must be a JSON integer")
        token = string_field(document, "token", required=True, limit=MAX_TOKEN)
        name = string_field(document, "name", required=False, limit=MAX_NAME)
        created = await shield(self.lifecycle.create(user.id, gid, token, name))
        return created.status, {"task": created.task}

    @app.route("/api/tasks", methods=["GET"])
    @endpoint
    async def list_tasks(self, request: Request) -> Reply:
        user = await self._user(request)
        limit = query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        after = query_int(request, "after", 0, 0, GID_MAX)
        views, following = await self.db.read(list_tasks, _scope(user), limit, after)
        return 200, {"tasks": views, "next": following}

    @app.route("/api/tasks/<gid>", methods=["GET"])
    @endpoint
    async def get_task(self, request: Request, gid: str) -> Reply:
        user = await self._user(request)
        view = await self.db.read(visible_task, parse_gid(gid), _scope(user))
        return 200, {"task": view}

    @app.route("/api/tasks/<gid>", methods=["DELETE"])
    @endpoint
    async def delete_task(self, request: Request, gid: str) -> Reply:
        user = await self._user(request)
        outcome = await shield(self.lifecycle.delete(_scope(user), parse_gid(gid)))
        if outcome.completed:
            return 200, {"deleted": outcome.gid}
        return 202, {"task": outcome.task}

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
        verdict = string_field(document, "verdict", required=True, limit=32)
        if verdict not in reconcile.VERDICTS:
            raise ApiError(
                "invalid_request", f"'verdict' must be one of {list(reconcile.VERDICTS)}"
            )
        note = string_field(document, "note", required=False, limit=MAX_NOTE)
        view = await shield(self.lifecycle.resolve(number, verdict, user.name, note))
        return 200, {"task": view}

    @app.route("/api/admin/nodes", methods=["GET"])
    @endpoint
    async def nodes(self, request: Request) -> Reply:
        require_admin(await self._user(request))
        if self.site.nodes_view is None:
            raise ApiError("unavailable", "the node view is not wired into this site")
        return 200, {"nodes": await maybeDeferred(self.site.nodes_view)}

    @app.route("/api/events")
    def events(self, request: Request) -> IResource | bytes:
        if self.site.events_resource is None:
            return write_error(request, "unavailable", "live events are not wired into this site")
        return self.site.events_resource

    # health, metrics, UI

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: Request) -> bytes:
        return write_json(request, 200, self.site.health())

    @app.route("/metrics", methods=["GET"])
    def metrics_page(self, request: Request) -> IResource:
        return metrics.metrics_resource(self._refresh_metrics)

    def _refresh_metrics(self) -> Deferred[None]:
        return self.db.read(count_by_state).addCallback(metrics.set_task_counts)

    @app.route("/api/<path:rest>")
    def api_not_found(self, request: Request, rest: str) -> bytes:
        return write_error(request, "not_found", f"no API endpoint /api/{rest}")

    @app.route("/", branch=True, methods=["GET", "HEAD"])
    def ui(self, request: Request) -> IResource:
        return cast(IResource, File(str(STATIC_DIR)))

    @app.handle_errors(NotFound)
    def not_found(self, request: Request, failure: Any) -> bytes:
        return write_error(request, "not_found", "no such resource")

    @app.handle_errors(MethodNotAllowed)
    def method_not_allowed(self, request: Request, failure: Any) -> bytes:
        return write_error(
            request, "method_not_allowed", f"{request.method.decode()} is not allowed here"
        )


def make_web_resource(site: Site) -> IResource:
    """The root resource of the site's HTTP port."""
    return cast(IResource, SiteApi(site).app.resource())
