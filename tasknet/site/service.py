"""``twistd -n tasknet-site``: options, the :class:`Site` object and the
startup order of LIFECYCLE.md invariant 10.

In :func:`makeService` (synchronous, before the reactor runs): take the
database's instance lock (:mod:`tasknet.site.storage.lock`; held by another
site: refused before anything is read or recovered, exit 1), open the
database and initialise or verify the schema (an unmigrated legacy database is
refused with the command to run), create the ``--demo`` user on a fresh
database, bind the report handler, dispatcher and outbox (the wiring block).

In :meth:`SiteService.startService` (a Deferred chain, ``service.ready``):
recovery → node listener → dispatch enabled only if recovery succeeded →
HTTP.  If recovery fails, nodes still connect and reports are still applied,
but nothing is dispatched; ``/healthz`` and the log say so.  While running,
node keys are re-read from the ``node_key`` table every
``NODE_KEYS_REFRESH`` seconds (``tasknet-admin node-key`` changes apply
without a restart).

A start that fails (a port taken, ...) is undone (the stop below, lock
released) and, under twistd, the process exits 1 (:mod:`tasknet.startup`).

Stop: both listeners stop accepting, dispatch stops, the reports in flight
are committed and ACKed on their still-open connections, and only then are
the node connections closed (so a node never redelivers what was committed).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.application import service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.web.resource import IResource

from tasknet.site import ratelimit
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.storage import lock as instance_lock
from tasknet.site.storage import users
from tasknet.site.storage.db import PRIVATE_MODE, Database, connect, open_pool, run_write
from tasknet.site.storage.lock import InstanceLock
from tasknet.site.storage.schema import SchemaError, prepare_database
from tasknet.site.upstream_client import UpstreamClient
from tasknet.site.web.http import DEFAULT_MAX_BODY, BoundedSite
from tasknet.startup import exit_after_stop

log = Logger()

#: Seconds between two reads of the ``node_key`` table.
NODE_KEYS_REFRESH = 5.0


class Options(usage.Options):
    optParameters = [
        ["db", None, "tasknet-site.sqlite", "SQLite database (created on first start)."],
        ["http", None, "tcp:8080:interface=127.0.0.1", "HTTP API, UI, WebSocket, /metrics."],
        ["nodes", None, "tcp:7100:interface=127.0.0.1", "Where storage nodes connect."],
        ["upstream", None, "http://127.0.0.1:7200", "Upstream base URL."],
        [
            "upstream-timeout",
            None,
            30.0,
            "Submit timeout (seconds); past it the operation is UNKNOWN.",
            float,
        ],
        ["webhook", None, None, "POST a JSON notification per user-visible change."],
        ["name", None, "tasknet-site", "Site name sent in Identity."],
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
    ]
    optFlags = [
        ["demo", None, "On a fresh database, create the admin user 'demo' with token 'demo'."],
    ]

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
        if not self["upstream-timeout"] > 0:
            raise usage.UsageError("--upstream-timeout must be > 0")
        if self["default-quota"] < 0:
            raise usage.UsageError("--default-quota must be >= 0")
        if self["max-body"] < 1:
            raise usage.UsageError("--max-body must be >= 1")
        if self["create-rate"] < 0 or self["create-burst"] < 1:
            raise usage.UsageError("--create-rate must be >= 0 and --create-burst >= 1")
        if not self["upstream"].startswith(("http://", "https://")):
            raise usage.UsageError("--upstream must be an http:// or https:// URL")
        webhook = self["webhook"]
        if webhook is not None and not webhook.startswith(("http://", "https://")):
            raise usage.UsageError("--webhook must be an http:// or https:// URL")


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
class Site:
    """Everything one running site holds.  The slots after ``node_factory``
    are filled by the reports/dispatch/notify wiring."""

    db: Database
    lifecycle: Lifecycle
    upstream: UpstreamClient
    node_keys: dict[str, str]  # in force: the node_key table joined by --node-key
    name: str
    default_quota: int
    option_node_keys: dict[str, str] = field(default_factory=dict)  # --node-key (win)
    webhook: str | None = None
    max_body: int = DEFAULT_MAX_BODY  # --max-body, enforced by web.http
    create_limiter: Any = None  # ratelimit.CreateRateLimiter (--create-rate), or None
    recovery_state: str = "pending"  # "pending" / "done" / "failed"
    dispatch_enabled: bool = False
    node_factory: Any = None  # tasknet.site.nodes.NodeListenerFactory
    # --- slots the reports/dispatch/notify wiring fills ---
    handler: Any = None  # ISiteHandler
    dispatcher: Any = None  # .enable() -> Deferred, called once recovery succeeded
    outbox: Any = None  # .wake() after each commit that enqueued notifications
    events_resource: IResource | None = None  # /api/events
    nodes_view: Callable[[], Any] | None = None  # /api/admin/nodes: list or Deferred[list]
    # Called (in order) after recovery, before the node listener starts, and
    # at stop before the database closes; each may return a Deferred.
    on_start: list[Callable[[], Any]] = field(default_factory=list)
    on_stop: list[Callable[[], Any]] = field(default_factory=list)
    # The database's instance lock (storage.lock), held until the site stops.
    instance_lock: InstanceLock | None = None

    async def refresh_node_keys(self) -> None:
        """Re-read the ``node_key`` table; ``--node-key`` options win.  The
        new mapping replaces the old one in one assignment, so a removed key
        stops working at the next Login (connected nodes stay connected)."""
        keys = {**await self.db.read(users.node_keys), **self.option_node_keys}
        self.node_keys = keys
        if self.node_factory is not None:
            self.node_factory.node_keys = keys

    def wake_outbox(self) -> None:
        if self.outbox is not None:
            self.outbox.wake()

    def health(self) -> dict[str, str]:
        return {
            "recovery": self.recovery_state,
            "dispatch": "enabled" if self.dispatch_enabled else "disabled",
        }


class SiteService(service.MultiService):
    """Starts the site in the order of invariant 10; ``ready`` fires when
    HTTP is listening (children services, if any, start first)."""

    def __init__(
        self, site: Site, http_endpoint: str, nodes_endpoint: str, reactor: Any = None
    ) -> None:
        super().__init__()
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.site = site
        self._reactor = reactor
        self._http_endpoint = http_endpoint
        self._nodes_endpoint = nodes_endpoint
        # Any: zope interfaces are opaque to mypy (IListeningPort when set).
        self.http_port: Any = None
        self.nodes_port: Any = None
        self.ready: Deferred[None] = Deferred()
        self.node_keys_refresh = NODE_KEYS_REFRESH
        self._keys_loop: LoopingCall | None = None
        # Set by makeService (twistd): a failed start stops the reactor and
        # the process exits 1.  In-process callers see ``ready`` fail.
        self.exit_on_failure = False
        self._stopping: Deferred[None] | None = None
        self._stop_waiters: list[Deferred[None]] | None = []

    def startService(self) -> None:
        super().startService()
        d = Deferred.fromCoroutine(self._start())
        d.addErrback(lambda failure: Deferred.fromCoroutine(self._start_failed(failure)))
        d.chainDeferred(self.ready)

    async def _start_failed(self, failure: Failure) -> Failure:
        """Undo what was started (listeners, loops, database, lock), log why
        and, under twistd, exit non-zero."""
        log.failure("the site could not start", failure)
        log.critical(
            "tasknet-site could not start: {why}; undoing the start-up and exiting",
            why=failure.getErrorMessage(),
        )
        try:
            await self.stopService()
        except Exception:
            log.failure("undoing the failed start-up failed")
        if self.exit_on_failure:
            exit_after_stop(self._reactor, 1)
        return failure

    async def _start(self) -> None:
        site = self.site
        from tasknet.site.web.api import make_web_resource

        # Node keys from the database join --node-key (options win), and are
        # re-read while running.
        await site.refresh_node_keys()
        self._keys_loop = LoopingCall(self._refresh_node_keys)
        self._keys_loop.clock = self._reactor
        self._keys_loop.start(self.node_keys_refresh, now=False)
        try:
            await site.lifecycle.recover()
            site.recovery_state = "done"
        except Exception:
            site.recovery_state = "failed"
            log.failure(
                "RECOVERY FAILED: nodes may connect and reports are applied, "
                "but NOTHING WILL BE DISPATCHED until a restart recovers"
            )
        for hook in site.on_start:
            await maybeDeferred(hook)
        self.nodes_port = await serverFromString(self._reactor, self._nodes_endpoint).listen(
            site.node_factory
        )
        log.info("node listener on {address}", address=self.nodes_port.getHost())
        if site.recovery_state == "done":
            site.dispatch_enabled = True
            if site.dispatcher is not None:
                await maybeDeferred(site.dispatcher.enable)
            log.info("dispatch enabled")
        else:
            log.warn("dispatch disabled: recovery failed (see /healthz)")
        self.http_port = await serverFromString(self._reactor, self._http_endpoint).listen(
            BoundedSite(make_web_resource(site), max_body=site.max_body, reactor=self._reactor)
        )
        log.info("HTTP on {address}", address=self.http_port.getHost())

    def _refresh_node_keys(self) -> Deferred[None]:
        d = Deferred.fromCoroutine(self.site.refresh_node_keys())
        # Logged, not returned as a failure: that would stop the loop.
        return d.addErrback(lambda f: log.failure("re-reading node keys failed", f))

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
        site = self.site
        if self._keys_loop is not None and self._keys_loop.running:
            self._keys_loop.stop()
        site.lifecycle.stop()
        for port in (self.http_port, self.nodes_port):
            if port is not None:
                await maybeDeferred(port.stopListening)
        # The stop hooks close the node connections themselves once the
        # reports in flight are ACKed (see build_service); this catches any
        # connection left (a site without the protocol side wired).
        for hook in site.on_stop:
            try:
                await maybeDeferred(hook)
            except Exception:
                log.failure("a stop hook failed")
        if site.node_factory is not None and hasattr(site.node_factory, "close_all"):
            await maybeDeferred(site.node_factory.close_all, "site stopping")
        if self.running:
            await super().stopService()
        await site.upstream.close()
        site.db.close()
        if site.instance_lock is not None:
            site.instance_lock.release()


def _private(path: str) -> None:
    """Tighten an existing database (and its -wal/-shm) to 0600: they hold
    node secrets and users' upstream tokens."""
    for name in (path, path + "-wal", path + "-shm"):
        try:
            mode = os.stat(name).st_mode & 0o777
        except FileNotFoundError:
            continue
        if mode & ~PRIVATE_MODE:
            os.chmod(name, PRIVATE_MODE)
            log.warn("{name} was mode {mode:o}; now 0600", name=name, mode=mode)


def _default_reactor() -> Any:
    from twisted.internet import reactor

    return reactor


def build_site(options: Options, reactor: Any = None) -> Site:
    """Take the database's instance lock, open the database (initialised or
    verified) and build the Site with its lifecycle; raises
    :class:`SchemaError` for an unusable database, and
    :class:`~tasknet.site.storage.lock.DatabaseInUse` (before touching the
    database) while another site holds it."""
    path = options["db"]
    held = instance_lock.acquire(path, role="tasknet-site")
    try:
        site = _open_site(options, path, reactor)
    except BaseException:
        held.release()
        raise
    site.instance_lock = held
    return site


def _open_site(options: Options, path: str, reactor: Any) -> Site:
    _private(path)
    fresh = prepare_database(path)
    connection = connect(path)
    try:
        # tasknet-admin gives new users this quota while this setting stands.
        run_write(connection, users.set_default_quota, options["default-quota"])
        if fresh and options["demo"]:
            run_write(
                connection,
                lambda cursor: users.create_user(
                    cursor, "demo", admin=True, quota=options["default-quota"], token="demo"
                ),
            )
            log.info("fresh database: created admin user 'demo' with token 'demo'")
    finally:
        connection.close()
    db = open_pool(path)
    upstream = UpstreamClient(options["upstream"], reactor=reactor)
    lifecycle = Lifecycle(db, upstream, upstream_timeout=options["upstream-timeout"])
    site = Site(
        db=db,
        lifecycle=lifecycle,
        upstream=upstream,
        node_keys=dict(options["node-keys"]),
        name=options["name"],
        default_quota=options["default-quota"],
        option_node_keys=dict(options["node-keys"]),
        webhook=options["webhook"],
        max_body=options["max-body"],
    )
    if options["create-rate"] > 0:
        site.create_limiter = ratelimit.CreateRateLimiter(
            options["create-rate"], options["create-burst"], reactor or _default_reactor()
        )
    lifecycle.on_commit = site.wake_outbox
    return site


def build_service(options: Options, reactor: Any = None) -> SiteService:
    """The whole site, wired, not yet started (raises :class:`SchemaError`)."""
    site = build_site(options, reactor)
    site_service = SiteService(site, options["http"], options["nodes"], reactor)

    # Reports, dispatch and notifications: the protocol side of the site.
    from tasknet.site.handler import build_protocol_side

    side = build_protocol_side(
        site.db,
        lambda token: site.db.read(users.user_by_token, token),
        webhook_url=site.webhook,
    )
    site.handler = side.handler
    site.dispatcher = side.dispatcher
    site.outbox = side.outbox
    site.events_resource = side.events_resource
    site.nodes_view = side.nodes_view
    site.lifecycle.on_task_changed = side.dispatcher.task_changed
    site.on_start.append(side.start)  # delivers what the last run left undelivered

    def close_nodes() -> Any:
        return site.node_factory.close_all("site stopping")

    # Reports in flight are ACKed before the node connections close.
    site.on_stop.append(lambda: side.stop(close_nodes=close_nodes))

    # Receipts and audit rows past their retention, pruned on the site's clock.
    from tasknet.site.retention import Housekeeping

    housekeeping = Housekeeping(site.db, clock=reactor or _default_reactor())
    site.on_start.append(housekeeping.start)
    site.on_stop.append(housekeeping.stop)

    from tasknet.site.nodes import NodeListenerFactory

    site.node_factory = NodeListenerFactory(site.handler, site.node_keys, site.name)
    return site_service


def makeService(options: Options) -> SiteService:
    try:
        site_service = build_service(options)
        site_service.exit_on_failure = True
        return site_service
    except SchemaError as e:
        # A clean message (and exit status 1), not a traceback.
        print(f"tasknet-site: {e}", file=sys.stderr)
        raise SystemExit(1) from e
