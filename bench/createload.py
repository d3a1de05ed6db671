"""HTTP create load for B2: ``POST /api/tasks``, closed or open loop.

``python -m bench.createload --url URL --token T --clients C GID ...``
(closed loop) or ``... --rate R [--warmup N] GID ...`` (open loop).

Closed loop (B2b): C concurrent clients; each takes the next gid from the
shared list and POSTs ``{"gid": g, "token": "..."}`` with the bearer token
over a persistent loopback connection, one request at a time, until the
list is empty.  A client waits for its answer before it sends again, so a
stall of the site slows the load down and hides itself (coordinated
omission): the latencies are a queueing figure.

Open loop (B2a, as wrk2 does it): request ``k`` is due at ``t0 + k / R``
whatever happened to the earlier ones (as many in flight as it takes, over
a pool of keep-alive connections that grows when they are all busy), and
its latency is measured from that *intended* start, so a stall shows as
the latency of every request that should have started during it.  The
first ``--warmup`` requests are sent on the same schedule but not counted
(connections opened, the site's first requests).  ``lag_ms`` is how late
the generator itself sent each one (its own reactor's delay, to tell the
generator's lateness from the site's).

Prints one JSON line: elapsed seconds, per-request latencies (ms) and any
answer that was not ``201 Created``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from typing import Any

from treq.client import HTTPClient
from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers

#: Keep-alive connections the open loop keeps for reuse (more are opened
#: while all are busy; those close after their answer).
OPEN_LOOP_POOL = 256


def _headers(token: str) -> Headers:
    return Headers({"Authorization": [f"Bearer {token}"], "Content-Type": ["application/json"]})


async def _post(http: HTTPClient, url: str, headers: Headers, gid: int) -> tuple[int, bytes]:
    body = json.dumps({"gid": gid, "token": f"bench-{gid}"}).encode()
    response = await http.post(f"{url}/api/tasks", data=body, headers=headers)
    content = await response.content()
    return int(response.code), content


def _failure(out: dict[str, Any], gid: int, code: int, content: bytes) -> None:
    out["failures"].append({"gid": gid, "code": code, "body": content[:300].decode()})


async def client(
    http: HTTPClient, url: str, token: str, gids: deque[int], out: dict[str, Any]
) -> None:
    headers = _headers(token)
    while gids:
        gid = gids.popleft()
        started = time.perf_counter()
        code, content = await _post(http, url, headers, gid)
        out["latencies_ms"].append((time.perf_counter() - started) * 1000)
        if code != 201:
            _failure(out, gid, code, content)


async def closed_loop(reactor: Any, http: HTTPClient, args: argparse.Namespace) -> dict[str, Any]:
    gids = deque(args.gids)
    out: dict[str, Any] = {"mode": "closed", "latencies_ms": [], "failures": []}
    started = time.perf_counter()
    await defer.gatherResults(
        [
            defer.Deferred.fromCoroutine(client(http, args.url, args.token, gids, out))
            for _ in range(args.clients)
        ],
        consumeErrors=True,
    )
    out["seconds"] = time.perf_counter() - started
    return out


async def open_loop(reactor: Any, http: HTTPClient, args: argparse.Namespace) -> dict[str, Any]:
    """Each gid's POST at its own intended time (``t0 + k / rate``)."""
    headers = _headers(args.token)
    gids = list(args.gids)
    interval = 1.0 / args.rate
    out: dict[str, Any] = {
        "mode": "open",
        "rate": args.rate,
        "warmup": args.warmup,
        "latencies_ms": [],
        "service_ms": [],
        "lag_ms": [],
        "intended_s": [],
        "failures": [],
        "max_in_flight": 0,
    }
    finished: defer.Deferred[None] = defer.Deferred()
    state = {"next": 0, "in_flight": 0, "done": 0}
    last_done = [0.0]
    t0 = time.perf_counter() + 0.05

    async def one(k: int, gid: int, intended: float) -> None:
        sent = time.perf_counter()
        try:
            code, content = await _post(http, args.url, headers, gid)
        except Exception as e:  # a refused or reset connection is a failed create
            code, content = 0, repr(e).encode()
        now = time.perf_counter()
        state["in_flight"] -= 1
        state["done"] += 1
        last_done[0] = now
        if k >= args.warmup:
            out["latencies_ms"].append((now - intended) * 1000)
            out["service_ms"].append((now - sent) * 1000)
            out["lag_ms"].append((sent - intended) * 1000)
            out["intended_s"].append(intended - t0)
            if code != 201:
                _failure(out, gid, code, content)
        if state["done"] == len(gids) and not finished.called:
            finished.callback(None)

    def tick() -> None:
        # Send every request that is due (several at once if the reactor
        # was late), then sleep until the next one is.
        now = time.perf_counter()
        while state["next"] < len(gids) and t0 + state["next"] * interval <= now:
            k = state["next"]
            state["next"] += 1
            state["in_flight"] += 1
            out["max_in_flight"] = max(out["max_in_flight"], state["in_flight"])
            defer.Deferred.fromCoroutine(one(k, gids[k], t0 + k * interval))
        if state["next"] < len(gids):
            reactor.callLater(max(0.0, t0 + state["next"] * interval - time.perf_counter()), tick)

    if not gids:
        finished.callback(None)
    else:
        reactor.callLater(max(0.0, t0 - time.perf_counter()), tick)
    await finished
    measured_start = t0 + min(args.warmup, len(gids)) * interval
    out["seconds"] = last_done[0] - measured_start
    out["intended_seconds"] = (len(gids) - min(args.warmup, len(gids))) * interval
    return out


async def main(reactor: Any, args: argparse.Namespace) -> None:
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = OPEN_LOOP_POOL if args.rate else args.clients
    agent: Any = Agent(reactor, pool=pool)
    http = HTTPClient(agent)
    if args.rate:
        out = await open_loop(reactor, http, args)
    else:
        out = await closed_loop(reactor, http, args)
    await pool.closeCachedConnections()
    print(json.dumps(out), flush=True)


def run() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.createload")
    p.add_argument("--url", required=True, help="the site's HTTP base URL")
    p.add_argument("--token", required=True)
    p.add_argument("--clients", type=int, default=32, help="closed loop: concurrent clients")
    p.add_argument(
        "--rate", type=float, default=0.0, help="open loop: requests per second (0: closed loop)"
    )
    p.add_argument(
        "--warmup", type=int, default=0, help="open loop: first requests sent but not counted"
    )
    p.add_argument("gids", nargs="+", type=int)
    args = p.parse_args()
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, args)))


if __name__ == "__main__":
    run()
