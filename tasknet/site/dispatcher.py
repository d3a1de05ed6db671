"""Sending commands to nodes (LIFECYCLE.md invariants 5, 9 and 10).

:class:`Dispatcher` is a service: off until the site starts it, once
recovery succeeded (``startService``).  Then:

* on a node's login (the logins that arrive while a login pass runs are
  caught up together by the next pass, for those nodes only: a storm of
  logins costs what those nodes hold, not the number of nodes connected),
  the node gets every command for the tasks already
  assigned to it (``DOWNLOAD`` for those not yet completed at the site, with
  their own operationId, so a repeat is a no-op at the node; ``DELETE`` for
  pending deletes), and every eligible unassigned task is assigned to the
  least loaded connected node and sent (never a legacy row that waits for a
  node to claim it: see ``storage/dispatch.py``);
* when a task becomes ``SUBMITTED`` or ``DELETE_PENDING`` (the lifecycle calls
  :meth:`Dispatcher.task_changed` after the commit), that one task is
  assigned if needed and sent to its node when connected;
* every ``poll_interval`` seconds (a ``TimerService`` child) a pass
  catches what no in-process trigger announced (a task resolved by
  ``tasknet-admin`` in another process, a trigger whose write failed):
  unassigned eligible tasks are assigned and sent, and pending deletes go
  to connected nodes that have not had them on their current connection.
  Nothing else is resent: resending is for logins.
* several sites on one PostgreSQL database (``wakeups``): a task changed
  through this site is announced on ``tasknet_dispatch`` (payload: its gid)
  after the commit, and a site that hears of one elsewhere handles it as
  its own :meth:`Dispatcher.task_changed` would (the site holding the
  task's node sends the command at once); after the wake-ups were cut off
  it runs the periodic pass at once.  A lost notification costs one
  ``poll_interval``.

* a node that is gone (DELIVERY.md "A node that is gone";
  ``reassign_after`` seconds, ``--reassign-after``, ``0``: never): every
  ``reassign_check`` seconds a read finds the nodes holding unfinished tasks
  that no site holds (:func:`~tasknet.site.storage.reassign.stranded_nodes`);
  each is timed on the site's clock from its disconnect here (or from the
  first check that found it gone: after a restart, or gone at another
  site).  Once gone that long, with no login anywhere since (the epoch of
  its ``node_session`` row unchanged), its unfinished tasks move in one
  transaction to this site's least loaded connected node (or back to
  waiting, for whichever site next has a node), with the same operationId,
  and a ``CANCEL`` is owed to it (``storage/reassign.py``).  The operator's
  :meth:`Dispatcher.reassign_now` and :meth:`Dispatcher.retire` do the same
  at once (audited); a retired node's live session here is closed.
* ``CANCEL`` (v2 only): a node that logs in is sent, before anything else,
  a ``CANCEL`` for every generation moved off it (``node_cancel``), decided
  in a write transaction like every command.  A legacy node cannot be
  cancelled: its rows wait for a v2 login, its late reports are
  ``not_owner`` and its files stay.

Only what :mod:`tasknet.site.storage.dispatch` returns is ever sent: the
eligibility rule lives there (and in ``storage.eligibility.is_dispatchable``).
Every set of commands is decided inside a write transaction and sent on the
reactor right after its commit, with no yield in between, so a DOWNLOAD
never follows the DELETE of its task (see ``storage/dispatch.py``).  Large
sets go a page (one transaction) at a time; between pages the reactor runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TypeVar

from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from tasknet.coalesce import CoalescingRunner
from tasknet.protocol.messages import ACTION_DELETE
from tasknet.protocol.session import INodeSession
from tasknet.site import metrics
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.storage import dispatch as storage
from tasknet.site.storage import node_control, reassign
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Database

log = Logger()

#: What a move transaction of :mod:`~tasknet.site.storage.reassign` answers.
Moved = TypeVar("Moved", reassign.Reassigned, reassign.Retired)

#: Seconds between two counts of every connected node's open tasks (the
#: loads new tasks are balanced by; each login counts its own node's).
LOADS_REFRESH = 60.0

#: The longest wait between two looks for nodes gone past ``reassign_after``
#: (a tenth of it when shorter, at least a second): how late a move may come.
REASSIGN_CHECK_MAX = 30.0

#: The epoch of a node whose disconnect this site saw and whose row it has
#: not read since (the next check fills it in).
_UNREAD = -2


def reassign_check_interval(reassign_after: float) -> float:
    """Seconds between two checks for gone nodes, for ``reassign_after``."""
    return max(1.0, min(reassign_after / 10.0, REASSIGN_CHECK_MAX))


def send_command(session: INodeSession, command: storage.Command) -> None:
    """One command on one session (the session picks the wire message)."""
    if command.action == ACTION_DELETE:
        session.send_delete(command.operation_id, command.gid, command.name)
    else:
        session.send_download(
            command.operation_id,
            command.gid,
            command.token,
            command.name,
            command.url,
            command.size,
        )


class Dispatcher(MultiService):
    """Assigns eligible tasks to connected nodes and sends their commands;
    running (started) means dispatch is on."""

    def __init__(
        self,
        db: Database,
        nodes: ConnectedNodes,
        *,
        page_size: int = storage.PAGE_SIZE,
        assign_delay: float = 0.0,
        poll_interval: float | None = 5.0,
        clock: IReactorTime,
        wakeups: listen.Wakeups | None = None,
        reassign_after: float = 0.0,
        reassign_check: float | None = None,
        on_committed: Callable[[], object] | None = None,
    ) -> None:
        if reassign_after < 0:
            raise ValueError(f"reassign_after must be >= 0, got {reassign_after}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if assign_delay < 0:
            raise ValueError(f"assign_delay must be >= 0, got {assign_delay}")
        if poll_interval is not None and poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 or None, got {poll_interval}")
        super().__init__()
        self._clock = clock
        if poll_interval is not None:
            poll = TimerService(poll_interval, self._poll_tick)
            poll.clock = self._clock
            poll.setServiceParent(self)
        self._polling = False
        #: Seconds a node may stay gone before its unfinished tasks move
        #: (0: never), and each gone node's (since, epoch) on our clock.
        self.reassign_after = reassign_after
        self._gone_since: dict[str, tuple[float, int | None]] = {}
        self._reassigning = False
        if reassign_after > 0:
            check = TimerService(
                reassign_check or reassign_check_interval(reassign_after), self._reassign_tick
            )
            check.clock = self._clock
            check.setServiceParent(self)
        #: Told after a commit that enqueued notifications (wakes the outbox).
        self._on_committed = on_committed
        #: Tasks moved off gone nodes, CANCELs sent (tests, logs).
        self.reassigned = 0
        self.cancels_sent = 0
        self._assign_delay = assign_delay
        self._assign_call: IDelayedCall | None = None
        self._db = db
        self._nodes = nodes
        #: Delete ids sent on each node's current session (so the periodic
        #: pass sends a pending delete once per connection, not every time).
        self._deletes_sent: dict[str, set[str]] = {}
        #: Sessions logged in since the last login pass began (node id →
        #: session): a burst of logins is caught up in one pass.
        self._arrived: dict[str, INodeSession] = {}
        self._logins = CoalescingRunner(self._login_pass)
        #: Open tasks of each connected node as last counted (at its login,
        #: and again every ``LOADS_REFRESH`` seconds), plus those this site
        #: assigned to it since: which node a new task goes to (a balancing
        #: hint; nothing else depends on it), without counting every
        #: node's tasks per create.
        self._loads: dict[str, int] = {}
        self._loads_counted_at: float | None = None
        self._page_size = page_size
        #: Nodes an operator drained or paused, and those with a download
        #: limit, as last read here (node_control): who new tasks skip.
        self._closed: set[str] = set()
        self._bounded: set[str] = set()
        self._controls_known: dict[str, node_control.Control] = {}
        #: Bumped by each control set here: a read of the controls that an
        #: operator's change overtook is stale and dropped.
        self._controls_changes = 0
        self.enabled = False
        # One unassigned pass at a time; a request during a pass runs one more after it.
        self._unassigned = CoalescingRunner(self._assign_all)
        # Insertion-ordered (a dict, not a set): idle() gathers them in the
        # order they started, whatever their ids.
        self._running: dict[Deferred[None], None] = {}
        #: Commands sent since start, periodic passes completed (tests, logs).
        self.sent = 0
        self.polls = 0
        self._wakeups: listen.Wakeups = wakeups if wakeups is not None else listen.NoWakeups()
        self._subscription: listen.Subscription | None = None
        #: Tasks announced by another site and handled here (tests, logs).
        self.hints = 0

    def _track(self, d: Deferred[None]) -> Deferred[None]:
        if not d.called:
            self._running[d] = None

            def done(result: object) -> object:
                self._running.pop(d, None)
                return result

            d.addBoth(done)
        return d

    def idle(self) -> Deferred[None]:
        """Fires once every pass running now has finished (shutdown, tests)."""
        running = list(self._running)
        return gatherResults(running, consumeErrors=True).addBoth(lambda _: None)

    # -- triggers

    def startService(self) -> None:
        """Turn dispatch on (recovery succeeded): catch up with every node
        already connected (:meth:`idle` fires when done), then poll."""
        # The poll timer calls its first tick as it starts, while dispatch is
        # still off, so that tick does nothing: the catch-up below is that pass.
        super().startService()
        self.enabled = True
        if self._subscription is None:
            self._subscription = self._wakeups.subscribe(listen.DISPATCH, self._hinted)
        log.info("dispatch enabled")
        self._track(Deferred.fromCoroutine(self._catch_up(list(self._nodes.values()))))

    def _poll_tick(self) -> None:
        # Not returned to the timer (a failure would stop it); a tick
        # while the previous pass still runs is skipped.
        if not self.enabled or self._polling or not self._nodes:
            return
        self._polling = True

        def done(_: object) -> None:
            self._polling = False
            self.polls += 1

        self._track(Deferred.fromCoroutine(self._periodic_pass())).addBoth(done)

    async def _periodic_pass(self) -> None:
        await self._read_controls()
        await self._guarded_unassigned_pass()
        await self._guarded_deletes_pass()
        if (
            self._loads_counted_at is None
            or self._clock.seconds() - self._loads_counted_at >= LOADS_REFRESH
        ):
            await self._count_loads(self._nodes.ids())

    def node_attached(self, session: INodeSession) -> Deferred[None]:
        """A node logged in: resend its tasks, then hand out unassigned ones.
        Logins that arrive while a login pass runs are caught up together
        by the next one (fires when the pass covering this login is done)."""
        self._deletes_sent[session.node_id] = set()  # a new connection has had none
        self._gone_since.pop(session.node_id, None)  # back: its timer starts again when it goes
        if not self.enabled:
            return succeed(None)
        self._arrived[session.node_id] = session
        return self._track(self._logins.run())

    def node_detached(self, session: INodeSession) -> None:
        """A node's session went: forget the deletes sent on it, unless a
        newer session of the node has already taken its place."""
        if session.node_id not in self._nodes:
            # Gone from here (perhaps to another site: the check reads that).
            self._gone_since[session.node_id] = (self._clock.seconds(), _UNREAD)
            self._deletes_sent.pop(session.node_id, None)
            self._loads.pop(session.node_id, None)
            if self._arrived.get(session.node_id) is session:
                del self._arrived[session.node_id]

    def task_changed(self, gid: int) -> Deferred[None]:
        """``gid`` became ``SUBMITTED`` or ``DELETE_PENDING`` (committed):
        send its command if it has (or can get) a connected node, and tell
        the other sites (its node may be connected to one of them)."""
        self._wakeups.notify(listen.DISPATCH, str(gid))
        return self._task_changed(gid)

    def _hinted(self, channel: str, payload: str | None) -> None:
        """Another site changed a task (or the wake-ups were cut off)."""
        if payload is None:
            self._poll_tick()
        elif payload.isdigit():
            self.hints += 1
            self._task_changed(int(payload))
        else:
            log.warn(
                "ignoring a malformed {channel} payload {payload!r}",
                channel=channel,
                payload=payload,
            )

    def _task_changed(self, gid: int) -> Deferred[None]:
        if not self.enabled or not self._nodes:
            # Nobody to send to: not even a write.  The catch-up pass of the
            # next node to log in reads this (committed) task and assigns
            # or resends it then.
            return succeed(None)
        d = Deferred.fromCoroutine(self._one(gid))
        d.addErrback(lambda f: log.failure("dispatch of gid {gid} failed", f, gid=gid))
        return self._track(d)

    # -- passes

    async def _login_pass(self) -> None:
        sessions = list(self._arrived.values())
        self._arrived.clear()
        if sessions:
            await self._catch_up(sessions)

    async def _catch_up(self, sessions: Iterable[INodeSession]) -> None:
        """Catch up with ``sessions`` (a burst of logins): resend their
        tasks, send them the pending deletes they have not had, count their
        loads, then hand out unassigned tasks.  Costs what these nodes hold,
        whatever the number of nodes connected."""
        sessions = list(sessions)
        try:
            await self._node_pass(sessions)
        except Exception:
            log.failure("dispatch pass failed")
        current = [s.node_id for s in sessions if self._nodes.is_current(s)]
        # Pending deletes of tasks these nodes have just claimed, among others.
        await self._guarded_deletes_pass(current)
        await self._count_loads(current)
        if not self.enabled:
            return  # stopped meanwhile: schedule nothing more
        if self._assign_delay:
            # Nodes reconnecting after a site restart arrive over a short
            # while: wait a little so unassigned tasks spread over all of
            # them instead of going (sticky) to the first one.
            if self._assign_call is None:
                self._assign_call = self._clock.callLater(self._assign_delay, self._assign_later)
            return
        await self._guarded_unassigned_pass()

    def _assign_later(self) -> None:
        self._assign_call = None
        self._track(Deferred.fromCoroutine(self._guarded_unassigned_pass()))

    async def _guarded_unassigned_pass(self) -> None:
        try:
            await self._unassigned.run()
        except Exception:
            log.failure("assigning unassigned tasks failed")

    async def _guarded_deletes_pass(self, node_ids: list[str] | None = None) -> None:
        try:
            await self._deletes_pass(node_ids)
        except Exception:
            log.failure("sending pending deletes failed")

    async def _count_loads(self, node_ids: list[str]) -> None:
        """Count the open tasks of ``node_ids`` again (a read: the writer
        goes on meanwhile); a failure leaves the previous figures."""
        if not node_ids:
            return
        try:
            counted = await self._db.read(storage.node_loads, node_ids)
        except Exception:
            log.failure("counting the nodes' open tasks failed")
            return
        everyone = len(node_ids) == len(self._nodes)
        for node_id, load in counted.items():
            if node_id in self._nodes:
                self._loads[node_id] = load
        if everyone:
            self._loads_counted_at = self._clock.seconds()

    def stopService(self) -> Deferred[None]:
        """Stop scheduling passes; fires when the running ones are done."""
        self.enabled = False
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.cancel().addErrback(
                lambda f: log.failure("stopping the dispatch wake-ups failed", f)
            )
        if self._assign_call is not None and self._assign_call.active():
            self._assign_call.cancel()
        self._assign_call = None
        # Never started (recovery failed): no timer to stop.
        stopped: Deferred[None] = super().stopService() if self.running else succeed(None)
        return stopped.addCallback(lambda _: self.idle())

    def _send_cancels(self, session: INodeSession, cancels: list[tuple[str, int]]) -> None:
        for operation_id, gid in cancels:
            session.send_cancel(operation_id, gid)
        self.cancels_sent += len(cancels)
        if cancels:
            log.info(
                "sent {n} CANCEL(s) to node {node} for tasks moved off it",
                n=len(cancels),
                node=session.node_id,
            )

    # -- a node that is gone

    def _reassign_tick(self) -> None:
        # Not returned to the timer (a failure would stop it); a tick
        # while the previous check still runs is skipped.
        if not self.enabled or self._reassigning:
            return
        self._reassigning = True

        def done(_: object) -> None:
            self._reassigning = False

        d = Deferred.fromCoroutine(self._reassign_pass())
        d.addErrback(lambda f: log.failure("reassigning the tasks of gone nodes failed", f))
        self._track(d).addBoth(done)

    async def _reassign_pass(self) -> None:
        """Time each gone node; move the tasks of those gone long enough."""
        stranded = await self._db.read(reassign.stranded_nodes)
        now = self._clock.seconds()
        for node_id in list(self._gone_since):
            if node_id not in stranded:
                del self._gone_since[node_id]  # back somewhere, or nothing left to move
        due: list[tuple[str, int | None]] = []
        for node_id, epoch in stranded.items():
            if node_id in self._nodes:
                self._gone_since.pop(node_id, None)
                continue
            seen = self._gone_since.get(node_id)
            if seen is None or (seen[1] != _UNREAD and seen[1] != epoch):
                # First seen gone, or it logged in (somewhere) since: from now.
                self._gone_since[node_id] = (now, epoch)
                continue
            since = seen[0]
            self._gone_since[node_id] = (since, epoch)
            if now - since >= self.reassign_after:
                due.append((node_id, epoch))
        for node_id, epoch in due:
            if not self.enabled:
                return
            moved = await self._move(node_id, reassign.reassign_node, epoch=epoch)
            if not moved.skipped:
                self._gone_since.pop(node_id, None)
                self._moved(moved, "timeout")

    async def _move(
        self, node_id: str, fn: Callable[..., Moved], **kwargs: str | int | None
    ) -> Moved:
        """Run the move ``fn`` (a :mod:`~tasknet.site.storage.reassign`
        transaction) for ``node_id`` towards this site's other connected
        nodes, and send its DOWNLOADs right after its commit."""
        targets = [other for other in self._nodes.ids() if other != node_id]
        loads = {other: self._loads.get(other, 0) for other in targets} if targets else None
        result = await self._db.write(fn, node_id, targets, loads=loads, **kwargs)
        moved: reassign.Reassigned = (
            result.reassigned if isinstance(result, reassign.Retired) else result
        )
        self._send_all(moved.commands)
        for other, load in moved.loads.items():
            if other in self._nodes:
                self._loads[other] = load
        if moved.tasks and self._on_committed is not None:
            self._on_committed()
        return result

    def _moved(self, moved: reassign.Reassigned, cause: str) -> None:
        if not moved.tasks:
            return
        self.reassigned += moved.tasks
        metrics.TASKS_REASSIGNED.labels(cause=cause).inc(moved.tasks)
        log.info(
            "moved {n} unfinished task(s) off node {node} ({cause}): {sent} sent to other"
            " nodes, {waiting} waiting for a node",
            n=moved.tasks,
            node=moved.node_id,
            cause=cause,
            sent=len(moved.commands),
            waiting=len(moved.waiting),
        )

    async def _read_controls(self) -> None:
        """Which nodes an operator drained, paused or bounded (another
        process's ``tasknet-admin node ...`` is learnt here at the next
        periodic pass; the assignment itself always reads them afresh)."""
        changes = self._controls_changes
        try:
            found = await self._db.read(node_control.controls)
        except Exception:
            log.failure("reading the nodes' controls failed")
            return
        if changes != self._controls_changes:
            return  # read before a change made here landed: the next pass reads again
        self._note_controls(found.values())

    def _note_controls(self, found: Iterable[node_control.Control]) -> None:
        self._closed = {c.node_id for c in found if not c.takes_new_work}
        self._bounded = {c.node_id for c in found if c.limit is not None}
        self._controls_known = {c.node_id: c for c in found}

    async def control_node(
        self,
        node_id: str,
        *,
        mode: str | None = None,
        limit: int | None | str = "keep",
        actor: str,
        note: str = "",
    ) -> node_control.Control:
        """An operator's drain, pause or resume of ``node_id`` (``mode``)
        and its download limit (``limit``: ``"keep"``, None for no bound);
        obeyed by the next assignment, and a node given room again is
        handed unassigned tasks at once.  :class:`node_control.UnknownNode`
        or :class:`node_control.BadControl`: nothing changed."""
        control: node_control.Control = await self._db.write(
            node_control.set_control, node_id, mode=mode, limit=limit, actor=actor, note=note
        )
        self._controls_changes += 1
        known = dict(self._controls_known)
        known[node_id] = control
        self._note_controls(known.values())
        log.info(
            "node {node}: {mode}, download limit {limit} (by {actor})",
            node=node_id,
            mode=control.mode,
            limit=control.limit if control.limit is not None else "none",
            actor=actor,
        )
        if self.enabled and control.takes_new_work and self._nodes:
            self._track(Deferred.fromCoroutine(self._guarded_unassigned_pass()))
        return control

    async def reassign_now(self, node_id: str, *, actor: str, note: str) -> reassign.Reassigned:
        """The operator's "reassign this node's unfinished tasks now"
        (whatever the timer; audited).  A v2 session of the node here gets
        its ``CANCEL``s at once.  :class:`~tasknet.site.storage.reassign.UnknownNode`
        for a node the site never heard of."""
        moved: reassign.Reassigned = await self._move(
            node_id, reassign.operator_reassign, actor=actor, note=note
        )
        self._gone_since.pop(node_id, None)
        self._moved(moved, "admin")
        session = self._nodes.get(node_id)
        if session is not None and session.protocol_version >= 2:
            self._send_cancels(session, moved.cancels)
        return moved

    async def retire(self, node_id: str, *, actor: str, note: str) -> reassign.Retired:
        """The operator's "retire this node": its unfinished tasks move now,
        its completed ones show ``ARCHIVE_GONE`` (``NODE_RETIRED``), its key
        goes, and its session here is closed (audited).
        :class:`~tasknet.site.storage.reassign.UnknownNode` for a node the
        site never heard of."""
        retired: reassign.Retired = await self._move(
            node_id, reassign.retire_node, actor=actor, note=note
        )
        more = retired.archives
        while more:  # the rest of a big node's archives, a transaction per batch
            more = await self._db.write(reassign.mark_retired_archives_gone, node_id)
            retired = dataclasses.replace(retired, archives=retired.archives + more)
        self._gone_since.pop(node_id, None)
        self._moved(retired.reassigned, "retire")
        if retired.archives:
            metrics.ARCHIVES_RELEASED.labels(reason="NODE_RETIRED").inc(retired.archives)
            if self._on_committed is not None:
                self._on_committed()
        session = self._nodes.get(node_id)
        if session is not None:
            session.close("node retired")
        return retired

    async def _node_pass(self, sessions: list[INodeSession]) -> None:
        """Resend each session's tasks: the pages of several nodes in one
        transaction (:func:`~tasknet.site.storage.dispatch.claim_nodes_pages`),
        each node's in gid order."""
        todo = [(session, 0) for session in sessions]
        resent: dict[str, int] = {}
        first = True
        while todo:
            todo = [(s, after) for s, after in todo if self._nodes.is_current(s)]
            if not todo:
                break
            # Decided in a write transaction; sent right after its commit
            # with no yield in between (see the module doc).
            wanted = [(s.node_id, after) for s, after in todo]
            if first:
                # The CANCELs owed to these nodes (v2 only) go first, decided
                # in the same transaction as their first pages.
                first = False
                v2 = [s for s, _ in todo if s.protocol_version >= 2]
                owed, pages = await self._db.write(
                    reassign.login_pages, [s.node_id for s in v2], wanted, self._page_size
                )
                for session in v2:
                    if self._nodes.is_current(session):
                        self._send_cancels(session, owed.get(session.node_id, []))
            else:
                pages = await self._db.write(storage.claim_nodes_pages, wanted, self._page_size)
            more = []
            for (session, _), page in zip(todo, pages, strict=False):
                if not self._nodes.is_current(session):
                    continue  # replaced or gone meanwhile: the new session has its own pass
                for command in page.commands:
                    self._send(session, command)
                if page.commands:
                    resent[session.node_id] = resent.get(session.node_id, 0) + len(page.commands)
                if page.last_gid is not None:
                    more.append((session, page.last_gid))
            todo = more + todo[len(pages) :]
        # Part of a login (its line is the listener's): a line only when it resent any.
        for node, n in resent.items():
            log.info("resent {n} command(s) to node {node}", n=n, node=node)

    async def _deletes_pass(self, node_ids: list[str] | None = None) -> None:
        """Pending deletes to the connected nodes (``node_ids``: those of
        them only, e.g. a burst of logins) that have not had them on their
        current connection."""
        after: int | None = 0
        pending: set[str] = set()
        if node_ids is not None and not node_ids:
            return
        # What was sent before this pass began: only those ids may be
        # forgotten at its end (one sent meanwhile may be newer than our pages).
        wanted = None if node_ids is None else set(node_ids)
        known_before = {
            node: set(ids)
            for node, ids in self._deletes_sent.items()
            if wanted is None or node in wanted
        }
        while after is not None:
            if not self._nodes:
                return
            page = await self._db.write(
                storage.pending_deletes_page,
                self._nodes.ids() if node_ids is None else node_ids,
                after,
                self._page_size,
            )
            for command in page.commands:
                pending.add(command.operation_id)
                self._send_unsent_delete(command)
            after = page.last_gid
        # A whole pass: forget ids no longer pending (completed), so the sets
        # stay small.
        for node, before in known_before.items():
            sent = self._deletes_sent.get(node)
            if sent is not None:
                sent -= before - pending

    def _send_unsent_delete(self, command: storage.Command) -> None:
        session = self._nodes.get(command.node_id)
        if session is not None and command.operation_id not in self._deletes_sent.get(
            session.node_id, ()
        ):
            self._send(session, command)

    def _send(self, session: INodeSession, command: storage.Command) -> None:
        send_command(session, command)
        self.sent += 1
        if command.action == ACTION_DELETE:
            self._deletes_sent.setdefault(session.node_id, set()).add(command.operation_id)

    async def _assign_all(self) -> None:
        after = 0
        loads = None
        while True:
            node_ids = self._nodes.ids()
            if not node_ids:
                return
            page = await self._db.write(
                storage.claim_unassigned_page, node_ids, after, self._page_size, loads
            )
            self._send_all(page.commands)
            if page.loads:
                # Counted in that transaction, with its assignments: exact.
                for node_id, load in page.loads.items():
                    if node_id in self._nodes:
                        self._loads[node_id] = load
            if page.last_gid is None:
                return
            after, loads = page.last_gid, page.loads

    async def _one(self, gid: int) -> None:
        if not self._nodes:
            return  # gone meanwhile: the next login's catch-up reads the task
        # The least loaded node as counted here (ties: the lowest id), so
        # the transaction counts nobody's tasks; a drained or paused node
        # (as last read here) is passed over.  A bounded node's room is
        # counted in the transaction: all open nodes go, loads counted there.
        open_nodes = [node for node in self._nodes if node not in self._closed] or list(self._nodes)
        target = min(open_nodes, key=lambda node: (self._loads.get(node, 0), node))
        if target in self._bounded:
            command = await self._db.write(storage.claim_task, gid, open_nodes)
        else:
            command = await self._db.write(
                storage.claim_task, gid, [target], {target: self._loads.get(target, 0)}
            )
        if command is not None:
            if command.action != ACTION_DELETE and command.node_id in self._nodes:
                self._loads[command.node_id] = self._loads.get(command.node_id, 0) + 1
            self._send_all([command])

    def _send_all(self, commands: list[storage.Command]) -> None:
        for command in commands:
            session = self._nodes.get(command.node_id)
            if session is None:
                # Assigned and marked, its node left meanwhile: resent on its login.
                continue
            self._send(session, command)
