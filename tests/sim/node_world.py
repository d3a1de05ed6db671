"""A real node, built by its own ``NodeService``, in a simulated world.

The node dials a scripted site (tests/sim/scripted_site.py) over simulated
TCP, is sent two DOWNLOADs, fetches them from the real mock upstream,
compresses them (its compression pool runs inline) and reports until both
are ACKed; then its reactor stops as twistd's would (the shutdown triggers,
the node's ``stopService``).  The node still opens its store's
``adbapi.ConnectionPool`` on Twisted's global reactor and makes its own
``ThreadPool`` (seams not there yet), so this runs in a process of its own
where ``tasknet.sim.process_global`` makes the node's simulated reactor
the global one.

    python -m tests.sim.node_world SEED DATA_DIR   # one JSON line
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

GIDS = (11, 12)
SECRET = "sim-secret"


def run(seed: int, data: str) -> dict[str, Any]:
    from tasknet.sim import World
    from tasknet.sim.process_global import install

    started = time.perf_counter()
    world = World(seed)
    node_reactor = world.add_process("node")
    install(node_reactor)  # before anything imports twisted.internet.reactor
    site_reactor = world.add_process("site")
    upstream_reactor = world.add_process("upstream")

    from twisted.internet.endpoints import serverFromString

    from tasknet.node.service import NodeService
    from tasknet.upstream import catalog
    from tests.sim.scripted_site import ScriptedSite, SiteConnection
    from tests.sim.worlds import start_upstream_service

    start_upstream_service(upstream_reactor, seed=seed)

    def on_login(connection: SiteConnection) -> None:
        for gid in GIDS:
            url = f"http://127.0.0.1:7200/files/{gid}-1.bin"
            connection.download(f"op-{gid}", gid, url, catalog.gallery(gid).size)

    site = ScriptedSite(SECRET, random.Random(world.rng.getrandbits(64)), on_login)
    serverFromString(site_reactor, "tcp:7100:interface=127.0.0.1").listen(site)

    node = NodeService(
        connect="tcp:127.0.0.1:7100",
        node_id="node-1",
        secret=SECRET,
        data=data,
        reactor=node_reactor,
        debounce=0.05,
    )
    # As twistd: the service starts, then the reactor runs; it stops before shutdown.
    node.startService()
    node_reactor.addSystemEventTrigger("before", "shutdown", node.stopService)
    for reactor in (upstream_reactor, site_reactor, node_reactor):
        reactor.startRunning()

    def settled() -> bool:
        if not all(site.latest_status(gid) == 4 for gid in GIDS):
            return False
        last = site.reports()[-1]
        return last.report_id in site.acked and not node_reactor.world.network.between(
            "node", "upstream"
        )

    running = time.perf_counter()
    finished = world.run_until(settled, within=300)
    archives = sorted(p.name for p in node.data.archives.iterdir())
    node_reactor.stop()
    world.run_until(lambda: not node_reactor.alive, within=60)
    world.assert_clean()
    now = time.perf_counter()
    wall, run_wall = now - started, now - running
    return {
        "finished": finished,
        "stopped": not node_reactor.alive,
        "archives": archives,
        "logins": site.logins,
        "reports": len(site.reports()),
        "statuses": {str(gid): site.latest_status(gid) for gid in GIDS},
        "events": world.events,
        "simulated": world.elapsed(),
        "wall": wall,
        "run_wall": run_wall,
        "digest": world.trace.hexdigest(),
    }


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]), sys.argv[2])))
