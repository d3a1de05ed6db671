"""Bearer-token authentication: ``Authorization: Bearer TOKEN`` (or
``?token=`` where a header cannot be sent, e.g. a browser WebSocket).
Tokens are looked up by their sha256 hash (``storage.users``)."""

from __future__ import annotations

from twisted.web.server import Request

from tasknet.site.storage import users
from tasknet.site.storage.db import Database
from tasknet.site.storage.users import User
from tasknet.site.web.errors import ApiError

MAX_TOKEN = 512


def request_token(request: Request, *, allow_query: bool = False) -> str | None:
    """The token the request carries, or None."""
    header = request.getHeader("authorization")
    if header:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    if allow_query:
        values = request.args.get(b"token")
        if values and values[0]:
            return values[0].decode("utf-8", "replace")
    return None


async def authenticate(db: Database, request: Request, *, allow_query: bool = False) -> User:
    """The calling user; :class:`ApiError` ``unauthorized`` otherwise."""
    token = request_token(request, allow_query=allow_query)
    if token is None:
        raise ApiError("unauthorized", "an 'Authorization: Bearer TOKEN' header is required")
    if len(token) > MAX_TOKEN:
        raise ApiError("unauthorized", "unknown token")
    user = await db.read(users.user_by_token, token)
    if user is None:
        raise ApiError("unauthorized", "unknown token")
    return user


def require_admin(user: User) -> None:
    if not user.is_admin:
        raise ApiError("forbidden", "this needs an admin token")
