"""Log lines that a peer can repeat at will, at most once per interval per key.

A node with a wrong secret, or a peer that connects and never logs in, can
make the same event happen every second forever.  :class:`RateLimitedLog`
logs the first event of a key, drops (and counts) the ones that follow within
``interval`` seconds, and logs the first event after the interval with the
count of those it dropped (field ``repeats``; the text says "N more since the
last line").  So a steady flood is one line per interval per key.

No timers: the clock is only read, so nothing is left scheduled when the
listener stops.  At most ``max_keys`` keys are tracked (expired ones are
forgotten first); past that, events share one overflow key, so a flood of
distinct keys costs bounded memory.

What a peer sends goes into a line only through :func:`clip`: a 65,000
character ``Goodbye`` reason is 200 characters and its length (issue 38: a
thousand of them were 65 MB of log in four seconds).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger, LogLevel

__all__ = ["LOG_TEXT_LIMIT", "OVERFLOW_KEY", "RateLimitedLog", "clip"]

#: The key under which events are counted once ``max_keys`` keys are tracked.
OVERFLOW_KEY = ("(other keys)",)

#: How much of a peer's text a log line carries.
LOG_TEXT_LIMIT = 200


def clip(text: str, limit: int = LOG_TEXT_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was when cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters in all)"


class RateLimitedLog:
    """One log line per key per ``interval`` seconds, with the count of those dropped."""

    def __init__(
        self,
        log: Logger,
        clock: IReactorTime,
        *,
        interval: float = 60.0,
        level: LogLevel = LogLevel.warn,
        max_keys: int = 1000,
    ) -> None:
        self.log = log
        self.clock = clock
        self.interval = interval
        self.level = level
        self.max_keys = max_keys
        #: key -> [time of the last line logged, events dropped since]
        self._windows: dict[Hashable, list[float]] = {}

    def emit(
        self, key: Hashable, format: str, *, level: LogLevel | None = None, **fields: Any
    ) -> None:
        """Log ``format`` (at ``level``, default the instance's) unless ``key``
        was logged less than ``interval`` seconds ago."""
        now = self.clock.seconds()
        windows = self._windows
        if key not in windows and len(windows) >= self.max_keys:
            self._forget_expired(now)
            if len(windows) >= self.max_keys:
                key = OVERFLOW_KEY
        window = windows.get(key)
        if window is not None and now - window[0] < self.interval:
            window[1] += 1
            return
        repeats = int(window[1]) if window is not None else 0
        windows[key] = [now, 0]
        if repeats:
            format += " ({repeats} more since the last line)"
        self.log.emit(self.level if level is None else level, format, repeats=repeats, **fields)

    def _forget_expired(self, now: float) -> None:
        # A key whose interval is over and that dropped nothing has nothing to
        # report; one that did loses its count (the price of the bound).
        for key in [k for k, (logged, _) in self._windows.items() if now - logged >= self.interval]:
            del self._windows[key]
