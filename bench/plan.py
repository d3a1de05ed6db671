"""Names both the seeding step and the load nodes derive from the same numbers.

Node ``i`` is ``bench-node-0007``; in report benchmarks it holds ``K``
consecutive gids starting at ``GID_BASE + i * K``, so the database seeded
before the site starts and the snapshots the load nodes send agree (the
operation ids the seeding got are passed in a file).
"""

from __future__ import annotations

from collections.abc import Sequence

from tasknet.protocol.messages import TaskEntry

GID_BASE = 10_000_000
NODE_PREFIX = "bench-node-"
SECRET = "bench-secret"


def node_id(index: int) -> str:
    return f"{NODE_PREFIX}{index:04d}"


def node_gids(index: int, per_node: int) -> range:
    start = GID_BASE + index * per_node
    return range(start, start + per_node)


def snapshot_entries(gids: Sequence[int], seq: int, changing: int) -> tuple[TaskEntry, ...]:
    """The ``seq``-th snapshot of a node holding ``gids``: like a node with
    ``changing`` download slots, the first ``changing`` tasks are downloading
    (their progress moves with every snapshot) and the rest wait at 0."""
    moving = (seq % 999 + 1) / 1000
    return tuple(TaskEntry(gid, 1, moving if n < changing else 0.0) for n, gid in enumerate(gids))
