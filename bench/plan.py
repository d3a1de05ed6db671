"""Names both the seeding step and the load nodes derive from the same numbers.

Node ``i`` is ``bench-node-0007``; in report benchmarks it holds ``K``
consecutive gids starting at ``GID_BASE + i * K``, each with the operation id
``bench-op-<gid>``, so the database seeded before the site starts and the
snapshots the load nodes send agree without passing lists around.
"""

from __future__ import annotations

GID_BASE = 10_000_000
NODE_PREFIX = "bench-node-"
SECRET = "bench-secret"


def node_id(index: int) -> str:
    return f"{NODE_PREFIX}{index:04d}"


def node_gids(index: int, per_node: int) -> range:
    start = GID_BASE + index * per_node
    return range(start, start + per_node)


def operation_id(gid: int) -> str:
    return f"bench-op-{gid}"


def node_key_args(count: int) -> list[str]:
    """``--node-key ID:SECRET`` for every load node, for ``twistd tasknet-site``."""
    args = []
    for i in range(count):
        args += ["--node-key", f"{node_id(i)}:{SECRET}"]
    return args
