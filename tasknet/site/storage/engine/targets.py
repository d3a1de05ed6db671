"""What a ``--db`` value names: a SQLite file or a PostgreSQL database
(:func:`is_postgres`, :func:`backend_of`), and how it is shown
(:func:`describe`, :func:`redact`: never a password), and what a
backend can do that the layers above depend on (:class:`Capabilities`).

This is where the backend is decided: the engine opens the driver the
target names (:func:`tasknet.site.storage.engine.database.connect`), and
from there each statement carries its own text for each engine
(:mod:`tasknet.site.storage.engine.sql`).  Nothing above the engine asks
which backend a cursor is on; what they need of it is a capability
(``Database.capabilities``), never the backend's name
(``tests/site/test_backend_capabilities.py`` keeps it so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from tasknet.logging import REDACTED, redact_secrets

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
_URL_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str) -> bool:
    """Whether ``target`` (a ``--db`` value) names a PostgreSQL database
    (a ``postgresql://`` or ``postgres://`` URL) rather than a SQLite file."""
    return target.startswith(_URL_SCHEMES)


def backend_of(target: str) -> str:
    """``"postgresql"`` or ``"sqlite"`` for a ``--db`` value."""
    return POSTGRESQL if is_postgres(target) else SQLITE


@dataclass(frozen=True)
class Capabilities:
    """What the layers above the engine may depend on, named for what they
    need.  A new backend says what it can do here; nothing above changes.

    ``shared_by_sites``: several site processes may run on this database at
    once (PostgreSQL; a SQLite file has one site, held by its flock), so
    what they share goes through it: which site holds each node, the outbox
    tail and the webhook claims, and another instance's row may be a live
    site's rather than an earlier run's."""

    shared_by_sites: bool


_CAPABILITIES = {
    SQLITE: Capabilities(shared_by_sites=False),
    POSTGRESQL: Capabilities(shared_by_sites=True),
}


def capabilities_of(target: str) -> Capabilities:
    """What the backend of ``target`` (a ``--db`` value) can do."""
    return _CAPABILITIES[backend_of(target)]


def several_hosts(target: str) -> bool:
    """Whether ``target`` (a ``--db`` value) is a PostgreSQL URL or conninfo
    naming several servers (``postgresql://h1:p1,h2:p2/db``, libpq tries them
    in turn): a failover deployment (SCALE.md "Database failover" 1)."""
    if not is_postgres(target):
        return False
    # Imported here: a site on SQLite never loads the PostgreSQL driver.
    from psycopg import conninfo

    try:
        params = conninfo.conninfo_to_dict(target)
    except Exception:
        return False  # a broken URL: the connection says what is wrong with it
    return any("," in str(params.get(key) or "") for key in ("host", "hostaddr"))


def _passwords(target: str) -> set[str]:
    """Every spelling of the passwords in a ``--db`` URL: the userinfo's
    (``user:PW@``; up to the last ``@`` of the authority, or of the whole
    text for a URL too broken to tell) and each ``password=`` parameter,
    each as written and percent-decoded."""
    if not is_postgres(target):
        return set()
    rest = target.partition("://")[2]
    found: set[str] = set()
    authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    for userinfo in (rest[:authority_end], rest):
        credentials, at, _ = userinfo.rpartition("@")
        if at and ":" in credentials:
            found.add(credentials.split(":", 1)[1])
    for match in re.finditer(r"(?i)[?&]password=([^&#]*)", target):
        found.add(match.group(1))
    found |= {unquote(value) for value in found}
    found.discard("")
    return found


def redact(text: str, target: str | None = None) -> str:
    """``text`` (a message, a driver's error) fit for a log line or a
    terminal: no password of a URL or connection string in it, and none of
    ``target``'s (a ``--db`` value) wherever it appears, in any spelling
    (libpq's errors repeat a bad URI, or just its password, as written).
    The one helper for this: every message naming a target or carrying a
    database error goes through it (``describe`` for the target itself)."""
    if target is not None:
        # Longest first, so a password that contains another is replaced whole.
        for password in sorted(_passwords(target), key=len, reverse=True):
            text = text.replace(password, REDACTED)
    return redact_secrets(text)


def describe(target: str) -> str:
    """``target`` (a ``--db`` value) fit for a log line or a message: a URL
    without its password (``user:***@``, ``password=***``)."""
    return redact(target, target)
