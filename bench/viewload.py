"""HTTP view load for B9: each query of a plan, by 1 or N concurrent clients.

``python -m bench.viewload PLAN.json`` prints one JSON line:
``{"<query name>": {"ms": [...], "errors": [...]}, ...}``.

The plan: ``{"host", "port", "clients", "max_samples", "min_samples",
"seconds", "queries": [{"name", "path", "token"}, ...]}``.  The queries run
one after another; for each, ``clients`` threads (each its own keep-alive
connection) start together and send the same ``GET`` one request at a time
until ``max_samples`` answers in all, or ``seconds`` have passed and each
has at least ``min_samples / clients`` (at least one).  The answer is read
whole (it is what a browser waits for) but not parsed.  Latency per
request: from sending it to the last byte of its answer.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from typing import Any


def _run_query(plan: dict[str, Any], query: dict[str, Any]) -> dict[str, Any]:
    clients = int(plan["clients"])
    max_samples = int(plan["max_samples"])
    least_each = max(1, -(-int(plan["min_samples"]) // clients))
    seconds = float(plan["seconds"])
    headers = {"Authorization": f"Bearer {query['token']}"}
    ms: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)
    sizes: list[int] = []

    def client() -> None:
        connection = http.client.HTTPConnection(plan["host"], int(plan["port"]), timeout=600)
        mine = 0
        try:
            start.wait()
            began = time.perf_counter()
            while True:
                with lock:
                    if len(ms) >= max_samples:
                        return
                if mine >= least_each and time.perf_counter() - began > seconds:
                    return
                t0 = time.perf_counter()
                try:
                    connection.request("GET", query["path"], headers=headers)
                    response = connection.getresponse()
                    body = response.read()
                except (OSError, http.client.HTTPException) as e:
                    connection.close()
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    return
                elapsed = (time.perf_counter() - t0) * 1000
                mine += 1
                with lock:
                    if response.status != 200:
                        errors.append(
                            f"HTTP {response.status}: {body[:200].decode(errors='replace')}"
                        )
                    else:
                        ms.append(elapsed)
                        sizes.append(len(body))
        finally:
            connection.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"ms": ms, "errors": errors[:5], "bytes": max(sizes, default=0)}


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    out = {query["name"]: _run_query(plan, query) for query in plan["queries"]}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
