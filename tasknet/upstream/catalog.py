"""Deterministic gallery metadata and archive bytes for any gid in 1..2^31.

Drills and tests need no fixtures: every gid has a stable title, page count,
archive size and cost, all pure functions of the gid. Archive bytes are a
pseudo-random block seeded by the gid and repeated; the period is a prime so
an offset mix-up by any power-of-two chunk size still changes the bytes, and the
block is random so compressors cannot shrink it much (like real images).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

GID_MIN = 1
GID_MAX = 2**31
MIN_SIZE = 64 * 1024
MAX_SIZE = 1024 * 1024
MIN_COST = 1
MAX_COST = 20
PATTERN_PERIOD = 65521  # largest prime below 2**16

_THEMES = ("夏日", "星空", "旅途", "雨夜", "花火", "海辺", "桜", "古城", "Winter", "Ocean")
_SUBJECTS = ("物语", "画集", "作品集", "スケッチ", "記録", "Artbook", "合集", "写真集")


class InvalidGid(ValueError):
    """The gid is not an integer in GID_MIN..GID_MAX."""


@dataclass(frozen=True)
class Gallery:
    gid: int
    title: str
    pages: int
    size: int
    cost: int

    def to_json(self) -> dict[str, Any]:
        return {
            "gid": self.gid,
            "title": self.title,
            "pages": self.pages,
            "size": self.size,
            "cost": self.cost,
        }


def check_gid(gid: int) -> int:
    if isinstance(gid, bool) or not isinstance(gid, int) or not GID_MIN <= gid <= GID_MAX:
        raise InvalidGid(f"gid must be an integer in {GID_MIN}..{GID_MAX}, got {gid!r}")
    return gid


def _mix(gid: int) -> int:
    digest = hashlib.sha256(b"tasknet-upstream:%d" % gid).digest()
    return int.from_bytes(digest[:16], "big")


@lru_cache(maxsize=4096)
def gallery(gid: int) -> Gallery:
    """The metadata of ``gid`` (raises InvalidGid when out of range)."""
    check_gid(gid)
    h = _mix(gid)
    theme = _THEMES[h % len(_THEMES)]
    subject = _SUBJECTS[(h >> 8) % len(_SUBJECTS)]
    return Gallery(
        gid=gid,
        title=f"{theme}{subject} #{gid}",
        pages=10 + (h >> 16) % 291,
        size=MIN_SIZE + (h >> 32) % (MAX_SIZE - MIN_SIZE + 1),
        cost=MIN_COST + (h >> 64) % (MAX_COST - MIN_COST + 1),
    )


@lru_cache(maxsize=64)
def _pattern(gid: int) -> bytes:
    return random.Random(gid).randbytes(PATTERN_PERIOD)


def archive_slice(gid: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the archive of ``gid`` (clipped to its size)."""
    size = gallery(gid).size
    start, end = max(0, start), min(end, size)
    if start >= end:
        return b""
    pattern = _pattern(gid)
    first = start % PATTERN_PERIOD
    length = end - start
    if first + length <= PATTERN_PERIOD:
        return pattern[first : first + length]
    repeats = (first + length) // PATTERN_PERIOD + 1
    return (pattern * repeats)[first : first + length]


def archive_bytes(gid: int) -> bytes:
    """The whole archive of ``gid``: what a correct download must end up with."""
    return archive_slice(gid, 0, gallery(gid).size)
