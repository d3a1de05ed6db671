"""Query parameters of the views for people with many tasks
(``GET /api/tasks``, ``/api/tasks/counts``, ``/api/stats``), read strictly:
anything malformed is ``400 invalid_request`` with a message naming it.

Decisions the spec leaves open (also in docs/operations.md, "Task views"):

* ``status`` is a comma-separated list of display keys (OR); an empty or
  unknown key is a 400.
* ``q`` (at most :data:`MAX_SEARCH` characters, trimmed) matches a task whose
  name contains it (ASCII case-insensitively) or whose gid in decimal starts
  with it; ``/api/tasks/counts`` takes the same ``q``.
* ``after`` is the ``next`` of the previous page, verbatim, for the same
  ``order``.
* ``window`` is in seconds, :data:`~tasknet.site.storage.stats.MIN_WINDOW`
  .. :data:`~tasknet.site.storage.stats.MAX_WINDOW`.
"""

from __future__ import annotations

import re

from twisted.web.server import Request

from tasknet.site.storage import stats
from tasknet.site.storage.views import Order, TaskQuery, parse_cursor
from tasknet.site.web.errors import ApiError
from tasknet.status import TaskStatus

DEFAULT_PAGE = 50
MAX_PAGE = 500
MAX_SEARCH = 256


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


def task_query(request: Request, user_id: int | None) -> TaskQuery:
    """The :class:`TaskQuery` of a ``GET /api/tasks`` request."""
    order_text = _text(request, "order")
    if order_text is None:
        order_text = Order.NEWEST.value
    try:
        order = Order(order_text)
    except ValueError:
        raise ApiError(
            "invalid_request", f"'order' must be one of {[o.value for o in Order]}"
        ) from None
    statuses: set[TaskStatus] = set()
    status_text = _text(request, "status")
    if status_text is not None:
        for key in status_text.split(","):
            try:
                statuses.add(TaskStatus(key))
            except ValueError:
                raise ApiError(
                    "invalid_request",
                    f"unknown status {key!r}; one of {[s.value for s in TaskStatus]}",
                ) from None
    after_text = _text(request, "after")
    after: str | int | None = None
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
    )


def stats_window(request: Request) -> int:
    return _int(request, "window", stats.DEFAULT_WINDOW, stats.MIN_WINDOW, stats.MAX_WINDOW)
