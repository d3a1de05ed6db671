"""A real node, built by its composition root, in a simulated world.

The node (``tasknet.node.service.makeService``, as ``twistd -n
tasknet-node`` builds it from its options) is given the world's reactor as
its reactor and clock, the simulated process as its thread pools
(``IThreadPools``: its store's ``adbapi`` pool and its compression pool run
inline) and a seeded ``IEntropy`` (its challenges, report ids and jitter).
It dials a scripted site (tests/sim/scripted_site.py) over simulated TCP,
is sent two DOWNLOADs, fetches them from the real mock upstream (built by
its own root), compresses them and reports until both are ACKed; then its
reactor stops as twistd's would (the shutdown triggers, the node's
``stopService``).  Nothing reaches Twisted's global reactor: run alone
(``python -m``) the process's global reactor is :class:`NoGlobalReactor`,
which fails whatever touches it (klein imports it, and never uses it).

    python -m tests.sim.node_world SEED DATA_DIR   # one JSON line
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from typing import Any

from tasknet.protocol.messages import encode
from tasknet.runtime import SeededEntropy
from tasknet.sim import World
from tasknet.sim.no_global_reactor import NoGlobalReactor, forbid

GIDS = (11, 12)
SECRET = "sim-secret"


def forbid_the_global_reactor() -> None:
    forbid()


def run(seed: int, data: str) -> dict[str, Any]:
    from twisted.internet.endpoints import serverFromString

    from tasknet.node.service import NodeService, Options, makeService
    from tasknet.upstream import catalog
    from tests.sim.scripted_site import ScriptedSite, SiteConnection
    from tests.sim.worlds import start_upstream_service

    started = time.perf_counter()
    world = World(seed)
    node_reactor = world.add_process("node")
    site_reactor = world.add_process("site")
    upstream_reactor = world.add_process("upstream")

    start_upstream_service(upstream_reactor, seed=seed)

    def on_login(connection: SiteConnection) -> None:
        for gid in GIDS:
            url = f"http://127.0.0.1:7200/files/{gid}-1.bin"
            connection.download(f"op-{gid}", gid, url, catalog.gallery(gid).size)

    site = ScriptedSite(SECRET, random.Random(world.rng.getrandbits(64)), on_login)
    serverFromString(site_reactor, "tcp:7100:interface=127.0.0.1").listen(site)

    options = Options()
    options.parseOptions(
        ["--connect", "tcp:127.0.0.1:7100", "--node-id", "node-1", "--secret", SECRET]
        + ["--data", data]
    )
    service = makeService(
        options,
        reactor=node_reactor,
        threads=node_reactor,
        entropy=SeededEntropy(world.rng.getrandbits(64)),
    )
    assert isinstance(service, NodeService)
    node = service
    node.exit_on_failure = False  # a failed start fails `ready` (in-process)
    # As twistd: the service starts, then the reactor runs; it stops before shutdown.
    node.startService()
    node_reactor.addSystemEventTrigger("before", "shutdown", node.stopService)
    for reactor in (upstream_reactor, site_reactor, node_reactor):
        reactor.startRunning()

    def settled() -> bool:
        if not all(site.latest_status(gid) == 4 for gid in GIDS):
            return False
        last = site.reports()[-1]
        return last.report_id in site.acked and not world.network.between("node", "upstream")

    running = time.perf_counter()
    finished = world.run_until(settled, within=300)
    archives = sorted(p.name for p in node.data.archives.iterdir())
    node_reactor.stop()
    world.run_until(lambda: not node_reactor.alive, within=60)
    world.assert_clean()
    now = time.perf_counter()
    wall, run_wall = now - started, now - running
    # What the node sent, byte for byte: its nonces, ids and revisions are
    # the seed's too (the trace holds only the frames' lengths).
    frames = hashlib.sha256(b"".join(encode(m) for m in site.received)).hexdigest()
    return {
        "finished": finished,
        "stopped": not node_reactor.alive,
        "archives": archives,
        "logins": site.logins,
        "reports": len(site.reports()),
        "report_ids": [r.report_id for r in site.reports()],
        "statuses": {str(gid): site.latest_status(gid) for gid in GIDS},
        "events": world.events,
        "simulated": world.elapsed(),
        "wall": wall,
        "run_wall": run_wall,
        "digest": world.trace.hexdigest(),
        "frames": frames,
        "global_reactor_used": list(NoGlobalReactor.touched),
    }


if __name__ == "__main__":
    forbid_the_global_reactor()
    print(json.dumps(run(int(sys.argv[1]), sys.argv[2])))
