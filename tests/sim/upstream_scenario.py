"""A seeded run against the real mock upstream with its own faults on.

The upstream is built by its composition root (``makeService``) on a
simulated process, its ``--seed`` drawn from the world's seed; its fault
table holds rules of every kind, each firing with a probability, so which
request gets which fault is the upstream's own draw. Two clients submit
archives (``POST``, retried after a lost answer only once the audit says
nothing was applied) and download them; at times drawn from the seed the
world drops every hung request at once (``drop_hung``, several
connections aborted together).

    python -m tests.sim.upstream_scenario SEED   # one JSON line
"""

from __future__ import annotations

import json
import sys
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from tasknet.sim import LinkProfile, SimReactor, World
from tasknet.upstream import catalog
from tasknet.upstream.app import UpstreamApp
from tests.sim.worlds import agent, fetch, serve_upstream

CLIENTS = ("client-1", "client-2")
BASE = "http://127.0.0.1:7200"
ATTEMPTS = 6
ARCHIVE = "/api/galleries/*/archive"


def _rule(method: str, path: str, fault: str, probability: float, **params: Any) -> dict:
    rule = {"method": method, "path": path, "fault": fault, "params": params}
    return {**rule, "probability": probability}


# Every fault kind but ``missing``, each firing with a probability.
RULES = [
    _rule("GET", "/api/galleries/*", "latency", 0.3, ms=400),
    _rule("POST", ARCHIVE, "timeout", 0.25),
    _rule("POST", ARCHIVE, "commit_then_drop", 0.2),
    _rule("POST", ARCHIVE, "error", 0.2, status=503, charged=True),
    _rule("POST", ARCHIVE, "reject", 0.1),
    _rule("GET", "/files/*", "drop_before", 0.15),
    _rule("GET", "/files/*", "reset_mid_body", 0.2, after_bytes=30_000),
    _rule("GET", "/files/*", "slow_body", 0.3, bytes_per_s=400_000),
]


def _note(tally: dict[str, Any], what: str) -> None:
    tally["outcomes"][what] = tally["outcomes"].get(what, 0) + 1


async def _submitted(web: Any, reactor: SimReactor, gid: int, tally: dict) -> int:
    """A submission number of ``gid``'s archive: POST, and after an answer
    lost, ask the audit (the upstream's journal) before sending again."""
    url = f"{BASE}/api/galleries/{gid}/archive"
    for _ in range(ATTEMPTS):
        try:
            code, body = await fetch(web, url, b"POST", timeout=3, clock=reactor)
            _note(tally, f"POST {code}")
            if code == 200:
                return int(json.loads(body)["archiveUrl"].rsplit("-", 1)[1].split(".")[0])
            if code < 500:
                continue  # rejected: nothing applied, send again
        except Exception as e:
            _note(tally, f"POST {type(e).__name__}")
        try:
            code, body = await fetch(web, url, timeout=3, clock=reactor)
        except Exception as e:
            _note(tally, f"audit {type(e).__name__}")
            continue
        if code == 200 and json.loads(body)["submissions"]:
            return int(json.loads(body)["submissions"])
    return 0


async def _client(world: World, reactor: SimReactor, gids: list[int], tally: dict) -> None:
    web = agent(reactor)
    for gid in gids:
        try:
            await fetch(web, f"{BASE}/api/galleries/{gid}", timeout=3, clock=reactor)
        except Exception as e:
            _note(tally, f"GET meta {type(e).__name__}")
        n = await _submitted(web, reactor, gid, tally)
        if not n:
            continue
        for attempt in range(1, ATTEMPTS + 1):
            try:
                code, body = await fetch(
                    web, f"{BASE}/files/{gid}-{n}.bin", timeout=3, clock=reactor
                )
                if code == 200 and body == catalog.archive_bytes(gid):
                    tally["downloaded"] += 1
                    break
            except Exception as e:
                _note(tally, f"GET file {type(e).__name__}")
            await deferLater(reactor, world.draw(0.1, 0.5) * attempt, lambda: None)


def run(seed: int, gids_per_client: int = 5) -> dict[str, Any]:
    world = World(seed, link=LinkProfile(latency=(0.0005, 0.005), bandwidth=2e6))
    app: UpstreamApp
    app, _ = serve_upstream(world, seed=world.rng.getrandbits(32))
    app.set_faults({"rules": RULES})
    tally: dict[str, Any] = {"downloaded": 0, "outcomes": {}, "dropped": 0}
    waits = []
    for name in CLIENTS:
        reactor = world.add_process(name)
        reactor.startRunning()
        gids = [world.rng.randrange(1, 40) for _ in range(gids_per_client)]
        waits.append(Deferred.fromCoroutine(_client(world, reactor, gids, tally)))

    def drop() -> None:
        tally["dropped"] += app.drop_hung()

    for _ in range(4):
        world.call_at(world.now + world.rng.uniform(0.5, 6), drop)
    finished = world.run_until(lambda: all(d.called for d in waits), within=3600)
    for d in waits:
        world.wait(d)
    world.assert_clean()
    fired = {}
    for entry in app.journal.to_json()["requests"]:
        if entry["fault"]:
            fired[entry["fault"]] = fired.get(entry["fault"], 0) + 1
    return {
        "seed": seed,
        "finished": finished,
        "downloaded": tally["downloaded"],
        "dropped": tally["dropped"],
        "outcomes": dict(sorted(tally["outcomes"].items())),
        "upstream_faults": dict(sorted(fired.items())),
        "journal": app.journal.to_json(),
        "stats": app.journal.stats(),
        "events": world.events,
        "digest": world.trace.hexdigest(),
    }


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]))))
