"""The admin UI's Users section over the API (issue 36, item 8): what
``tasknet-admin user`` and ``session end --user`` do, as JSON.

Each action is one transaction of :mod:`tasknet.site.storage.users` (or
:mod:`~tasknet.site.storage.sessions`); this module turns their answers and
their refusals into the API's (a :class:`~tasknet.site.storage.users.UserError`
naming no user is ``404 not_found``, any other ``400 invalid_request``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NotRequired, TypedDict, TypeVar

from tasknet.json_types import JsonObject
from tasknet.site.storage import sessions, users
from tasknet.site.storage.users import User
from tasknet.site.web.errors import ApiError

__all__ = ["MAX_QUOTA", "guarded", "quota_field", "required_quota", "user_name", "user_view"]

#: The largest weekly quota an admin may set (cost units): past any real
#: use, and well inside either backend's integer.
MAX_QUOTA = 1_000_000_000

T = TypeVar("T")


class UserView(TypedDict):
    """A user as the API shows it (never its token's hash)."""

    name: str
    admin: bool
    quota: int
    createdAt: str
    disabledAt: str | None
    sessions: NotRequired[int]


def user_view(user: User, open_sessions: int | None = None) -> UserView:
    """A user as the API shows it (never its token's hash)."""
    view: UserView = {
        "name": user.name,
        "admin": user.is_admin,
        "quota": user.quota,
        "createdAt": user.created_at,
        "disabledAt": user.disabled_at,
    }
    if open_sessions is not None:
        view["sessions"] = open_sessions
    return view


def user_name(name: str) -> str:
    """``name`` if it can be a user's name; ``400`` otherwise."""
    if not users.NAME_PATTERN.fullmatch(name):
        raise ApiError(
            "invalid_request",
            "a user name is 1 to 64 letters, digits, '_', '.' or '-'",
        )
    return name


def quota_field(document: JsonObject, *, required: bool) -> int | None:
    """The body's ``quota``: a JSON integer from 0 to :data:`MAX_QUOTA`."""
    if "quota" not in document:
        if required:
            raise ApiError("invalid_request", "'quota' is required")
        return None
    quota = document["quota"]
    if isinstance(quota, float) and quota.is_integer():
        quota = int(quota)  # 450.0 is 450 in JSON
    if isinstance(quota, bool) or not isinstance(quota, int) or not 0 <= quota <= MAX_QUOTA:
        raise ApiError("invalid_request", f"'quota' must be a whole number from 0 to {MAX_QUOTA:,}")
    return quota


def required_quota(document: JsonObject) -> int:
    """The body's ``quota``, which it must have."""
    quota = quota_field(document, required=True)
    assert quota is not None  # quota_field refused its absence
    return quota


async def guarded(action: Callable[[], Awaitable[T]]) -> T:
    """``action()``, its storage refusals as the API's errors."""
    try:
        return await action()
    except (users.UserError, sessions.SessionError) as refused:
        message = str(refused)
        code = "not_found" if message.startswith("no user ") else "invalid_request"
        if "already exists" in message:
            code = "conflict"
        raise ApiError(code, message) from None
