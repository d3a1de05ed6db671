"""Users, their API tokens and quotas, and node keys.

Tokens are never stored: only their sha256 hex digest (``user.token_hash``),
so a copy of the database does not hand out API access.  Used by the HTTP API
(:func:`user_by_token`) and by ``tasknet-admin`` (everything else); every
function is one transaction body of a cursor (run it with
``Database.write``/``read``, or ``db.run_write``/``run_read`` on a plain
connection).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sqlite3
from dataclasses import dataclass

from tasknet.protocol.messages import NODE_ID

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


def hash_token(token: str) -> str:
    """The stored form of an API token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random API token (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def _user(row: sqlite3.Row) -> User:
    return User(row["id"], row["name"], bool(row["is_admin"]), int(row["quota"]), row["created_at"])


def create_user(
    cursor: sqlite3.Cursor,
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
    token = token if token is not None else new_token()
    if not token:
        raise UserError("token must not be empty")
    # ON CONFLICT, not a caught IntegrityError: on PostgreSQL a failed
    # statement would abort the whole transaction.
    cursor.execute(
        'INSERT INTO "user" (name, token_hash, is_admin, quota) VALUES (?, ?, ?, ?)'
        " ON CONFLICT DO NOTHING",
        (name, hash_token(token), int(admin), quota),
    )
    if cursor.rowcount != 1:
        raise UserError(f"user {name!r} already exists (or the token is taken)")
    user = get_user(cursor, name)
    assert user is not None
    return user, token


def get_user(cursor: sqlite3.Cursor, name: str) -> User | None:
    row = cursor.execute('SELECT * FROM "user" WHERE name = ?', (name,)).fetchone()
    return None if row is None else _user(row)


def user_by_token(cursor: sqlite3.Cursor, token: str) -> User | None:
    """The user whose API token is ``token``, or None."""
    row = cursor.execute(
        'SELECT * FROM "user" WHERE token_hash = ?', (hash_token(token),)
    ).fetchone()
    return None if row is None else _user(row)


def list_users(cursor: sqlite3.Cursor) -> list[User]:
    return [_user(row) for row in cursor.execute('SELECT * FROM "user" ORDER BY id').fetchall()]


def set_quota(cursor: sqlite3.Cursor, name: str, quota: int) -> User:
    """Set ``name``'s weekly quota (cost units)."""
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        raise UserError(f"quota must be a non-negative integer, got {quota!r}")
    cursor.execute('UPDATE "user" SET quota = ? WHERE name = ?', (quota, name))
    if cursor.rowcount != 1:
        raise UserError(f"no user {name!r}")
    user = get_user(cursor, name)
    assert user is not None
    return user


def rotate_token(cursor: sqlite3.Cursor, name: str) -> str:
    """Give ``name`` a new API token (the old one stops working); returns it."""
    token = new_token()
    cursor.execute('UPDATE "user" SET token_hash = ? WHERE name = ?', (hash_token(token), name))
    if cursor.rowcount != 1:
        raise UserError(f"no user {name!r}")
    return token


# The site's --default-quota -------------------------------------------------------

# A small key/value table of settings the site records for the tools that
# share its database (schema v4; a database the site has not yet upgraded
# simply has no setting).
_DEFAULT_QUOTA_SETTING = "default_quota"


def set_default_quota(cursor: sqlite3.Cursor, quota: int) -> None:
    """Record the site's ``--default-quota`` (written at each site start):
    the quota ``tasknet-admin user add`` gives when no ``--quota`` is given."""
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        raise UserError(f"default quota must be a non-negative integer, got {quota!r}")
    cursor.execute(
        "INSERT INTO site_setting (name, value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        (_DEFAULT_QUOTA_SETTING, str(quota)),
    )


def default_quota(cursor: sqlite3.Cursor) -> int:
    """The quota of a new user: the ``--default-quota`` of the site's last
    start, else :data:`DEFAULT_QUOTA`."""
    try:
        row = cursor.execute(
            "SELECT value FROM site_setting WHERE name = ?", (_DEFAULT_QUOTA_SETTING,)
        ).fetchone()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return DEFAULT_QUOTA
        raise
    return DEFAULT_QUOTA if row is None else int(row["value"])


# Node keys (in addition to --node-key options) --------------------------------


def node_keys(cursor: sqlite3.Cursor) -> dict[str, str]:
    """``{node_id: secret}`` from the ``node_key`` table."""
    return {
        row["node_id"]: row["secret"]
        for row in cursor.execute("SELECT node_id, secret FROM node_key ORDER BY node_id")
    }


def add_node_key(cursor: sqlite3.Cursor, node_id: str, secret: str | None = None) -> str:
    """Allow node ``node_id`` to log in (replacing its secret); returns the secret."""
    if not NODE_ID_PATTERN.fullmatch(node_id):
        raise UserError(f"node id must match {NODE_ID_PATTERN.pattern}, got {node_id!r}")
    secret = secret if secret else secrets.token_hex(16)
    cursor.execute(
        "INSERT INTO node_key (node_id, secret) VALUES (?, ?) "
        "ON CONFLICT (node_id) DO UPDATE SET secret = excluded.secret",
        (node_id, secret),
    )
    return secret


def remove_node_key(cursor: sqlite3.Cursor, node_id: str) -> bool:
    cursor.execute("DELETE FROM node_key WHERE node_id = ?", (node_id,))
    return cursor.rowcount == 1
