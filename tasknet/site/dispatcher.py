"""Sending commands to nodes (LIFECYCLE.md invariants 5, 9 and 10).

:class:`Dispatcher` is a service: off until the site starts it, once
recovery succeeded (``startService``).  Then:

* on a node's login, the node gets every command for the tasks already
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

Only what :mod:`tasknet.site.storage.dispatch` returns is ever sent: the
eligibility rule lives there (and in ``storage.eligibility.is_dispatchable``).
Every set of commands is decided inside a write transaction and sent on the
reactor right after its commit, with no yield in between, so a DOWNLOAD
never follows the DELETE of its task (see ``storage/dispatch.py``).  Large
sets go a page (one transaction) at a time; between pages the reactor runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger

from tasknet.clock import default_reactor
from tasknet.coalesce import CoalescingRunner
from tasknet.protocol.messages import ACTION_DELETE
from tasknet.protocol.session import INodeSession
from tasknet.site.connected_nodes import ConnectedNodes
from tasknet.site.storage import dispatch as storage
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Database

log = Logger()


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
        clock: Any = None,
        wakeups: listen.Wakeups | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if assign_delay < 0:
            raise ValueError(f"assign_delay must be >= 0, got {assign_delay}")
        if poll_interval is not None and poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 or None, got {poll_interval}")
        super().__init__()
        self._clock = default_reactor(clock)
        if poll_interval is not None:
            poll = TimerService(poll_interval, self._poll_tick)
            poll.clock = self._clock
            poll.setServiceParent(self)
        self._polling = False
        self._assign_delay = assign_delay
        self._assign_call: Any = None
        self._db = db
        self._nodes = nodes
        #: Delete ids sent on each node's current session (so the periodic
        #: pass sends a pending delete once per connection, not every time).
        self._deletes_sent: dict[str, set[str]] = {}
        self._page_size = page_size
        self.enabled = False
        # One unassigned pass at a time; a request during a pass runs one more after it.
        self._unassigned = CoalescingRunner(self._assign_all)
        self._running: set[Deferred[None]] = set()
        #: Commands sent since start, periodic passes completed (tests, logs).
        self.sent = 0
        self.polls = 0
        self._wakeups: listen.Wakeups = wakeups if wakeups is not None else listen.NoWakeups()
        self._subscription: listen.Subscription | None = None
        #: Tasks announced by another site and handled here (tests, logs).
        self.hints = 0

    def _track(self, d: Deferred[None]) -> Deferred[None]:
        if not d.called:
            self._running.add(d)

            def done(result: object) -> object:
                self._running.discard(d)
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
        await self._guarded_unassigned_pass()
        await self._guarded_deletes_pass()

    def node_attached(self, session: INodeSession) -> Deferred[None]:
        """A node logged in: resend its tasks, then hand out unassigned ones."""
        self._deletes_sent[session.node_id] = set()  # a new connection has had none
        if not self.enabled:
            return succeed(None)
        return self._track(Deferred.fromCoroutine(self._catch_up([session])))

    def node_detached(self, session: INodeSession) -> None:
        """A node's session went: forget the deletes sent on it, unless a
        newer session of the node has already taken its place."""
        if session.node_id not in self._nodes:
            self._deletes_sent.pop(session.node_id, None)

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

    async def _catch_up(self, sessions: Iterable[INodeSession]) -> None:
        try:
            for session in sessions:
                await self._node_pass(session)
        except Exception:
            log.failure("dispatch pass failed")
        # Pending deletes of tasks a node has just claimed, among others.
        await self._guarded_deletes_pass()
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

    async def _guarded_deletes_pass(self) -> None:
        try:
            await self._deletes_pass()
        except Exception:
            log.failure("sending pending deletes failed")

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
        stopped: Deferred[Any] = super().stopService() if self.running else succeed(None)
        return stopped.addCallback(lambda _: self.idle())

    async def _node_pass(self, session: INodeSession) -> None:
        after = 0
        sent = 0
        while self._nodes.is_current(session):
            # Decided in a write transaction; sent right after its commit
            # with no yield in between (see the module doc).
            page = await self._db.write(
                storage.claim_node_page, session.node_id, after, self._page_size
            )
            if not self._nodes.is_current(session):
                break  # replaced or gone meanwhile: the new session has its own pass
            for command in page.commands:
                self._send(session, command)
            sent += len(page.commands)
            if page.last_gid is None:
                break
            after = page.last_gid
        # Part of a login (its line is the listener's): a line only when it resent any.
        (log.info if sent else log.debug)(
            "resent {n} command(s) to node {node}", n=sent, node=session.node_id
        )

    async def _deletes_pass(self) -> None:
        """Pending deletes to the connected nodes that have not had them on
        their current connection."""
        after: int | None = 0
        pending: set[str] = set()
        # What was sent before this pass began: only those ids may be
        # forgotten at its end (one sent meanwhile may be newer than our pages).
        known_before = {node: set(ids) for node, ids in self._deletes_sent.items()}
        while after is not None:
            if not self._nodes:
                return
            page = await self._db.write(
                storage.pending_deletes_page, self._nodes.ids(), after, self._page_size
            )
            for command in page.commands:
                pending.add(command.operation_id)
                self._send_unsent_delete(command)
            after = page.last_gid
        # A whole pass: forget ids no longer pending (completed), so the sets
        # stay small.
        for node, sent in self._deletes_sent.items():
            sent -= known_before.get(node, set()) - pending

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
            if page.last_gid is None:
                return
            after, loads = page.last_gid, page.loads

    async def _one(self, gid: int) -> None:
        command = await self._db.write(storage.claim_task, gid, self._nodes.ids())
        if command is not None:
            self._send_all([command])

    def _send_all(self, commands: list[storage.Command]) -> None:
        for command in commands:
            session = self._nodes.get(command.node_id)
            if session is None:
                # Assigned and marked, its node left meanwhile: resent on its login.
                continue
            self._send(session, command)
