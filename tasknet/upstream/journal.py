"""Counts, charges and the journal of every side effect the upstream applied.

``posts`` and ``entries`` count only archive POSTs whose side effect was
applied (charged), in order; ``postAttempts`` counts every archive POST that
reached the upstream, applied or not, so a drill can tell "the site sent a
second POST" from "the upstream charged twice". The request log keeps the last
``REQUEST_LOG_LIMIT`` requests for debugging a drill.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

REQUEST_LOG_LIMIT = 10_000


@dataclass(frozen=True)
class Submission:
    seq: int
    gid: int
    submission: int  # this gid's submission number, 1-based
    at: float
    cost: int

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "gid": self.gid,
            "submission": self.submission,
            "at": self.at,
            "cost": self.cost,
        }


class Journal:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.charged = 0
        self.posts: Counter[int] = Counter()
        self.post_attempts: Counter[int] = Counter()
        self.file_gets: Counter[str] = Counter()
        self.ranged_gets: Counter[str] = Counter()
        self.entries: list[Submission] = []
        self.last_at: dict[int, float] = {}
        self.request_log: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_LIMIT)
        self._request_seq = 0

    def record_request(
        self, method: str, path: str, range_header: str | None, at: float
    ) -> dict[str, Any]:
        """Log a request; the returned entry gets its ``fault`` filled in later."""
        self.requests += 1
        self._request_seq += 1
        entry: dict[str, Any] = {
            "seq": self._request_seq,
            "method": method,
            "path": path,
            "range": range_header,
            "at": at,
            "fault": None,
        }
        self.request_log.append(entry)
        return entry

    def record_post_attempt(self, gid: int) -> None:
        self.post_attempts[gid] += 1

    def record_file_get(self, name: str, ranged: bool) -> None:
        self.file_gets[name] += 1
        if ranged:
            self.ranged_gets[name] += 1

    def submit(self, gid: int, cost: int, at: float) -> Submission:
        """Apply one archive submission: count it, charge it, journal it."""
        self.posts[gid] += 1
        self.charged += cost
        self.last_at[gid] = at
        entry = Submission(len(self.entries) + 1, gid, self.posts[gid], at, cost)
        self.entries.append(entry)
        return entry

    def audit(self, gid: int) -> dict[str, Any]:
        return {"gid": gid, "submissions": self.posts[gid], "lastAt": self.last_at.get(gid)}

    def stats(self) -> dict[str, Any]:
        return {
            "posts": {str(gid): n for gid, n in sorted(self.posts.items())},
            "postAttempts": {str(gid): n for gid, n in sorted(self.post_attempts.items())},
            "charged": self.charged,
            "requests": self.requests,
            "fileGets": dict(sorted(self.file_gets.items())),
            "rangedGets": dict(sorted(self.ranged_gets.items())),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": [entry.to_json() for entry in self.entries],
            "requests": list(self.request_log),
        }
