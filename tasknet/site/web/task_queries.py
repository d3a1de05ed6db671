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
* ``page`` (1-based) asks for a page by its number: the rows after the
  first ``(page - 1) × limit`` of the order (``OFFSET``), with ``page ×
  limit`` at most :data:`MAX_PAGE_REACH`; never with ``after``.  Its
  ``next`` is the keyset cursor as on any page.
* ``window`` is in seconds, :data:`~tasknet.site.storage.stats.MIN_WINDOW`
  .. :data:`~tasknet.site.storage.stats.MAX_WINDOW`.
"""

from __future__ import annotations

import re

from twisted.web.server import Request

from tasknet.site.storage import stats
from tasknet.site.storage.views import FILTER_KEYS, Order, PageCursor, TaskQuery, parse_cursor
from tasknet.site.web.errors import ApiError

DEFAULT_PAGE = 50
MAX_PAGE = 500
MAX_SEARCH = 256
MAX_NODE_ID = 128
#: ``page × limit`` at most: an ``OFFSET`` walks the rows it skips, so a
#: page by number is bounded (the 3,000th row costs what the 50th does; a
#: row past this is reached by the cursor).
MAX_PAGE_REACH = 100_000
#: ``POST /api/tasks/bulk`` with a ``filter``: the most tasks it acts on at
#: once by default (``--max-bulk-matching``); more is ``413 too_many_tasks``.
MAX_BULK_MATCHING = 10_000
#: ``--max-bulk-matching`` at most (each task is one delete in turn).
MAX_BULK_MATCHING_SETTING = 100_000


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
    after: PageCursor | None = None
    if after_text is not None:
        try:
            after = parse_cursor(order, after_text)
        except ValueError as e:
            raise ApiError("invalid_request", str(e)) from None
    limit = _int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    page = _int(request, "page", 1, 1, MAX_PAGE_REACH)
    if _text(request, "page") is not None and after is not None:
        raise ApiError("invalid_request", "give 'page' or 'after', not both")
    if page * limit > MAX_PAGE_REACH:
        raise ApiError(
            "invalid_request",
            f"'page' × 'limit' must be at most {MAX_PAGE_REACH:,}: a later row is reached"
            " with 'after'",
        )
    return TaskQuery(
        user_id=user_id,
        limit=limit,
        offset=(page - 1) * limit,
        order=order,
        statuses=frozenset(statuses),
        text=search_text(request),
        after=after,
        favorite_of=caller_id if _favorite(request) else None,
        node=_node(request),
    )


def stats_window(request: Request) -> int:
    return _int(request, "window", stats.DEFAULT_WINDOW, stats.MIN_WINDOW, stats.MAX_WINDOW)


#: The keys of ``POST /api/tasks/bulk``'s ``filter``: ``GET /api/tasks``'s
#: filters, as JSON.
BULK_FILTER_KEYS = ("status", "q", "node", "favorite")


def bulk_filter(document: object, user_id: int | None, caller_id: int) -> TaskQuery:
    """The :class:`TaskQuery` of ``POST /api/tasks/bulk``'s ``filter``:
    ``status`` an array of filter keys (empty or absent: every status),
    ``q`` and ``node`` as the list's, ``favorite`` true or false; the same
    bounds as the list's query, and an unknown key is a 400."""
    if not isinstance(document, dict):
        raise ApiError("invalid_request", "'filter' must be an object")
    unknown = sorted(set(document) - set(BULK_FILTER_KEYS))
    if unknown:
        raise ApiError(
            "invalid_request", f"unknown key {unknown[0]!r} in 'filter'; one of {BULK_FILTER_KEYS}"
        )
    statuses = document.get("status", [])
    if not isinstance(statuses, list) or not all(key in FILTER_KEYS for key in statuses):
        raise ApiError(
            "invalid_request", f"'filter.status' must be an array of status keys, of {FILTER_KEYS}"
        )
    text = document.get("q", "")
    if not isinstance(text, str) or len(text) > MAX_SEARCH or any(ord(ch) < 32 for ch in text):
        raise ApiError(
            "invalid_request",
            f"'filter.q' must be a string of at most {MAX_SEARCH} characters, no control"
            " characters",
        )
    node = document.get("node")
    if node is not None and (
        not isinstance(node, str)
        or not 1 <= len(node) <= MAX_NODE_ID
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in node)
    ):
        raise ApiError(
            "invalid_request",
            f"'filter.node' must be a node id of 1..{MAX_NODE_ID} characters, no control"
            " characters",
        )
    favorite = document.get("favorite", False)
    if not isinstance(favorite, bool):
        raise ApiError("invalid_request", "'filter.favorite' must be true or false")
    return TaskQuery(
        user_id=user_id,
        limit=1,
        statuses=frozenset(statuses),
        text=text.strip(),
        favorite_of=caller_id if favorite else None,
        node=node,
    )
