"""``twistd -n tasknet-site``: the command-line :class:`Options` and the
running site, :class:`SiteService`, which starts and stops the parts the
composition root (:mod:`tasknet.site.root`) built, in the order of
LIFECYCLE.md invariant 10.

In :meth:`SiteService.startService` (a Deferred chain, ``service.ready``):
node keys read → recovery → housekeeping and outbox started (the outbox
delivers what the last run left) → node ownership watch, then node listener
→ dispatch started only if recovery succeeded → HTTP.  If recovery fails, nodes still connect and
reports are still applied, but nothing is dispatched; ``/healthz`` and the
log say so.  While running, node keys are re-read from the ``node_key``
table every ``node_keys_refresh`` seconds (``tasknet-admin node-key``
changes apply without a restart).

The parts are children of the service (``namedServices``: ``instance``,
``node-keys``, ``housekeeping``, ``outbox``, ``node-ownership``,
``dispatch``), each a Twisted service with its timers as ``TimerService``
children; the site starts each at its step above rather than all at once.

A start that fails (a port taken, ...) is undone (the stop below, lock
released) and, under twistd, the process exits 1 (:mod:`tasknet.startup`).
So does a site whose instance lost its lease (:mod:`tasknet.site.instance_service`:
fenced, it writes nothing more).

Stop: both listeners stop accepting, dispatch stops, the reports in flight
are committed and ACKed on their still-open connections, and only then are
the node connections closed (so a node never redelivers what was committed).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.application import service
from twisted.application.internet import TimerService
from twisted.internet.defer import CancelledError, Deferred, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IReactorCore, IReactorTCP, IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.failure import Failure

from tasknet.logging import LogOptions, use_for_twistd
from tasknet.site import ratelimit
from tasknet.site.connected_nodes import ConnectedNodes, NodeOwnership
from tasknet.site.dispatcher import Dispatcher
from tasknet.site.housekeeping import Housekeeping
from tasknet.site.instance_service import InstanceService
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.node_listener import (
    DEFAULT_NODE_LOGIN_FAILURE_RATE,
    DEFAULT_NODE_LOGIN_FAILURES,
    NODES_BACKLOG,
    NodeListenerFactory,
)
from tasknet.site.outbox import OutboxExecutor
from tasknet.site.report_pipeline import ReportPipeline
from tasknet.site.storage import sessions, users
from tasknet.site.storage.engine.database import Database
from tasknet.site.storage.throughput import iso
from tasknet.site.upstream_client import UpstreamClient
from tasknet.site.web import auth
from tasknet.site.web.events import EventHub
from tasknet.site.web.http import DEFAULT_MAX_BODY, BoundedSite
from tasknet.site.web.interfaces import WebDependencies
from tasknet.site.web.task_queries import MAX_BULK_MATCHING, MAX_BULK_MATCHING_SETTING
from tasknet.startup import exit_after_stop
from tasknet.units import parse_duration
from tasknet.version import version_option

log = Logger()

#: Seconds between two reads of the ``node_key`` table.
NODE_KEYS_REFRESH = 5.0
#: After a failed recovery, the first pause before it is tried again
#: (doubled each time up to the maximum).
RECOVERY_RETRY = 5.0
RECOVERY_RETRY_MAX = 60.0


#: Bounds of --auth-burst/--node-auth-burst, --auth-rate/--node-auth-rate
#: and --max-sessions-per-user: far above any sensible value, low enough that
#: a typo (an extra digit or three) is refused rather than disabling a limit.
MAX_AUTH_BURST = 1_000_000
MAX_AUTH_RATE = 10_000.0
MAX_SESSIONS_PER_USER = 10_000


#: Seconds a fenced site's stop may take before the process exits anyway
#: (under twistd).  It writes nothing more (its lease refuses) and has
#: answered every create under way, so nothing is left that needs the stop:
#: a primary whose host is cut off answers nothing (no RST), and a thread
#: blocked on it would hold the exit until its TCP timeout
#: (``tcp_user_timeout``, 25 s), the restart, on the new primary, with it.
#: Its sessions end with the process, as a killed site's; its successor's
#: reap settles what it left.
FENCED_EXIT_DEADLINE = 5.0


class Options(LogOptions, usage.Options):
    optParameters = [
        [
            "db",
            None,
            "tasknet-site.sqlite",
            "SQLite database file (created on first start), or a postgresql:// URL "
            "(several sites may share one; the schema is created on an empty database).",
        ],
        ["http", None, "tcp:8080:interface=127.0.0.1", "HTTP API, UI, WebSocket, /metrics."],
        [
            "nodes",
            None,
            f"tcp:7100:interface=127.0.0.1:backlog={NODES_BACKLOG}",
            f"Where storage nodes connect (a listen backlog of {NODES_BACKLOG} by default:"
            " after a restart every node reconnects at once; give backlog= in your own"
            " endpoint).",
        ],
        ["upstream", None, "http://127.0.0.1:7200", "Upstream base URL."],
        [
            "upstream-timeout",
            None,
            30.0,
            "Submit timeout (seconds); past it the operation is UNKNOWN.",
            float,
        ],
        ["webhook", None, None, "POST a JSON notification per user-visible change."],
        [
            "access-log",
            None,
            None,
            "Write the HTTP access log (combined format, secrets redacted) to this file; "
            "without it access lines are debug events, not in the main log at info.",
        ],
        [
            "name",
            None,
            None,
            "This site's name: sent in Identity, the site of a node in /api/admin/nodes, "
            "in /healthz and in the instance table (default: HOST:HTTP-PORT).",
        ],
        [
            "default-quota",
            None,
            5000,
            "Weekly quota of a new user (cost units): the --demo user, and users "
            "tasknet-admin adds without --quota while this setting stands.",
            int,
        ],
        [
            "max-body",
            None,
            DEFAULT_MAX_BODY,
            "Largest HTTP request body (bytes); larger ones are refused with 413 "
            "before they are read.",
            int,
        ],
        [
            "create-rate",
            None,
            ratelimit.DEFAULT_RATE,
            "Creates per second one user may make (token bucket; 0: no limit); "
            "past it POST /api/tasks answers 429 rate_limited with Retry-After.",
            float,
        ],
        ["create-burst", None, ratelimit.DEFAULT_BURST, "Creates one user may make at once.", int],
        [
            "max-bulk-matching",
            None,
            MAX_BULK_MATCHING,
            "The most tasks one 'select all N matching' (POST /api/tasks/bulk with a filter) "
            f"acts on (1..{MAX_BULK_MATCHING_SETTING:,}); more answers 413 too_many_tasks.",
            int,
        ],
        [
            "auth-burst",
            None,
            ratelimit.DEFAULT_AUTH_FAILURES,
            "Wrong tokens (bearer, ?token=, sign-in) one client address may send at once "
            f"(1..{MAX_AUTH_BURST:,}); past it every token from that address answers 429 "
            "rate_limited, unlooked-up, until --auth-rate refills it.",
            int,
        ],
        [
            "auth-rate",
            None,
            ratelimit.DEFAULT_AUTH_FAILURE_RATE,
            "Wrong tokens a second one client address regains after --auth-burst "
            f"(> 0, at most {MAX_AUTH_RATE:,}).",
            float,
        ],
        [
            "node-auth-burst",
            None,
            DEFAULT_NODE_LOGIN_FAILURES,
            "Failed node Logins (unknown node, bad signature) one address may make at once "
            f"(1..{MAX_AUTH_BURST:,}); past it its Logins are refused unjudged.",
            int,
        ],
        [
            "node-auth-rate",
            None,
            DEFAULT_NODE_LOGIN_FAILURE_RATE,
            "Failed node Logins a second one address regains after --node-auth-burst "
            f"(> 0, at most {MAX_AUTH_RATE:,}).",
            float,
        ],
        [
            "max-sessions-per-user",
            None,
            sessions.DEFAULT_MAX_LIVE,
            f"Browser sessions one user may have (1..{MAX_SESSIONS_PER_USER:,}); a sign-in "
            "past it ends the user's oldest.",
            int,
        ],
        [
            "public-url",
            None,
            None,
            "The site's URL as browsers see it (http(s)://HOST[:PORT]), behind a proxy: "
            "the origin cookie-authenticated writes must come from (default: the request's "
            "Host, https over TLS); an https URL also marks the cookie Secure.",
        ],
        [
            "link-ttl",
            None,
            "10m",
            "How long an archive link the site issues stays valid (seconds, or a number "
            "with s, m, h or d).",
        ],
        [
            "reassign-after",
            None,
            "15m",
            "Move the unfinished tasks of a node gone (disconnected from every site) this "
            "long to a connected node, same operationId, nothing charged again (seconds, or "
            "a number with s, m, h or d; 0: never).",
        ],
        [
            "archive-streams-per-user",
            None,
            4,
            "Archives one user may fetch through the site at once (those of nodes "
            "without --public-url); past it GET /api/tasks/{gid}/archive answers 429 "
            "too_many_streams.",
            int,
        ],
        [
            "session-idle",
            None,
            auth.DEFAULT_SESSION_IDLE,
            "Seconds a browser session stays signed in without being used.",
            float,
        ],
        [
            "session-max-age",
            None,
            auth.DEFAULT_SESSION_MAX_AGE,
            "Seconds a browser session stays signed in at most, used or not.",
            float,
        ],
    ]
    optFlags = [
        ["demo", None, "On a fresh database, create the admin user 'demo' with token 'demo'."],
        [
            "cookie-secure",
            None,
            "Mark the session cookie Secure on plain HTTP too (a TLS-terminating proxy in front).",
        ],
    ]

    opt_version = version_option("tasknet-site")

    def __init__(self) -> None:
        super().__init__()
        self["node-keys"] = {}

    def opt_node_key(self, value: str) -> None:
        """ID:SECRET  A node allowed to log in (repeatable)."""
        node_id, sep, secret = value.partition(":")
        if not sep or not node_id or not secret:
            raise usage.UsageError(f"--node-key wants ID:SECRET, got {value!r}")
        if not users.NODE_ID_PATTERN.fullmatch(node_id):
            raise usage.UsageError(f"--node-key: bad node id {node_id!r}")
        self["node-keys"][node_id] = secret

    def opt_node_key_file(self, path: str) -> None:
        """PATH  Node keys, one ID:SECRET a line ('#' comments and blank lines
        allowed), kept off the command line (repeatable)."""
        self["node-keys"].update(read_node_key_file(path))

    def postOptions(self) -> None:
        use_for_twistd(self)  # --log-format, --log-level (tasknet/logging.py)
        if not self["upstream-timeout"] > 0:
            raise usage.UsageError("--upstream-timeout must be > 0")
        if self["default-quota"] < 0:
            raise usage.UsageError("--default-quota must be >= 0")
        if self["max-body"] < 1:
            raise usage.UsageError("--max-body must be >= 1")
        if self["create-rate"] < 0 or self["create-burst"] < 1:
            raise usage.UsageError("--create-rate must be >= 0 and --create-burst >= 1")
        if not 1 <= self["max-bulk-matching"] <= MAX_BULK_MATCHING_SETTING:
            raise usage.UsageError(
                f"--max-bulk-matching must be 1 to {MAX_BULK_MATCHING_SETTING:,}"
            )
        for burst, rate in (("auth-burst", "auth-rate"), ("node-auth-burst", "node-auth-rate")):
            if not 1 <= self[burst] <= MAX_AUTH_BURST:
                raise usage.UsageError(f"--{burst} must be 1 to {MAX_AUTH_BURST:,}")
            # not (0 < x <= max): NaN is refused too.
            if not 0 < self[rate] <= MAX_AUTH_RATE:
                raise usage.UsageError(f"--{rate} must be > 0 and at most {MAX_AUTH_RATE:,}")
        if not 1 <= self["max-sessions-per-user"] <= MAX_SESSIONS_PER_USER:
            raise usage.UsageError(
                f"--max-sessions-per-user must be 1 to {MAX_SESSIONS_PER_USER:,}"
            )
        if not self["upstream"].startswith(("http://", "https://")):
            raise usage.UsageError("--upstream must be an http:// or https:// URL")
        webhook = self["webhook"]
        if webhook is not None and not webhook.startswith(("http://", "https://")):
            raise usage.UsageError("--webhook must be an http:// or https:// URL")
        if not self["session-idle"] > 0 or not self["session-max-age"] > 0:
            raise usage.UsageError("--session-idle and --session-max-age must be > 0")
        try:
            self["link-ttl"] = parse_duration(str(self["link-ttl"]))
        except ValueError as e:
            raise usage.UsageError(f"--link-ttl: {e}") from None
        if not self["link-ttl"] >= 1:
            raise usage.UsageError("--link-ttl must be at least 1 second")
        try:
            self["reassign-after"] = parse_duration(str(self["reassign-after"]))
        except ValueError as e:
            raise usage.UsageError(f"--reassign-after: {e}") from None
        if not self["reassign-after"] >= 0:
            raise usage.UsageError("--reassign-after must be >= 0 (0: never)")
        if self["archive-streams-per-user"] < 1:
            raise usage.UsageError("--archive-streams-per-user must be >= 1")
        if self["public-url"] is not None:
            try:
                auth.parse_public_url(self["public-url"])
            except ValueError as e:
                raise usage.UsageError(str(e)) from None
        if self["name"] is None:
            self["name"] = default_site_name(self["http"])
        elif not self["name"].strip() or len(self["name"]) > 200:
            raise usage.UsageError("--name must be 1 to 200 characters")


def default_site_name(http_endpoint: str) -> str:
    """``HOST:PORT`` of this machine and the HTTP endpoint's port (the
    host alone when the endpoint names no port)."""
    host = socket.gethostname()
    parts = http_endpoint.split(":")
    port = next((p for p in parts[1:] if p.isdigit()), None)
    return f"{host}:{port}" if port else host


def read_node_key_file(path: str) -> dict[str, str]:
    """The ``ID:SECRET`` lines of a node key file; a bad line, a repeated id
    or an unreadable file is a :class:`usage.UsageError` naming the line
    (never showing a secret)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise usage.UsageError(f"--node-key-file {path}: cannot read it: {e}") from e
    keys: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"--node-key-file {path} line {number}"
        node_id, sep, secret = line.partition(":")
        node_id, secret = node_id.strip(), secret.strip()
        if not sep or not node_id or not secret:
            raise usage.UsageError(f"{where}: expected ID:SECRET")
        if not users.NODE_ID_PATTERN.fullmatch(node_id):
            raise usage.UsageError(f"{where}: bad node id {node_id!r}")
        if node_id in keys:
            raise usage.UsageError(f"{where}: node id {node_id!r} appears twice")
        keys[node_id] = secret
    return keys


@dataclass
class Health:
    """What ``/healthz`` answers; the service sets it as the start goes."""

    #: The site's ``--name`` and its database's backend (sqlite / postgresql).
    site: str = ""
    backend: str = "sqlite"
    recovery: str = "pending"  # "pending" / "done" / "failed"
    dispatch_enabled: bool = False
    #: When the database last stopped answering (ISO 8601 UTC), ``None``
    #: while it answers (SCALE.md "Fencing" 4: ``/healthz`` is 503 then).
    database_failing_since: str | None = None
    #: The lease's replication check (SCALE.md "Database failover" 2):
    #: ``(answer, since)``, ``since`` the Unix time it stopped being
    #: ``sync`` (storage.lease.Lease.replication); None: ``n/a``.
    replication_of: Callable[[], tuple[str, float | None]] | None = None

    def replication(self) -> str:
        """``sync``, ``async since <time>``, ``unknown since <time>``,
        ``none`` or ``n/a`` (SQLite)."""
        if self.replication_of is None:
            return "n/a"
        answer, since = self.replication_of()
        return answer if since is None else f"{answer} since {iso(since)}"

    @property
    def database_ok(self) -> bool:
        return self.database_failing_since is None

    def document(self) -> dict[str, str]:
        return {
            "site": self.site,
            "backend": self.backend,
            "recovery": self.recovery,
            "dispatch": "enabled" if self.dispatch_enabled else "disabled",
            "database": "ok"
            if self.database_failing_since is None
            else f"failing since {self.database_failing_since}",
            "replication": self.replication(),
        }

    async def probe(
        self, ping: Callable[[], Deferred[None]], clock: IReactorTime, *, timeout: float = 2.0
    ) -> dict[str, str]:
        """Ask the database for an answer within ``timeout`` seconds (on
        ``clock``), note whether it answered, and return :meth:`document`."""
        try:
            await ping().addTimeout(timeout, clock)
        except Exception as e:
            if self.database_failing_since is None:
                self.database_failing_since = iso(clock.seconds())
                log.error("the database does not answer: {e}", e=e)
        else:
            if self.database_failing_since is not None:
                log.info(
                    "the database answers again (failing since {since})",
                    since=self.database_failing_since,
                )
            self.database_failing_since = None
        return self.document()


class NodeKeys:
    """The node keys in force: the ``node_key`` table joined by
    ``--node-key`` (the options win), handed to the node listener."""

    def __init__(
        self, db: Database, listener: NodeListenerFactory, option_keys: dict[str, str]
    ) -> None:
        self._db = db
        self._listener = listener
        self._option_keys = dict(option_keys)

    async def refresh(self) -> None:
        """Re-read the table.  The new mapping replaces the old one in one
        assignment, so a removed key stops working at the next Login
        (connected nodes stay connected)."""
        self._listener.node_keys = {**await self._db.read(users.node_keys), **self._option_keys}

    def refresh_logged(self) -> Deferred[None]:
        d = Deferred.fromCoroutine(self.refresh())
        # Logged, not returned as a failure: that would stop the timer.
        return d.addErrback(lambda f: log.failure("re-reading node keys failed", f))


@dataclass(frozen=True)
class NodeSide:
    """What node connections reach: one registry of connected nodes, which
    of them this site holds (the ownership, a service: its watch), the
    report pipeline, the dispatcher, the outbox and its event hub, and the
    listener (built by :func:`tasknet.site.root.build_node_side`)."""

    nodes: ConnectedNodes
    ownership: NodeOwnership
    reports: ReportPipeline
    dispatcher: Dispatcher
    outbox: OutboxExecutor
    hub: EventHub
    listener: NodeListenerFactory

    async def stop(self, *, fenced: bool = False) -> None:
        """Shut the node side down (call it after the node listener stopped
        accepting): stop dispatching, finish the reports in flight while
        their connections are still open (their ACKs go out, so no node
        redelivers what is already committed), then close the node
        connections, finish what arrived meanwhile, stop delivery and close
        the WebSocket clients.  The ownership's watch stops first, with the
        listener that no longer accepts.  Legacy reports waiting to be tried
        again are given up (lost, as on the wire).  A ``fenced`` site (its
        lease lost) commits nothing more, so it waits for no ACK: it closes
        the node connections at once and its nodes send their reports to
        another site instead of again to this one."""
        if self.ownership.running:
            await self.ownership.stopService()
        await self.dispatcher.stopService()
        self.reports.stop_retrying()
        if not fenced:
            await self.reports.idle()
        await self.listener.close_all("site stopping")
        await self.reports.idle()
        await self.outbox.stopService()
        self.hub.close_all()


@dataclass(frozen=True)
class SiteParts:
    """Everything one running site holds, each part built complete by the
    composition root (:func:`tasknet.site.root.build_site`)."""

    db: Database
    upstream: UpstreamClient
    lifecycle: Lifecycle
    node_side: NodeSide
    node_keys: NodeKeys
    housekeeping: Housekeeping
    #: What the web layer was given, and the HTTP port's factory (the web
    #: resource behind ``--max-body``).
    web: WebDependencies
    http: BoundedSite
    health: Health
    #: This site as an instance on its database: its lease (taken by the
    #: root, released when the site stops), lease checks, reaping.
    instance: InstanceService


class SiteService(service.MultiService):
    """Starts the site in the order of invariant 10; ``ready`` fires when
    HTTP is listening."""

    def __init__(
        self,
        parts: SiteParts,
        *,
        http_endpoint: str,
        nodes_endpoint: str,
        reactor: IReactorTCP,
        node_keys_refresh: float = NODE_KEYS_REFRESH,
        exit_on_failure: bool = False,
    ) -> None:
        super().__init__()
        self.parts = parts
        self._reactor = reactor
        self._http_endpoint = http_endpoint
        self._nodes_endpoint = nodes_endpoint
        # The port of each listener, once listening.
        self.http_port: IListeningPort | None = None
        self.nodes_port: IListeningPort | None = None
        self.ready: Deferred[None] = Deferred()
        keys_timer = TimerService(node_keys_refresh, parts.node_keys.refresh_logged)
        keys_timer.clock = reactor
        # Children in the order they start; each is started at its step.
        self._keys_timer = keys_timer
        for name, child in (
            ("instance", parts.instance),
            ("node-keys", keys_timer),
            ("housekeeping", parts.housekeeping),
            ("outbox", parts.node_side.outbox),
            ("node-ownership", parts.node_side.ownership),
            ("dispatch", parts.node_side.dispatcher),
        ):
            child.setName(name)
            child.setServiceParent(self)
        # Under twistd (makeService) a failed start stops the reactor and the
        # process exits 1.  In-process callers see ``ready`` fail.
        self.exit_on_failure = exit_on_failure
        self._stopping: Deferred[None] | None = None
        self._stop_waiters: list[Deferred[None]] | None = []
        #: Recovery tried again after it failed at the start (until it succeeds).
        self._recovery_retry: Deferred[None] | None = None
        parts.instance.fenced.addCallback(self._fenced)

    def _fenced(self, reason: str) -> None:
        """The lease is lost: the lifecycle already refuses to write; stop
        the site and, under twistd, exit 1, within :data:`FENCED_EXIT_DEADLINE`.
        Every create under way is answered first (a create that waits on a
        database in failover would otherwise wait for the exit)."""
        log.critical("tasknet-site lost its lease ({reason}): stopping", reason=reason)
        self.parts.lifecycle.answer_in_flight(f"this site lost its lease ({reason})")
        if self.exit_on_failure:
            # twistd stops the site on the way out; a stop held up by the
            # database does not hold up the exit.
            exit_after_stop(IReactorCore(self._reactor), 1, deadline=FENCED_EXIT_DEADLINE)
        else:
            self.stopService()

    def startService(self) -> None:
        # Not MultiService's: the children start one by one in _start.
        service.Service.startService(self)
        d = Deferred.fromCoroutine(self._start())
        d.addErrback(lambda failure: Deferred.fromCoroutine(self._start_failed(failure)))
        d.chainDeferred(self.ready)

    async def _start_failed(self, failure: Failure) -> Failure:
        """Undo what was started (listeners, loops, database, lock), log why
        and, under twistd, exit non-zero."""
        if not failure.check(CannotListenError):
            # A port taken or not allowed says all in its one line below.
            log.failure("the site could not start", failure)
        log.critical(
            "tasknet-site could not start: {why}; undoing the start-up and exiting",
            why=failure.getErrorMessage().rstrip("."),
        )
        try:
            await self.stopService()
        except Exception:
            log.failure("undoing the failed start-up failed")
        if self.exit_on_failure:
            exit_after_stop(IReactorCore(self._reactor), 1)
        return failure

    async def _start(self) -> None:
        parts = self.parts
        health = parts.health
        node_side = parts.node_side
        # Node keys from the database join --node-key (options win), and are
        # re-read while running (the timer's first run repeats this read).
        await parts.node_keys.refresh()
        self._keys_timer.startService()
        # Lease checks, heartbeat and reaping of gone instances (PostgreSQL),
        # from before recovery: a long recovery must not let the lease go
        # stale (the reaper runs one reaping pass at a time).
        parts.instance.startService()
        try:
            await parts.lifecycle.recover()
            health.recovery = "done"
        except Exception:
            health.recovery = "failed"
            log.failure(
                "RECOVERY FAILED: nodes may connect and reports are applied, "
                "but NOTHING WILL BE DISPATCHED until a restart recovers"
            )
        parts.housekeeping.startService()
        node_side.outbox.startService()
        await node_side.outbox.wake()  # what the last run left undelivered
        # Watching for this site's nodes taken elsewhere, before any logs in.
        node_side.ownership.startService()
        self.nodes_port = await serverFromString(self._reactor, self._nodes_endpoint).listen(
            node_side.listener
        )
        log.info("node listener on {address}", address=self.nodes_port.getHost())
        if health.recovery == "done":
            await self._enable_dispatch()
        else:
            log.warn(
                "dispatch disabled: recovery failed (see /healthz); retrying it"
                " every {seconds:.0f} s or more",
                seconds=RECOVERY_RETRY,
            )
            self._recovery_retry = Deferred.fromCoroutine(self._retry_recovery())
        self.http_port = await serverFromString(self._reactor, self._http_endpoint).listen(
            parts.http
        )
        log.info("HTTP on {address}", address=self.http_port.getHost())

    async def _enable_dispatch(self) -> None:
        self.parts.health.dispatch_enabled = True
        dispatcher = self.parts.node_side.dispatcher
        dispatcher.startService()
        await dispatcher.idle()  # caught up with the nodes already connected

    async def _retry_recovery(self) -> None:
        """Recovery again, with backoff, until it succeeds (a transient
        database error, an I/O error, must not leave dispatch off until an
        operator restarts the site); then dispatch starts.  Recovery only
        settles instances known to be gone (their lease lost), so it is as
        safe while the site runs as at its start."""
        clock = IReactorTime(self._reactor)
        delay = RECOVERY_RETRY
        try:
            while True:
                await deferLater(clock, delay, lambda: None)
                try:
                    await self.parts.lifecycle.recover()
                except Exception:
                    log.failure("recovery failed again; retrying in {delay:.0f} s", delay=delay)
                    delay = min(delay * 2, RECOVERY_RETRY_MAX)
                    continue
                break
        except CancelledError:
            return  # the site stops
        self.parts.health.recovery = "done"
        log.info("recovery done at last: dispatch enabled")
        await self._enable_dispatch()

    def stopService(self) -> Deferred[None]:
        """Stop once: a second call (twistd's shutdown after a failed start
        already undone) waits for the first stop's end."""
        if self._stopping is None:
            self._stopping = Deferred.fromCoroutine(self._stop())
            self._stopping.addBoth(self._stopped)
        waiter: Deferred[None] = Deferred()
        if self._stop_waiters is None:
            waiter.callback(None)
        else:
            self._stop_waiters.append(waiter)
        return waiter

    def _stopped(self, result: Any) -> None:
        waiters, self._stop_waiters = self._stop_waiters or [], None
        for waiter in waiters:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(None)
        if isinstance(result, Failure):
            log.failure("stopping the site failed", result)

    async def _stop(self) -> None:
        parts = self.parts
        if self._recovery_retry is not None:
            self._recovery_retry.cancel()
        if self._keys_timer.running:
            await self._keys_timer.stopService()
        if parts.instance.running:
            await parts.instance.stopService()
        parts.lifecycle.stop()
        for port in (self.http_port, self.nodes_port):
            if port is not None:
                await maybeDeferred(port.stopListening)
        # Reports in flight are ACKed before the node connections close
        # (unless fenced: none can commit).
        try:
            await parts.node_side.stop(fenced=parts.instance.fenced.called)
        except Exception:
            log.failure("stopping the node side failed")
        await parts.housekeeping.stopService()
        service.Service.stopService(self)
        await parts.upstream.close()
        parts.db.close()
        # The instance's last write (ended), then its lease goes.
        parts.instance.lease.release()
