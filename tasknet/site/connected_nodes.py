"""The site's one registry of logged-in node sessions (newest wins), and
which site of the database holds each node (:class:`NodeOwnership`).

A session's life (:class:`~tasknet.site.session_states.SessionLife`, the
table of ``session_states.py``) attaches it to the registry as it becomes
its node's current one and detaches it as it leaves (its outputs); the
registry moves no session itself, but feeds ``REPLACED`` to the older
session a newer one of the same node displaces (newest wins).  So the
registry holds exactly the sessions that say they are attached.  The
dispatcher asks it whom to send to, the report pipeline tells it which
revision each node's reports reached, and the admin view
(``web/admin_nodes.py``) lists what it holds.

Several sites on one database (SCALE.md 5): a node is held by one site at a
time, and the newest connection wins across sites.  The database decides
(``storage/node_sessions.py``): each attached session takes the node's row
(:meth:`NodeOwnership.take`) and, once that committed, is ``HELD`` with the
:class:`~tasknet.site.storage.node_sessions.Holding` of its login.  Its
reports carry that holding (:meth:`NodeOwnership.holding`: a report that
arrives before the take committed waits for it), and each is judged against
the node's row in the report's own transaction, on both backends
(``storage/reports.py``).  :class:`NodeOwnership` is a service: while it
runs it watches for logins elsewhere -- the ``tasknet_node_taken``
notification, and on a shared database a check every ``check_interval``
seconds (a ``TimerService`` child on the site's clock) that covers a lost
one -- and feeds ``TAKEN_ELSEWHERE`` to a session whose node another
connection took (its life detaches and closes it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from tasknet.coalesce import CoalescingRunner
from tasknet.protocol.session import INodeSession
from tasknet.site.session_states import ITrackedSession, SessionInput
from tasknet.site.storage import node_sessions
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.node_sessions import Holding
from tasknet.site.storage.reports import ReportOutcome

__all__ = ["ConnectedNodes", "NodeOwnership"]

log = Logger()

#: Seconds between two checks that this site's sessions still hold their
#: nodes (the safety net under the ``tasknet_node_taken`` notification).
CHECK_INTERVAL = 5.0


class ConnectedNodes(Mapping[str, ITrackedSession]):
    """Node id → the node's current (newest) logged-in session.

    A read-only mapping to its readers; only :meth:`attach` and
    :meth:`detach` change it, each an output of the session's life.  It
    also remembers the last report revision applied for each node since the
    site started.  ``site_name`` and ``instance_id`` say who this site is
    in the ``node_session`` rows (the admin view tells its own rows from
    others').  Each session says where its node serves archives
    (``archive_url``, ``serve_url``: ``""`` when none), believed as it was
    attached (``node_listener.py``): ``nodes.get(node_id)`` is how the
    archive routes find them.  A node held by another site of the database
    is not here, whatever it serves.
    """

    def __init__(self, site_name: str = "", instance_id: int | None = None) -> None:
        self.site_name = site_name
        self.instance_id = instance_id
        self._sessions: dict[str, ITrackedSession] = {}
        self._last_revision: dict[str, int] = {}

    # -- Mapping

    def __getitem__(self, node_id: str) -> ITrackedSession:
        return self._sessions[node_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __repr__(self) -> str:
        return f"<ConnectedNodes {sorted(self._sessions)}>"

    # -- the sessions' outputs

    def attach(self, session: ITrackedSession) -> ITrackedSession | None:
        """``session`` became its node's current one (its life says so): hold
        it, and feed ``REPLACED`` to the session it displaces (newest wins),
        given back.  Attaching the current session again changes nothing."""
        old = self._sessions.get(session.node_id)
        if old is session:
            return None
        self._sessions[session.node_id] = session
        if old is None:
            return None
        old.life.handle(SessionInput.REPLACED)
        return old

    def detach(self, session: ITrackedSession) -> bool:
        """``session`` left its attached states: forget it if it is its node's
        current one (true; a replaced session is already gone)."""
        if self._sessions.get(session.node_id) is not session:
            return False
        del self._sessions[session.node_id]
        return True

    # -- readers

    def is_current(self, session: INodeSession) -> bool:
        """Whether ``session`` is its node's current one."""
        return self._sessions.get(session.node_id) is session

    def ids(self) -> list[str]:
        """The connected node ids, sorted."""
        return sorted(self._sessions)

    def holding_of(self, session: ITrackedSession) -> Holding | None:
        """``session``'s hold on its node, while it holds it (``HELD``)."""
        return session.life.holding if session.life.held else None

    def holdings(self) -> dict[Holding, ITrackedSession]:
        """The current sessions that hold their node, by holding."""
        return {
            session.life.holding: session
            for session in self._sessions.values()
            if session.life.held and session.life.holding is not None
        }

    # -- reports

    def report_applied(self, session: INodeSession, outcome: ReportOutcome) -> None:
        """After a committed report: remember the node's latest revision (it
        goes down only when the report started a new revision epoch)."""
        revision = outcome.revision
        if revision is None:
            return
        if outcome.new_epoch or revision > self._last_revision.get(session.node_id, -1):
            self._last_revision[session.node_id] = revision

    def last_revision(self, node_id: str) -> int | None:
        """The revision of the last report applied since the site started."""
        return self._last_revision.get(node_id)


class NodeOwnership(MultiService):
    """This site's side of ``node_session`` (see the module doc): takes a
    node at login, gives it back when the connection goes, gives each
    report the holding it is judged against, and while running watches for
    the node being taken elsewhere.

    ``shared``: other sites may share the database
    (``db.capabilities.shared_by_sites``), and only then is there a
    periodic check.  ``wakeups`` carries
    ``tasknet_node_taken`` (:class:`~tasknet.site.storage.engine.listen.NoWakeups`
    on SQLite)."""

    def __init__(
        self,
        db: Database,
        nodes: ConnectedNodes,
        *,
        wakeups: listen.Wakeups | None = None,
        check_interval: float | None = CHECK_INTERVAL,
        clock: IReactorTime,
    ) -> None:
        if check_interval is not None and check_interval <= 0:
            raise ValueError(f"check_interval must be > 0 or None, got {check_interval}")
        super().__init__()
        self._db = db
        self.nodes = nodes
        self.shared = db.capabilities.shared_by_sites
        self._wakeups: listen.Wakeups = wakeups if wakeups is not None else listen.NoWakeups()
        if self.shared and check_interval is not None:
            check = TimerService(check_interval, self._check_in_background)
            check.clock = clock
            check.setServiceParent(self)
        self._checker = CoalescingRunner(self._check_all)
        self._subscription: listen.Subscription | None = None
        # Takes not yet committed, with the reports waiting for them, and
        # the newest epoch notified per node (a notification may come
        # before our own take's answer).
        self._takes: dict[ITrackedSession, list[Deferred[None]]] = {}
        self._latest: dict[str, int] = {}
        #: Sessions closed because another connection took their node
        #: (notification or check), and checks run (tests, logs).
        self.taken_elsewhere = 0
        self.checks = 0

    # -- the service

    def startService(self) -> None:
        """Watch: the notification now, the check every ``check_interval``
        seconds (a first one at once: nothing is held yet at a site's start)."""
        if self._subscription is None:
            self._subscription = self._wakeups.subscribe(listen.NODE_TAKEN, self._notified)
        super().startService()

    def stopService(self) -> Deferred[None]:
        """Stop watching; fires when the wake-ups let go."""
        stopped: Deferred[None] = super().stopService()
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            stopped.addCallback(lambda _: subscription.cancel())
        return stopped.addCallback(lambda _: None)

    # -- logins and disconnects

    def take(self, session: ITrackedSession) -> Deferred[Holding]:
        """``session`` logged in: make it its node's holder (one write
        transaction, shared with the other logins queued meanwhile).  Once
        committed the session is fed ``TAKE_COMMITTED``: it is ``HELD`` or,
        if it is no longer its node's current session here, gives the node
        back (unless a newer take holds it); then the Deferred fires with
        the holding.
        Reports waiting for the take go on after that."""
        self._takes[session] = []
        # The takes of a burst of logins share a transaction (few, short
        # writes: the creates queued meanwhile are not held behind them).
        d = self._db.write_joined(
            node_sessions.take_all,
            (
                session.node_id,
                self.nodes.instance_id,
                self.nodes.site_name,
                session.protocol_version,
                tuple(session.features),
                iso(session.connected_at),
            ),
        )
        held: Deferred[Holding] = d.addCallback(
            lambda committed: self._taken_here(committed.value, session)
        )

        def settled(result: Any) -> Any:
            for waiter in self._takes.pop(session, []):
                waiter.callback(None)
            return result

        return held.addBoth(settled)

    def _taken_here(self, result: node_sessions.Taken, session: ITrackedSession) -> Holding:
        holding = result.holding
        if result.previous_site is not None and (
            result.previous_instance != self.nodes.instance_id
            or result.previous_site != self.nodes.site_name
        ):
            log.info(
                "node {node} moved here from site {site} (instance {instance})",
                node=session.node_id,
                site=result.previous_site,
                instance=result.previous_instance,
            )
        # HELD if still current; gone or replaced meanwhile, it gives it back.
        session.life.handle(SessionInput.TAKE_COMMITTED, holding)
        if session.life.held and self._latest.get(holding.node_id, 0) > holding.epoch:
            # A take elsewhere was notified before this answer came.
            self._taken(session, holding)
        return holding

    def release(self, holding: Holding) -> Deferred[None]:
        """The connection of ``holding`` went: free its node, unless a newer
        connection holds it (best effort: a failure is logged; the row is
        freed by the next login, or by the reaper)."""
        d = self._db.write(node_sessions.release, holding)

        def failed(failure: Any) -> None:
            log.failure("releasing node {node} failed", failure, node=holding.node_id)

        return d.addCallbacks(lambda _: None, failed)

    # -- reports

    def holding(self, session: ITrackedSession) -> Deferred[Holding | None]:
        """The holding a report just received on ``session`` is judged
        against (in its transaction): at once while the session is
        ``HELD``, after its take committed while that is under way, and
        ``None`` (the report is refused) when it holds nothing: its take
        failed, or it is no longer its node's current session."""
        life = session.life
        if life.held:
            return succeed(life.holding)
        waiting = self._takes.get(session)
        if waiting is None:
            return succeed(None)
        taken: Deferred[None] = Deferred()
        waiting.append(taken)
        return taken.addCallback(lambda _: self.holding(session))

    # -- watching for logins elsewhere

    def _notified(self, channel: str, payload: str | None) -> None:
        if payload is None:  # the notifications may have been lost: check now
            self._check_in_background()
            return
        parsed = node_sessions.parse_taken_payload(payload)
        if parsed is None:
            log.warn(
                "ignoring a malformed {channel} payload {payload!r}",
                channel=channel,
                payload=payload,
            )
            return
        node_id, epoch = parsed
        self._latest[node_id] = max(epoch, self._latest.get(node_id, 0))
        session = self.nodes.get(node_id)
        if session is None:
            return
        holding = self.nodes.holding_of(session)
        if holding is not None and holding.epoch < epoch:
            self._taken(session, holding)

    def _check_in_background(self) -> None:
        # Not returned to the timer: a failed check must not stop it.
        self._checker.run().addErrback(
            lambda f: log.failure("checking which nodes this site holds failed", f)
        )

    async def _check_all(self) -> None:
        current = self.nodes.holdings()
        if current:
            held = await self._db.read(node_sessions.still_held, list(current))
            for holding, session in current.items():
                if holding not in held and self.nodes.holding_of(session) == holding:
                    self._taken(session, holding)
        self.checks += 1

    def _taken(self, session: ITrackedSession, holding: Holding) -> None:
        self.taken_elsewhere += 1
        log.info(
            "node {node}: a newer connection took it (epoch {epoch} is no longer"
            " the node's); closing this one",
            node=holding.node_id,
            epoch=holding.epoch,
        )
        session.life.handle(SessionInput.TAKEN_ELSEWHERE)
