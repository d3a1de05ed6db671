"""Browser sessions (INTERFACES.md, "Sessions and downloads"): the
``web_session`` table (schema v5).

``POST /api/session`` trades an API token for a session: a random id
(:func:`new_session_id`, 32 bytes of the site's entropy: the OS's in
production) that goes into the
browser's cookie and nowhere else.  The table keeps only its sha256
(``id_hash``), so a copy of the database does not hand out sessions, and
neither the id nor its hash is ever logged or shown in full (the tools show
a :data:`PREFIX_LENGTH`-character prefix of the hash).

A session is usable while it is not ended and both of its expiries are in
the future: ``idle_until`` (slid forward by use: :func:`touch_session`,
written at most every ``touch_interval`` seconds by the web layer, so a
request is not a write) and ``expires_at`` (absolute, from the sign-in).
It ends (``ended_at``, ``ended_why``) at sign-out, when its user's token is
rotated or revoked (:mod:`.users`), or by an admin (``tasknet-admin session
end``).  Rows that stopped being usable more than :data:`RETENTION` seconds
ago are deleted at the next sign-in, so the table grows with the sessions
in use, not with every sign-in ever made.  A user has at most
``max_live`` usable sessions (:data:`DEFAULT_MAX_LIVE`): a sign-in past
that ends the user's oldest ones (issue 38: 3,000 sign-ins left 3,000 live
sessions).

Time is always given, never read here: ``now`` is Unix seconds from the
caller's clock (the site's reactor, a test's ``task.Clock``, or the
tool's), stored as the site's timestamp text (ISO 8601 UTC, milliseconds),
which compares as a string on both backends.  Each function is one
transaction body of a cursor, like every storage function.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from dataclasses import dataclass

from tasknet.runtime import IEntropy, SystemEntropy
from tasknet.site.storage.engine.sources import token_urlsafe
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.engine.transactions import Cursor

#: Random bytes in a session id (its text is 43 URL-safe characters).
SESSION_ID_BYTES = 32
#: How many characters of ``id_hash`` the tools show (and take back).
PREFIX_LENGTH = 12
#: The shortest prefix ``tasknet-admin session end`` accepts.
MIN_PREFIX = 6
#: Seconds a session row is kept after it stopped being usable (ended or
#: expired), for ``tasknet-admin session list --all``.
RETENTION = 7 * 24 * 3600.0

#: Usable sessions a user may have at once; a sign-in past it ends the oldest.
DEFAULT_MAX_LIVE = 20
#: ``ended_why`` of a session ended by the cap.
ENDED_BY_CAP = "ended by a newer sign-in: at most {limit} sessions per user"

_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}")
_HEX = re.compile(r"[0-9a-f]+")


class SessionError(Exception):
    """Bad input to a session function (the message says why)."""


@dataclass(frozen=True)
class ActiveSession:
    """A usable session, as the web layer needs it."""

    id: int
    user_id: int
    last_seen_at: str
    idle_until: str
    expires_at: str


@dataclass(frozen=True)
class SessionRow:
    """A session as the tools show it (never the whole hash)."""

    id: int
    prefix: str
    user: str
    created_at: str
    last_seen_at: str
    idle_until: str
    expires_at: str
    ended_at: str | None
    ended_why: str | None

    @property
    def ends_at(self) -> str:
        """When it stops being usable unless used again (the earlier expiry)."""
        return min(self.idle_until, self.expires_at)

    def state(self, now: float) -> str:
        """``active``, ``ended (why)``, ``idle`` or ``expired`` at ``now``."""
        if self.ended_at is not None:
            return f"ended ({self.ended_why})" if self.ended_why else "ended"
        stamp = iso(now)
        if self.expires_at <= stamp:
            return "expired"
        if self.idle_until <= stamp:
            return "idle"
        return "active"


def new_session_id(entropy: IEntropy | None = None) -> str:
    """A fresh session id for a cookie (never stored: :func:`hash_session_id`):
    :data:`SESSION_ID_BYTES` bytes of ``entropy`` (the site's, from its root;
    None, a tool's or a test's: the OS's), as ``secrets.token_urlsafe`` writes
    them."""
    return token_urlsafe(entropy if entropy is not None else SystemEntropy(), SESSION_ID_BYTES)


def well_formed(session_id: str) -> bool:
    """Whether ``session_id`` could be one :func:`new_session_id` made
    (anything else is not looked up)."""
    return bool(_SESSION_ID.fullmatch(session_id))


def hash_session_id(session_id: str) -> str:
    """The stored form of a session id."""
    return hashlib.sha256(session_id.encode("ascii")).hexdigest()


_USABLE = "ended_at IS NULL AND idle_until > ? AND expires_at > ?"
_PRUNE = sql("DELETE FROM web_session WHERE ended_at < ? OR idle_until < ? OR expires_at < ?")
_START = sql(
    "INSERT INTO web_session "
    "(id_hash, user_id, created_at, last_seen_at, idle_until, expires_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_ACTIVE = sql(
    "SELECT id, user_id, last_seen_at, idle_until, expires_at FROM web_session "  # noqa: S608
    f"WHERE id_hash = ? AND {_USABLE}"
)
_TOUCH = sql(
    "UPDATE web_session SET last_seen_at = ?, "
    "idle_until = CASE WHEN expires_at < ? THEN expires_at ELSE ? END "
    "WHERE id = ? AND ended_at IS NULL"
)
_LIVE_OF_USER = sql(
    "SELECT id FROM web_session "  # noqa: S608
    f"WHERE user_id = ? AND {_USABLE} ORDER BY id DESC"
)
_END_BY_ID = sql("UPDATE web_session SET ended_at = ?, ended_why = ? WHERE id = ?")
_END = sql(
    "UPDATE web_session SET ended_at = ?, ended_why = ? WHERE id_hash = ? AND ended_at IS NULL"
)
_END_USER_SESSIONS_NOW = sql(
    "UPDATE web_session SET ended_at = {now}, ended_why = ? WHERE user_id = ? AND ended_at IS NULL"
)
_END_USER_SESSIONS = sql(
    "UPDATE web_session SET ended_at = ?, ended_why = ? WHERE user_id = ? AND ended_at IS NULL"
)


def start_session(
    cursor: Cursor,
    user_id: int,
    id_hash: str,
    now: float,
    idle: float,
    max_age: float,
    replaces: str | None = None,
    max_live: int = DEFAULT_MAX_LIVE,
) -> int:
    """Record a new session of ``user_id`` signed in at ``now``: usable for
    ``idle`` seconds unless used, ``max_age`` seconds at most.  The session
    whose id hashes to ``replaces`` (the browser's previous one), if still
    open, ends; so do the user's oldest usable sessions beyond ``max_live``
    (the new one counted); rows past :data:`RETENTION` go; all in this
    transaction.  Returns how many sessions the cap ended."""
    if max_live < 1:
        raise SessionError(f"max_live must be at least 1, got {max_live}")
    stamp = iso(now)
    cutoff = iso(now - RETENTION)
    if replaces is not None:
        end_session(cursor, replaces, "signed in again", now)
    cursor.execute(_PRUNE, (cutoff, cutoff, cutoff))
    cursor.execute(
        _START,
        (id_hash, user_id, stamp, stamp, iso(now + min(idle, max_age)), iso(now + max_age)),
    )
    live = [row["id"] for row in cursor.execute(_LIVE_OF_USER, (user_id, stamp, stamp))]
    over = live[max_live:]  # newest first: the oldest are past the cap
    why = ENDED_BY_CAP.format(limit=max_live)
    cursor.executemany(_END_BY_ID, [(stamp, why, session) for session in over])
    return len(over)


def active_session(cursor: Cursor, id_hash: str, now: float) -> ActiveSession | None:
    """The session whose id hashes to ``id_hash`` if it is usable at ``now``."""
    stamp = iso(now)
    row = cursor.execute(_ACTIVE, (id_hash, stamp, stamp)).fetchone()
    if row is None:
        return None
    return ActiveSession(
        int(row["id"]),
        int(row["user_id"]),
        row["last_seen_at"],
        row["idle_until"],
        row["expires_at"],
    )


def touch_session(cursor: Cursor, session: int, now: float, idle: float) -> bool:
    """The session was used at ``now``: it stays usable ``idle`` seconds
    more (never past its absolute expiry).  False if it ended meanwhile."""
    stamp = iso(now)
    cursor.execute(_TOUCH, (stamp, iso(now + idle), iso(now + idle), session))
    return cursor.rowcount == 1


def end_session(cursor: Cursor, id_hash: str, why: str, now: float) -> bool:
    """End the session whose id hashes to ``id_hash`` (sign-out); False if
    there was none still open."""
    cursor.execute(_END, (iso(now), why, id_hash))
    return cursor.rowcount == 1


def end_user_sessions(cursor: Cursor, user_id: int, why: str, now: float | None = None) -> int:
    """End every open session of ``user_id`` (its token was rotated or
    revoked, or an admin asked); how many.  ``now`` None: the database's
    time (``ended_at`` is a record; nothing compares it with a clock)."""
    if now is None:
        cursor.execute(_END_USER_SESSIONS_NOW, (why, user_id))
    else:
        cursor.execute(_END_USER_SESSIONS, (iso(now), why, user_id))
    return int(cursor.rowcount)


def _row(row: sqlite3.Row) -> SessionRow:
    return SessionRow(
        int(row["id"]),
        row["id_hash"][:PREFIX_LENGTH],
        row["name"],
        row["created_at"],
        row["last_seen_at"],
        row["idle_until"],
        row["expires_at"],
        row["ended_at"],
        row["ended_why"],
    )


_LISTED = (
    "SELECT s.id, s.id_hash, u.name, s.created_at, s.last_seen_at, s.idle_until, "
    's.expires_at, s.ended_at, s.ended_why FROM web_session AS s JOIN "user" AS u '
    "ON u.id = s.user_id"
)
_OPEN_NOW = "s.ended_at IS NULL AND s.idle_until > ? AND s.expires_at > ?"
_ALL_SESSIONS = sql(f"{_LISTED} ORDER BY s.id")
_USABLE_SESSIONS = sql(f"{_LISTED} WHERE {_OPEN_NOW} ORDER BY s.id")
_OPEN_WITH_PREFIX = sql(f"{_LISTED} WHERE {_OPEN_NOW} AND substr(s.id_hash, 1, ?) = ?")
_END_BY_ID = sql("UPDATE web_session SET ended_at = ?, ended_why = ? WHERE id = ?")
_USER_ID = sql('SELECT id FROM "user" WHERE name = ?')


def list_sessions(
    cursor: Cursor, now: float, *, include_unusable: bool = False
) -> list[SessionRow]:
    """The sessions usable at ``now`` (with ``include_unusable``, also the
    ended and expired ones still kept), oldest first."""
    if include_unusable:
        rows = cursor.execute(_ALL_SESSIONS).fetchall()
    else:
        stamp = iso(now)
        rows = cursor.execute(_USABLE_SESSIONS, (stamp, stamp)).fetchall()
    return [_row(row) for row in rows]


def end_session_by_prefix(cursor: Cursor, prefix: str, why: str, now: float) -> SessionRow:
    """End the one open session whose ``id_hash`` starts with ``prefix``
    (as ``session list`` shows it); :class:`SessionError` for none or
    several."""
    prefix = prefix.strip().lower()
    if len(prefix) < MIN_PREFIX or not _HEX.fullmatch(prefix):
        raise SessionError(
            f"a session is named by at least {MIN_PREFIX} hex characters of its ID "
            "(as 'session list' shows it)"
        )
    stamp = iso(now)
    rows = cursor.execute(_OPEN_WITH_PREFIX, (stamp, stamp, len(prefix), prefix)).fetchall()
    if not rows:
        raise SessionError(f"no open session {prefix}")
    if len(rows) > 1:
        raise SessionError(f"{len(rows)} open sessions start with {prefix}: give more of the ID")
    (row,) = rows
    cursor.execute(_END_BY_ID, (stamp, why, row["id"]))
    return _row(row)


def end_sessions_of(cursor: Cursor, name: str, why: str, now: float | None = None) -> int:
    """End every open session of user ``name``; how many
    (:class:`SessionError` if there is no such user)."""
    row = cursor.execute(_USER_ID, (name,)).fetchone()
    if row is None:
        raise SessionError(f"no user {name!r}")
    return end_user_sessions(cursor, int(row["id"]), why, now)
