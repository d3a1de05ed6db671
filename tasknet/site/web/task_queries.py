"""Query parameters of the views for people with many tasks
(``GET /api/tasks``, ``/api/tasks/counts``, ``/api/stats``), read strictly:
anything malformed is ``400 invalid_request`` with a message naming it.

Decisions the spec leaves open (also in docs/operations.md, "Task views"):

* ``status`` is a comma-separated list of display keys (OR), or
  ``QUEUED`` (the SUBMITTED tasks queued on a node) or
  ``SUBMITTED_NOT_QUEUED`` (the others: what the UI's "In progress" tab
  lists beside the downloads); an empty or unknown key is a 400.
* ``q`` (at most :data:`MAX_SEARCH` characters, trimmed) matches a task whose
  name contains it (ASCII case-insensitively) or whose gid in decimal
  contains it ("1777" finds 101777); ``/api/tasks/counts`` takes the same ``q``.
* ``favorite`` is ``1`` (only the caller's favourites, admins included) or
  ``0`` (no filter); ``node`` a node id (1..:data:`MAX_NODE_ID` characters,
  no control character).
* ``after`` is the ``next`` of the previous page, verbatim, for the same
  ``order``.
* ``window`` is in seconds, :data:`~tasknet.site.storage.stats.MIN_WINDOW`
  .. :data:`~tasknet.site.storage.stats.MAX_WINDOW`.
"""

from __future__ import annotations

import re

from twisted.web.server import Request

from tasknet.site.storage import stats
from tasknet.site.storage.views import FILTER_KEYS, Cursor, Order, TaskQuery, parse_cursor
from tasknet.site.web.errors import ApiError

DEFAULT_PAGE = 50
MAX_PAGE = 500
MAX_SEARCH = 256
MAX_NODE_ID = 128


def _text(request: Request, name: str) -> str | None:
    values = request.args.get(name.encode("ascii"))
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError("invalid_request", f"{name!r} is not valid UTF-8") from e


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    text = _text(request, name)
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]{1,12}", text) or not low <= int(text) <= high:
        raise ApiError("invalid_request", f"{name!r} must be an integer in {low}..{high}")
    return int(text)


def search_text(request: Request) -> str:
    """``q`` as sent (at most :data:`MAX_SEARCH` characters, no control
    character, trailing newlines and tabs included: the OpenAPI document's
    bounds), then trimmed."""
    text = _text(request, "q") or ""
    if len(text) > MAX_SEARCH:
        raise ApiError("invalid_request", f"'q' is limited to {MAX_SEARCH} characters")
    if any(ord(ch) < 32 for ch in text):
        raise ApiError("invalid_request", "'q' must not contain control characters")
    return text.strip()


def _node(request: Request) -> str | None:
    text = _text(request, "node")
    if text is None:
        return None
    if not 1 <= len(text) <= MAX_NODE_ID or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ApiError(
            "invalid_request",
            f"'node' must be a node id of 1..{MAX_NODE_ID} characters, no control characters",
        )
    return text


def _favorite(request: Request) -> bool:
    text = _text(request, "favorite")
    if text is None or text == "0":
        return False
    if text == "1":
        return True
    raise ApiError("invalid_request", "'favorite' must be 1 or 0")


def task_query(request: Request, user_id: int | None, caller_id: int | None = None) -> TaskQuery:
    """The :class:`TaskQuery` of a ``GET /api/tasks`` request; ``user_id``
    whose tasks (None: everyone's), ``caller_id`` whose favourites
    ``favorite=1`` means."""
    order_text = _text(request, "order")
    if order_text is None:
        order_text = Order.NEWEST.value
    try:
        order = Order(order_text)
    except ValueError:
        raise ApiError(
            "invalid_request", f"'order' must be one of {[o.value for o in Order]}"
        ) from None
    statuses: set[str] = set()
    status_text = _text(request, "status")
    if status_text is not None:
        for key in status_text.split(","):
            if key not in FILTER_KEYS:
                raise ApiError("invalid_request", f"unknown status {key!r}; one of {FILTER_KEYS}")
            statuses.add(key)
    after_text = _text(request, "after")
    after: Cursor | None = None
    if after_text is not None:
        try:
            after = parse_cursor(order, after_text)
        except ValueError as e:
            raise ApiError("invalid_request", str(e)) from None
    return TaskQuery(
        user_id=user_id,
        limit=_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE),
        order=order,
        statuses=frozenset(statuses),
        text=search_text(request),
        after=after,
        favorite_of=caller_id if _favorite(request) else None,
        node=_node(request),
    )


def stats_window(request: Request) -> int:
    return _int(request, "window", stats.DEFAULT_WINDOW, stats.MIN_WINDOW, stats.MAX_WINDOW)
