"""Sizes and durations as options spell them (DELIVERY.md).

A size is bytes, or a number with ``kB``, ``MB``, ``GB`` (powers of 1,000) or
``KiB``, ``MiB``, ``GiB`` (powers of 1,024); a duration is seconds, or a
number with ``s``, ``m``, ``h`` or ``d``.  Both sides of the wire use them, so
they live beside the other shared leaves.
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_duration", "parse_rate", "parse_size"]

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER_AND_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def _parse(text: str, units: dict[str, int], what: str) -> float:
    match = _NUMBER_AND_UNIT.fullmatch(text)
    if match is None or match.group(2) not in units:
        spelled = ", ".join(repr(u) for u in units if u)
        raise ValueError(f"{what} must be a number, optionally with one of {spelled}: {text!r}")
    value = float(match.group(1)) * units[match.group(2)]
    if not math.isfinite(value):
        raise ValueError(f"{what} is too large: {text!r}")
    return value


def parse_size(text: str) -> int:
    """Bytes: ``"1073741824"``, ``"1GiB"``, ``"50MB"`` (whole bytes, rounded down)."""
    return int(_parse(text, _SIZE_UNITS, "a size"))


def parse_rate(text: str) -> int:
    """Bytes per second: a size with an optional ``/s`` (``"50MB/s"``)."""
    return parse_size(text.removesuffix("/s"))


def parse_duration(text: str) -> float:
    """Seconds: ``"600"``, ``"10m"``, ``"7d"``, ``"1.5h"``."""
    return _parse(text, _DURATION_UNITS, "a duration")
