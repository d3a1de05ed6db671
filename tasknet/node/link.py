"""The node's connection to the site, kept up by a ClientService.

A v2 node sends its ``ProtocolHello`` before its ``Login``; it decides the
wire version at ``LoginResult`` without a timer: v2 only if the site's Hello
arrived first (a site sends it on accept, so a v2 site's Hello always does).
``protocol=1`` is a faithful legacy node: it never sends a Hello, ignores
types it does not know (10–13 included) and closes the connection on an
unknown field in types 0–9 (the strict reader).

Mutual authentication (PROTOCOL.md, "Mutual authentication (v2)"): a v2
node announces ``site-proof`` in its Hello and, right after an accepted
``LoginResult`` on a v2 connection, sends ``NodeChallenge`` (a fresh nonce)
and waits for ``SiteProof``: the HMAC that only a site knowing the node's
secret can compute.  Until a valid one arrived the link is not up (the
handler hears nothing, so no command runs and nothing but heartbeats and
``Goodbye`` is sent); a wrong proof, a command before the proof, or no proof
within ``proof_timeout`` (10 s, on the factory's clock) is logged and closes
the connection, which counts as a failed login for the backoff.  A legacy
site (no Hello by ``LoginResult``) cannot prove itself: the node closes
after its login unless ``trust_legacy_site`` is set or the connection is a
verified ``tls:`` one.  ``protocol=1`` (the legacy emulation) does none of
this, exactly as before.

The link's life is one machine, :attr:`SiteLink.TRANSITIONS`: for every
:class:`LinkState` and every :class:`LinkInput`, the next state and the
outputs (methods of the link) that run, in order.  The link's way through
it::

    CONNECTED --Identity--> IDENTIFIED --LoginResult{true}, v2 site--> PROVING
        PROVING --right SiteProof--> UP --connection lost--> DOWN (link_down)
    IDENTIFIED --LoginResult{true}, legacy wire we work with--> UP
    anything refused before UP --> REFUSED --connection lost--> DOWN (a failed login)

The messages the site sends become inputs in one place
(:meth:`SiteLink._input_of`: an Identity's nonce, a LoginResult's wire, a
SiteProof's HMAC), the proof deadline and the connection's loss are the
others; no flag beside the state decides anything.  PeerProtocol's gate
(types before and after login, Heartbeat, Error, Goodbye, a Hello after
login) runs first, as it does for the site.

Reconnecting: the ClientService's backoff counts only failed TCP connects and
starts again after every accepted one, so a node whose login is refused (a
wrong secret) would redial about every second for ever.  The retry policy
here also counts each connection that ended before its login succeeded, and
forgets them at the next successful login.

Several sites (``--connect`` repeated): a :class:`RotatingEndpoint` under
the one ClientService dials them in turn, one endpoint per attempt, so every
failed connect, refused or unfinished login and lost link moves the node to
the next site, with the same backoff between attempts.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import _parse as parse_endpoint  # the parser clientFromString uses
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import (
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTCP,
    IReactorTime,
    ISSLTransport,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.protocol.connection import LOGIN_TIMEOUT, PeerFactory, PeerProtocol, hello_is_v2
from tasknet.protocol.messages import (
    FEATURE_ARCHIVE_INVENTORY,
    FEATURE_RELIABLE,
    FEATURE_SITE_PROOF,
    LEGACY_TYPES,
    MAX_PAYLOAD,
    PRE_LOGIN_MAX_PAYLOAD,
    ArchiveInventoryAck,
    DeleteGallery,
    DownloadPost,
    Error,
    Goodbye,
    Identity,
    Login,
    LoginResult,
    Message,
    NodeChallenge,
    ProtocolHello,
    SiteProof,
    TaskCommand,
    TaskReportAck,
    sign_login,
    verify_site_proof,
)
from tasknet.protocol.session import INodeHandler, ISiteLink
from tasknet.runtime import IEntropy

__all__ = [
    "PROOF_TIMEOUT",
    "LinkInput",
    "LinkState",
    "RotatingEndpoint",
    "SiteClientService",
    "SiteLink",
    "SiteLinkFactory",
    "login_backoff",
    "site_client_service",
    "refused_connect",
    "site_endpoints",
    "unsafe_connect",
]

log = Logger()

#: Seconds after an accepted LoginResult by which the site's SiteProof must be in.
PROOF_TIMEOUT = 10.0
#: The only Identity.nonce the node signs (PROTOCOL.md: 32 hex characters).
SITE_NONCE = re.compile(r"[0-9a-fA-F]{32}")
#: The features a v2 node announces in its Hello.
NODE_FEATURES = (FEATURE_RELIABLE, FEATURE_SITE_PROOF, FEATURE_ARCHIVE_INVENTORY)


class LinkState(enum.Enum):
    """Where one connection of the node to the site is in its life."""

    #: Connected (a v2 node has sent its Hello); waiting for the site's Identity.
    CONNECTED = "connected"
    #: The site's Identity taken and our Login sent; waiting for its LoginResult.
    IDENTIFIED = "identified"
    #: Login accepted on a v2 connection: our NodeChallenge is out, its deadline
    #: armed (armed exactly while PROVING); nothing the site sends runs.
    PROVING = "proving"
    #: ``link_up`` handed to the node's handler: commands run, reports go.
    UP = "up"
    #: This end gave up on the connection before it was up (the site refused
    #: our login, or broke the exchange) and is closing it.
    REFUSED = "refused"
    #: The connection is gone.
    DOWN = "down"


class LinkInput(enum.Enum):
    """What happens to a link: the site's messages as :meth:`SiteLink._input_of`
    names them, the proof deadline, the connection's loss."""

    SITE_HELLO = "the site's ProtocolHello"
    IDENTITY = "Identity, its nonce 32 hex characters"
    IDENTITY_BAD_NONCE = "Identity, any other nonce"
    LOGIN = "Login (not something a site sends)"
    LOGIN_REFUSED = "LoginResult{false}"
    LOGIN_ACCEPTED_V2 = "LoginResult{true} after the site's v2 Hello"
    #: protocol=1 (the legacy emulation), --trust-legacy-site, or a verified tls: link.
    LOGIN_ACCEPTED_LEGACY = "LoginResult{true} on the legacy wire, from a site we work with"
    LOGIN_ACCEPTED_UNTRUSTED = "LoginResult{true} from a legacy site we do not trust"
    SITE_PROOF_GOOD = "SiteProof of our NodeChallenge, right"
    SITE_PROOF_BAD = "SiteProof, wrong"
    COMMAND = "any other message the site may send a logged-in node (commands, ACKs)"
    PROOF_DEADLINE = "no SiteProof within proof_timeout"
    CONNECTION_LOST = "the connection is gone"


S = LinkState
I = LinkInput  # noqa: E741 (the table's shorthand)
#: One output: a SiteLink method run with the input's message (or the
#: connection's loss reason, or None).
Output = Callable[["SiteLink", Any], None]
Transition = tuple[LinkState, tuple[Output, ...]]


@implementer(ISiteLink)
class SiteLink(PeerProtocol):
    """One connection to the site; an :class:`ISiteLink` once logged in.

    Its life is :attr:`TRANSITIONS` (see the module doc): every input goes
    through :meth:`_input`, which enters the next state and runs the
    outputs, and nothing else decides.  ``authenticated`` and
    ``protocol_version`` are :class:`PeerProtocol`'s (its login gate and
    routing read them); only this table's outputs set them.
    """

    factory: SiteLinkFactory
    # What the site may send a logged-in node (commands; v2 adds the ACKs and
    # the site's proof).
    incoming_legacy = frozenset({DownloadPost.TYPE, DeleteGallery.TYPE})
    incoming_v2 = frozenset(
        {TaskCommand.TYPE, TaskReportAck.TYPE, SiteProof.TYPE, ArchiveInventoryAck.TYPE}
    )
    peer_role = "site"

    def __init__(self, factory: SiteLinkFactory) -> None:
        super().__init__(factory)
        # The legacy node reads strictly; v2 is a tolerant reader.
        self.strict = factory.wire_protocol == 1
        self.node_id = factory.node_id
        self.state = S.CONNECTED
        # What the exchange has told us so far (data the outputs and the
        # naming of inputs read; never a decision of their own).
        self._site_hello: ProtocolHello | None = None  # decides v2 at LoginResult
        self._site_name = ""  # from Identity: says which site, when the node lists several
        self._site_nonce = ""  # from Identity: the site's half of the proof
        self._node_nonce = ""  # our NodeChallenge's: our half of the proof
        self._proof_deadline: IDelayedCall | None = None

    # -- the machine

    def _input(self, what: LinkInput, event: Any = None) -> None:
        """Take ``what``: enter its next state, then run its outputs in order.

        A connection that is closing (whoever closed it) reads nothing more
        (:class:`FrameProtocol`) and takes no input but its loss: a proof
        deadline due meanwhile changes nothing.
        """
        if self.closing and what is not I.CONNECTION_LOST:
            return
        self.state, outputs = self.TRANSITIONS[self.state, what]
        for output in outputs:
            output(self, event)

    def _input_of(self, message: Message) -> LinkInput:
        """The input a message from the site is."""
        if type(message) is ProtocolHello:
            return I.SITE_HELLO
        if type(message) is Identity:
            # Signed as is, another shape of nonce could make our Login
            # equal some other HMAC of this secret (a SiteProof: issue 38).
            return I.IDENTITY if SITE_NONCE.fullmatch(message.nonce) else I.IDENTITY_BAD_NONCE
        if type(message) is Login:
            return I.LOGIN
        if type(message) is LoginResult:
            if not message.accepted:
                return I.LOGIN_REFUSED
            if self.factory.wire_protocol < 2:
                return I.LOGIN_ACCEPTED_LEGACY  # the legacy emulation: as a legacy node always did
            if hello_is_v2(self._site_hello):
                return I.LOGIN_ACCEPTED_V2
            if self.factory.trust_legacy_site or self._verified_tls():
                return I.LOGIN_ACCEPTED_LEGACY
            return I.LOGIN_ACCEPTED_UNTRUSTED
        if type(message) is SiteProof:
            right = verify_site_proof(
                self.factory.secret,
                self._node_nonce,
                self._site_nonce,
                self.node_id,
                message.signature,
            )
            return I.SITE_PROOF_GOOD if right else I.SITE_PROOF_BAD
        return I.COMMAND

    def _verified_tls(self) -> bool:
        """Whether this connection is TLS dialled by a ``tls:`` endpoint (which
        always verifies the site's chain and host name)."""
        return ISSLTransport.providedBy(self.transport) and self.factory.dialled_tls()

    # -- the connection: inputs

    def connectionMade(self) -> None:
        super().connectionMade()
        if self.factory.wire_protocol >= 2:
            # Before Login, so the site can decide at Login without a timer.
            archive_url, serve_url = self.factory.hello_urls()
            self.sendMessage(
                ProtocolHello(features=NODE_FEATURES, archive_url=archive_url, serve_url=serve_url)
            )

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)
        self._input(I.CONNECTION_LOST, reason)

    def beforeLogin(self, message: Message) -> None:
        self._input(self._input_of(message), message)

    def loggedInMessage(self, message: Message) -> None:
        self._input(self._input_of(message), message)

    def _proof_deadline_passed(self) -> None:
        self._proof_deadline = None
        self._input(I.PROOF_DEADLINE)

    # -- outputs: the login

    def _keep_hello(self, hello: ProtocolHello) -> None:
        self._site_hello = hello

    def _take_identity(self, identity: Identity) -> None:
        self._site_name = identity.name
        self._site_nonce = identity.nonce

    def _send_login(self, identity: Identity) -> None:
        signature = sign_login(self.factory.secret, identity.nonce, self.node_id)
        self.sendMessage(Login(self.node_id, signature))

    def _log_refusal(self, result: LoginResult) -> None:
        log.error(
            "the site {site} at {peer} refused node {node_id}: {reason}",
            site=self._site_name,
            peer=self._peer(),
            node_id=self.node_id,
            reason=result.reason,
        )
        self.closeConnection()

    def _log_in(self, _: object) -> None:
        self.loggedIn()

    def _log_in_v2(self, _: object) -> None:
        self.protocol_version = 2
        self.loggedIn()
        log.debug(
            "node {node_id}: login accepted by the site {site} at {peer}; asking it to"
            " prove itself",
            node_id=self.node_id,
            site=self._site_name,
            peer=self._peer(),
        )

    def _refuse_legacy_site(self, _: object) -> None:
        log.error(
            "the site {site} at {peer} is a legacy site (no Hello before LoginResult):"
            " it cannot prove itself, so node {node_id} runs none of its commands and"
            " hangs up; start the node with --trust-legacy-site to work with it, or"
            " dial it over a verified tls: endpoint",
            site=self._site_name,
            peer=self._peer(),
            node_id=self.node_id,
        )
        self.close("a legacy site cannot prove itself to this node")

    # -- outputs: the site's proof

    def _challenge_site(self, _: object) -> None:
        self._node_nonce = self.factory.entropy.token_hex(16)
        self.sendMessage(NodeChallenge(self._node_nonce))
        self._proof_deadline = self.clock.callLater(
            self.factory.proof_timeout, self._proof_deadline_passed
        )

    def _cancel_deadline(self, _: object) -> None:
        if self._proof_deadline is not None and self._proof_deadline.active():
            self._proof_deadline.cancel()
        self._proof_deadline = None

    def _refuse_wrong_proof(self, _: object) -> None:
        log.error(
            "the site {site} at {peer} sent a wrong SiteProof: it does not know node"
            " {node_id}'s secret (not the site, or the node's secret is wrong); closing",
            site=self._site_name,
            peer=self._peer(),
            node_id=self.node_id,
        )
        self.sendError("auth_failed", "wrong SiteProof")

    def _refuse_late_proof(self, _: object) -> None:
        log.error(
            "no SiteProof from the site {site} at {peer} within {timeout} s; closing",
            site=self._site_name,
            peer=self._peer(),
            timeout=self.factory.proof_timeout,
        )
        self.sendMessage(
            Error("auth_failed", f"no SiteProof within {self.factory.proof_timeout:g} s")
        )
        self.closeConnection()

    def _refuse_unproved(self, message: Message) -> None:
        # Logged in but the site has not proved itself: nothing it sends runs.
        log.error(
            "the site at {peer} sent {type} before proving itself; closing",
            peer=self._peer(),
            type=type(message).__name__,
        )
        self.sendError("protocol_violation", f"{type(message).__name__} before SiteProof")

    # -- outputs: up and down

    def _link_up(self, _: object) -> None:
        self.factory.failed_logins = 0
        log.info(
            "node {node_id} logged in to the site {site} at {peer}: protocol {protocol_version}",
            node_id=self.node_id,
            site=self._site_name,
            peer=self._peer(),
            protocol_version=self.protocol_version,
            features=list(self._site_hello.features) if self._site_hello else [],
        )
        self.factory.handler.link_up(self)

    def _hand_to_handler(self, message: Message) -> None:
        self.factory.handler.message_received(self, message)

    def _report_link_lost(self, reason: Failure | None) -> None:
        log.info(
            "link to the site lost: {reason}",
            reason=reason.getErrorMessage() if reason is not None else "closed",
        )
        self.factory.handler.link_down(self)

    def _count_failed_login(self, reason: Failure | None) -> None:
        # Refused, the site never completed the login, never proved itself,
        # or is a legacy site we do not trust: back off further.
        self.factory.failed_logins += 1
        tls_failure = tls_failure_text(reason)
        if tls_failure is not None:
            # ClientService's own line ("Scheduling retry") says only that it retries.
            log.warn(
                "TLS with the site at {endpoint} failed: {why}; check that --connect's"
                " trustRoots= holds the CA that signed the site's certificate and that"
                " the host name is one the certificate names",
                endpoint=self.factory.dialled_endpoint() or "?",
                why=tls_failure,
            )

    # -- outputs: refusals of a message out of turn (each sends an Error and closes)

    def _refuse_nonce(self, identity: Identity) -> None:
        self.sendError(
            "bad_message",
            f"Identity.nonce must be 32 hex characters (PROTOCOL.md); got "
            f"{len(identity.nonce)} characters: {identity.nonce[:40]!r}",
        )

    def _refuse_second_identity(self, _: object) -> None:
        self.sendError("protocol_violation", "a second Identity")

    def _refuse_early_result(self, _: object) -> None:
        self.sendError("protocol_violation", "LoginResult before Identity")

    def _refuse_site_login(self, message: Message) -> None:
        self.sendError("protocol_violation", f"{type(message).__name__} from the site")

    def _refuse_unasked_proof(self, _: object) -> None:
        self.sendError("protocol_violation", "SiteProof without a NodeChallenge")

    def _out_of_turn(self, message: Message) -> None:
        # PeerProtocol's gate answers these first (a type not allowed before
        # login, or after it): never reached unless that gate changes.
        self.sendError("protocol_violation", f"{type(message).__name__} out of turn")

    #: The link's life: ``(state, input) -> (next state, outputs)``, every
    #: input in every state.  :meth:`_input` enters the next state first,
    #: then runs the outputs in order (so a handler that closes the link from
    #: ``link_up`` finds it UP).  "gated": PeerProtocol answers that message
    #: before it gets here (``unauthenticated`` before login; after login a
    #: pre-login type is a ``protocol_violation`` and a Hello is ignored).
    TRANSITIONS: ClassVar[dict[tuple[LinkState, LinkInput], Transition]] = {
        # -- CONNECTED: waiting for the site's Identity
        (S.CONNECTED, I.SITE_HELLO): (S.CONNECTED, (_keep_hello,)),
        (S.CONNECTED, I.IDENTITY): (S.IDENTIFIED, (_take_identity, _send_login)),
        (S.CONNECTED, I.IDENTITY_BAD_NONCE): (S.REFUSED, (_refuse_nonce,)),
        (S.CONNECTED, I.LOGIN): (S.REFUSED, (_refuse_site_login,)),
        (S.CONNECTED, I.LOGIN_REFUSED): (S.REFUSED, (_refuse_early_result,)),
        (S.CONNECTED, I.LOGIN_ACCEPTED_V2): (S.REFUSED, (_refuse_early_result,)),
        (S.CONNECTED, I.LOGIN_ACCEPTED_LEGACY): (S.REFUSED, (_refuse_early_result,)),
        (S.CONNECTED, I.LOGIN_ACCEPTED_UNTRUSTED): (S.REFUSED, (_refuse_early_result,)),
        (S.CONNECTED, I.PROOF_DEADLINE): (S.CONNECTED, ()),  # never armed here
        (S.CONNECTED, I.CONNECTION_LOST): (S.DOWN, (_count_failed_login,)),
        # gated:
        (S.CONNECTED, I.SITE_PROOF_GOOD): (S.REFUSED, (_out_of_turn,)),
        (S.CONNECTED, I.SITE_PROOF_BAD): (S.REFUSED, (_out_of_turn,)),
        (S.CONNECTED, I.COMMAND): (S.REFUSED, (_out_of_turn,)),
        # -- IDENTIFIED: our Login sent, waiting for the LoginResult
        (S.IDENTIFIED, I.SITE_HELLO): (S.IDENTIFIED, (_keep_hello,)),
        (S.IDENTIFIED, I.IDENTITY): (S.REFUSED, (_refuse_second_identity,)),
        (S.IDENTIFIED, I.IDENTITY_BAD_NONCE): (S.REFUSED, (_refuse_second_identity,)),
        (S.IDENTIFIED, I.LOGIN): (S.REFUSED, (_refuse_site_login,)),
        (S.IDENTIFIED, I.LOGIN_REFUSED): (S.REFUSED, (_log_refusal,)),
        (S.IDENTIFIED, I.LOGIN_ACCEPTED_V2): (S.PROVING, (_log_in_v2, _challenge_site)),
        (S.IDENTIFIED, I.LOGIN_ACCEPTED_LEGACY): (S.UP, (_log_in, _link_up)),
        (S.IDENTIFIED, I.LOGIN_ACCEPTED_UNTRUSTED): (S.REFUSED, (_refuse_legacy_site,)),
        (S.IDENTIFIED, I.PROOF_DEADLINE): (S.IDENTIFIED, ()),  # never armed here
        (S.IDENTIFIED, I.CONNECTION_LOST): (S.DOWN, (_count_failed_login,)),
        # gated:
        (S.IDENTIFIED, I.SITE_PROOF_GOOD): (S.REFUSED, (_out_of_turn,)),
        (S.IDENTIFIED, I.SITE_PROOF_BAD): (S.REFUSED, (_out_of_turn,)),
        (S.IDENTIFIED, I.COMMAND): (S.REFUSED, (_out_of_turn,)),
        # -- PROVING: our NodeChallenge out, waiting for the SiteProof (the deadline armed)
        (S.PROVING, I.SITE_PROOF_GOOD): (S.UP, (_cancel_deadline, _link_up)),
        (S.PROVING, I.SITE_PROOF_BAD): (S.REFUSED, (_cancel_deadline, _refuse_wrong_proof)),
        (S.PROVING, I.COMMAND): (S.REFUSED, (_cancel_deadline, _refuse_unproved)),
        (S.PROVING, I.PROOF_DEADLINE): (S.REFUSED, (_refuse_late_proof,)),
        (S.PROVING, I.CONNECTION_LOST): (S.DOWN, (_cancel_deadline, _count_failed_login)),
        # gated:
        (S.PROVING, I.SITE_HELLO): (S.PROVING, ()),
        (S.PROVING, I.IDENTITY): (S.REFUSED, (_cancel_deadline, _out_of_turn)),
        (S.PROVING, I.IDENTITY_BAD_NONCE): (S.REFUSED, (_cancel_deadline, _out_of_turn)),
        (S.PROVING, I.LOGIN): (S.REFUSED, (_cancel_deadline, _out_of_turn)),
        (S.PROVING, I.LOGIN_REFUSED): (S.REFUSED, (_cancel_deadline, _out_of_turn)),
        (S.PROVING, I.LOGIN_ACCEPTED_V2): (S.REFUSED, (_cancel_deadline, _out_of_turn)),
        (S.PROVING, I.LOGIN_ACCEPTED_LEGACY): (S.REFUSED, (_cancel_deadline, _out_of_turn)),
        (S.PROVING, I.LOGIN_ACCEPTED_UNTRUSTED): (S.REFUSED, (_cancel_deadline, _out_of_turn)),
        # -- UP: the handler has the link; a refusal closes it, and it is down once lost
        (S.UP, I.COMMAND): (S.UP, (_hand_to_handler,)),
        (S.UP, I.SITE_PROOF_GOOD): (S.UP, (_refuse_unasked_proof,)),
        (S.UP, I.SITE_PROOF_BAD): (S.UP, (_refuse_unasked_proof,)),
        (S.UP, I.PROOF_DEADLINE): (S.UP, ()),  # cancelled when the proof came
        (S.UP, I.CONNECTION_LOST): (S.DOWN, (_report_link_lost,)),
        # gated:
        (S.UP, I.SITE_HELLO): (S.UP, ()),
        (S.UP, I.IDENTITY): (S.UP, (_out_of_turn,)),
        (S.UP, I.IDENTITY_BAD_NONCE): (S.UP, (_out_of_turn,)),
        (S.UP, I.LOGIN): (S.UP, (_out_of_turn,)),
        (S.UP, I.LOGIN_REFUSED): (S.UP, (_out_of_turn,)),
        (S.UP, I.LOGIN_ACCEPTED_V2): (S.UP, (_out_of_turn,)),
        (S.UP, I.LOGIN_ACCEPTED_LEGACY): (S.UP, (_out_of_turn,)),
        (S.UP, I.LOGIN_ACCEPTED_UNTRUSTED): (S.UP, (_out_of_turn,)),
        # -- REFUSED: closing; nothing but its loss (a failed login for the backoff)
        **{(S.REFUSED, i): (S.REFUSED, ()) for i in I if i is not I.CONNECTION_LOST},
        (S.REFUSED, I.CONNECTION_LOST): (S.DOWN, (_count_failed_login,)),
        # -- DOWN: the end
        **{(S.DOWN, i): (S.DOWN, ()) for i in I},
    }

    # -- ISiteLink

    def send(self, message: Message) -> None:
        if message.TYPE not in LEGACY_TYPES and self.protocol_version < 2:
            raise ValueError(f"{type(message).__name__} cannot go on a legacy (protocol 1) link")
        self.sendMessage(message)

    def close(self, reason: str) -> None:
        self.sendMessage(Goodbye(reason))
        self.closeConnection()

    def __repr__(self) -> str:
        return f"<SiteLink {self.node_id} v{self.protocol_version} {self.state.value}>"


class SiteLinkFactory(PeerFactory):
    """Builds a :class:`SiteLink` per connection attempt of the ClientService.

    ``failed_logins`` counts the connections in a row that ended before their
    login succeeded (:func:`login_backoff` reads it), a site's proof
    included.  ``trust_legacy_site``: work with a site that sends no Hello
    (it cannot prove itself); ``dialled_tls()`` says whether the current
    attempt dialled a ``tls:`` endpoint (set by :func:`site_client_service`),
    which also makes a legacy site acceptable.  ``proof_timeout``: seconds
    for the site's SiteProof after an accepted LoginResult.  ``hello_urls``
    says, at each connection, where the node serves archives (its Hello's
    ``archiveUrl`` and ``serveUrl``; ``("", "")`` when it does not serve).
    """

    def __init__(
        self,
        node_id: str,
        secret: str,
        handler: INodeHandler,
        *,
        protocol: int = 2,
        clock: IReactorTime,
        max_payload: int = MAX_PAYLOAD,
        heartbeat_interval: float = 15.0,
        idle_timeout: float = 45.0,
        pre_login_max_payload: int = PRE_LOGIN_MAX_PAYLOAD,
        login_timeout: float = LOGIN_TIMEOUT,
        trust_legacy_site: bool = False,
        proof_timeout: float = PROOF_TIMEOUT,
        entropy: IEntropy,
        hello_urls: Callable[[], tuple[str, str]] = lambda: ("", ""),
    ) -> None:
        if protocol not in (1, 2):
            raise ValueError(f"protocol must be 1 or 2, got {protocol!r}")
        super().__init__(
            clock=clock,
            max_payload=max_payload,
            pre_login_max_payload=pre_login_max_payload,
            heartbeat_interval=heartbeat_interval,
            idle_timeout=idle_timeout,
            login_timeout=login_timeout,
        )
        self.failed_logins = 0
        self.node_id = node_id
        self.secret = secret
        self.handler = handler
        self.wire_protocol = protocol  # not .protocol: Factory uses that name
        self.trust_legacy_site = trust_legacy_site
        self.proof_timeout = proof_timeout
        #: The nonces of the site's proof (NodeChallenge) come from it.
        self.entropy: IEntropy = entropy
        self.dialled_tls: Callable[[], bool] = lambda: False
        #: The ``--connect`` string of the current attempt (None before one).
        self.dialled_endpoint: Callable[[], str | None] = lambda: None
        self.hello_urls = hello_urls

    def buildProtocol(self, addr: Any) -> Any:  # Any: Factory's generic typing wants more
        return SiteLink(self)


def tls_failure_text(reason: Failure | None) -> str | None:
    """Why a TLS handshake failed, in OpenSSL's words (``certificate verify
    failed``), or None when ``reason`` is not a TLS failure."""
    if reason is None:
        return None
    from OpenSSL import SSL  # twisted[tls]: only a tls: link gets here with one

    if not reason.check(SSL.Error):
        return None
    texts = [
        str(entry[-1])
        for group in getattr(reason.value, "args", ())
        for entry in (group if isinstance(group, list) else [group])
        if isinstance(entry, tuple) and entry and entry[-1]
    ]
    return "; ".join(dict.fromkeys(texts)) or "the handshake was refused"


#: The longest wait between two dials of a node's sites.  Short enough that
#: a node is back within seconds of a site that was down for a while (a
#: database failover keeps every site down for about 30 s: with a 30 s cap
#: a node came back up to 13 s after its site, past SCALE.md's 45 s); a dial
#: of a site that is down costs it only a refused connection.
MAX_RECONNECT_DELAY = 5.0


def retry_policy_of(entropy: IEntropy) -> Callable[[int], float]:
    """The node's default reconnect policy: exponential from 0.5 s to
    :data:`MAX_RECONNECT_DELAY`, jittered from ``entropy`` (so that nodes
    dropped together do not all come back together)."""
    return backoffPolicy(
        initialDelay=0.5, maxDelay=MAX_RECONNECT_DELAY, jitter=entropy.random().random
    )


def login_backoff(
    policy: Callable[[int], float], factory: SiteLinkFactory
) -> Callable[[int], float]:
    """``policy`` with each connection that failed to log in counted as a failed attempt.

    ClientService calls the policy with its own count of failed connects in a
    row, which is 1 again after any accepted connection; after the n-th
    failed login in a row this gives ``policy(n)``, and failed connects that
    follow continue from there.
    """

    def delay(attempt: int) -> float:
        seconds = policy(attempt + max(factory.failed_logins - 1, 0))
        # Rounded to 0.1 s: ClientService logs it ("... in 3.9 seconds"),
        # and a jittered delay's sixteen digits say nothing more.
        return seconds if seconds < 0.1 else round(seconds, 1)

    return delay


@implementer(IStreamClientEndpoint)
class RotatingEndpoint:
    """The site's endpoints (``--connect``, in the order given), one per
    connection attempt, round and round.

    ClientService makes a new attempt only once the previous one has failed
    or its connection has ended, so taking the next endpoint at every attempt
    is exactly the failover rule: a failed connect, a login refused or never
    completed, and a lost link all move the node to the next site.  A site
    that just dropped the node may be dying, so it is dialled again only
    after the others have had their turn; a node never sticks to a failing
    endpoint, and while its link is up it stays where it is (no moving
    back).  The delay before each attempt is ClientService's, from
    :func:`login_backoff`: one backoff across all the endpoints, forgotten
    at the next successful login.  With one endpoint every attempt dials it,
    as before several were allowed.
    """

    def __init__(self, endpoints: Sequence[tuple[str, IStreamClientEndpoint]]) -> None:
        if not endpoints:
            raise ValueError("at least one site endpoint is needed")
        #: (endpoint string, endpoint) in dialling order.
        self.endpoints = tuple(endpoints)
        self._next = 0
        #: The endpoint string of the latest attempt (None before the first).
        self.dialled: str | None = None

    @property
    def upcoming(self) -> str:
        """The endpoint string the next attempt dials."""
        return self.endpoints[self._next][0]

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        description, endpoint = self.endpoints[self._next]
        self._next = (self._next + 1) % len(self.endpoints)
        self.dialled = description
        connecting: Deferred[IProtocol] = endpoint.connect(protocolFactory)
        connecting.addErrback(self._failed, description)
        return connecting

    def _failed(self, failure: Failure, description: str) -> Failure:
        if not failure.check(CancelledError):  # cancelled: the service is stopping
            log.warn(
                "cannot connect to the site at {endpoint}: {why}",
                endpoint=description,
                why=failure.getErrorMessage(),
            )
        return failure

    def __repr__(self) -> str:
        # ClientService logs "Scheduling retry N to connect {endpoint} in D
        # seconds" with this: name the endpoint that retry will dial.
        return self.upcoming


def site_endpoints(reactor: IReactorTCP, descriptions: str | Sequence[str]) -> RotatingEndpoint:
    """The endpoint strings parsed, in order, behind one :class:`RotatingEndpoint`.

    Each is any Twisted client endpoint string (``tcp:``, ``tls:`` with
    ``trustRoots=``, ``unix:``).  A string that cannot be parsed is a
    :class:`ValueError` naming it, raised before anything is dialled.
    """
    if isinstance(descriptions, str):
        descriptions = (descriptions,)
    parsed: list[tuple[str, IStreamClientEndpoint]] = []
    for description in descriptions:
        try:
            endpoint = clientFromString(reactor, description)
        except Exception as exc:  # parsers raise anything: TypeError, ValueError, OSError...
            raise ValueError(
                f"--connect {description!r} is not a usable client endpoint: "
                f"{str(exc) or type(exc).__name__}"
            ) from exc
        parsed.append((description, endpoint))
    return RotatingEndpoint(parsed)


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def unsafe_connect(description: str) -> str | None:
    """Why ``description`` may not be a ``--connect`` without ``--plaintext``
    (None when it may).  PROTOCOL.md, "Mutual authentication (v2)": the
    proof stops a listener that is not the site, not a relay on plain TCP,
    so a ``tcp:`` link leaves loopback only on purpose; ``ssl:`` never
    verifies the site's certificate, so it is refused outright (see
    :func:`refused_connect`)."""
    kind, _, rest = description.partition(":")
    if kind.lower() not in ("tcp", "tcp6"):
        return None
    try:
        args, kwargs = parse_endpoint(rest)
    except Exception:  # clientFromString reports unparseable strings, naming them
        return None
    host = str(kwargs.get("host", args[0] if args else ""))
    if _is_loopback(host):
        return None
    return (
        f"--connect {description}: plain TCP to {host!r}, which is not loopback: anyone"
        " on the path can read and change the traffic; use"
        " tls:HOST:PORT:trustRoots=CA_DIR, or give --plaintext if this network is trusted"
    )


def refused_connect(description: str) -> str | None:
    """Why ``description`` is never a ``--connect`` (None when it may be)."""
    if description.partition(":")[0].lower() == "ssl":
        return (
            f"--connect {description}: ssl: does not verify the site's certificate; use"
            " tls:HOST:PORT:trustRoots=CA_DIR (chain and host name verified)"
        )
    return None


class SiteClientService(ClientService):
    """The link's ClientService, with its factory (``link_factory.failed_logins``)
    and its endpoints (``site_endpoints.dialled``) at hand."""

    def __init__(
        self,
        endpoints: RotatingEndpoint,
        factory: SiteLinkFactory,
        retry_policy: Callable[[int], float],
        clock: IReactorTime,
    ) -> None:
        super().__init__(
            endpoints,
            factory,
            retryPolicy=login_backoff(retry_policy, factory),
            clock=clock,
        )
        self.link_factory = factory
        self.site_endpoints = endpoints


def site_client_service(
    endpoint: str | Sequence[str],
    node_id: str,
    secret: str,
    handler: INodeHandler,
    *,
    protocol: int = 2,
    reactor: IReactorTCP,
    clock: IReactorTime | None = None,
    max_payload: int = MAX_PAYLOAD,
    heartbeat_interval: float = 15.0,
    idle_timeout: float = 45.0,
    retry_policy: Callable[[int], float] | None = None,
    trust_legacy_site: bool = False,
    proof_timeout: float = PROOF_TIMEOUT,
    entropy: IEntropy,
    hello_urls: Callable[[], tuple[str, str]] = lambda: ("", ""),
) -> SiteClientService:
    """A service that keeps the node connected (and logged in) to the site.

    ``endpoint`` is a Twisted client endpoint string (``tcp:host=...:port=...``,
    ``tls:...``, ``unix:path=...``), or several: the sites are dialled in
    turn (:class:`RotatingEndpoint`); a bad string is a :class:`ValueError`
    here, before anything is dialled.  ``retry_policy`` defaults to exponential
    backoff from 0.5 s up to 30 s; a connection whose login is refused (or
    never completes) counts as a failed attempt until a login succeeds
    (:func:`login_backoff`).  ``clock`` (default: ``reactor``) runs the
    retry and connection timers, the site's proof deadline included.
    ``trust_legacy_site``: see :class:`SiteLinkFactory`.  ``entropy`` gives
    the site's challenges and the default policy's jitter.  ``reactor``
    (whose TCP, TLS and UNIX connections the endpoints use) and ``entropy``
    are the node root's.  ``hello_urls``: see :class:`SiteLinkFactory`.
    """
    if clock is None:
        clock = IReactorTime(reactor)
    endpoints = site_endpoints(reactor, endpoint)
    factory = SiteLinkFactory(
        node_id,
        secret,
        handler,
        protocol=protocol,
        clock=clock,
        max_payload=max_payload,
        heartbeat_interval=heartbeat_interval,
        idle_timeout=idle_timeout,
        trust_legacy_site=trust_legacy_site,
        proof_timeout=proof_timeout,
        entropy=entropy,
        hello_urls=hello_urls,
    )
    # One attempt at a time: the endpoint dialled last is the connection's.
    factory.dialled_tls = lambda: (endpoints.dialled or "").startswith("tls:")
    factory.dialled_endpoint = lambda: endpoints.dialled
    return SiteClientService(
        endpoints,
        factory,
        retry_policy or retry_policy_of(entropy),
        clock,
    )
