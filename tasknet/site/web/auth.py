"""Authentication of API calls.

A request carries its API token in one of:

* ``Authorization: Bearer TOKEN`` (programs);
* the session cookie ``tasknet_session`` (the web UI: ``POST /api/session``
  sets it ``HttpOnly; SameSite=Strict``, so page scripts never hold the
  token);
* ``?token=`` where a header cannot be sent (a WebSocket opened by a
  program; only where the caller allows it).

An ``Authorization`` header wins over the cookie.  A cookie-authenticated
unsafe method (``POST``/``PUT``/``DELETE``/``PATCH``) whose ``Origin`` header,
when present, names another host than ``Host`` is ``403`` (defence in depth
against cross-site requests; ``SameSite=Strict`` is the first line).
Tokens are looked up by their sha256 hash (``storage.users``); a header that
is not UTF-8 is ``401``, never a 500.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from twisted.web.server import Request

from tasknet.site.storage import users
from tasknet.site.storage.db import Database
from tasknet.site.storage.users import User
from tasknet.site.web.errors import ApiError

MAX_TOKEN = 512
SESSION_COOKIE = b"tasknet_session"
UNSAFE_METHODS = frozenset({b"POST", b"PUT", b"DELETE", b"PATCH"})
# What a cookie value may hold unquoted (RFC 6265 cookie-octet, minus a few);
# every token the site issues fits.
_COOKIE_SAFE = re.compile(r"[A-Za-z0-9!#$%&'()*+\-./:<=>?@\[\]^_`{|}~]{1,512}")


@dataclass(frozen=True)
class Credentials:
    token: str
    source: str  # "header" / "cookie" / "query"


def _header(request: Request, name: bytes) -> str | None:
    """A header's first value as text; not UTF-8: ``401``."""
    values = request.requestHeaders.getRawHeaders(name)
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("unauthorized", f"the {name.decode()} header is not UTF-8") from None


def request_credentials(request: Request, *, allow_query: bool = False) -> Credentials | None:
    """The token the request carries and where it came from, or None."""
    header = _header(request, b"authorization")
    if header:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return Credentials(value.strip(), "header")
        return None
    cookie = request.getCookie(SESSION_COOKIE)
    if cookie:
        try:
            return Credentials(cookie.decode("utf-8"), "cookie")
        except UnicodeDecodeError:
            raise ApiError("unauthorized", "the session cookie is not UTF-8") from None
    if allow_query:
        values = request.args.get(b"token")
        if values and values[0]:
            try:
                return Credentials(values[0].decode("utf-8"), "query")
            except UnicodeDecodeError:
                raise ApiError("unauthorized", "the token is not UTF-8") from None
    return None


def same_origin(request: Request) -> bool:
    """True unless an ``Origin`` header names another host than ``Host``."""
    origin = request.requestHeaders.getRawHeaders(b"origin")
    if not origin:
        return True
    host = request.requestHeaders.getRawHeaders(b"host")
    if not host:
        return False
    try:
        netloc = urlsplit(origin[0].decode("ascii")).netloc
        return bool(netloc) and netloc.lower() == host[0].decode("ascii").lower()
    except (UnicodeDecodeError, ValueError):
        return False


def check_origin(request: Request) -> None:
    """``403`` for an unsafe method from another origin."""
    if request.method in UNSAFE_METHODS and not same_origin(request):
        raise ApiError("forbidden", "this request came from another origin")


async def user_for_token(db: Database, token: str) -> User | None:
    if not token or len(token) > MAX_TOKEN:
        return None
    user: User | None = await db.read(users.user_by_token, token)
    return user


async def authenticate(db: Database, request: Request, *, allow_query: bool = False) -> User:
    """The calling user; :class:`ApiError` ``unauthorized`` otherwise (and
    ``forbidden`` for a cross-origin unsafe call made with the cookie)."""
    credentials = request_credentials(request, allow_query=allow_query)
    if credentials is None:
        raise ApiError(
            "unauthorized", "an 'Authorization: Bearer TOKEN' header or a session is required"
        )
    if credentials.source == "cookie":
        check_origin(request)
    user = await user_for_token(db, credentials.token)
    if user is None:
        raise ApiError("unauthorized", "unknown token")
    return user


def cookie_safe(token: str) -> bool:
    return bool(_COOKIE_SAFE.fullmatch(token))


def set_session_cookie(request: Request, token: str) -> None:
    """``tasknet_session=TOKEN; HttpOnly; SameSite=Strict; Path=/`` (and
    ``Secure`` over TLS); a browser session cookie."""
    request.addCookie(
        SESSION_COOKIE,
        token.encode("ascii"),
        path=b"/",
        httpOnly=True,
        secure=request.isSecure(),
        sameSite="strict",
    )


def clear_session_cookie(request: Request) -> None:
    request.addCookie(
        SESSION_COOKIE,
        b"",
        path=b"/",
        max_age=b"0",
        expires=b"Thu, 01 Jan 1970 00:00:00 GMT",
        httpOnly=True,
        secure=request.isSecure(),
        sameSite="strict",
    )


def require_admin(user: User) -> None:
    if not user.is_admin:
        raise ApiError("forbidden", "this needs an admin token")
