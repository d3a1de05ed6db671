"""Sending commands to nodes (LIFECYCLE.md invariants 5, 9 and 10).

Dispatch is off until the site enables it after recovery succeeded
(:meth:`Dispatcher.enable`).  Then:

* on a node's login, the node gets every command for the tasks already
  assigned to it (``DOWNLOAD`` for those not yet completed at the site, with
  their own operationId, so a repeat is a no-op at the node; ``DELETE`` for
  pending deletes), and every eligible unassigned task is assigned to the
  least loaded connected node and sent;
* when a task becomes ``SUBMITTED`` or ``DELETE_PENDING`` (the lifecycle calls
  :meth:`Dispatcher.task_changed` after the commit), that one task is
  assigned if needed and sent to its node when connected.

Only what :mod:`tasknet.site.storage.dispatch` returns is ever sent: the
eligibility rule lives there (and in ``storage.tasks.is_dispatchable``).
Large sets are read a page at a time; between pages the reactor runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger

from tasknet.protocol.messages import ACTION_DELETE
from tasknet.site.storage import dispatch as storage
from tasknet.site.storage.db import Database
from tasknet.site.storage.reports import ReportOutcome

log = Logger()


class Session(Protocol):
    """What the site uses of a ``tasknet.protocol.session.Session``
    (a typing view of the zope interface, which mypy cannot check)."""

    node_id: str
    protocol_version: int
    features: tuple[str, ...]
    connected_at: float

    def send_download(
        self, operation_id: str, gid: int, token: str, name: str, url: str
    ) -> None: ...

    def send_delete(self, delete_operation_id: str, gid: int, name: str) -> None: ...

    def send_ack(self, report_id: str, result: str) -> None: ...

    def close(self, reason: str) -> None: ...


class ConnectedNodes:
    """The logged-in node sessions by node id (newest wins), and what the
    site knows of each node (last applied report revision)."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.last_revision: dict[str, int] = {}

    def attach(self, session: Session) -> None:
        self.sessions[session.node_id] = session

    def detach(self, session: Session) -> bool:
        """Forget ``session`` if it is still the node's current one."""
        if self.sessions.get(session.node_id) is session:
            del self.sessions[session.node_id]
            return True
        return False

    def current(self, node_id: str) -> Session | None:
        return self.sessions.get(node_id)

    def is_current(self, session: Session) -> bool:
        return self.sessions.get(session.node_id) is session

    def ids(self) -> list[str]:
        return sorted(self.sessions)

    def report_applied(self, session: Session, outcome: ReportOutcome) -> None:
        """After a committed report: remember the node's latest revision."""
        revision = outcome.revision
        if revision is not None and revision > self.last_revision.get(session.node_id, -1):
            self.last_revision[session.node_id] = revision


def send_command(session: Session, command: storage.Command) -> None:
    """One command on one session (the session picks the wire message)."""
    if command.action == ACTION_DELETE:
        session.send_delete(command.operation_id, command.gid, command.name)
    else:
        session.send_download(
            command.operation_id, command.gid, command.token, command.name, command.url
        )


class Dispatcher:
    """Assigns eligible tasks to connected nodes and sends their commands."""

    def __init__(
        self,
        db: Database,
        nodes: ConnectedNodes,
        *,
        page_size: int = storage.PAGE_SIZE,
        assign_delay: float = 0.0,
        clock: Any = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if assign_delay < 0:
            raise ValueError(f"assign_delay must be >= 0, got {assign_delay}")
        if clock is None:
            from twisted.internet import reactor as clock
        self._clock = clock
        self._assign_delay = assign_delay
        self._assign_call: Any = None
        self._db = db
        self._nodes = nodes
        self._page_size = page_size
        self.enabled = False
        self._unassigned_running = False
        self._unassigned_again = False
        self._running: set[Deferred[None]] = set()
        #: Commands sent since start (tests and logs).
        self.sent = 0

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

    def enable(self) -> Deferred[None]:
        """Turn dispatch on (recovery succeeded) and catch up with every
        node already connected."""
        self.enabled = True
        log.info("dispatch enabled")
        return self._track(
            Deferred.fromCoroutine(self._catch_up(list(self._nodes.sessions.values())))
        )

    def node_attached(self, session: Session) -> Deferred[None]:
        """A node logged in: resend its tasks, then hand out unassigned ones."""
        if not self.enabled:
            return succeed(None)
        return self._track(Deferred.fromCoroutine(self._catch_up([session])))

    def task_changed(self, gid: int) -> Deferred[None]:
        """``gid`` became ``SUBMITTED`` or ``DELETE_PENDING`` (committed):
        send its command if it has (or can get) a connected node."""
        if not self.enabled or not self._nodes.sessions:
            # Nobody to send to: not even a write.  The catch-up pass of the
            # next node to log in reads this (committed) task and assigns
            # or resends it then.
            return succeed(None)
        d = Deferred.fromCoroutine(self._one(gid))
        d.addErrback(lambda f: log.failure("dispatch of gid {gid} failed", f, gid=gid))
        return self._track(d)

    # -- passes

    async def _catch_up(self, sessions: Iterable[Session]) -> None:
        try:
            for session in sessions:
                await self._node_pass(session)
        except Exception:
            log.failure("dispatch pass failed")
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
            await self._unassigned_pass()
        except Exception:
            log.failure("assigning unassigned tasks failed")

    def stop(self) -> Deferred[None]:
        """Stop scheduling passes; fires when the running ones are done."""
        self.enabled = False
        if self._assign_call is not None and self._assign_call.active():
            self._assign_call.cancel()
        self._assign_call = None
        return self.idle()

    async def _node_pass(self, session: Session) -> None:
        after = 0
        sent = 0
        while self._nodes.is_current(session):
            page = await self._db.read(
                storage.node_commands_page, session.node_id, after, self._page_size
            )
            commands = page.commands
            if page.unprepared:
                commands += await self._db.write(
                    storage.prepare_commands, session.node_id, page.unprepared
                )
            if not self._nodes.is_current(session):
                break  # replaced or gone meanwhile: the new session has its own pass
            for command in commands:
                send_command(session, command)
            sent += len(commands)
            if page.last_gid is None:
                break
            after = page.last_gid
        self.sent += sent
        log.info("resent {n} command(s) to node {node}", n=sent, node=session.node_id)

    async def _unassigned_pass(self) -> None:
        # One pass at a time; a request during a pass runs one more after it.
        if self._unassigned_running:
            self._unassigned_again = True
            return
        self._unassigned_running = True
        try:
            again = True
            while again:
                self._unassigned_again = False
                await self._assign_all()
                again = self._unassigned_again
        finally:
            self._unassigned_running = False

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
            session = self._nodes.current(command.node_id)
            if session is None:
                # Assigned and marked, its node left meanwhile: resent on its login.
                continue
            send_command(session, command)
            self.sent += 1
