"""The site's timestamp text, on the Python side: ISO 8601, UTC,
milliseconds, ``Z`` (``2026-05-09T07:35:25.123Z``).

The one format every timestamp is stored in, written by the database
(:mod:`tasknet.site.storage.engine.sql`'s ``{now}``, the same text on both
engines) or by Python (:func:`iso`), so that timestamps compare as strings
on both backends; the API shows the same text.  Older rows may carry more
digits (microseconds) or none: :func:`parse` reads any ISO 8601 text.

Time is given, never read here: the callers pass Unix seconds from their
own clock.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso(seconds: float) -> str:
    """Unix seconds as our timestamp text (milliseconds, truncated)."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def truncated(seconds: float) -> float:
    """Unix seconds cut to the millisecond :func:`iso` shows (the value the
    SQLite connections' ``tasknet_now()`` answers, so that SQLite's
    ``strftime`` of it, which rounds to the nearest millisecond, writes
    exactly ``iso(seconds)``)."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000).timestamp()


def precise(seconds: float) -> str:
    """Unix seconds as ISO 8601 with microseconds and an offset (what
    PostgreSQL's ``timestamptz`` reads: the session's ``tasknet.now``)."""
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def parse(text: str) -> datetime:
    """A stored timestamp as an aware datetime (UTC when it names no zone);
    ``ValueError`` if it is not ISO 8601."""
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def unix(text: str | None) -> float | None:
    """A stored timestamp as Unix seconds; ``None`` for none or an unreadable one."""
    if not text:
        return None
    try:
        return parse(text).timestamp()
    except ValueError:
        return None
