"""A small seeded scenario on the real mock upstream, for the trace digest
and the figures: clients download archives (retrying, with timeouts) and
record each in a real SQLite file through adbapi, while the seed cuts,
resets, stalls and slows their links.

    python -m tests.sim.scenario SEED DIR [DOWNLOADS]   # one JSON line
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from tasknet.sim import LinkProfile, SimConnectionPool, SimReactor, World
from tasknet.upstream import catalog
from tests.sim.worlds import agent, fetch, serve_upstream

CLIENTS = ("client-1", "client-2")


def _record(cursor: sqlite3.Cursor, who: str, gid: int, size: int) -> int:
    cursor.execute("CREATE TABLE IF NOT EXISTS fetched (who TEXT, gid INTEGER, size INTEGER)")
    cursor.execute("INSERT INTO fetched VALUES (?, ?, ?)", (who, gid, size))
    cursor.execute("SELECT count(*) FROM fetched")
    return int(cursor.fetchone()[0])


async def _client(
    world: World, reactor: SimReactor, pool: SimConnectionPool, gids: list[int], tally: dict
) -> None:
    web = agent(reactor)
    for gid in gids:
        attempt = 0
        while True:
            attempt += 1
            try:
                url = f"http://127.0.0.1:7200/files/{gid}-1.bin"
                code, body = await fetch(web, url, timeout=5, clock=reactor)
                if code == 200 and body == catalog.archive_bytes(gid):
                    break
            except Exception as e:  # reset, timeout, partial body: try again
                tally["failures"][type(e).__name__] = tally["failures"].get(type(e).__name__, 0) + 1
            await deferLater(reactor, world.draw(0.1, 1.0) * attempt, lambda: None)
        tally["rows"] = await pool.runInteraction(_record, reactor.name, gid, len(body))
        tally["done"] += 1


def _faults(world: World, horizon: float) -> None:
    """Faults at times drawn from the seed (the world's own events)."""
    network = world.network
    rng = world.rng
    for _ in range(8):
        at = world.now + rng.uniform(0, horizon)
        kind = rng.choice(("partition", "reset", "stall", "slow"))
        who = rng.choice(CLIENTS)
        if kind == "partition":
            world.call_at(at, network.partition, who, "upstream")
            world.call_at(at + rng.uniform(0.5, 8), network.heal, who, "upstream")
        elif kind == "reset":

            def reset(who: str = who) -> None:
                for connection in network.between(who, "upstream"):
                    connection.reset()

            world.call_at(at, reset)
        elif kind == "stall":

            def stall(who: str = who, after: int = rng.randrange(0, 4096)) -> None:
                for c in network.between(who, "upstream"):
                    c.stall("upstream", after)
                    world.call_later(rng.uniform(0.5, 8), c.unstall)

            world.call_at(at, stall)
        else:
            bandwidth = rng.uniform(1e5, 1e6)
            world.call_at(
                at, lambda who=who, b=bandwidth: network.set_link(who, "upstream", bandwidth=b)
            )
            world.call_at(at + rng.uniform(1, 5), network.reset_link, who, "upstream")


def run(seed: int, directory: str, downloads: int = 6) -> dict[str, Any]:
    started = time.perf_counter()
    # Links of 2 MB/s: a download takes a few tenths of a simulated second.
    world = World(seed, link=LinkProfile(latency=(0.0005, 0.005), bandwidth=2e6))
    serve_upstream(world, seed=seed)
    database = str(Path(directory) / f"scenario-{seed}.sqlite")
    tally: dict[str, Any] = {"done": 0, "rows": 0, "failures": {}}
    waits = []
    for name in CLIENTS:
        reactor = world.add_process(name)
        pool = SimConnectionPool(
            reactor, "sqlite3", database, check_same_thread=False, cp_min=1, cp_max=1
        )
        reactor.startRunning()
        gids = [world.rng.randrange(1, 60) for _ in range(downloads)]
        waits.append(Deferred.fromCoroutine(_client(world, reactor, pool, gids, tally)))
    _faults(world, horizon=downloads * 0.5)
    finished = world.run_until(lambda: all(d.called for d in waits), within=3600)
    for d in waits:
        world.wait(d)
    world.assert_clean()
    wall = time.perf_counter() - started
    return {
        "seed": seed,
        "finished": finished,
        "done": tally["done"],
        "rows": tally["rows"],
        "failures": dict(sorted(tally["failures"].items())),
        "faults": dict(sorted(world.faults.items())),
        "events": world.events,
        "bytes": world.network.bytes_delivered,
        "simulated": world.elapsed(),
        "wall": wall,
        "digest": world.trace.hexdigest(),
    }


if __name__ == "__main__":
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    print(json.dumps(run(int(sys.argv[1]), sys.argv[2], count)))
