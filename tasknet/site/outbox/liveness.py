"""The outbox's liveness room: pushes for changes that come with no commit.

Some changes of a task's view come with no commit of the task: its node
dropped (or came back: the view's ``nodeConnected``), or its download
stopped moving (``speed`` gone after ``throughput.STALL_SECONDS``,
``stalledSince`` after ``views.STALL_AFTER_SECONDS``).  At every sweep
(:class:`LivenessSweep`, a ``TimerService`` of its own at the outbox's
``poll_interval``) the watch (:class:`LivenessWatch`) compares the connected
nodes (and, while WebSocket clients listen, the moving tasks) with what it
saw last and pushes the current view of each task whose liveness changed
(straight to this site's clients, like a drained row; nothing is written,
and a webhook does not hear of it: the task itself did not change).  A node
that drops pushes its unfinished tasks, newest first, at most
``node_limit`` of them (a client that shows more marks the rest of that
node's rows by the same push).

Reading the connected nodes lists every node's session row (10,000 of them
with as many nodes: most of an idle site's CPU when read at every poll).
One site alone on its database (not *shared*) writes those rows itself,
through its registry of connected nodes (``connected_nodes.py``), so the
watch reads them only when the registry's nodes changed since the last
read, when that read disagreed with the registry (a take or release still
on its way to the database, a row left by a previous run), and at least
every ``refresh_sweeps`` sweeps (a minute at the default poll) for what the
registry cannot see (the admin CLI).  Shared, other sites' logins and
drops change the rows unseen here: it reads them at every sweep (the
composition root gives the watch the registry only when alone).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import Any

from twisted.application.internet import TimerService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from tasknet.site.outbox.tail import Publisher
from tasknet.site.storage import node_sessions, views
from tasknet.site.storage.engine.database import Cursor, Database
from tasknet.status import TaskStatus

log = Logger()

#: The unfinished tasks of a node that dropped or came back pushed at most,
#: newest first; the moving tasks whose stall is watched at most.
LIVENESS_NODE_LIMIT = 500
LIVENESS_MOVING_LIMIT = 500
#: Sweeps at most between two reads of the connected nodes while the
#: registry says nothing changed (the module doc, last paragraph).
LIVENESS_REFRESH_SWEEPS = 12

#: The statuses whose row says something about its node (queued on it,
#: downloading on it, a delete waiting for it).
_NODE_BOUND = frozenset(
    status.value
    for status in (
        TaskStatus.SUBMITTED,
        TaskStatus.DOWNLOADING,
        TaskStatus.WAITING_COMPRESSION,
        TaskStatus.COMPRESSING,
        TaskStatus.DELETE_PENDING,
    )
)
_MOVING = frozenset({TaskStatus.DOWNLOADING.value, TaskStatus.COMPRESSING.value})


def _connected(cursor: Cursor) -> set[str]:
    """The connected nodes of the database."""
    return {holder.node_id for holder in node_sessions.holders(cursor)}


def _moving(cursor: Cursor, limit: int) -> dict[int, tuple[bool, bool]]:
    """The moving tasks (newest first, at most ``limit``) as
    ``{gid: (speed shown, stalled)}``."""
    moving, _, _ = views.list_tasks(
        cursor, views.TaskQuery(user_id=None, limit=limit, statuses=_MOVING)
    )
    return {
        view["gid"]: (view["speed"] is not None, view["stalledSince"] is not None)
        for view in moving
    }


def _connected_and_moving(
    cursor: Cursor, limit: int
) -> tuple[set[str], dict[int, tuple[bool, bool]]]:
    """The connected nodes of the database, and the moving tasks (one snapshot)."""
    return _connected(cursor), _moving(cursor, limit)


def _views_to_push(
    cursor: Cursor, nodes: Iterable[str], gids: Iterable[int], node_limit: int
) -> list[tuple[views.TaskView, int | None]]:
    """``(view, owner)`` of ``gids`` and of the unfinished tasks of each of
    ``nodes`` (newest first, at most ``node_limit`` a node), each once."""
    wanted = list(dict.fromkeys(gids))
    for node in sorted(nodes):
        listed, _, _ = views.list_tasks(
            cursor,
            views.TaskQuery(user_id=None, limit=node_limit, statuses=_NODE_BOUND, node=node),
        )
        wanted += [view["gid"] for view in listed]
    found = views.task_views_and_owners(cursor, dict.fromkeys(wanted))
    pushed = []
    for gid in dict.fromkeys(wanted):
        view, owner = found.get(gid, (None, None))
        if view is not None:
            pushed.append((view, owner))
    return pushed


class LivenessWatch:
    """Pushes the views whose liveness changed without a commit (the module
    doc, "Liveness pushes").  :meth:`sweep` compares with the last sweep.

    The connected nodes are read at every sweep, clients or not (one small
    read), so that a node that drops just before a client's first sweep is
    still a change.  The moving tasks are read only while clients listen;
    the first sweep of a listening spell pushes those that are not live
    (no speed, or stalled), which may have changed unseen since the
    client loaded its list.  The very first sweep only records the nodes.

    ``nodes``: the node ids of this site's registry (its
    ``ConnectedNodes``, a mapping by node id, read only), when the site is
    alone on its database (not shared): the connected nodes are then read
    only when they can have changed (the module doc, last paragraph);
    ``None``: at every sweep."""

    def __init__(
        self,
        db: Database,
        publisher: Publisher,
        *,
        node_limit: int = LIVENESS_NODE_LIMIT,
        moving_limit: int = LIVENESS_MOVING_LIMIT,
        nodes: Collection[str] | None = None,
        refresh_sweeps: int = LIVENESS_REFRESH_SWEEPS,
    ) -> None:
        if refresh_sweeps < 1:
            raise ValueError(f"refresh_sweeps must be >= 1, got {refresh_sweeps}")
        self._db = db
        self._publisher = publisher
        self._node_limit = node_limit
        self._moving_limit = moving_limit
        self._nodes = nodes
        self._refresh_sweeps = refresh_sweeps
        self._connected: set[str] | None = None
        #: The registry's nodes when the connected nodes were last read.
        self._held_at_read: frozenset[str] | None = None
        self._sweeps_unread = 0
        self._moving: dict[int, tuple[bool, bool]] | None = None
        #: Views pushed since start (tests, logs).
        self.pushed = 0
        #: Reads of the connected nodes since start (tests, logs).
        self.connected_reads = 0

    def _held(self) -> frozenset[str] | None:
        # Attached, not only held: a login's take may still be on its way
        # (then the read disagrees, and the next sweep reads again).
        return None if self._nodes is None else frozenset(self._nodes)

    def _must_read(self, held: frozenset[str] | None) -> bool:
        """Whether the connected nodes can have changed since the last read."""
        return (
            held is None
            or self._connected is None
            or held != self._held_at_read  # logins or drops here since
            or self._connected != held  # still on their way to the database
            or self._sweeps_unread + 1 >= self._refresh_sweeps
        )

    def _read_done(self, held: frozenset[str] | None) -> None:
        self._held_at_read = held
        self._sweeps_unread = 0
        self.connected_reads += 1

    async def sweep(self) -> int:
        """One comparison; returns how many views were pushed."""
        held = self._held()
        fresh = self._must_read(held)
        if not fresh:
            self._sweeps_unread += 1
        if not self._publisher.listening():
            if fresh:
                self._connected = await self._db.read(_connected)
                self._read_done(held)
            self._moving = None
            return 0
        if fresh:
            connected, moving = await self._db.read(_connected_and_moving, self._moving_limit)
            self._read_done(held)
        else:
            assert self._connected is not None
            connected = self._connected
            moving = await self._db.read(_moving, self._moving_limit)
        before, self._connected = self._connected, connected
        changed_nodes = set() if before is None else before ^ connected
        seen = self._moving
        if seen is None:
            changed = [gid for gid, (speed, stalled) in moving.items() if stalled or not speed]
        else:
            changed = [gid for gid, flags in moving.items() if gid in seen and seen[gid] != flags]
        self._moving = moving
        if not changed_nodes and not changed:
            return 0
        found = await self._db.read(_views_to_push, changed_nodes, changed, self._node_limit)
        for view, owner in found:
            payload = json.dumps({"type": "task", "task": view}, ensure_ascii=False)
            self._publisher.publish(owner, payload)
        self.pushed += len(found)
        return len(found)


class LivenessSweep(TimerService):
    """Runs :meth:`LivenessWatch.sweep` every ``interval`` seconds on
    ``clock`` (the first as it starts).  A sweep is not returned to the
    timer (a slow one must not hold the outbox's poll back, nor this
    timer); one at a time; a failed sweep is logged and the next one
    compares again.  Stopping waits for the sweep in flight."""

    def __init__(self, watch: LivenessWatch, interval: float, *, clock: IReactorTime) -> None:
        super().__init__(interval, self._sweep_in_background)
        self.clock = clock
        self.watch = watch
        self._sweeping: Deferred[Any] | None = None

    def _sweep_in_background(self) -> None:
        if self._sweeping is not None or not self.running:
            return
        d = Deferred.fromCoroutine(self.watch.sweep())
        self._sweeping = d
        d.addErrback(lambda f: log.failure("the liveness sweep failed", f))
        d.addBoth(self._swept)

    def _swept(self, result: object) -> None:
        self._sweeping = None

    def idle(self) -> Deferred[None]:
        """Fires once no sweep runs."""
        sweeping = self._sweeping
        if sweeping is None:
            return succeed(None)
        done: Deferred[None] = Deferred()
        sweeping.addBoth(lambda result: done.callback(None))
        return done

    def stopService(self) -> Deferred[None]:
        stopped: Deferred[None] = super().stopService()
        return stopped.addCallback(lambda _: self.idle())
