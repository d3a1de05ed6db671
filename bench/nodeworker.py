"""The node's own download + compress pipeline on a list of archive URLs (B6).

``python -m bench.nodeworker --data DIR --downloads N --compressors N GID=URL ...``

Runs ``tasknet.node.worker.Worker`` over a real ``NodeStore`` exactly as the
node service does after accepting DOWNLOAD commands, in its own process and
reactor, and prints one JSON line: seconds from the first command to the
last archive, archive bytes, archives built.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorCore, IReactorTime

from tasknet.node.paths import DataDir
from tasknet.node.store import NodeStore
from tasknet.node.worker import Worker
from tasknet.runtime import IEntropy, IThreadPools, RealThreadPools, SystemEntropy
from tasknet.status import NodeCode


async def pipeline(
    args: argparse.Namespace,
    *,
    reactor: IReactorCore,
    clock: IReactorTime,
    threads: IThreadPools,
    entropy: IEntropy,
) -> dict[str, Any]:
    jobs = []
    for item in args.jobs:
        gid, _, url = item.partition("=")
        jobs.append((int(gid), url))
    data = DataDir(args.data)
    store = NodeStore(data, reactor=reactor, clock=clock, threads=threads)
    await store.create_schema()
    done: defer.Deferred[None] = defer.Deferred()
    checking = False

    def on_change() -> None:
        # Called after every status write; check whether every task is complete.
        nonlocal checking
        if checking or done.called:
            return
        checking = True

        def check(rows: list[Any]) -> None:
            nonlocal checking
            checking = False
            if len(rows) == len(jobs) and all(r.status == NodeCode.COMPLETED for r in rows):
                if not done.called:
                    done.callback(None)
            elif not done.called:
                clock.callLater(0.02, on_change)

        store.tasks().addCallback(check)

    worker = Worker(
        store,
        data,
        on_change,
        downloads=args.downloads,
        compressors=args.compressors,
        clock=clock,  # and, the same object, its TCP and its callFromThread
        threads=threads,
        rng=entropy.random(),
    )
    worker.start()
    started = time.perf_counter()
    for gid, url in jobs:
        operation_id = f"bench-b6-{gid}"
        await store.accept_download(gid, operation_id, f"gallery {gid}", url, 2)
        worker.run(gid, operation_id)
    await done
    seconds = time.perf_counter() - started
    rows = await store.tasks()
    await worker.stop()
    store.close()
    archives = sum((data.archives / r.archive).stat().st_size for r in rows if r.archive)
    return {"seconds": seconds, "archive_bytes": archives, "files": len(rows)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.nodeworker")
    p.add_argument("--data", required=True)
    p.add_argument("--downloads", type=int, default=4)
    p.add_argument("--compressors", type=int, default=1)
    p.add_argument("jobs", nargs="+", metavar="GID=URL")
    args = p.parse_args()

    # The entry point: Twisted's global reactor (task.react runs it), real
    # threads and the OS's entropy, as the node's makeService gives them.
    def run(reactor: Any) -> defer.Deferred[None]:
        d = defer.Deferred.fromCoroutine(
            pipeline(
                args,
                reactor=IReactorCore(reactor),
                clock=IReactorTime(reactor),
                threads=RealThreadPools(),
                entropy=SystemEntropy(),
            )
        )
        return d.addCallback(lambda result: print(json.dumps(result), flush=True))

    task.react(run)


if __name__ == "__main__":
    main()
