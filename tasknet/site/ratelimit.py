"""A per-user rate limit on create (INTERFACES.md "Growth"; docs/operations.md
"Retention and limits"): one token bucket per user, timed on the site's clock.

A bucket holds at most ``burst`` tokens and gains ``rate`` tokens a second; a
create takes one.  An empty bucket refuses with the seconds until the next
token, which the API answers as ``429 rate_limited`` with ``Retry-After``.
The check runs before anything is read or written, so a refused create
costs no transaction and leaves no trace.

:class:`AuthFailureLimiter` slows credential guessing the same way, per
client address (issue 38).
"""

from __future__ import annotations

import ipaddress
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


# Credential guessing (issue 38: 3,000 wrong sign-ins in 2.4 s, nothing slowed
# or recorded) ----------------------------------------------------------------

#: Defaults of the authentication limit per client address: this many wrong
#: tokens at once, then ten a second.  Generous for a client by hand, a
#: NAT's users, or a fuzzer's run (schemathesis sends hundreds of wrong
#: tokens on purpose); still a hundredth of the 1,250 a second guessed before.
DEFAULT_AUTH_FAILURES = 1000
DEFAULT_AUTH_FAILURE_RATE = 10.0


class AuthFailureLimiter:
    """Wrong tokens per client address (a sign-in's, a bearer token's), on
    ``clock``: a bucket of ``threshold`` attempts that refills ``rate`` a
    second.  Each attempt takes one before its token is looked up
    (:meth:`take`: so attempts in flight together are counted too); one that
    succeeds gives it back (:meth:`give_back`).  An empty bucket refuses
    before any lookup, with the seconds to wait.  The key is the address;
    an IPv6 address counts by its /64 (one host's share of addresses)."""

    def __init__(
        self,
        clock: IReactorTime,
        *,
        threshold: int = DEFAULT_AUTH_FAILURES,
        rate: float = DEFAULT_AUTH_FAILURE_RATE,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        if threshold < 1 or not rate > 0 or max_tracked < 1:
            raise ValueError("the threshold must be >= 1 and the rate > 0")
        self.threshold = threshold
        self.rate = float(rate)
        self._clock = clock
        self._max_tracked = max_tracked
        self._buckets: dict[str, _Bucket] = {}

    @staticmethod
    def key(address: str) -> str:
        """What ``address`` is counted as: itself, or its /64 for IPv6."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return address  # not an IP (a unix socket): one key
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped)
            return str(ipaddress.ip_network(f"{ip}/64", strict=False))
        return str(ip)

    def _bucket(self, address: str, now: float) -> _Bucket:
        key = self.key(address)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max_tracked:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(float(self.threshold), now)
        else:
            elapsed = max(0.0, now - bucket.at)
            bucket.tokens = min(float(self.threshold), bucket.tokens + elapsed * self.rate)
            bucket.at = max(bucket.at, now)
        return bucket

    def take(self, address: str) -> float:
        """Take one attempt for ``address``: ``0.0`` if allowed, else the
        seconds until one is there (nothing taken)."""
        bucket = self._bucket(address, self._clock.seconds())
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def give_back(self, address: str) -> None:
        """The attempt :meth:`take` took found its user: it costs nothing."""
        bucket = self._bucket(address, self._clock.seconds())
        bucket.tokens = min(float(self.threshold), bucket.tokens + 1.0)

    def _forget_full(self, now: float) -> None:
        full_after = self.threshold / self.rate
        for key in [k for k, b in self._buckets.items() if now - b.at >= full_after]:
            del self._buckets[key]
        if len(self._buckets) >= self._max_tracked:
            # Still full of recent guessers: the oldest is forgotten (bounded memory).
            del self._buckets[min(self._buckets, key=lambda k: self._buckets[k].at)]

    @property
    def tracked(self) -> int:
        """Addresses with a bucket in memory."""
        return len(self._buckets)
