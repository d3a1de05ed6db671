"""HTTP create load for B2: C concurrent clients POSTing ``/api/tasks``.

``python -m bench.createload --url URL --token T --clients C GID ...``

Each client takes the next gid from the shared list and POSTs
``{"gid": g, "token": "..."}`` with the bearer token over a persistent
loopback connection, one request at a time, until the list is empty.  Prints
one JSON line: elapsed seconds, per-request latencies (ms) and any answer that
was not ``201 Created``.
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


async def client(
    http: HTTPClient, url: str, token: str, gids: deque[int], out: dict[str, Any]
) -> None:
    headers = Headers({"Authorization": [f"Bearer {token}"], "Content-Type": ["application/json"]})
    while gids:
        gid = gids.popleft()
        body = json.dumps({"gid": gid, "token": f"bench-{gid}"}).encode()
        started = time.perf_counter()
        response = await http.post(f"{url}/api/tasks", data=body, headers=headers)
        content = await response.content()
        out["latencies_ms"].append((time.perf_counter() - started) * 1000)
        if response.code != 201:
            out["failures"].append(
                {"gid": gid, "code": response.code, "body": content[:300].decode()}
            )


async def main(reactor: Any, args: argparse.Namespace) -> None:
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = args.clients
    agent: Any = Agent(reactor, pool=pool)
    http = HTTPClient(agent)
    gids = deque(args.gids)
    out: dict[str, Any] = {"latencies_ms": [], "failures": []}
    started = time.perf_counter()
    await defer.gatherResults(
        [
            defer.Deferred.fromCoroutine(client(http, args.url, args.token, gids, out))
            for _ in range(args.clients)
        ],
        consumeErrors=True,
    )
    out["seconds"] = time.perf_counter() - started
    await pool.closeCachedConnections()
    print(json.dumps(out), flush=True)


def run() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.createload")
    p.add_argument("--url", required=True, help="the site's HTTP base URL")
    p.add_argument("--token", required=True)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("gids", nargs="+", type=int)
    args = p.parse_args()
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, args)))


if __name__ == "__main__":
    run()
