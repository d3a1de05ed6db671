"""Authentication of API calls, browser sessions and the same-origin rule
(INTERFACES.md, "Sessions and downloads").

A request carries its credentials in one of:

* ``Authorization: Bearer TOKEN`` (programs);
* the session cookie ``tasknet_session`` (the web UI): ``POST /api/session
  {"token"}`` trades the API token for a server-side session
  (:mod:`tasknet.site.storage.sessions`) and the cookie holds only the
  session's random id, never the token; ``DELETE /api/session`` ends it;
* ``?token=`` where a header cannot be sent (a WebSocket opened by a
  program; only where the caller allows it).

An ``Authorization`` header wins over the cookie, the cookie over
``?token=``.  Tokens are looked up by their sha256 hash
(``storage.users``), session ids by theirs; a header that is not UTF-8 is
``401``, never a 500.

Sessions.  A session is usable until its idle expiry (``--session-idle``,
default 12 h) or its absolute one (``--session-max-age``, default 7 days),
whichever comes first.  A user has at most ``max_per_user`` usable sessions
(default 20): a sign-in past that ends the user's oldest.  Each
authenticated use slides the idle expiry, but the slide is written only
when the stored ``last_seen_at`` is at least :data:`TOUCH_INTERVAL`
seconds old, so a busy page is not a write per request (the idle expiry
is therefore exact to within that interval).  A
failed slide is logged and the request goes on.  All times come from the
clock the :class:`Authenticator` is given (the site's reactor; a test's
``task.Clock``).  Rotating or revoking a token ends its user's sessions
(``storage.users``); ``/api/events`` re-checks its sockets' sessions as it
re-checks tokens, so their sockets close within 5 s.

The cookie is ``HttpOnly; SameSite=Strict; Path=/`` with no expiry of its
own (the server's expiries decide), plus ``Secure`` when the request came
over TLS, the site runs with ``--cookie-secure``, or ``--public-url`` is an
``https`` URL.

Same origin.  A cookie-authenticated request that changes anything
(``POST``/``PUT``/``DELETE``/``PATCH``, and the ``/api/events`` handshake
made with the cookie), and the sign-in and sign-out themselves, need an
``Origin`` header whose scheme, host and port all equal the site's own:
``--public-url`` when set, else the request's ``Host`` header and whether
the request came over TLS (a port left out is the scheme's default).  No
``Origin`` (or ``Origin: null``, or several) is ``403``, as is any
difference.  ``SameSite=Strict`` is the first line, this the second; a
bearer-token request needs neither (a browser never adds that header by
itself).  Reads with the cookie need no ``Origin``: their answers are not
readable by another origin.

Guessing.  Every token presented (a bearer token, ``?token=``, a sign-in's)
takes an attempt from its client address's bucket before it is looked up,
and a token that finds its user gives it back
(:class:`~tasknet.site.ratelimit.AuthFailureLimiter`: ``--auth-burst``
wrong tokens at once, 1,000 by default, then ``--auth-rate`` a second, 10);
an empty bucket answers ``429 rate_limited`` with ``Retry-After`` without a
lookup.  Wrong tokens and the slowing are logged at most once a minute per
address, with the count between, and counted in
``tasknet_auth_failures_total`` and ``tasknet_auth_throttled_total``
(``kind``: ``token`` or ``sign_in``) (issue 38: 3,000 wrong sign-ins took
2.4 s and left no trace).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger, LogLevel
from twisted.web.server import Request

from tasknet.protocol.ratelog import RateLimitedLog
from tasknet.runtime import IEntropy
from tasknet.site import metrics
from tasknet.site.ratelimit import AuthFailureLimiter
from tasknet.site.storage import sessions, users
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.throughput import iso
from tasknet.site.storage.users import User
from tasknet.site.web.errors import ApiError

log = Logger()

MAX_TOKEN = 512
SESSION_COOKIE = b"tasknet_session"
UNSAFE_METHODS = frozenset({b"POST", b"PUT", b"DELETE", b"PATCH"})

#: Defaults of ``--session-idle`` and ``--session-max-age`` (seconds).
DEFAULT_SESSION_IDLE = 12 * 3600.0
DEFAULT_SESSION_MAX_AGE = 7 * 24 * 3600.0
#: A session's slide is written when its ``last_seen_at`` is this old.
TOUCH_INTERVAL = 60.0

_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_HEADER = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


@dataclass(frozen=True)
class Origin:
    """A web origin: scheme, host (lower case, no brackets), port (explicit)."""

    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Origin | None:
        """The origin an ``Origin`` header (or a URL) names, or None for
        anything else (``null``, another scheme, a bad port, a path)."""
        try:
            parts = urlsplit(text.strip())
            scheme = parts.scheme.lower()
            port = parts.port
        except ValueError:
            return None
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            return None
        if parts.username is not None or parts.password is not None:
            return None
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            return None
        return cls(scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme])

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = _DEFAULT_PORTS[self.scheme] == self.port
        return f"{self.scheme}://{host}" + ("" if default else f":{self.port}")


def parse_public_url(text: str) -> Origin:
    """``--public-url``: an ``http``/``https`` URL with a host and at most
    a ``/`` path; :class:`ValueError` saying why otherwise."""
    origin = Origin.parse(text)
    if origin is None:
        raise ValueError(
            f"--public-url wants http(s)://HOST[:PORT] (no path, query or user), got {text!r}"
        )
    return origin


@dataclass(frozen=True)
class SessionSettings:
    """The site's session options."""

    #: ``--session-idle``: seconds a session stays usable without use.
    idle: float = DEFAULT_SESSION_IDLE
    #: ``--session-max-age``: seconds a session stays usable at most.
    max_age: float = DEFAULT_SESSION_MAX_AGE
    #: ``--cookie-secure``: mark the cookie ``Secure`` on plain HTTP too
    #: (a TLS-terminating proxy in front).
    cookie_secure: bool = False
    #: ``--public-url``: the site's own origin, instead of ``Host``.
    public_origin: Origin | None = None
    touch_interval: float = TOUCH_INTERVAL
    #: Usable sessions a user may have; a sign-in past it ends the oldest.
    max_per_user: int = sessions.DEFAULT_MAX_LIVE


@dataclass(frozen=True)
class Credentials:
    secret: str
    source: str  # "header" (a token) / "cookie" (a session id) / "query" (a token)


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
    """What the request authenticates with and where it came from, or None."""
    header = _header(request, b"authorization")
    if header:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return Credentials(value.strip(), "header")
        return None
    cookie = session_cookie(request)
    if cookie is not None:
        return Credentials(cookie, "cookie")
    if allow_query:
        values = request.args.get(b"token")
        if values and values[0]:
            try:
                return Credentials(values[0].decode("utf-8"), "query")
            except UnicodeDecodeError:
                raise ApiError("unauthorized", "the token is not UTF-8") from None
    return None


def session_cookie(request: Request) -> str | None:
    """The session cookie's value, or None."""
    cookie = request.getCookie(SESSION_COOKIE)
    if not cookie:
        return None
    try:
        return cookie.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("unauthorized", "the session cookie is not UTF-8") from None


def client_address(request: Request) -> str:
    """The TCP peer's address (never a header a client writes); ``local``
    for a transport without one."""
    host = getattr(request.getClientAddress(), "host", None)
    return str(host) if host else "local"


def own_origin(request: Request, settings: SessionSettings) -> Origin | None:
    """The site's origin as this request reached it: ``--public-url``, else
    its ``Host`` header with ``https`` over TLS, ``http`` otherwise."""
    if settings.public_origin is not None:
        return settings.public_origin
    values = request.requestHeaders.getRawHeaders(b"host")
    if not values or len(values) != 1:
        return None
    try:
        host = values[0].decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if not _HOST_HEADER.fullmatch(host):
        return None
    scheme = "https" if request.isSecure() else "http"
    return Origin.parse(f"{scheme}://{host}")


def require_same_origin(request: Request, settings: SessionSettings) -> None:
    """``403`` unless the request's one ``Origin`` equals the site's own in
    scheme, host and port."""
    values = request.requestHeaders.getRawHeaders(b"origin")
    if not values:
        raise ApiError("forbidden", "this request needs an Origin header (a browser sends one)")
    if len(values) != 1:
        raise ApiError("forbidden", "this request has more than one Origin header")
    try:
        origin = Origin.parse(values[0].decode("ascii"))
    except UnicodeDecodeError:
        origin = None
    own = own_origin(request, settings)
    if origin is None or own is None or origin != own:
        raise ApiError("forbidden", "this request came from another origin")


class Authenticator:
    """Who a request is: tokens, browser sessions, the same-origin rule.
    Built once by the composition root; its clock decides every expiry, its
    ``entropy`` makes the session ids; ``guesses`` slows wrong tokens per
    client address (default: its defaults, on ``clock``)."""

    def __init__(
        self,
        db: Database,
        clock: IReactorTime,
        settings: SessionSettings = SessionSettings(),
        *,
        entropy: IEntropy,
        guesses: AuthFailureLimiter | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.entropy = entropy
        self.guesses = guesses if guesses is not None else AuthFailureLimiter(clock)
        self._guess_log = RateLimitedLog(log, clock, interval=60.0)

    # -- lookups (also the WebSocket's: web/events.py) ----------------------

    def token_user(self, token: str) -> Deferred[User | None]:
        """The user whose API token is ``token``, or None."""
        if not token or len(token) > MAX_TOKEN:
            return succeed(None)
        return self.db.read(users.user_by_token, token)

    def session_user(self, session_id: str, slide: bool = True) -> Deferred[User | None]:
        """The user of the usable session ``session_id``, or None; ``slide``:
        this is a use (the idle expiry moves, written at most every
        :data:`TOUCH_INTERVAL`)."""
        return Deferred.fromCoroutine(self._session_user(session_id, slide))

    async def _session_user(self, session_id: str, slide: bool) -> User | None:
        if not sessions.well_formed(session_id):
            return None
        now = self.clock.seconds()
        found = await self.db.read(users.user_by_session, sessions.hash_session_id(session_id), now)
        if found is None:
            return None
        user, session = found
        if slide and session.last_seen_at <= iso(now - self.settings.touch_interval):
            try:
                await self.db.write(sessions.touch_session, session.id, now, self.settings.idle)
            except Exception:
                # The request goes on; the next use tries again.
                log.failure("sliding the idle expiry of session {id} failed", id=session.id)
        return user

    async def guarded_token_user(self, request: Request, token: str, kind: str = "token") -> User:
        """The user of ``token`` presented by ``request``'s client, counted
        against its address (the module doc, "Guessing"): ``429
        rate_limited`` (with ``Retry-After``) while the address is slowed,
        ``401`` for a wrong token.  ``kind`` (``token``, ``sign_in``) labels
        the metrics ``tasknet_auth_failures_total`` and
        ``tasknet_auth_throttled_total``."""
        address = client_address(request)
        wait = self.guesses.take(address)
        if wait > 0:
            metrics.AUTH_THROTTLED.labels(kind=kind).inc()
            seconds = max(1, math.ceil(wait))
            request.setHeader(b"Retry-After", str(seconds).encode("ascii"))
            self._guess_log.emit(
                ("slowed", self.guesses.key(address)),
                "authentication from {address} slowed: more than {threshold} wrong tokens;"
                " refused without a lookup",
                address=address,
                threshold=self.guesses.threshold,
            )
            raise ApiError(
                "rate_limited", f"too many wrong tokens from this address: retry in {seconds} s"
            )
        try:
            user = await self.token_user(token)
        except BaseException:
            self.guesses.give_back(address)  # not a wrong token: the lookup failed
            raise
        if user is None and token and len(token) <= MAX_TOKEN:
            disabled = await self.db.read(users.disabled_user_by_token, token)
            if disabled is not None:
                # The right token of a disabled account: not a guess, and
                # its holder is told why (issue 36, item 8).
                self.guesses.give_back(address)
                raise ApiError(
                    "account_disabled",
                    f"the account {disabled.name} is disabled: an admin can enable it again",
                )
        if user is None:
            metrics.AUTH_FAILURES.labels(kind=kind).inc()
            self._guess_log.emit(
                ("wrong token", self.guesses.key(address)),
                "a wrong token from {address}",
                address=address,
            )
            raise ApiError("unauthorized", "unknown token")
        self.guesses.give_back(address)
        return user

    # -- requests -------------------------------------------------------------

    async def authenticate(
        self, request: Request, *, allow_query: bool = False, writes: bool | None = None
    ) -> User:
        """The calling user; :class:`ApiError` ``unauthorized`` otherwise,
        and ``forbidden`` for a cookie-authenticated request that changes
        something (``writes``; default: an unsafe method) from no or
        another origin."""
        credentials = request_credentials(request, allow_query=allow_query)
        if credentials is None:
            raise ApiError(
                "unauthorized", "an 'Authorization: Bearer TOKEN' header or a session is required"
            )
        if credentials.source == "cookie":
            if writes if writes is not None else request.method in UNSAFE_METHODS:
                require_same_origin(request, self.settings)
            user = await self.session_user(credentials.secret)
            if user is None:
                raise ApiError("unauthorized", "the session has ended or expired: sign in again")
            return user
        return await self.guarded_token_user(request, credentials.secret)

    def check_origin(self, request: Request) -> None:
        """``403`` unless the request comes from the site's own origin."""
        require_same_origin(request, self.settings)

    async def sign_in(self, request: Request, token: str) -> User:
        """A new session for the user of ``token``, its id in the cookie.
        The session the request's cookie named, if any, ends."""
        self.check_origin(request)
        user = await self.guarded_token_user(request, token, "sign_in")
        session_id = sessions.new_session_id(self.entropy)
        previous = session_cookie(request)
        replaced = (
            sessions.hash_session_id(previous)
            if previous is not None and sessions.well_formed(previous)
            else None
        )
        capped = await self.db.write(
            sessions.start_session,
            user.id,
            sessions.hash_session_id(session_id),
            self.clock.seconds(),
            self.settings.idle,
            self.settings.max_age,
            replaced,
            self.settings.max_per_user,
        )
        if capped:
            self._guess_log.emit(
                ("session cap", user.id),
                "user {user} signed in past {limit} sessions: its oldest {ended} ended",
                level=LogLevel.info,
                user=user.name,
                limit=self.settings.max_per_user,
                ended=capped,
            )
        self._set_cookie(request, session_id)
        return user

    async def sign_out(self, request: Request) -> None:
        """End the cookie's session on the server, and clear the cookie."""
        self.check_origin(request)
        session_id = session_cookie(request)
        if session_id is not None and sessions.well_formed(session_id):
            await self.db.write(
                sessions.end_session,
                sessions.hash_session_id(session_id),
                "signed out",
                self.clock.seconds(),
            )
        self._set_cookie(request, None)

    # -- the cookie -------------------------------------------------------------

    def cookie_secure(self, request: Request) -> bool:
        public = self.settings.public_origin
        return (
            request.isSecure()
            or self.settings.cookie_secure
            or (public is not None and public.scheme == "https")
        )

    def _set_cookie(self, request: Request, session_id: str | None) -> None:
        """``tasknet_session=ID; HttpOnly; SameSite=Strict; Path=/`` (a
        browser-session cookie: the server's expiries decide), or its
        removal (``session_id`` None)."""
        extra: dict[str, Any] = {}
        if session_id is None:
            extra = {"max_age": b"0", "expires": b"Thu, 01 Jan 1970 00:00:00 GMT"}
        request.addCookie(
            SESSION_COOKIE,
            (session_id or "").encode("ascii"),
            path=b"/",
            httpOnly=True,
            secure=self.cookie_secure(request),
            sameSite="strict",
            **extra,
        )


def require_admin(user: User) -> None:
    if not user.is_admin:
        raise ApiError("forbidden", "this needs an admin token")
