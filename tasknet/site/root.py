"""The composition root: the one place that knows how the site's parts connect.

:func:`build_site` turns the command-line :class:`Options` into a complete,
not yet started :class:`~tasknet.site.service.SiteService`, building each
part once, in dependency order, and handing it its collaborators and the
site's clock (the reactor) as constructor arguments:

1. storage: on SQLite the database's instance lock (held by another site:
   refused before anything is read or recovered), the schema initialised or
   verified (an unmigrated legacy database is refused with the command to
   run), the ``--demo`` user on a fresh database, the connection pool, then
   the site instance registered with its lease (:mod:`.storage.lease`: the
   flock on SQLite, an advisory lock on a session of its own on
   PostgreSQL), all before recovery;
2. the upstream client;
3. the node side (:func:`build_node_side`): the one registry of connected
   nodes, the node ownership (its check a timer on the site's clock), the
   outbox executor (WebSocket hub, webhook), the report pipeline, the
   dispatcher, the session handler and the node listener;
4. the lifecycle, told of commits (outbox) and of tasks to send
   (dispatcher), holding the instance's lease; the instance service (lease
   checks, heartbeat, reaping of gone instances: :mod:`.instances`);
5. housekeeping, the node keys;
6. the web layer, given its own :class:`~tasknet.site.web.interfaces.WebDependencies`.

Nothing is filled in later and no layer imports this module
(``lint-imports``: the ``site-layers`` contract in ``setup.cfg``).
:func:`makeService` is the twistd entry (``twistd -n tasknet-site``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, cast

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IReactorCore,
    IReactorFromThreads,
    IReactorTCP,
    IReactorTime,
)
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.logging import rotate_on
from tasknet.runtime import (
    IEntropy,
    IProcesses,
    IThreadPools,
    OSProcesses,
    RealThreadPools,
    SystemEntropy,
    freeze_startup_heap,
)
from tasknet.site import fault_points, ratelimit
from tasknet.site.connected_nodes import CHECK_INTERVAL as NODE_CHECK_INTERVAL
from tasknet.site.connected_nodes import ConnectedNodes, NodeOwnership
from tasknet.site.dispatcher import Dispatcher
from tasknet.site.housekeeping import Housekeeping
from tasknet.site.instance_service import INTERVAL as INSTANCE_INTERVAL
from tasknet.site.instance_service import InstanceService
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.node_listener import NodeListenerFactory
from tasknet.site.outbox import (
    LivenessWatch,
    LocalTail,
    LocalWebhook,
    OutboxExecutor,
    SharedTail,
    SharedWebhook,
    Tail,
    WebhookRoom,
    WebhookSender,
)
from tasknet.site.reaper import Reaper
from tasknet.site.report_pipeline import ReportPipeline
from tasknet.site.service import (
    NODE_KEYS_REFRESH,
    Health,
    NodeKeys,
    NodeSide,
    Options,
    SiteParts,
    SiteService,
)
from tasknet.site.session_handler import SiteHandler
from tasknet.site.storage import reconcile, users
from tasknet.site.storage.dispatch import PAGE_SIZE
from tasknet.site.storage.engine import file_lock as instance_lock
from tasknet.site.storage.engine.database import (
    DEFAULT_READERS,
    PRIVATE_MODE,
    Database,
    classify,
    connect,
    describe,
    is_postgres,
    open_pool,
    reader_count,
    redact,
    run_write,
)
from tasknet.site.storage.engine.errors import DatabaseError
from tasknet.site.storage.engine.listen import NoWakeups, Wakeups, open_wakeups
from tasknet.site.storage.engine.schema import SchemaError, prepare_database
from tasknet.site.storage.engine.sources import Sources, StorageFaults
from tasknet.site.storage.engine.sqlite import stop_memory_statistics
from tasknet.site.storage.engine.targets import several_hosts
from tasknet.site.storage.lease import Lease, application_name, take_lease, wait_for_primary
from tasknet.site.storage.reassign import Retired
from tasknet.site.upstream_client import UpstreamClient, UpstreamReach
from tasknet.site.web.admin_nodes import nodes_view
from tasknet.site.web.api import make_web_resource
from tasknet.site.web.archive_stream import ArchiveStreams
from tasknet.site.web.archives import ArchiveDelivery
from tasknet.site.web.auth import Authenticator, SessionSettings, parse_public_url
from tasknet.site.web.events import EventHub, events_resource
from tasknet.site.web.http import BoundedSite
from tasknet.site.web.interfaces import WebDependencies
from tasknet.startup import keep_files_private

__all__ = ["Options", "Tuning", "build_node_side", "build_site", "makeService"]

log = Logger()


@dataclass(frozen=True)
class Tuning:
    """The site's internal timings and sizes: not command-line options; the
    defaults are production's, tests pass shorter ones."""

    dispatch_page_size: int = PAGE_SIZE
    #: After a login, wait this long before handing out unassigned tasks, so
    #: nodes reconnecting after a restart share them (see dispatch.py).
    dispatch_assign_delay: float = 0.5
    dispatch_poll_interval: float | None = 5.0
    outbox_poll_interval: float | None = 5.0
    webhook_timeout: float = 10.0
    webhook_concurrency: int = 4
    webhook_max_attempts: int = 5
    webhook_backoff: float = 1.0
    node_keys_refresh: float = NODE_KEYS_REFRESH
    #: How often a site checks that its node connections still hold their
    #: nodes (the safety net under the tasknet_node_taken notification).
    node_check_interval: float | None = NODE_CHECK_INTERVAL
    #: Lease check, heartbeat and reaping of gone instances (PostgreSQL).
    instance_interval: float = INSTANCE_INTERVAL
    #: Called just before the POST gate (a drill's fault point, a test's pause).
    before_post_gate: Callable[[], object] | None = None
    #: A simulation's storage faults (a failed BEGIN or COMMIT); None in production.
    storage_faults: StorageFaults | None = None
    #: A simulation's clock of a PostgreSQL server (its "now": one for every
    #: site, never moved by a site's own clock jumping); None in production,
    #: where the site's storage stamps on the site's clock and a PostgreSQL
    #: server reads its own.
    database_clock: Callable[[], float] | None = None
    #: False: no LISTEN connection on PostgreSQL (its blocking loop needs a
    #: real thread of its own); the sites learn of each other's changes by
    #: the polls above alone (a simulation: its world has one thread).
    listen: bool = True
    #: Reader connections of the database (``makeService`` gives a process
    #: of its own :func:`reader_count`).
    db_readers: int = DEFAULT_READERS


def build_site(
    options: Options,
    reactor: IReactorTCP | None = None,
    *,
    tuning: Tuning = Tuning(),
    exit_on_failure: bool = False,
    monotonic: Callable[[], float] = time.monotonic,
    threads: IThreadPools | None = None,
    entropy: IEntropy | None = None,
    processes: IProcesses | None = None,
) -> SiteService:
    """The whole site, built from ``options`` on ``reactor``, not yet
    started; ``monotonic`` is the clock its lease's freshness is judged on
    (and its transactions timed on), ``threads`` the pools its database
    and lease run on (default: real threads), ``entropy`` the source of its
    nonces, ids, secrets and jitter (default: the OS's), ``processes`` who
    this process is (its pid, host and process space, recorded with its
    lease) and the probe of whether a gone instance's process still runs
    (default: the kernel's).  The wall clock of
    everything it stores (``{now}`` in SQL, Python's timestamps) is the
    reactor's ``seconds``: a real reactor's is ``time.time``, the clock the
    database reads itself.
    Raises :class:`SchemaError` for an unusable database, and
    :class:`~tasknet.site.storage.engine.file_lock.DatabaseInUse` (before
    touching the database) while another site holds a SQLite file.

    ``reactor`` is the site's: what it listens and connects on
    (``IReactorTCP``) and, adapted to ``IReactorTime`` here (a wrong wire
    fails at once), the clock of every part.  Given none, Twisted's global
    reactor: this root is the one place of the site that resolves it."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = IReactorTCP(global_reactor)
    clock = IReactorTime(reactor)
    threads = threads if threads is not None else RealThreadPools()
    entropy = entropy if entropy is not None else SystemEntropy()
    processes = processes if processes is not None else OSProcesses()
    path = options["db"]
    # Several sites may share a PostgreSQL database; a SQLite file has one.
    held = (
        None
        if is_postgres(path)
        else instance_lock.acquire(path, role="tasknet-site", process=processes.this())
    )
    # What the storage stamps rows on (the module doc of storage.engine.sources).
    stamps = tuning.database_clock if tuning.database_clock is not None else clock.seconds
    try:
        _prepare_database(options, path, entropy, stamps)
        lease = take_lease(
            path,
            options["name"],
            flock=held,
            reactor=IReactorFromThreads(reactor),
            threads=threads,
            entropy=entropy,
            wall=stamps,
            processes=processes,
            upstream_timeout=options["upstream-timeout"],
            monotonic=monotonic,
        )
        try:
            # Every write passes the lease's fence; the sessions carry the
            # instance's name, so a reaper can end them.
            db = open_pool(
                path,
                reactor=IReactorCore(reactor),
                threads=threads,
                entropy=entropy,
                wall=stamps,
                monotonic=monotonic,
                clock=clock,
                fence=lease,
                storage_faults=tuning.storage_faults,
                readers=tuning.db_readers,
                application_name=application_name(lease.instance_id, "writer"),
                reader_application_name=application_name(lease.instance_id, "reader"),
            )
        except BaseException:
            lease.release()
            raise
    except BaseException:
        if held is not None:
            held.release()
        raise
    try:
        return _assemble(options, reactor, clock, entropy, db, lease, tuning, exit_on_failure)
    except BaseException:
        db.close()
        lease.release()
        raise


def _assemble(
    options: Options,
    reactor: IReactorTCP,
    clock: IReactorTime,
    entropy: IEntropy,
    db: Database,
    lease: Lease,
    tuning: Tuning,
    exit_on_failure: bool,
) -> SiteService:
    upstream = UpstreamClient(options["upstream"], reactor=reactor)
    node_side = build_node_side(
        db,
        clock,
        reactor=reactor,
        entropy=entropy,
        node_keys=dict(options["node-keys"]),
        site_name=options["name"],
        webhook_url=options["webhook"],
        tuning=tuning,
        instance_id=lease.instance_id,
        login_guesses=ratelimit.AuthFailureLimiter(
            clock, threshold=options["node-auth-burst"], rate=options["node-auth-rate"]
        ),
        reassign_after=options["reassign-after"],
    )
    outbox, dispatcher = node_side.outbox, node_side.dispatcher

    def wake_outbox() -> None:
        outbox.wake()

    # One reaper: the start's recovery and the instance service's ticks
    # share its lock (one reaping pass at a time).
    reaper = Reaper(db, lease, upstream_timeout=options["upstream-timeout"], on_commit=wake_outbox)
    lifecycle = Lifecycle(
        db,
        upstream,
        upstream_timeout=options["upstream-timeout"],
        on_commit=wake_outbox,
        on_task_changed=dispatcher.task_changed,
        lease=lease,
        reaper=reaper,
        clock=clock,
        entropy=entropy,
        before_post_gate=tuning.before_post_gate,
    )
    instance = InstanceService(
        lease, db, reaper.reap_gone, interval=tuning.instance_interval, clock=clock
    )
    health = Health(
        site=options["name"],
        backend=db.backend,
        replication_of=(lambda: (lease.replication, lease.replication_since))
        if lease.shared
        else None,
    )
    web = _web_dependencies(
        options,
        reactor,
        clock,
        entropy,
        db,
        lifecycle,
        node_side,
        health,
        wake_outbox,
        upstream.reach,
    )
    parts = SiteParts(
        db=db,
        upstream=upstream,
        lifecycle=lifecycle,
        node_side=node_side,
        node_keys=NodeKeys(db, node_side.listener, options["node-keys"]),
        # Receipts and audit rows past their retention, pruned on the site's clock.
        housekeeping=Housekeeping(db, clock=clock),
        web=web,
        http=BoundedSite(
            make_web_resource(web),
            max_body=options["max-body"],
            reactor=clock,
            access_log=options.get("access-log"),
        ),
        health=health,
        instance=instance,
    )
    return SiteService(
        parts,
        http_endpoint=options["http"],
        nodes_endpoint=options["nodes"],
        reactor=reactor,
        node_keys_refresh=tuning.node_keys_refresh,
        exit_on_failure=exit_on_failure,
    )


def _web_dependencies(
    options: Options,
    reactor: IReactorTCP,
    clock: IReactorTime,
    entropy: IEntropy,
    db: Database,
    lifecycle: Lifecycle,
    node_side: NodeSide,
    health: Health,
    wake_outbox: Callable[[], None],
    upstream_reach: UpstreamReach,
) -> WebDependencies:
    """What the web layer is given: its collaborators, never the service."""
    create_limiter = (
        ratelimit.CreateRateLimiter(options["create-rate"], options["create-burst"], clock)
        if options["create-rate"] > 0
        else None
    )

    def admin_nodes() -> Deferred[str]:
        return Deferred.fromCoroutine(nodes_view(db, node_side.nodes, clock))

    authenticator = Authenticator(
        db,
        clock,
        session_settings(options),
        entropy=entropy,
        guesses=ratelimit.AuthFailureLimiter(
            clock, threshold=options["auth-burst"], rate=options["auth-rate"]
        ),
    )
    listener = node_side.listener

    def node_secret(node_id: str) -> str | None:
        # The keys the listener checks logins with (the table and --node-key).
        return listener.node_keys.get(node_id)

    async def retire(node_id: str, actor: str, note: str) -> Retired:
        retired = await node_side.dispatcher.retire(node_id, actor=actor, note=note)
        # Its next Login here fails now, not at the next re-read of the keys
        # (a key given with --node-key stays while the option does).
        if node_id not in options["node-keys"]:
            listener.node_keys = {k: v for k, v in listener.node_keys.items() if k != node_id}
        return retired

    def retire_node(node_id: str, actor: str, note: str) -> Deferred[Retired]:
        return Deferred.fromCoroutine(retire(node_id, actor, note))

    archives = ArchiveDelivery(
        node_side.nodes,
        node_secret,
        clock,
        link_ttl=options["link-ttl"],
        streams=ArchiveStreams(reactor, clock, per_user=options["archive-streams-per-user"]),
    )
    return WebDependencies(
        db=db,
        lifecycle=lifecycle,
        events=events_resource(
            node_side.hub,
            authenticator.token_user,
            sessions=authenticator.session_user,
            clock=clock,
        ),
        admin_nodes=admin_nodes,
        health=lambda: Deferred.fromCoroutine(health.probe(db.ping, clock)),
        wake_outbox=wake_outbox,
        create_limiter=create_limiter,
        clock=clock,
        auth=authenticator,
        archives=archives,
        reassign_node=lambda node_id, actor, note: Deferred.fromCoroutine(
            node_side.dispatcher.reassign_now(node_id, actor=actor, note=note)
        ),
        retire_node=retire_node,
        control_node=lambda node_id, mode, limit, actor, note: Deferred.fromCoroutine(
            node_side.dispatcher.control_node(
                node_id, mode=mode, limit=limit, actor=actor, note=note
            )
        ),
        max_bulk_matching=options["max-bulk-matching"],
        site_name=options["name"],
        demo=bool(options["demo"]),
        upstream_reach=upstream_reach,
    )


def session_settings(options: Options) -> SessionSettings:
    """The browser sessions' options (``web/auth.py``)."""
    public_url = options["public-url"]
    return SessionSettings(
        idle=options["session-idle"],
        max_age=options["session-max-age"],
        cookie_secure=bool(options["cookie-secure"]),
        public_origin=None if public_url is None else parse_public_url(public_url),
        max_per_user=options["max-sessions-per-user"],
    )


def build_node_side(
    db: Database,
    clock: IReactorTime,
    *,
    reactor: IReactorTCP | None = None,
    entropy: IEntropy,
    node_keys: dict[str, str],
    site_name: str,
    webhook_url: str | None = None,
    tuning: Tuning = Tuning(),
    instance_id: int | None = None,
    wakeups: Wakeups | None = None,
    login_guesses: ratelimit.AuthFailureLimiter | None = None,
    reassign_after: float = 0.0,
) -> NodeSide:
    """The parts node connections reach, over ``db``, timed on ``clock``;
    ``reactor`` (default: ``clock``, which is then a reactor) is what the
    webhook sender connects on and the LISTEN connection's thread calls
    back to; ``entropy`` gives the connections' nonces.  ``node_keys``
    (node id → secret) is who may log in until :class:`NodeKeys` refreshes
    it.

    ``instance_id`` (this site's instance) and ``wakeups`` (default: a
    LISTEN connection of its own on PostgreSQL, nothing on SQLite) make it
    one of several sites on the database: node ownership, the outbox tail
    and webhook claims per instance, wake-ups between sites.
    ``login_guesses`` slows failed node Logins per address (default: the
    listener's defaults).  ``reassign_after`` (``--reassign-after``; 0:
    never) is how long a node may be gone before its unfinished tasks move."""
    if reactor is None:
        reactor = cast(IReactorTCP, clock)  # the same object (the docstring)
    if wakeups is None and not tuning.listen:
        wakeups = NoWakeups()
    if wakeups is None:
        wakeups = open_wakeups(db.target, IReactorFromThreads(reactor), site_name=site_name)
    nodes = ConnectedNodes(site_name, instance_id)
    ownership = NodeOwnership(
        db, nodes, wakeups=wakeups, check_interval=tuning.node_check_interval, clock=clock
    )
    hub = EventHub()
    sender = None
    if webhook_url:
        sender = WebhookSender(
            webhook_url,
            db,
            concurrency=tuning.webhook_concurrency,
            timeout=tuning.webhook_timeout,
            max_attempts=tuning.webhook_max_attempts,
            backoff=tuning.webhook_backoff,
            clock=clock,
            reactor=reactor,
        )
    # The outbox's rooms, chosen here once: one site alone on its database,
    # or one of several on PostgreSQL (a tail per instance, webhook rows
    # claimed with a lease renewed on its own timer).
    tail: Tail
    webhook: WebhookRoom | None
    if db.capabilities.shared_by_sites and instance_id is not None:
        tail = SharedTail(db, instance_id)
        webhook = SharedWebhook(sender, db, instance_id, clock=clock) if sender else None
        # Other sites' logins and drops change the session rows unseen here.
        liveness = LivenessWatch(db, hub)
    else:
        tail = LocalTail(db)
        webhook = LocalWebhook(sender, db) if sender else None
        # The registry's node ids: the sweep reads the rows when they change.
        liveness = LivenessWatch(db, hub, nodes=nodes)
    outbox = OutboxExecutor(
        db,
        hub,
        webhook,
        tail=tail,
        liveness=liveness,
        poll_interval=tuning.outbox_poll_interval,
        clock=clock,
        wakeups=wakeups,
    )
    reports = ReportPipeline(
        db, on_committed=outbox.wake, on_applied=nodes.report_applied, clock=clock
    )
    dispatcher = Dispatcher(
        db,
        nodes,
        page_size=tuning.dispatch_page_size,
        assign_delay=tuning.dispatch_assign_delay,
        poll_interval=tuning.dispatch_poll_interval,
        clock=clock,
        wakeups=wakeups,
        reassign_after=reassign_after,
        on_committed=outbox.wake,
    )
    handler = SiteHandler(reports, dispatcher, db, ownership, wake_outbox=outbox.wake)
    listener = NodeListenerFactory(
        handler,
        nodes,
        node_keys,
        site_name,
        ownership=ownership,
        clock=clock,
        entropy=entropy,
        login_guesses=login_guesses,
    )
    return NodeSide(nodes, ownership, reports, dispatcher, outbox, hub, listener)


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


def _prepare_database(
    options: Options, path: str, entropy: IEntropy, wall: Callable[[], float]
) -> None:
    """Initialise or verify the schema, apply ``--default-quota`` and
    ``--demo`` (conflict reruns jittered from ``entropy``, rows stamped on
    ``wall``: the site's, as its pools')."""
    _private(path)
    fresh = prepare_database(path)
    connection = connect(path, Sources(wall, entropy))
    try:
        # tasknet-admin gives new users this quota while this setting stands.
        jitter = entropy.random()
        run_write(connection, users.set_default_quota, options["default-quota"], jitter=jitter)
        # tasknet-admin unknown/resolve read the audit from this upstream.
        run_write(connection, reconcile.record_upstream, options["upstream"], jitter=jitter)
        if fresh and options["demo"]:
            run_write(
                connection,
                lambda cursor: users.create_user(
                    cursor, "demo", admin=True, quota=options["default-quota"], token="demo"
                ),
                jitter=jitter,
            )
            log.info("fresh database: created the admin user 'demo' (--demo's documented token)")
    finally:
        connection.close()


def sqlite_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a site's SQLite database (None: it can).  The
    site creates the database file on its first start, never a directory."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        return (
            f"--db {path} is a directory, not a database file: name a file in it, e.g."
            f" --db {os.path.join(path, 'site.sqlite')} (created on the first start)"
        )
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        return (
            f"--db {path}: there is no directory {parent}; create it first (the site"
            " creates the database file, not its directory)"
        )
    if os.path.lexists(target) and not os.path.isfile(target):
        return f"--db {path} is not a regular file"
    return None


class NewDatabaseFiles:
    """The SQLite files a start is about to create (the database, its
    journal files and its lock file), so that a start that fails leaves none
    of them behind (a port taken, a bad option found late): nothing is
    removed unless the database file itself did not exist before this start.

    :meth:`remove` takes the database's lock again first (a site that
    started on the same new path meanwhile keeps everything) and unlinks
    the lock file while holding it, so no other process can be holding a lock on the
    file that goes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.names: list[str] = []
        if is_postgres(path) or os.path.lexists(path):
            return
        # Absolute: a daemon may change its directory before a start fails.
        candidates = [os.path.abspath(path) + s for s in ("", "-wal", "-shm", "-journal")]
        candidates.append(instance_lock.lock_path(path))
        self.names = [name for name in candidates if not os.path.lexists(name)]

    def remove(self) -> list[str]:
        """Remove what this start created; the names removed."""
        if not self.names:
            return []
        try:
            held = instance_lock.acquire(self.path, role="tasknet-site")
        except (SchemaError, OSError):  # in use by another process now: keep it all
            return []
        removed = []
        try:
            for name in self.names:
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    continue
                removed.append(name)
        finally:
            held.release()
        self.names = []
        return removed


def _refuse(message: str, cause: BaseException | None = None) -> NoReturn:
    """The one clear line of a start refused before anything ran; exit 1."""
    print(message, file=sys.stderr)
    raise SystemExit(1) from cause


def makeService(
    options: Options,
    *,
    reactor: IReactorTCP | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    threads: IThreadPools | None = None,
    entropy: IEntropy | None = None,
    processes: IProcesses | None = None,
) -> SiteService:
    """The site as ``twistd -n tasknet-site`` builds it: on twistd's reactor,
    the process's monotonic clock, real threads, the OS's entropy and the
    kernel's processes unless given others (a simulation's)."""
    own_process = reactor is None
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = IReactorTCP(global_reactor)
    rotate_on(IReactorFromThreads(reactor, None))  # twistd's log file, on SIGUSR1
    # Every file the site creates, twistd's --logfile included, is 0600
    # (INTERFACES.md, "Nothing secret in logs").
    keep_files_private("tasknet-site")
    path = options["db"]
    if not is_postgres(path):
        problem = sqlite_path_problem(path)
        if problem is not None:
            _refuse(f"tasknet-site could not start: {problem}")
    if own_process and not stop_memory_statistics():
        log.info("SQLite's memory statistics stay on: its allocations take one mutex")
    created = NewDatabaseFiles(path)
    try:
        if own_process and several_hosts(path):
            # A site fenced by a failover waits here for the new primary
            # rather than fail its starts until then (storage.lease.PRIMARY_WAIT).
            wait_for_primary(path)
        tuning = Tuning(
            before_post_gate=fault_points.pause_before_post(os.environ),
            db_readers=reader_count(path, os.cpu_count()) if own_process else DEFAULT_READERS,
        )
        site = build_site(
            options,
            reactor,
            tuning=tuning,
            exit_on_failure=True,
            monotonic=monotonic,
            threads=threads if threads is not None else RealThreadPools(),
            entropy=entropy if entropy is not None else SystemEntropy(),
            processes=processes if processes is not None else OSProcesses(),
        )
    except SchemaError as e:
        created.remove()
        # A clean message (and exit status 1), not a traceback.
        _refuse(f"tasknet-site: {redact(str(e), path)}", e)
    except OSError as e:
        created.remove()
        # The lock file or the database cannot be created or opened (no
        # rights, a read-only file system).
        where = f": {e.filename}" if e.filename else ""
        _refuse(
            f"tasknet-site could not start: database {describe(path)}: {e.strerror or e}{where}",
            e,
        )
    except Exception as e:
        created.remove()
        # The database cannot be reached or used (refused, no such database,
        # no rights): the same clean message, not the driver's traceback.
        classified = classify(e)
        if not isinstance(classified, DatabaseError):
            raise
        _refuse(
            f"tasknet-site could not start: database {describe(path)}: "
            f"{redact(str(classified), path)}",
            e,
        )
    except BaseException:
        created.remove()
        raise

    def start_failed(failure: Failure) -> None:
        # The site logged why and has closed its database and lock; exit 1
        # follows.  A database this start created goes too.
        removed = created.remove()
        if removed:
            log.info(
                "removed {names}: created by this start, which failed",
                names=", ".join(removed),
            )

    site.ready.addErrback(start_failed)
    if own_process:
        freeze_startup_heap(site.ready)
    return site
