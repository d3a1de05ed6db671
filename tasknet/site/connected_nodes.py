"""The site's one registry of logged-in node sessions (newest wins), and
which site of the database holds each node (:class:`NodeOwnership`).

The node listener (``node_listener.py``) attaches a session when its login
succeeds and detaches it when its connection goes; a newer session for the
same node replaces the older one, which :meth:`ConnectedNodes.attach` hands
back for the listener to close.  The dispatcher asks it whom to send to, the
report pipeline tells it which revision each node's reports reached, and the
admin view (``web/admin_nodes.py``) lists what it holds.

Several sites on one database (SCALE.md 5): a node is held by one site at a
time, and the newest connection wins across sites.  The database decides
(``storage/node_sessions.py``): each attached session takes the node's row
(:meth:`NodeOwnership.take`) and, once that committed, carries the
:class:`~tasknet.site.storage.node_sessions.Holding` of its login.
:class:`NodeOwnership` watches for logins elsewhere -- the
``tasknet_node_taken`` notification, and a check every ``check_interval``
seconds that covers a lost one -- and has the listener close a session whose
node another connection took.  On PostgreSQL (where another site may exist)
every report is first confirmed against the database (:meth:`confirm`,
one read for the reports that arrive together); on SQLite there is one site
per file, the in-process registry alone decides, and nothing is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from tasknet.clock import default_reactor
from tasknet.coalesce import CoalescingRunner
from tasknet.protocol.session import INodeSession
from tasknet.site.storage import node_sessions, throughput
from tasknet.site.storage.engine import listen
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.node_sessions import Holding
from tasknet.site.storage.reports import ReportOutcome

__all__ = ["ConnectedNodes", "NodeOwnership"]

log = Logger()

#: Seconds between two checks that this site's sessions still hold their
#: nodes (the safety net under the ``tasknet_node_taken`` notification).
CHECK_INTERVAL = 5.0


class ConnectedNodes(Mapping[str, INodeSession]):
    """Node id → the node's current (newest) logged-in session.

    A read-only mapping to its readers; only :meth:`attach` and
    :meth:`detach` change it.  It also remembers the last report revision
    applied for each node since the site started, and each session's
    :class:`Holding` (``None`` for a session attached without one).
    ``site_name`` and ``instance_id`` say who this site is in the
    ``node_session`` rows (the admin view tells its own rows from others').
    """

    def __init__(self, site_name: str = "", instance_id: int | None = None) -> None:
        self.site_name = site_name
        self.instance_id = instance_id
        self._sessions: dict[str, INodeSession] = {}
        self._holdings: dict[str, Holding | None] = {}
        self._last_revision: dict[str, int] = {}

    # -- Mapping

    def __getitem__(self, node_id: str) -> INodeSession:
        return self._sessions[node_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __repr__(self) -> str:
        return f"<ConnectedNodes {sorted(self._sessions)}>"

    # -- the listener

    def attach(self, session: INodeSession) -> INodeSession | None:
        """Make ``session`` its node's current one; give back the session it
        replaced (newest wins), if any, for the caller to close."""
        old = self._sessions.get(session.node_id)
        self._sessions[session.node_id] = session
        if old is not session:
            self._holdings[session.node_id] = None
        return old if old is not session else None

    def hold(self, session: INodeSession, holding: Holding) -> bool:
        """``session``'s take committed: remember its holding, if it is
        still the current one (true)."""
        if not self.is_current(session):
            return False
        self._holdings[session.node_id] = holding
        return True

    def detach(self, session: INodeSession) -> bool:
        """Forget ``session`` if it is still its node's current one (a
        replaced session is already gone); true if it was."""
        if self._sessions.get(session.node_id) is session:
            del self._sessions[session.node_id]
            del self._holdings[session.node_id]
            return True
        return False

    # -- readers

    def is_current(self, session: INodeSession) -> bool:
        return self._sessions.get(session.node_id) is session

    def ids(self) -> list[str]:
        """The connected node ids, sorted."""
        return sorted(self._sessions)

    def holding_of(self, session: INodeSession) -> Holding | None:
        """``session``'s hold on its node, while it is the current one."""
        return self._holdings.get(session.node_id) if self.is_current(session) else None

    def holdings(self) -> dict[Holding, INodeSession]:
        """The current sessions that carry a holding, by holding."""
        return {
            holding: self._sessions[node_id]
            for node_id, holding in self._holdings.items()
            if holding is not None
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


class NodeOwnership:
    """This site's side of ``node_session`` (see the module doc): takes a
    node at login, gives it back when the connection goes, confirms reports,
    and while :meth:`start`-ed watches for the node being taken elsewhere.

    ``shared``: the database may have other sites (PostgreSQL).  ``wakeups``
    carries ``tasknet_node_taken`` (:class:`~tasknet.site.storage.engine.listen.NoWakeups`
    on SQLite)."""

    def __init__(
        self,
        db: Database,
        nodes: ConnectedNodes,
        *,
        wakeups: listen.Wakeups | None = None,
        check_interval: float | None = CHECK_INTERVAL,
        clock: Any = None,
    ) -> None:
        if check_interval is not None and check_interval <= 0:
            raise ValueError(f"check_interval must be > 0 or None, got {check_interval}")
        self._db = db
        self.nodes = nodes
        self.shared = db.backend == "postgresql"
        self._wakeups: listen.Wakeups = wakeups if wakeups is not None else listen.NoWakeups()
        self._check_interval = check_interval
        self._clock = default_reactor(clock)
        self._pending: list[tuple[Holding, Deferred[bool]]] = []
        self._confirmer = CoalescingRunner(self._confirm_pending)
        self._checker = CoalescingRunner(self._check_all)
        self._loop: LoopingCall | None = None
        self._subscription: listen.Subscription | None = None
        self._lost: Callable[[INodeSession], object] = lambda session: None
        # Takes not yet committed, and the newest epoch notified per node
        # (a notification may come before our own take's answer).
        self._takes: dict[INodeSession, list[Deferred[None]]] = {}
        self._latest: dict[str, int] = {}
        #: Sessions closed because another connection took their node
        #: (notification or check), and checks run (tests, logs).
        self.taken_elsewhere = 0
        self.checks = 0

    # -- logins and disconnects

    def take(self, session: INodeSession) -> Deferred[Holding]:
        """``session`` logged in: make it its node's holder (one write
        transaction).  Once committed the registry has its holding, or, if
        it is no longer its node's current session here, the node is given
        back (unless a newer take holds it); then the Deferred fires with
        the holding.  Reports waiting for the take are confirmed after that."""
        self._takes[session] = []
        d = self._db.write(
            node_sessions.take,
            session.node_id,
            self.nodes.instance_id,
            self.nodes.site_name,
            session.protocol_version,
            tuple(session.features),
            throughput.iso(session.connected_at),
        )
        held: Deferred[Holding] = d.addCallback(self._taken_here, session)

        def settled(result: Any) -> Any:
            for waiter in self._takes.pop(session, []):
                waiter.callback(None)
            return result

        return held.addBoth(settled)

    def _taken_here(self, result: node_sessions.Taken, session: INodeSession) -> Holding:
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
        if not self.nodes.hold(session, holding):
            # Gone or replaced here while its take committed.
            self.release(holding)
        elif self._latest.get(holding.node_id, 0) > holding.epoch:
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

    def confirm(self, session: INodeSession) -> Deferred[bool]:
        """Whether a report just received on ``session`` may be applied:
        the session is its node's current one here and, on a shared
        database, still holds the node (read after the report arrived;
        reports arriving together share one read).  A report the database
        cannot be asked about (a failed read) is let through: applying it
        is what decides, and the node's reports are the node's, whichever
        connection carried them."""
        if not self.nodes.is_current(session):
            return succeed(False)
        if not self.shared:
            return succeed(True)
        holding = self.nodes.holding_of(session)
        if holding is None:
            waiting = self._takes.get(session)
            if waiting is None:
                return succeed(False)  # its take failed: it is being closed
            taken: Deferred[None] = Deferred()
            waiting.append(taken)
            return taken.addCallback(lambda _: self.confirm(session))
        d: Deferred[bool] = Deferred()
        self._pending.append((holding, d))
        self._confirmer.run()
        return d

    async def _confirm_pending(self) -> None:
        batch, self._pending = self._pending, []
        try:
            held = await self._db.read(node_sessions.still_held, [h for h, _ in batch])
        except Exception:
            log.failure("confirming {n} report(s) against node_session failed", n=len(batch))
            held = {h for h, _ in batch}
        for holding, d in batch:
            d.callback(holding in held)

    # -- watching for logins elsewhere

    def start(self, lost: Callable[[INodeSession], object]) -> None:
        """Call ``lost(session)`` for each current session whose node
        another connection took (the caller closes it), until :meth:`stop`."""
        self._lost = lost
        if self._subscription is None:
            self._subscription = self._wakeups.subscribe(listen.NODE_TAKEN, self._notified)
        if self.shared and self._check_interval is not None and self._loop is None:
            self._loop = LoopingCall(self._check_in_background)
            self._loop.clock = self._clock
            self._loop.start(self._check_interval, now=False)

    def stop(self) -> Deferred[None]:
        """Stop watching; fires when the wake-ups let go."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        subscription, self._subscription = self._subscription, None
        return subscription.cancel() if subscription is not None else succeed(None)

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
        # Not returned to the LoopingCall: a failed check must not stop it.
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

    def _taken(self, session: INodeSession, holding: Holding) -> None:
        self.taken_elsewhere += 1
        log.info(
            "node {node}: a newer connection took it (epoch {epoch} is no longer"
            " the node's); closing this one",
            node=holding.node_id,
            epoch=holding.epoch,
        )
        self._lost(session)
