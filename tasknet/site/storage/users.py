"""Users, their API tokens and quotas, and node keys.

Tokens are never stored: only their sha256 hex digest (``user.token_hash``),
so a copy of the database does not hand out API access.  Rotating or revoking
a token ends every browser session of its user (:mod:`.sessions`) in the same
transaction.  Used by the HTTP API (:func:`user_by_token`,
:func:`user_by_session`) and by ``tasknet-admin`` (everything else); every
function is one transaction body of a cursor (run it with
``Database.write``/``read``, or ``db.run_write``/``run_read`` on a plain
connection).  New tokens and node secrets are drawn from the entropy of
the cursor's connection (:func:`~tasknet.site.storage.engine.sources.entropy_of`:
the OS's for a tool's connection, the site's root's for its own).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from dataclasses import dataclass

from tasknet.protocol.messages import NODE_ID
from tasknet.runtime import IEntropy
from tasknet.site.storage import sessions
from tasknet.site.storage.engine.sources import entropy_of, token_urlsafe
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.engine.transactions import Cursor

#: The weekly quota of a new user when no site has recorded its
#: ``--default-quota`` in this database yet.
DEFAULT_QUOTA = 5000
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: The wire rule for node ids (one definition, in the protocol).
NODE_ID_PATTERN = NODE_ID


class UserError(Exception):
    """Bad input to a user or node-key function (the message says why)."""


@dataclass(frozen=True)
class User:
    id: int
    name: str
    is_admin: bool
    quota: int
    created_at: str
    #: When an admin disabled the user (``tasknet-admin user disable``); None
    #: while enabled.  A disabled user authenticates nothing: the lookups
    #: :func:`user_by_token` and :func:`user_by_session` do not find it.
    disabled_at: str | None = None

    @property
    def disabled(self) -> bool:
        return self.disabled_at is not None


def hash_token(token: str) -> str:
    """The stored form of an API token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token(entropy: IEntropy) -> str:
    """A fresh random API token (32 URL-safe characters: 24 bytes of
    ``entropy`` as ``secrets.token_urlsafe(24)`` writes them)."""
    return token_urlsafe(entropy, 24)


def _user(row: sqlite3.Row) -> User:
    try:
        disabled_at = row["disabled_at"]
    except (IndexError, KeyError):  # a database before v5 (read by a migration's tests)
        disabled_at = None
    return User(
        row["id"],
        row["name"],
        bool(row["is_admin"]),
        int(row["quota"]),
        row["created_at"],
        disabled_at,
    )


_INSERT_USER = sql(
    'INSERT INTO "user" (name, token_hash, is_admin, quota, created_at)'
    " VALUES (?, ?, ?, ?, {now}) ON CONFLICT DO NOTHING"
)
_USER_NAMED = sql('SELECT * FROM "user" WHERE name = ?')
_USER_BY_TOKEN = sql('SELECT * FROM "user" WHERE token_hash = ? AND disabled_at IS NULL')
_ENABLED_USER = sql('SELECT * FROM "user" WHERE id = ? AND disabled_at IS NULL')
_USERS = sql('SELECT * FROM "user" ORDER BY id')
_DISABLED_BY_TOKEN = sql('SELECT * FROM "user" WHERE token_hash = ? AND disabled_at IS NOT NULL')
# Each user with how many of its browser sessions are usable now (the
# admin UI's Users section).
_USERS_WITH_SESSIONS = sql(
    "SELECT u.*, (SELECT count(*) FROM web_session AS s WHERE s.user_id = u.id"
    " AND s.ended_at IS NULL AND s.idle_until > ? AND s.expires_at > ?) AS open_sessions"
    ' FROM "user" AS u ORDER BY u.id'
)
_SET_QUOTA = sql('UPDATE "user" SET quota = ? WHERE name = ?')
_SET_TOKEN = sql('UPDATE "user" SET token_hash = ? WHERE name = ?')
_DISABLE = sql('UPDATE "user" SET disabled_at = {now} WHERE id = ?')
_ENABLE = sql('UPDATE "user" SET disabled_at = NULL WHERE id = ?')


def create_user(
    cursor: Cursor,
    name: str,
    *,
    admin: bool = False,
    quota: int = DEFAULT_QUOTA,
    token: str | None = None,
) -> tuple[User, str]:
    """Create user ``name``; returns the user and the API token (shown once:
    only its hash is stored).  ``token`` fixes the token (``--demo``)."""
    if not NAME_PATTERN.fullmatch(name):
        raise UserError(f"user name must match {NAME_PATTERN.pattern}, got {name!r}")
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        raise UserError(f"quota must be a non-negative integer, got {quota!r}")
    token = token if token is not None else new_token(entropy_of(cursor))
    if not token:
        raise UserError("token must not be empty")
    # ON CONFLICT, not a caught IntegrityError: on PostgreSQL a failed
    # statement would abort the whole transaction.
    cursor.execute(_INSERT_USER, (name, hash_token(token), int(admin), quota))
    if cursor.rowcount != 1:
        raise UserError(f"user {name!r} already exists (or the token is taken)")
    user = get_user(cursor, name)
    assert user is not None
    return user, token


def get_user(cursor: Cursor, name: str) -> User | None:
    row = cursor.execute(_USER_NAMED, (name,)).fetchone()
    return None if row is None else _user(row)


def user_by_token(cursor: Cursor, token: str) -> User | None:
    """The enabled user whose API token is ``token``, or None (a disabled
    user's token authenticates nothing)."""
    row = cursor.execute(_USER_BY_TOKEN, (hash_token(token),)).fetchone()
    return None if row is None else _user(row)


def user_by_session(
    cursor: Cursor, id_hash: str, now: float
) -> tuple[User, sessions.ActiveSession] | None:
    """The user of the session whose id hashes to ``id_hash``, with the
    session, if it is usable at ``now`` and the user is enabled; else None."""
    session = sessions.active_session(cursor, id_hash, now)
    if session is None:
        return None
    row = cursor.execute(_ENABLED_USER, (session.user_id,)).fetchone()
    return None if row is None else (_user(row), session)


def list_users(cursor: Cursor) -> list[User]:
    return [_user(row) for row in cursor.execute(_USERS).fetchall()]


def disabled_user_by_token(cursor: Cursor, token: str) -> User | None:
    """The disabled user whose API token is ``token``, or None: a sign-in
    with it is told the account is disabled, not that the token is wrong."""
    row = cursor.execute(_DISABLED_BY_TOKEN, (hash_token(token),)).fetchone()
    return None if row is None else _user(row)


def list_users_with_sessions(cursor: Cursor, now: float) -> list[tuple[User, int]]:
    """Every user, oldest first, with how many browser sessions it has usable at ``now``."""
    stamp = iso(now)
    rows = cursor.execute(_USERS_WITH_SESSIONS, (stamp, stamp)).fetchall()
    return [(_user(row), int(row["open_sessions"])) for row in rows]


def set_quota(cursor: Cursor, name: str, quota: int) -> User:
    """Set ``name``'s weekly quota (cost units)."""
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        raise UserError(f"quota must be a non-negative integer, got {quota!r}")
    cursor.execute(_SET_QUOTA, (quota, name))
    if cursor.rowcount != 1:
        raise UserError(f"no user {name!r}")
    user = get_user(cursor, name)
    assert user is not None
    return user


def _replace_token(cursor: Cursor, name: str, token: str, why: str) -> None:
    cursor.execute(_SET_TOKEN, (hash_token(token), name))
    if cursor.rowcount != 1:
        raise UserError(f"no user {name!r}")
    user = get_user(cursor, name)
    assert user is not None
    sessions.end_user_sessions(cursor, user.id, why)


def rotate_token(cursor: Cursor, name: str) -> str:
    """Give ``name`` a new API token (the old one stops working, and so
    does every browser session of ``name``); returns it."""
    token = new_token(entropy_of(cursor))
    _replace_token(cursor, name, token, "token rotated")
    return token


def revoke_token(cursor: Cursor, name: str) -> None:
    """Take ``name``'s API token away (and end every browser session of
    ``name``): nothing authenticates as ``name`` until :func:`rotate_token`
    gives a new one.  The hash stored is that of a random token nobody is
    told."""
    _replace_token(cursor, name, new_token(entropy_of(cursor)), "token revoked")


# Disabling and removing users ------------------------------------------------------


def _existing(cursor: Cursor, name: str) -> User:
    user = get_user(cursor, name)
    if user is None:
        raise UserError(f"no user {name!r}")
    return user


def disable_user(cursor: Cursor, name: str) -> tuple[User, int | None]:
    """Disable ``name``: its API token and browser sessions stop working at
    once (its sessions end; open WebSockets close at their next check), its
    tasks stay and go on.  Returns the user and how many sessions ended, or
    None for a user already disabled (left as it is, its first
    ``disabled_at``)."""
    user = _existing(cursor, name)
    if user.disabled:
        return user, None
    cursor.execute(_DISABLE, (user.id,))
    ended = sessions.end_user_sessions(cursor, user.id, "user disabled")
    return _existing(cursor, name), ended


def enable_user(cursor: Cursor, name: str) -> tuple[User, bool]:
    """Enable ``name`` again: its API token works as before (sessions ended
    by :func:`disable_user` stay ended: sign in again).  Returns the user and
    whether it was disabled."""
    user = _existing(cursor, name)
    if not user.disabled:
        return user, False
    cursor.execute(_ENABLE, (user.id,))
    return _existing(cursor, name), True


#: A task of a user that is not its ``DELETED`` tombstone: it keeps the user.
_LIVE_TASKS_SQL = sql("""
SELECT (SELECT count(*) FROM gallery WHERE user_id = ?1)
     + (SELECT count(*) FROM task_operation AS o
        WHERE o.user_id = ?1 AND o.state <> 'DELETED'
          AND NOT EXISTS (SELECT 1 FROM gallery AS g WHERE g.gid = o.gid))
""")
_DISOWN_TOMBSTONES = sql(
    "UPDATE task_operation SET user_id = NULL WHERE user_id = ? AND state = 'DELETED'"
)
#: What goes with a removed user.
_REMOVE_ROWS_OF = [
    sql(f"DELETE FROM {table} WHERE user_id = ?")  # noqa: S608 (our table names)
    for table in ("web_session", "favorite", "weekly_usage")
]
_REMOVE_USER = sql('DELETE FROM "user" WHERE id = ?')


def live_task_count(cursor: Cursor, user_id: int) -> int:
    """How many tasks of ``user_id`` are live: a task row, or an operation
    that is not a ``DELETED`` tombstone (submitting, unknown, pending delete)."""
    return int(cursor.execute(_LIVE_TASKS_SQL, (user_id,)).fetchone()[0])


def remove_user(cursor: Cursor, name: str) -> User:
    """Delete ``name`` for good; refused (:class:`UserError`, nothing
    changed) while it has a live task (:func:`live_task_count`): delete its
    tasks first, or disable it.  What goes with it: its sessions, its
    favourites and its weekly usage rows; its ``DELETED`` tombstones stay,
    owned by nobody (so their gids stay settled), and the throughput history
    keeps its numbers under the removed id, which names no one from then on:
    ids are never given twice (schema v12's ``user_id_high``), so only the
    admin's site-wide totals count them.  Returns the user as it was."""
    user = _existing(cursor, name)
    live = live_task_count(cursor, user.id)
    if live:
        raise UserError(
            f"user {name!r} has {live} live task(s): delete them first (or 'user disable"
            f" {name}' to lock the user out and keep its tasks); nothing changed"
        )
    cursor.execute(_DISOWN_TOMBSTONES, (user.id,))
    for remove in _REMOVE_ROWS_OF:
        cursor.execute(remove, (user.id,))
    cursor.execute(_REMOVE_USER, (user.id,))
    return user


# The site's --default-quota -------------------------------------------------------

# A small key/value table of settings the site records for the tools that
# share its database (schema v4; a database the site has not yet upgraded
# simply has no setting).
_DEFAULT_QUOTA_SETTING = "default_quota"
_SET_SETTING = sql(
    "INSERT INTO site_setting (name, value) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
_SETTING = sql("SELECT value FROM site_setting WHERE name = ?")


def set_default_quota(cursor: Cursor, quota: int) -> None:
    """Record the site's ``--default-quota`` (written at each site start):
    the quota ``tasknet-admin user add`` gives when no ``--quota`` is given."""
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        raise UserError(f"default quota must be a non-negative integer, got {quota!r}")
    cursor.execute(_SET_SETTING, (_DEFAULT_QUOTA_SETTING, str(quota)))


def default_quota(cursor: Cursor) -> int:
    """The quota of a new user: the ``--default-quota`` of the site's last
    start, else :data:`DEFAULT_QUOTA`."""
    try:
        row = cursor.execute(_SETTING, (_DEFAULT_QUOTA_SETTING,)).fetchone()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return DEFAULT_QUOTA
        raise
    return DEFAULT_QUOTA if row is None else int(row["value"])


# Node keys (in addition to --node-key options) --------------------------------

_NODE_KEYS = sql("SELECT node_id, secret FROM node_key ORDER BY node_id")
_SET_NODE_KEY = sql(
    "INSERT INTO node_key (node_id, secret, created_at) VALUES (?, ?, {now}) "
    "ON CONFLICT (node_id) DO UPDATE SET secret = excluded.secret"
)
_REMOVE_NODE_KEY = sql("DELETE FROM node_key WHERE node_id = ?")


def node_keys(cursor: Cursor) -> dict[str, str]:
    """``{node_id: secret}`` from the ``node_key`` table."""
    return {row["node_id"]: row["secret"] for row in cursor.execute(_NODE_KEYS)}


def add_node_key(cursor: Cursor, node_id: str, secret: str | None = None) -> str:
    """Allow node ``node_id`` to log in (replacing its secret); returns the secret."""
    if not NODE_ID_PATTERN.fullmatch(node_id):
        raise UserError(f"node id must match {NODE_ID_PATTERN.pattern}, got {node_id!r}")
    secret = secret if secret else entropy_of(cursor).token_hex(16)
    cursor.execute(_SET_NODE_KEY, (node_id, secret))
    return secret


def remove_node_key(cursor: Cursor, node_id: str) -> bool:
    cursor.execute(_REMOVE_NODE_KEY, (node_id,))
    return cursor.rowcount == 1
