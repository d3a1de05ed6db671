"""The event trace of a simulated run and its digest.

Every event the world runs adds one line: the simulated time in whole
microseconds since the world's epoch, who ran it (a process name, ``net``
or ``world``) and what (a callable's qualified name, a segment's
connection, direction, kind and length, a fault).  Nothing in a line comes
from ``repr``, ``id`` or a hash, so the same seed gives the same lines, and
the same sha256, in any process and under any ``PYTHONHASHSEED``.

Bytes on a connection enter the trace by length only: Twisted's HTTP
server stamps a ``Date`` header from the wall clock (fixed length, varying
text), which is no choice of the simulation.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import deque
from typing import Any

__all__ = ["Trace", "failure_name", "label"]


class Trace:
    """A running sha256 over the lines, and the last ``keep`` lines (or all
    of them with ``keep=None``) for a person to read."""

    def __init__(self, keep: int | None = 0) -> None:
        self._hash = hashlib.sha256()
        self.count = 0
        self.lines: deque[str] = deque(maxlen=keep)

    def record(self, micros: int, who: str, what: str) -> None:
        line = f"{micros} {who} {what}\n"
        self._hash.update(line.encode())
        self.count += 1
        if self.lines.maxlen != 0:
            self.lines.append(line)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def text(self) -> str:
        return "".join(self.lines)


def label(fn: Any) -> str:
    """A stable name for a callable: its qualified name, never its repr."""
    if isinstance(fn, functools.partial):
        return f"partial({label(fn.func)})"
    name = getattr(fn, "__qualname__", None)
    if name is None:
        name = type(fn).__qualname__
    # Some wrappers (automat's) name themselves by their function's repr.
    return _ADDRESS.sub("", str(name))


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def failure_name(failure: Any) -> str:
    """The qualified name of a Failure's exception type."""
    kind = getattr(failure, "type", None)
    return kind.__qualname__ if kind is not None else "?"
