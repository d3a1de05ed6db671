"""Registers a file as an archive a node holds, through the node's own store.

``python -m bench.serveseed --data DIR --gid G --operation-id OP --name NAME
--size BYTES --sha256 HEX`` records a DOWNLOAD for the generation and marks
it complete with its archive (``NodeStore.accept_download`` then
``NodeStore.complete``: the same transactions a real download ends with),
so the node started on ``DIR`` afterwards serves it.  The archive's file
must already be at ``DataDir(DIR).archive_path(G, OP)``.  Run before the
node starts (one writer at a time on the node's database).
"""

from __future__ import annotations

import argparse
from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorCore, IReactorTime

from tasknet.node.paths import DataDir
from tasknet.node.store import NodeStore
from tasknet.runtime import RealThreadPools


async def register(args: argparse.Namespace, reactor: Any) -> None:
    data = DataDir(args.data)
    path = data.archive_path(args.gid, args.operation_id)
    if not path.is_file() or path.stat().st_size != args.size:
        raise SystemExit(f"{path} is not there with {args.size} bytes")
    store = NodeStore(
        data, reactor=IReactorCore(reactor), clock=IReactorTime(reactor), threads=RealThreadPools()
    )
    try:
        await store.create_schema()
        await store.accept_download(
            args.gid, args.operation_id, args.name, "http://127.0.0.1/bench", 2, size=args.size
        )
        done = await store.complete(
            args.gid, args.operation_id, path.name, size=args.size, sha256=args.sha256
        )
        if not done:
            raise SystemExit("the node's store did not take the completion")
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serveseed")
    parser.add_argument("--data", required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--operation-id", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--sha256", required=True)
    args = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(register(args, reactor)))


if __name__ == "__main__":
    main()
