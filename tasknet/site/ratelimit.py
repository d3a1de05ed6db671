"""A per-user rate limit on create (INTERFACES.md "Growth"; docs/operations.md
"Retention and limits"): one token bucket per user, timed on the site's clock.

A bucket holds at most ``burst`` tokens and gains ``rate`` tokens a second; a
create takes one.  An empty bucket refuses with the seconds until the next
token, which the API answers as ``429 rate_limited`` with ``Retry-After``.
The check runs before anything is read or written, so a refused create
costs no transaction and leaves no trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime

#: Defaults of ``--create-rate`` / ``--create-burst``: far above what one
#: user needs by hand and above the B2 benchmark (32 clients in a closed
#: loop, one user, ~350-600 creates/s), so only a runaway client is limited.
DEFAULT_RATE = 1000.0
DEFAULT_BURST = 2000

#: Buckets kept before full (idle) ones are forgotten: a full bucket is the
#: same as none, so forgetting it changes no answer.
MAX_TRACKED = 10_000


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class CreateRateLimiter:
    """Token buckets per user id on ``clock`` (an ``IReactorTime``: the
    reactor, or a ``task.Clock`` in tests; only ``seconds()`` is used)."""

    def __init__(
        self, rate: float, burst: int, clock: IReactorTime, *, max_tracked: int = MAX_TRACKED
    ) -> None:
        if not rate > 0 or burst < 1 or max_tracked < 1:
            raise ValueError("the create rate must be > 0 and the burst >= 1")
        self.rate = float(rate)
        self.burst = int(burst)
        self._clock = clock
        self._max_tracked = max_tracked
        self._buckets: dict[int, _Bucket] = {}

    def take(self, user_id: int) -> float:
        """Take a token for one create of ``user_id``: ``0.0`` if allowed,
        else the seconds until a token is there (nothing is taken)."""
        now = self._clock.seconds()
        bucket = self._buckets.get(user_id)
        if bucket is None:
            if len(self._buckets) >= self._max_tracked:
                self._forget_full(now)
            bucket = self._buckets[user_id] = _Bucket(float(self.burst), now)
        else:
            # max(): a clock that steps back refills nothing and takes nothing.
            elapsed = max(0.0, now - bucket.at)
            bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate)
            bucket.at = max(bucket.at, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        full_after = self.burst / self.rate
        for user_id in [u for u, b in self._buckets.items() if now - b.at >= full_after]:
            del self._buckets[user_id]

    @property
    def tracked(self) -> int:
        """Users with a bucket in memory."""
        return len(self._buckets)
