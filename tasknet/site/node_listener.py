"""The site's node listener: one :class:`NodeSession` per node connection.

On accept the site sends ``Identity`` (fresh nonce) and ``ProtocolHello`` at
once.  At ``Login`` it checks the HMAC signature against the node's key and
decides the wire version without a timer: v2 only if the node's Hello came
first.  A logged-in session goes into the site's :class:`ConnectedNodes`
(where a newer connection for the same node replaces the older one: newest
wins) and is handed to the :class:`ISiteHandler`.  Each session's life
(from its Login's turn and its challenge to its take, its replacement and
its close) is its :class:`~tasknet.site.session_states.SessionLife`, moved
only by the table of ``session_states.py``: :class:`NodeSession` names its
inputs (the node's messages, its Login's turn as judged, the challenge
deadline, the connection's loss) and is the outputs the table lists; the
registry, the ownership, the admission's grace and the ACKs feed the
others.

Mutual authentication (PROTOCOL.md): a v2 node whose Hello announces
``site-proof`` sends ``NodeChallenge`` right after its accepted
``LoginResult``; its session is ``PROVING``, and attached (registry,
ownership, handler: the dispatcher does not know it yet, so no command can
go to it) only once the site has answered with ``SiteProof``.  Anything
else such a node sends first, or no challenge within ``login_timeout`` of
the LoginResult, closes the connection.  A node without ``site-proof`` (the
previous release) is attached at login, as before, and gets no proof.

Where a v2 node serves its archives (its Hello's ``archiveUrl`` and
``serveUrl``, DELIVERY.md "Serving (node)") is believed only as the session
is attached: once logged in and, with ``site-proof``, proven.  Until then,
on a legacy session, and for a value that is not an ``http://`` or
``https://`` URL with a host (logged), the session's ``archive_url`` and
``serve_url`` are ``""``.

Node-secret guessing is slowed per client address (an
:class:`~tasknet.site.ratelimit.AuthFailureLimiter`, ``login_guesses``):
each Login takes an attempt from its address's bucket when its turn comes,
before anything is looked up, and an accepted one gives it back.  An empty
bucket refuses the Login at once (``LoginResult{false, "too many failed
logins from this address: retry in N s"}``, then close), one log line a
minute per address; ``tasknet_auth_failures_total{kind="node_secret"}``
counts wrong secrets and unknown nodes, ``tasknet_auth_throttled_total
{kind="node_secret"}`` the Logins refused unjudged.

Logins are admitted at a pace (:meth:`NodeListenerFactory.admit`): at most
:data:`LOGINS_PER_TURN` per turn of the reactor, and at most
:data:`LOGINS_IN_FLIGHT` whose take and first report are still under way;
the others wait, in arrival order, with their connection open (a storm of
logins after a restart then costs the API a transaction's worth of delay,
not seconds).

With a :class:`NodeOwnership` (every site the composition root builds)
each attached session also takes its node in the database (one write,
queued before anything the login makes the dispatcher write, so on one
site's writer nothing about the node is decided before it), and is
``HELD`` when that commits: the take that commits last wins, across every
site of the database (SCALE.md 5).  The node is answered at once, as on a
site of its own; its reports wait for the take and are judged against it
in their own transaction (``NodeOwnership.holding``).  A session whose node
another connection took -- at this site (the registry: ``REPLACED``) or
at another (the ownership's notification or check: ``TAKEN_ELSEWHERE``) --
gets ``Goodbye{"replaced by a newer connection"}`` and is closed; one whose
take failed (the database busy or down) gets ``Goodbye{"site busy, try
again"}``.  A held session that went gives its node back.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.protocol.connection import LOGIN_TIMEOUT, PeerFactory, PeerProtocol, hello_is_v2
from tasknet.protocol.messages import (
    ACTION_CANCEL,
    ACTION_DELETE,
    ACTION_DOWNLOAD,
    FEATURE_ARCHIVE_INVENTORY,
    FEATURE_SITE_PROOF,
    INT63_MAX,
    MAX_PAYLOAD,
    PRE_LOGIN_MAX_PAYLOAD,
    ArchiveInventory,
    ArchiveInventoryAck,
    DeleteGallery,
    DeleteResult,
    DownloadPost,
    Goodbye,
    HeldArchive,
    Identity,
    Login,
    LoginResult,
    Message,
    NodeChallenge,
    ProtocolHello,
    SiteProof,
    StatusReport,
    TaskCommand,
    TaskReport,
    TaskReportAck,
    sign_site_proof,
    verify_login,
)
from tasknet.protocol.session import ISiteHandler
from tasknet.runtime import IEntropy
from tasknet.site import metrics
from tasknet.site.connected_nodes import ConnectedNodes, NodeOwnership
from tasknet.site.ratelimit import AuthFailureLimiter
from tasknet.site.session_states import ITrackedSession, SessionInput, SessionLife

__all__ = [
    "INVENTORY_PARTS_MAX",
    "NODES_BACKLOG",
    "NodeListenerFactory",
    "NodeSession",
    "announced_url",
]

log = Logger()


def _wire_text(value: str) -> str:
    """A name for the wire: no NUL (a node refuses a frame holding one)."""
    return value.replace("\x00", "") if "\x00" in value else value


def _wire_url(value: str) -> str:
    """A URL for the wire: a NUL percent-encoded, as it would be in a URL."""
    return value.replace("\x00", "%00") if "\x00" in value else value


def announced_url(value: str) -> str | None:
    """``value`` if it is a base URL the site may use (``http://`` or
    ``https://``, a host, a valid port, no credentials, query nor fragment,
    no whitespace or control character), else ``None``.  ``""`` (none) is
    returned as it is."""
    if value == "":
        return value
    if any(c <= " " or c == "\x7f" for c in value):
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 -- raises ValueError for a port out of range or not a number
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None
    return value


#: The listen backlog of the site's default ``--nodes`` endpoint: after a
#: site restart every node reconnects within a second or two, and Twisted's
#: default (50) drops the SYNs of the rest (retried after 1, 3, 7 s).  An
#: endpoint of the operator's own sets it with ``backlog=``.
NODES_BACKLOG = 1024

#: Logins handled in one turn of the reactor at most; the rest wait for the
#: next turns, in arrival order.  After a restart every node logs in within
#: a second or two: handled at once, those logins (and the reports and
#: commands they set off) would hold the reactor for a second and more
#: at a time, and ``/healthz`` and the API with it.
LOGINS_PER_TURN = 32

#: Logins admitted and not yet settled, at most: the next ones wait.  A
#: login is settled when the first report of its connection was applied
#: (its ACK goes out), or :data:`LOGIN_GRACE` seconds after its take (the
#: ownership's write) committed or failed, or when its connection goes.
#: So a storm of logins goes at the pace of the writer, and the writes it
#: sets off (takes, catch-ups, the first reports after a restart) never
#: queue up ahead of a create by much more than one transaction's worth.
LOGINS_IN_FLIGHT = 64
#: Seconds a login whose node sends no report (a legacy node, an idle one)
#: stays in flight after its take.
LOGIN_GRACE = 0.1

#: Failed node Logins per client address at once, then a second: a node
#: with a wrong secret retries a few times a minute (its backoff), so only
#: a guesser meets the limit (issue 38: 3,000 guesses in 1.1 s before).
DEFAULT_NODE_LOGIN_FAILURES = 100
DEFAULT_NODE_LOGIN_FAILURE_RATE = 1.0

#: The Goodbye of a session whose node a newer connection took.
REPLACED = "replaced by a newer connection"

#: An ArchiveInventory of more parts is ``bad_message``: a connection holds
#: at most one unfinished inventory, so at most this many parts of
#: ``INVENTORY_PART_MAX`` archives (ten million) in memory.
INVENTORY_PARTS_MAX = 1_000


class _PartialInventory:
    """The parts of one inventory received so far on a connection."""

    __slots__ = ("inventory_id", "parts", "received")

    def __init__(self, inventory_id: str, parts: int) -> None:
        self.inventory_id = inventory_id
        self.parts = parts
        self.received: dict[int, tuple[HeldArchive, ...]] = {}

    def whole(self, last_part: int) -> ArchiveInventory:
        """Every part's archives in part order, as one ArchiveInventory whose
        ``part`` is the one that completed it (its ACK follows the judgement)."""
        archives = tuple(a for n in range(1, self.parts + 1) for a in self.received[n])
        return ArchiveInventory(self.inventory_id, last_part, self.parts, archives)


class AcceptedLogin(NamedTuple):
    """The event of an accepted Login: it, and its node's secret (for the SiteProof)."""

    login: Login
    secret: str


@implementer(ITrackedSession)
class NodeSession(PeerProtocol):
    """One node connection; an :class:`INodeSession` once logged in.

    Its life is :attr:`life`, run by the table of ``session_states.py``:
    this class names its inputs (:meth:`_input_of`, :meth:`_judged`) and
    is its outputs (the methods the table names); nothing else decides.
    """

    factory: NodeListenerFactory
    # What a node may send the site once logged in (reports; v2 adds TaskReport,
    # the challenge of a node that wants the site to prove itself, and the
    # inventory of a node that announced archive-inventory).
    incoming_legacy = frozenset({StatusReport.TYPE, DeleteResult.TYPE})
    incoming_v2 = frozenset({TaskReport.TYPE, NodeChallenge.TYPE, ArchiveInventory.TYPE})
    peer_role = "node"

    def __init__(self, factory: NodeListenerFactory) -> None:
        super().__init__(factory)
        self.nonce = factory.entropy.token_hex(16)
        self.node_id = ""
        self.features: tuple[str, ...] = ()
        self.connected_at = 0.0
        #: Where the node serves archives: its Hello's, believed at attach.
        self.archive_url = ""
        self.serve_url = ""
        #: Where this connection is in its life (``session_states.py``).
        self.life = SessionLife(self)
        # What the exchange has told us so far (data the outputs and the
        # naming of inputs read; never a decision of their own).
        self._hello: ProtocolHello | None = None  # decides v2 at the Login's turn
        self._secret = ""  # the node's, kept from its Login for the SiteProof
        #: The factory's number of this connection's accepted Login.
        self.login_number = 0
        self._challenge_deadline: IDelayedCall | None = None  # armed exactly while PROVING
        #: The inventory whose parts are arriving (one at a time; lost with
        #: the connection, so an inventory cut halfway changes nothing).
        self._inventory: _PartialInventory | None = None

    # -- the machine: inputs

    def _input(self, what: SessionInput, event: Any = None) -> None:
        """Feed the life an input of this connection's own (a message, the
        challenge deadline, the loss).  A connection that is closing
        (whoever closed it) reads nothing more and takes no such input but
        its loss: a deadline due meanwhile changes nothing."""
        if self.closing and what is not SessionInput.CONNECTION_LOST:
            return
        self.life.handle(what, event)

    def _input_of(self, message: Message) -> SessionInput:
        """The input a message from the node is (PeerProtocol's gate ran first)."""
        kind = type(message)
        if kind is ProtocolHello:
            return SessionInput.HELLO
        if kind is Login:
            return SessionInput.LOGIN
        if kind is NodeChallenge:
            if self.factory.superseded(self.node_id, self.login_number):
                return SessionInput.CHALLENGE_AFTER_NEWER_LOGIN
            return SessionInput.CHALLENGE
        if kind is ArchiveInventory:
            return SessionInput.INVENTORY_PART
        if kind is Identity or kind is LoginResult:
            return SessionInput.NOT_FROM_A_NODE
        return SessionInput.REPORT

    def login_turn(self, login: Login) -> None:
        """Its Login's turn came (:meth:`NodeListenerFactory.admit`): judge it,
        unless the connection went or is going meanwhile (then it is not
        judged: no attempt is taken from its address)."""
        if not self.closing:
            self._input(*self._judged(login))

    def _judged(self, login: Login) -> tuple[SessionInput, Login | AcceptedLogin | float]:
        """The input a Login is at its turn, with its event: the seconds to
        wait when slowed, the Login and its node's secret when accepted."""
        # Taken here, not as the Login arrives: an attempt is held only while
        # it is judged, so a storm of right Logins from one address (a NAT's
        # nodes after a restart) waiting their turn never empties the bucket.
        wait = self.factory.login_guesses.take(self._peerHost())
        if wait > 0:
            return SessionInput.LOGIN_SLOWED, wait  # before any secret is looked up (issue 38)
        # Looked up in factory.node_keys at each Login, so a change to that
        # mapping applies from the next Login.  The site service fills it from
        # --node-key and the node_key table, refreshed every few seconds.
        secret = self.factory.node_keys.get(login.node_id)
        if secret is None:
            return SessionInput.LOGIN_UNKNOWN_NODE, login
        if not verify_login(secret, self.nonce, login.node_id, login.signature):
            return SessionInput.LOGIN_BAD_SIGNATURE, login
        hello = self._hello
        if hello is not None and hello_is_v2(hello) and FEATURE_SITE_PROOF in hello.features:
            return SessionInput.LOGIN_ACCEPTED_PROOF_ASKED, AcceptedLogin(login, secret)
        return SessionInput.LOGIN_ACCEPTED, AcceptedLogin(login, secret)

    def connectionMade(self) -> None:
        super().connectionMade()
        self.connected_at = self.clock.seconds()
        self.sendMessage(Identity(self.factory.site_name, self.nonce))
        self.sendMessage(ProtocolHello())

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)
        self._input(SessionInput.CONNECTION_LOST, reason)

    def describePeer(self) -> str:
        return f"node {self.node_id or '?'} at {self._peer()}"

    def beforeLogin(self, message: Message) -> None:
        self._input(self._input_of(message), message)

    def loggedInMessage(self, message: Message) -> None:
        self._input(self._input_of(message), message)

    def _challenge_deadline_passed(self) -> None:
        self._challenge_deadline = None
        self._input(SessionInput.CHALLENGE_DEADLINE)

    # -- outputs: before login

    def _keep_hello(self, hello: ProtocolHello) -> None:
        self._hello = hello

    def _queue_login(self, login: Login) -> None:
        self.factory.admit(self, login)

    def _refuse_second_login(self, _: object) -> None:
        self.sendError("protocol_violation", "a second Login")

    def _refuse_not_from_a_node(self, message: Message) -> None:
        self.sendError("protocol_violation", f"{type(message).__name__} from a node")

    def _refuse_slowed(self, wait: float) -> None:
        """Refuse a Login unjudged: this address sent too many wrong ones."""
        metrics.AUTH_THROTTLED.labels(kind="node_secret").inc()
        limiter = self.factory.login_guesses
        self.factory.repeated_log.emit(
            ("login slowed", limiter.key(self._peerHost())),
            "node logins from {peer} slowed: more than {threshold} refused;"
            " refused without a lookup",
            peer=self._peerHost(),
            threshold=limiter.threshold,
        )
        self.sendMessage(
            LoginResult(
                False,
                f"too many failed logins from this address: retry in {max(1, math.ceil(wait))} s",
            )
        )
        self.closeConnection()

    def _refuse_unknown_node(self, login: Login) -> None:
        self._refuse(login.node_id, "unknown node")

    def _refuse_bad_signature(self, login: Login) -> None:
        self._refuse(login.node_id, "bad signature")

    def _refuse(self, node_id: str, reason: str) -> None:
        metrics.AUTH_FAILURES.labels(kind="node_secret").inc()
        # A node with a wrong secret retries for ever: one line per node and
        # host per interval, with the count of the refusals in between.
        self.factory.repeated_log.emit(
            ("login refused", node_id, self._peerHost()),
            "login refused for node {node_id!r} from {peer}: {reason}",
            node_id=node_id,
            peer=self._peer(),
            reason=reason,
        )
        self.sendMessage(LoginResult(False, reason))
        self.closeConnection()

    # -- outputs: the login and the site's proof

    def _log_in(self, accepted: AcceptedLogin) -> None:
        self.factory.login_guesses.give_back(self._peerHost())  # a right secret costs nothing
        self.node_id = accepted.login.node_id  # matches NODE_ID: the decoder refuses any other
        self._secret = accepted.secret
        if hello_is_v2(self._hello):
            assert self._hello is not None
            self.protocol_version = 2
            self.features = self._hello.features
        self.loggedIn()
        self.login_number = self.factory.logged_in(self.node_id)
        self.sendMessage(LoginResult(True, ""))
        log.info(
            "node {node_id} logged in from {peer}: protocol {protocol_version}, "
            "features {features}",
            node_id=self.node_id,
            peer=self._peer(),
            protocol_version=self.protocol_version,
            features=list(self.features),
        )

    def _arm_challenge_deadline(self, _: object) -> None:
        # Attached (so sent commands) only once its challenge is answered.
        self._challenge_deadline = self.clock.callLater(
            self.factory.login_timeout, self._challenge_deadline_passed
        )

    def _cancel_challenge_deadline(self, _: object) -> None:
        if self._challenge_deadline is not None and self._challenge_deadline.active():
            self._challenge_deadline.cancel()
        self._challenge_deadline = None

    def _send_proof(self, challenge: NodeChallenge) -> None:
        """Prove this site to the node: the HMAC only a holder of its secret can make."""
        self.sendMessage(
            SiteProof(sign_site_proof(self._secret, challenge.nonce, self.nonce, self.node_id))
        )

    def _log_proof_sent(self, _: object) -> None:
        log.debug("node {node_id}: SiteProof sent", node_id=self.node_id)

    def _log_unasked_challenge(self, _: object) -> None:
        # A node that did not announce site-proof: answered all the same
        # (harmless), but it was attached at login as before.
        log.info(
            "node {node_id} sent a NodeChallenge without announcing site-proof; answered",
            node_id=self.node_id,
        )

    def _refuse_second_challenge(self, _: object) -> None:
        self.sendError("protocol_violation", "a second NodeChallenge")

    def _refuse_before_challenge(self, message: Message) -> None:
        self.sendError(
            "protocol_violation",
            f"{type(message).__name__} before NodeChallenge (the node announced site-proof)",
        )

    def _refuse_no_challenge(self, _: object) -> None:
        self.factory.repeated_log.emit(
            ("no challenge", self.node_id, self._peerHost()),
            "node {node_id} at {peer} announced site-proof but sent no NodeChallenge"
            " within {timeout} s of its login; closing",
            node_id=self.node_id,
            peer=self._peer(),
            timeout=self.factory.login_timeout,
        )
        self.sendError(
            "protocol_violation", f"no NodeChallenge within {self.factory.login_timeout:g} s"
        )

    def _believe_urls(self, _: object) -> None:
        """Take the URLs of the node's Hello, as it is attached (logged in
        and, with site-proof, proven): a v2 session's only."""
        if self.protocol_version < 2 or self._hello is None:
            return
        self.archive_url = self._checked_url("archiveUrl", self._hello.archive_url)
        self.serve_url = self._checked_url("serveUrl", self._hello.serve_url)

    def _checked_url(self, field: str, value: str) -> str:
        checked = announced_url(value)
        if checked is not None:
            return checked
        self.factory.repeated_log.emit(
            ("bad url", self.node_id, field),
            "node {node_id} announced {field} {value!r}, not an http(s) URL with a host; ignored",
            node_id=self.node_id,
            field=field,
            value=value[:200],
        )
        return ""

    # -- outputs: attached, and detached

    def _attach(self, _: object) -> None:
        # The registry feeds REPLACED to the session this one displaces, so
        # the handler sees the old session go before the new one comes.
        self.factory.nodes.attach(self)

    def _take(self, _: object) -> None:
        """Take the node in the database (see the module doc): queued
        before the writes of node_attached.  Without an ownership (a site
        of its own, tests) a session stays CURRENT."""
        ownership = self.factory.ownership
        if ownership is None:
            return
        d = ownership.take(self)  # feeds TAKE_COMMITTED once committed
        d.addErrback(lambda failure: self.life.handle(SessionInput.TAKE_FAILED, failure))
        d.addErrback(
            lambda f: log.failure("taking the node of {session!r} failed", f, session=self)
        )

    def _tell_attached(self, _: object) -> None:
        self.factory.handler.node_attached(self)

    def _hand_up(self, message: Message) -> None:
        self.factory.handler.message_received(self, message)

    def _take_inventory_part(self, part: ArchiveInventory) -> None:
        """One part of the node's inventory (PROTOCOL.md "Archives (v2)"):
        kept until every part of that inventory arrived on this connection,
        then handed up whole.  Every part but the completing one is ACKed at
        once; that one once its judgement committed (the handler's)."""
        if FEATURE_ARCHIVE_INVENTORY not in self.features:
            self.sendError(
                "protocol_violation",
                f"ArchiveInventory from a node that did not announce {FEATURE_ARCHIVE_INVENTORY}",
            )
            return
        if part.parts > INVENTORY_PARTS_MAX:
            self.sendError(
                "bad_message",
                f"ArchiveInventory.parts must be at most {INVENTORY_PARTS_MAX}, got {part.parts}",
            )
            return
        partial = self._inventory
        if partial is None or partial.inventory_id != part.inventory_id:
            # A new inventory replaces an unfinished one (the node started over).
            partial = self._inventory = _PartialInventory(part.inventory_id, part.parts)
        elif partial.parts != part.parts:
            self.sendError(
                "bad_message",
                f"ArchiveInventory {part.inventory_id}: parts {part.parts},"
                f" not {partial.parts} as before",
            )
            return
        partial.received[part.part] = part.archives  # a part repeated replaces itself
        if len(partial.received) < partial.parts:
            self.send_inventory_ack(part.inventory_id, part.part)
            return
        self._inventory = None
        self.factory.handler.message_received(self, partial.whole(part.part))

    def _log_reconnected(self, _: object) -> None:
        log.info(
            "node {node_id} reconnected: the newer connection replaces the older one",
            node_id=self.node_id,
        )

    def _log_take_failed(self, failure: Failure) -> None:
        log.warn(
            "node {node_id}: taking it in the database failed ({why}); closing its connection",
            node_id=self.node_id,
            why=failure.getErrorMessage(),
        )

    def _leave_registry(self, _: object) -> None:
        self.factory.nodes.detach(self)

    def _tell_detached(self, _: object) -> None:
        try:
            self.factory.handler.node_detached(self)
        except Exception:
            log.failure("node_detached({session!r}) failed", session=self)

    def _say_replaced(self, _: object) -> None:
        self.close(REPLACED)

    def _say_busy(self, _: object) -> None:
        self.close("site busy, try again")

    def _give_back(self, _: object) -> None:
        """Free the node its take holds (a held session that went, or a take
        that committed once the session was no longer current)."""
        assert self.factory.ownership is not None and self.life.holding is not None
        self.factory.ownership.release(self.life.holding)

    def _log_disconnected(self, reason: Failure | None) -> None:
        log.info(
            "node {node_id} disconnected: {reason}",
            node_id=self.node_id,
            reason=reason.getErrorMessage() if reason is not None else "closed",
        )

    # -- outputs: the admission (see NodeListenerFactory.admit)

    def _begin_grace(self, _: object) -> None:
        self.factory.begin_grace(self)

    def _settle_login(self, _: object) -> None:
        self.factory.settled(self)

    def _forget_connection(self, _: object) -> None:
        self.factory.forget(self)

    # -- INodeSession

    def send_download(
        self, operation_id: str, gid: int, token: str, name: str, url: str, size: int = 0
    ) -> None:
        name, url = _wire_text(name), _wire_url(url)
        if self.protocol_version >= 2:
            size = size if 0 <= size <= INT63_MAX else 0  # out of bounds: unknown
            self.sendMessage(TaskCommand(operation_id, ACTION_DOWNLOAD, gid, name, url, size))
        else:
            self.sendMessage(DownloadPost(gid, _wire_text(token), name, url))

    def send_delete(self, delete_operation_id: str, gid: int, name: str) -> None:
        if self.protocol_version >= 2:
            self.sendMessage(
                TaskCommand(delete_operation_id, ACTION_DELETE, gid, _wire_text(name), "", 0)
            )
        else:
            self.sendMessage(DeleteGallery(gid))

    def send_ack(self, report_id: str, result: str) -> None:
        if self.protocol_version < 2:
            # A legacy node must never see a type >= 10 (it would ignore it anyway).
            log.error(
                "not sending TaskReportAck {report_id} to legacy node {node_id}",
                report_id=report_id,
                node_id=self.node_id,
            )
            return
        self.sendMessage(TaskReportAck(report_id, result))
        self.life.handle(SessionInput.REPORT_ACKED)  # a report applied: its login is done

    def send_cancel(self, operation_id: str, gid: int) -> None:
        if self.protocol_version < 2:
            log.error(
                "not sending CANCEL {operation_id} to legacy node {node_id}",
                operation_id=operation_id,
                node_id=self.node_id,
            )
            return
        self.sendMessage(TaskCommand(operation_id, ACTION_CANCEL, gid, "", "", 0))

    def send_inventory_ack(self, inventory_id: str, part: int) -> None:
        if self.protocol_version < 2:
            log.error(
                "not sending ArchiveInventoryAck to legacy node {node_id}", node_id=self.node_id
            )
            return
        self.sendMessage(ArchiveInventoryAck(inventory_id, part))

    def close(self, reason: str) -> None:
        self.sendMessage(Goodbye(reason))
        self.closeConnection()

    def __repr__(self) -> str:
        return (
            f"<NodeSession {self.node_id or '?'} v{self.protocol_version} {self.life.state.value}>"
        )


class NodeListenerFactory(PeerFactory):
    """Builds a :class:`NodeSession` per accepted node connection.

    Logged-in sessions go into ``nodes``, the site's one registry of them.
    ``node_keys`` (node id → secret) is consulted at every Login and never
    copied: mutate it, or assign a new mapping, to change who may log in.
    """

    def __init__(
        self,
        handler: ISiteHandler,
        nodes: ConnectedNodes,
        node_keys: Mapping[str, str],
        site_name: str,
        *,
        ownership: NodeOwnership | None = None,
        max_payload: int = MAX_PAYLOAD,
        heartbeat_interval: float = 15.0,
        idle_timeout: float = 45.0,
        clock: IReactorTime,
        entropy: IEntropy,
        pre_login_max_payload: int = PRE_LOGIN_MAX_PAYLOAD,
        login_timeout: float = LOGIN_TIMEOUT,
        log_interval: float = 60.0,
        login_guesses: AuthFailureLimiter | None = None,
    ) -> None:
        super().__init__(
            clock=clock,
            max_payload=max_payload,
            pre_login_max_payload=pre_login_max_payload,
            heartbeat_interval=heartbeat_interval,
            idle_timeout=idle_timeout,
            login_timeout=login_timeout,
            log_interval=log_interval,
        )
        self.handler = handler
        self.nodes = nodes
        self.node_keys = node_keys
        self.site_name = site_name
        self.ownership = ownership
        #: Where each connection's Identity nonce comes from.
        self.entropy = entropy
        #: Failed Logins per client address (node-secret guessing, issue 38).
        self.login_guesses = (
            login_guesses
            if login_guesses is not None
            else AuthFailureLimiter(
                clock, threshold=DEFAULT_NODE_LOGIN_FAILURES, rate=DEFAULT_NODE_LOGIN_FAILURE_RATE
            )
        )
        # Insertion-ordered (a dict, not a set): connections are closed and
        # aborted in the order they came, whatever their ids.
        self.connections: dict[NodeSession, None] = {}
        self._all_closed: list[Deferred[None]] = []
        # Per node id, the number of its latest accepted Login: a connection
        # still waiting for its challenge when a newer one logs in is not
        # attached later (newest wins by login, whatever order proofs end in).
        self._logins = itertools.count(1)
        self._latest_login: dict[str, int] = {}
        # Logins admitted in this turn of the reactor, those admitted and
        # not settled, those waiting, and the call that starts the next turn.
        self._admitted = 0
        self._in_flight: set[NodeSession] = set()
        #: The grace of each login in flight whose take settled.
        self._graces: dict[NodeSession, IDelayedCall] = {}
        self._waiting: deque[tuple[NodeSession, Login]] = deque()
        self._next_turn: Any = None

    def admit(self, session: NodeSession, login: Login) -> None:
        """``session`` sent ``login``: judged now, or once its turn comes
        (arrival order): at most :data:`LOGINS_PER_TURN` per turn of the
        reactor, and while fewer than :data:`LOGINS_IN_FLIGHT` takes are
        under way."""
        self._waiting.append((session, login))
        self._admit_more()

    def _admit_more(self) -> None:
        while (
            self._waiting
            and self._admitted < LOGINS_PER_TURN
            and len(self._in_flight) < LOGINS_IN_FLIGHT
        ):
            session, login = self._waiting.popleft()
            if session.connected and not session.closing:
                self._admitted += 1
                if self.ownership is not None:
                    self._in_flight.add(session)  # until its login settles, or it goes
                if self._next_turn is None:
                    self._next_turn = self.clock.callLater(0, self._turn)
            session.login_turn(login)

    def _turn(self) -> None:
        self._next_turn = None
        self._admitted = 0
        self._admit_more()

    def begin_grace(self, session: NodeSession) -> None:
        """``session``'s take committed or failed: its login settles
        :data:`LOGIN_GRACE` later (``GRACE_OVER``), unless a report of it is
        applied first."""
        if session in self._in_flight and session not in self._graces:
            self._graces[session] = self.clock.callLater(
                LOGIN_GRACE, session.life.handle, SessionInput.GRACE_OVER
            )

    def settled(self, session: NodeSession) -> None:
        """``session``'s login is done (see :data:`LOGINS_IN_FLIGHT`): its
        place is free."""
        grace = self._graces.pop(session, None)
        if grace is not None and grace.active():
            grace.cancel()
        if session in self._in_flight:
            self._in_flight.discard(session)
            self._admit_more()

    def logged_in(self, node_id: str) -> int:
        """Number an accepted Login of ``node_id`` (the newest is highest)."""
        number = next(self._logins)
        self._latest_login[node_id] = number
        return number

    def superseded(self, node_id: str, login: int) -> bool:
        """Whether a newer Login of ``node_id`` was accepted since ``login``."""
        return self._latest_login.get(node_id, login) > login

    def buildProtocol(self, addr: Any) -> Any:  # Any: Factory's generic typing wants more
        session = NodeSession(self)
        self.connections[session] = None
        return session

    def forget(self, session: NodeSession) -> None:
        """``session``'s connection is gone: its login settles, and
        :meth:`close_all` may be done."""
        self.connections.pop(session, None)
        self.settled(session)
        if not self.connections and self._all_closed:
            waiters, self._all_closed = self._all_closed, []
            for done in waiters:
                done.callback(None)

    def close_all(self, reason: str, *, timeout: float = 2.0) -> Deferred[None]:
        """Say Goodbye to and close every connection (site shutdown).

        Fires once every connection is gone; a peer that does not let us flush
        within ``timeout`` seconds is aborted.
        """
        for session in list(self.connections):
            session.close(reason)
        done: Deferred[None] = Deferred()
        if not self.connections:
            done.callback(None)
            return done
        self._all_closed.append(done)
        abort = self.clock.callLater(timeout, self._abort_all)

        def cancel_abort(result: object) -> object:
            if abort.active():
                abort.cancel()
            return result

        done.addBoth(cancel_abort)
        return done

    def _abort_all(self) -> None:
        for session in list(self.connections):
            transport: Any = session.transport
            if transport is not None:
                transport.abortConnection()
