"""``twistd -n tasknet-node``: options and the node service.

Start order: parse the site endpoints → open the store → pick up the report
left in flight → start retention → finish deletes interrupted by a crash →
resume unfinished work → dial the site (each ``--connect`` in turn,
link.RotatingEndpoint).
Stop order: Goodbye to the site, hang up, stop the jobs (``.part`` files stay
and resume with Range next time), close the store.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads, IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.failure import Failure
from zope.interface import implementer

from tasknet.logging import LogOptions, rotate_on, use_for_twistd
from tasknet.node.commands import BadCommand, CommandHandler
from tasknet.node.download import DEFAULT_MAX_ARCHIVE_BYTES
from tasknet.node.inventory import InventorySender
from tasknet.node.paths import DataDir
from tasknet.node.private import tighten
from tasknet.node.reporter import Reporter
from tasknet.node.retention import (
    DEFAULT_KEEP_DAYS,
    DEFAULT_MIN_FREE,
    MIN_FREE_OPTION,
    DiskFigures,
    DiskUsage,
    Retention,
    keep_days_option,
    size_option,
)
from tasknet.node.scrub import (
    DEFAULT_SCRUB_EVERY,
    DEFAULT_SCRUB_RATE,
    SCRUB_EVERY_OPTION,
    SCRUB_RATE_OPTION,
    Scrubber,
    scrub_every_option,
    scrub_rate_option,
)
from tasknet.node.serve import DEFAULT_SERVE_MAX, ArchiveServer, listening_url
from tasknet.node.serve import IDLE_TIMEOUT as SERVE_IDLE_TIMEOUT
from tasknet.node.store import NodeStore
from tasknet.node.worker import Worker
from tasknet.protocol.messages import NODE_ID, ArchiveInventoryAck, Message, TaskReportAck
from tasknet.protocol.session import INodeHandler, ISiteLink
from tasknet.runtime import (
    IEntropy,
    IThreadPools,
    RealThreadPools,
    SystemEntropy,
    freeze_startup_heap,
)
from tasknet.startup import exit_after_stop, keep_files_private
from tasknet.version import version_option

log = Logger()


def _positive_int(name: str):  # type: ignore[no-untyped-def]
    def parse(value: str) -> int:
        number = int(value)
        if number < 1:
            raise ValueError(f"--{name} must be at least 1")
        return number

    return parse


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError("--ack-timeout must be > 0")
    return number


#: The node's secret from the environment (INTERFACES.md), when neither
#: --secret nor --secret-file is given.
SECRET_ENV = "TASKNET_NODE_SECRET"

#: The site endpoint dialled when no --connect is given.
DEFAULT_CONNECT = "tcp:127.0.0.1:7100"


def site_endpoint_list(endpoints: Sequence[str], *, plaintext: bool = False) -> tuple[str, ...]:
    """The --connect values in order, or the default when none was given.
    An empty or repeated endpoint, ``ssl:``, and plain ``tcp:`` to a host
    that is not loopback without ``plaintext`` (``--plaintext``) are each a
    clear :class:`usage.UsageError`."""
    if not endpoints:
        return (DEFAULT_CONNECT,)
    from tasknet.node.link import refused_connect, unsafe_connect

    seen: set[str] = set()
    for endpoint in endpoints:
        if not endpoint.strip():
            raise usage.UsageError(
                "--connect needs an endpoint, e.g. tls:site.example:7143:trustRoots=/etc/tasknet/ca"
            )
        if endpoint in seen:
            # Listed twice, that site would get two turns in a row: surely a slip.
            raise usage.UsageError(f"--connect {endpoint} is given twice")
        seen.add(endpoint)
        complaint = refused_connect(endpoint) or (None if plaintext else unsafe_connect(endpoint))
        if complaint is not None:
            raise usage.UsageError(complaint)
    return tuple(endpoints)


def read_secret_file(path: str) -> str:
    """The secret in ``path``: its one non-blank line, surrounding
    whitespace removed.  A clear :class:`usage.UsageError` otherwise (the
    secret itself is never shown)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise usage.UsageError(f"--secret-file {path}: cannot read it: {e}") from e
    if not lines:
        raise usage.UsageError(f"--secret-file {path}: the file is empty")
    if len(lines) > 1:
        raise usage.UsageError(
            f"--secret-file {path}: expected the secret alone on one line, found {len(lines)} lines"
        )
    return lines[0]


def _secret(option: str | None, path: str | None, environment: str | None) -> str:
    """--secret or --secret-file (not both), else the environment."""
    if option is not None and path is not None:
        raise usage.UsageError("give --secret or --secret-file, not both")
    if path is not None:
        return read_secret_file(path)
    if option:
        return option
    if option is None and environment:
        return environment
    raise usage.UsageError(f"--secret is required (or --secret-file PATH, or {SECRET_ENV})")


def _check_serve_options(options: usage.Options) -> None:
    """--serve, --public-url and --serve-url (tasknet.node.serve), each a
    clear one-line :class:`usage.UsageError` when wrong."""
    from twisted.internet import reactor
    from twisted.internet.endpoints import serverFromString

    from tasknet.node.serve import serve_endpoint_problem, url_problem

    serve = options["serve"]
    for option in ("public-url", "serve-url"):
        if options[option] is None:
            continue
        if serve is None:
            raise usage.UsageError(f"--{option} needs --serve (the endpoint it names)")
        problem = url_problem(option, options[option])
        if problem is not None:
            raise usage.UsageError(problem)
    if serve is None:
        return
    problem = serve_endpoint_problem(serve)
    if problem is not None:
        raise usage.UsageError(problem)
    try:
        serverFromString(reactor, serve)  # parses it (and, for ssl:, reads the key files)
    except Exception as exc:
        raise usage.UsageError(f"--serve {serve}: {exc}") from exc


def _archive_bytes(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("--max-archive-bytes must be at least 1")
    return number


class Options(LogOptions, usage.Options):
    synopsis = "[options]"
    longdesc = "Storage node: dials the site, downloads, compresses, reports."
    optFlags = [
        [
            "trust-legacy-site",
            None,
            "work with a legacy site (no Hello: it cannot prove itself); without it the "
            "node hangs up on one after login, unless the link is a verified tls: one",
        ],
        [
            "plaintext",
            None,
            "allow --connect tcp: to a host that is not loopback (a trusted network only: "
            "prefer tls:)",
        ],
    ]
    optParameters = [
        ["node-id", None, "node-1", f"node id ({NODE_ID.pattern})"],
        [
            "secret",
            None,
            None,
            "shared secret for Login (visible in ps: prefer --secret-file or "
            f"the environment variable {SECRET_ENV})",
        ],
        ["secret-file", None, None, "file holding the shared secret (one line)"],
        ["data", None, "tasknet-node-data", "node database and archives"],
        ["protocol", None, 2, "2, or 1 to behave exactly as a legacy node", int],
        ["downloads", None, 4, "concurrent downloads", _positive_int("downloads")],
        ["compressors", None, 1, "concurrent compressions", _positive_int("compressors")],
        [
            "ack-timeout",
            None,
            10.0,
            "resend the in-flight report after this many seconds",
            _positive_float,
        ],
        [
            "max-archive-bytes",
            None,
            DEFAULT_MAX_ARCHIVE_BYTES,
            "stop a download past this many bytes when the site gave no size "
            "(legacy DownloadPost, or size 0)",
            _archive_bytes,
        ],
        [
            "metrics",
            None,
            None,
            "serve Prometheus metrics on this endpoint (tcp:9101 binds to 127.0.0.1; "
            "name another interface with tcp:9101:interface=ADDRESS)",
        ],
        [
            "serve",
            None,
            None,
            "serve archives over HTTP on this endpoint (tcp:7300:interface=0.0.0.0, or "
            "ssl:7443:privateKey=KEY:certKey=CERT) [default: off]",
        ],
        [
            "public-url",
            None,
            None,
            "the base URL users' browsers reach --serve at (https://node-1.example.org:7443/); "
            "without it users get archives through the site",
        ],
        [
            "serve-url",
            None,
            None,
            "the base URL the site reaches --serve at [default: derived from a tcp: --serve "
            "on loopback]",
        ],
        [
            "serve-max",
            None,
            DEFAULT_SERVE_MAX,
            "concurrent archive transfers; past it 503",
            _positive_int("serve-max"),
        ],
        [
            "scrub-every",
            None,
            SCRUB_EVERY_OPTION,
            "re-read every held archive at least this often (7d, 12h; seconds) and set "
            "aside one whose bytes no longer hash to its recorded SHA-256",
            scrub_every_option,
        ],
        [
            "scrub-rate",
            None,
            SCRUB_RATE_OPTION,
            "the scrub reads at most this many bytes per second (50MB/s, 200MiB/s)",
            scrub_rate_option,
        ],
        [
            "keep-days",
            None,
            DEFAULT_KEEP_DAYS,
            "remove an archive not served for this many days (never served: since it "
            "completed) and tell the site; 0 keeps archives for ever",
            keep_days_option,
        ],
        [
            "disk-budget",
            None,
            None,
            "the archives held and the downloads under way stay within this size (500GB, "
            "2TiB): the archive served longest ago goes first, and a download waits for "
            "room [default: none]",
            size_option("disk-budget"),
        ],
        [
            "min-free",
            None,
            MIN_FREE_OPTION,
            "keep this much free on the disk of --data, likewise (0 to not look)",
            size_option("min-free"),
        ],
    ]

    opt_version = version_option("tasknet-node")

    def __init__(self) -> None:
        super().__init__()
        self["connect"] = []

    def opt_connect(self, endpoint: str) -> None:
        self["connect"].append(endpoint)

    # The --help text (usage.Options prints an opt_ method's docstring as is).
    opt_connect.__doc__ = (
        "a site's node endpoint (a Twisted client endpoint string); repeat it for "
        "several sites, dialled in turn, moving to the next on failure; tls: "
        "(trustRoots=) for any site not on loopback, or tcp: with --plaintext; "
        f"never ssl: [default: {DEFAULT_CONNECT}]"
    )

    def postOptions(self) -> None:
        use_for_twistd(self)  # --log-format, --log-level (tasknet/logging.py)
        self["connect"] = site_endpoint_list(self["connect"], plaintext=bool(self["plaintext"]))
        self["secret"] = _secret(self["secret"], self["secret-file"], os.environ.get(SECRET_ENV))
        if self["protocol"] not in (1, 2):
            raise usage.UsageError(f"--protocol must be 2 or 1, got {self['protocol']}")
        if not NODE_ID.fullmatch(self["node-id"]):
            raise usage.UsageError(
                f"--node-id must match {NODE_ID.pattern}, got {self['node-id']!r}"
            )
        _check_serve_options(self)


@implementer(INodeHandler)
class NodeService(MultiService):
    """The node: store, worker, reporter, commands, and the link to the site.

    Its composition root: it builds every component and hands each what it
    reads time, randomness, ids and I/O through: ``reactor`` (the time,
    TCP and core of the process, adapted to each interface when given:
    a wrong wire fails here), ``threads`` (the store's and the
    compressions' pools) and ``entropy`` (the site's challenges, report and
    legacy ids, and the seeds of the components' jitter).  All three are
    required: :func:`makeService` gives production's (Twisted's global
    reactor, real threads, the OS's entropy), the simulation its own
    (tests/sim/node_world.py).
    """

    def __init__(
        self,
        *,
        connect: str | Sequence[str],
        node_id: str,
        secret: str,
        data: str,
        protocol: int = 2,
        downloads: int = 4,
        compressors: int = 1,
        ack_timeout: float = 10.0,
        reactor: IReactorCore,
        link_idle_timeout: float = 45.0,
        download_idle_timeout: float = 30.0,
        debounce: float = 0.3,
        retry_policy: Any = None,
        metrics: str | None = None,
        serve: str | None = None,
        public_url: str | None = None,
        serve_url: str | None = None,
        serve_max: int = DEFAULT_SERVE_MAX,
        serve_idle_timeout: float = SERVE_IDLE_TIMEOUT,
        scrub_every: float = DEFAULT_SCRUB_EVERY,
        scrub_rate: int = DEFAULT_SCRUB_RATE,
        keep_days: int = DEFAULT_KEEP_DAYS,
        disk_budget: int | None = None,
        min_free: int = DEFAULT_MIN_FREE,
        disk_usage: DiskUsage | None = None,
        trust_legacy_site: bool = False,
        max_archive_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
        proof_timeout: float | None = None,
        threads: IThreadPools,
        entropy: IEntropy,
    ) -> None:
        super().__init__()
        self.reactor: IReactorCore = IReactorCore(reactor)
        self.clock: IReactorTime = IReactorTime(reactor)
        self.tcp: IReactorTCP = IReactorTCP(reactor)
        self.threads: IThreadPools = threads
        self.entropy: IEntropy = entropy
        # The sites' endpoints in dialling order (link.RotatingEndpoint).
        self.connect: tuple[str, ...] = (connect,) if isinstance(connect, str) else tuple(connect)
        if not self.connect:
            raise ValueError("connect: at least one site endpoint is needed")
        self.node_id = node_id
        self.secret = secret
        self.protocol = protocol
        self.data = DataDir(data)
        self.downloads = downloads
        self.compressors = compressors
        self.ack_timeout = ack_timeout
        # PROTOCOL.md: a connection silent for 45 s is dropped.
        self.link_idle_timeout = link_idle_timeout
        # A download that receives no byte for this long is retried (Range).
        self.download_idle_timeout = download_idle_timeout
        self.debounce = debounce
        self.retry_policy = retry_policy
        self.metrics = metrics  # endpoint of the metrics page, if any
        # A legacy site (no Hello) cannot prove itself: only if told to trust one.
        self.trust_legacy_site = trust_legacy_site
        # A download without a size from the site stops past this many bytes.
        self.max_archive_bytes = max_archive_bytes
        self.proof_timeout = proof_timeout  # None: link.PROOF_TIMEOUT
        self.metrics_port: Any = None
        # --serve: the archive endpoint (tasknet.node.serve), its URLs for the Hello.
        self.serve = serve
        self.public_url = public_url
        self.serve_url = serve_url
        self.serve_max = serve_max
        self.serve_idle_timeout = serve_idle_timeout
        self.archive_server: ArchiveServer | None = None
        self.serve_port: Any = None
        # --scrub-every, --scrub-rate (tasknet.node.scrub).
        self.scrub_every = scrub_every
        self.scrub_rate = scrub_rate
        self.scrubber: Scrubber | None = None
        # --keep-days, --disk-budget, --min-free (tasknet.node.retention);
        # disk_usage: where free space is read (shutil.disk_usage unless given).
        self.keep_days = keep_days
        self.disk_budget = disk_budget
        self.min_free = min_free
        self.disk_usage = disk_usage
        self.retention: Retention | None = None
        self.store: NodeStore | None = None
        self.worker: Worker | None = None
        self.reporter: Reporter | None = None
        self.commands: CommandHandler | None = None
        self.inventory: InventorySender | None = None
        self.link: ISiteLink | None = None
        self.client: Any = None
        self.ready: Deferred[None] = Deferred()
        self._starting: Deferred[None] | None = None
        # Set by makeService (twistd): a failed start stops the reactor and
        # the process exits 1.  In-process callers see ``ready`` fail.
        self.exit_on_failure = False
        self._undone = False

    # service ------------------------------------------------------------------
    def startService(self) -> None:
        super().startService()
        self._starting = Deferred.fromCoroutine(self._start())
        self._starting.addCallbacks(
            self.ready.callback, lambda f: Deferred.fromCoroutine(self._start_failed(f))
        )

    async def _start_failed(self, failure: Failure) -> None:
        """Undo what was started (jobs, store), log why and, under twistd,
        exit non-zero."""
        log.failure("node failed to start", failure)
        log.critical(
            "tasknet-node could not start: {why}; undoing the start-up and exiting",
            why=failure.getErrorMessage(),
        )
        try:
            await self._release()
        except Exception:
            log.failure("undoing the failed start-up failed")
        self._undone = True
        self.ready.errback(failure)
        if self.exit_on_failure:
            exit_after_stop(self.reactor, 1)

    async def _start(self) -> None:
        from tasknet.node.link import PROOF_TIMEOUT, site_client_service

        # Built first, started last: a bad --connect fails the start before
        # the store is opened or any job resumed.
        client = site_client_service(
            self.connect,
            self.node_id,
            self.secret,
            self,
            protocol=self.protocol,
            reactor=self.tcp,
            clock=self.clock,
            entropy=self.entropy,
            idle_timeout=self.link_idle_timeout,
            retry_policy=self.retry_policy,
            trust_legacy_site=self.trust_legacy_site,
            proof_timeout=PROOF_TIMEOUT if self.proof_timeout is None else self.proof_timeout,
            hello_urls=self.hello_urls,
        )
        store = self.store = NodeStore(
            self.data, reactor=self.reactor, clock=self.clock, threads=self.threads
        )
        await store.create_schema()
        reporter = self.reporter = Reporter(
            store,
            legacy_node=self.protocol == 1,
            ack_timeout=self.ack_timeout,
            debounce=self.debounce,
            clock=self.clock,
            entropy=self.entropy,
            queued=lambda: self.worker.waiting() if self.worker is not None else frozenset(),
        )
        await reporter.load()
        store.on_release = reporter.changed  # the scrub's and the serve endpoint's set-asides
        self.inventory = InventorySender(store, entropy=self.entropy)
        retention = self.retention = Retention(
            store,
            self.data,
            clock=self.clock,
            keep_days=self.keep_days,
            disk_budget=self.disk_budget,
            min_free=self.min_free,
            disk_usage=shutil.disk_usage if self.disk_usage is None else self.disk_usage,
            busy=self._serving,
            on_release=reporter.changed,
        )
        retention.setServiceParent(self)  # stopped with the node, before the store
        worker = self.worker = Worker(
            store,
            self.data,
            reporter.changed,
            downloads=self.downloads,
            compressors=self.compressors,
            clock=self.clock,  # and, the same object, its TCP and its callFromThread
            idle_timeout=self.download_idle_timeout,
            max_archive_bytes=self.max_archive_bytes,
            threads=self.threads,
            rng=self.entropy.random(),
            space=retention,
        )
        worker.start()

        def command_applied() -> None:
            reporter.changed()
            retention.poke()  # a delete or a cancel may have freed room

        self.commands = CommandHandler(
            store, self.data, worker, command_applied, entropy=self.entropy, clock=self.clock
        )
        await self._recover()
        await worker.resume_all()
        self.scrubber = Scrubber(
            store,
            self.data,
            every=self.scrub_every,
            rate=self.scrub_rate,
            clock=self.clock,
            reactor=IReactorFromThreads(self.clock),
            threads=self.threads,
        )
        self.scrubber.setServiceParent(self)  # stopped with the node, before the store
        if self.metrics is not None:  # before dialling: a taken port fails the start
            await self._serve_metrics(self.metrics)
        if self.serve is not None:  # likewise
            await self._serve_archives(self.serve)
        log.info(
            "node {node_id} ready (protocol {protocol}, data {data}); dialling {connect}",
            node_id=self.node_id,
            protocol=self.protocol,
            data=str(self.data.root),
            connect=", ".join(self.connect),
        )
        self.client = client
        client.setServiceParent(self)

    async def _serve_metrics(self, endpoint: str) -> None:
        from twisted.internet.endpoints import serverFromString

        from tasknet.node.metrics import loopback_by_default, metrics_site, node_registry

        registry = node_registry(
            lambda: (self.worker, self.reporter, self.link is not None),
            self.clock,
            lambda: self.retention,
        )
        # No authentication on that page: tcp:PORT means loopback only.
        endpoint = loopback_by_default(endpoint)
        self.metrics_port = await serverFromString(self.tcp, endpoint).listen(
            metrics_site(registry, self.clock)
        )
        log.info("metrics on {endpoint}", endpoint=endpoint)

    async def _serve_archives(self, endpoint: str) -> None:
        from twisted.internet.endpoints import serverFromString

        assert self.store is not None
        self.archive_server = ArchiveServer(
            self.store,
            self.data,
            self.secret,
            clock=self.clock,
            serve_max=self.serve_max,
            idle_timeout=self.serve_idle_timeout,
        )
        self.archive_server.disk_figures = self._disk_figures
        self.serve_port = await serverFromString(self.tcp, endpoint).listen(
            self.archive_server.site()
        )
        archive_url, serve_url = self.hello_urls()
        log.info(
            "serving archives on {endpoint} (public URL {archive_url}, site's URL {serve_url})",
            endpoint=endpoint,
            archive_url=archive_url or "none",
            serve_url=serve_url or "none",
        )

    def _acked(self, _: object) -> None:
        # An ACKed completion may be removed now: a download waiting for
        # room need not wait for retention's next look.
        if self.retention is not None and self.retention.waiting():
            self.retention.poke()

    def _serving(self) -> frozenset[tuple[int, str]]:
        server = self.archive_server
        return server.serving() if server is not None else frozenset()

    def _disk_figures(self) -> DiskFigures | None:
        return self.retention.figures() if self.retention is not None else None

    def hello_urls(self) -> tuple[str, str]:
        """The Hello's archiveUrl and serveUrl: --public-url, and --serve-url
        or the one derived from where --serve listens ("" when not serving)."""
        if self.serve_port is None:
            return "", ""
        serve_url = self.serve_url
        if serve_url is None:
            kind = (self.serve or "").partition(":")[0].lower()
            serve_url = listening_url(kind, self.serve_port)
        return self.public_url or "", serve_url

    async def _recover(self) -> None:
        """Finish deletes a crash interrupted; remove leftovers of old generations."""
        assert self.store is not None and self.commands is not None
        tasks = {t.gid: t for t in await self.store.tasks()}
        for deletion in await self.store.deletions():
            if deletion.result is None:
                await self.commands.finish_delete(
                    deletion.gid, deletion.operation_id, held=deletion.gid in tasks
                )
        tasks = {t.gid: t for t in await self.store.tasks()}
        wanted = {self.data.part_path(t.gid, t.operation_id) for t in tasks.values()}
        wanted |= {self.data.archive_path(t.gid, t.operation_id) for t in tasks.values()}
        # Sorted: the directory's order is the file system's, not ours.
        leftovers = [p for p in sorted(self.data.partial.iterdir()) if p not in wanted]
        for archive in sorted(self.data.archives.iterdir()):
            gid = archive.name.split("-", 1)[0]
            # A .tmp is an interrupted compression; an archive of a gid held under
            # another generation is a leftover.  An archive of a gid not held at
            # all may be a finished task already ACKed (or a legacy drop): kept.
            if archive.name.endswith(".tmp") or (
                gid.isdigit() and int(gid) in tasks and archive not in wanted
            ):
                leftovers.append(archive)
        for leftover in leftovers:
            try:
                leftover.unlink(missing_ok=True)
            except OSError as exc:
                log.error("cannot remove leftover {path}: {error}", path=str(leftover), error=exc)

    def stopService(self) -> Deferred[None]:
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        if self._starting is not None and not self._starting.called:
            await self.ready
        if self._undone:  # a failed start already released everything
            if self.running:
                await MultiService.stopService(self)  # type: ignore[misc]
            return
        link = self.link
        if link is not None:
            try:
                link.close("node shutting down")
            except Exception:
                log.failure("Goodbye failed")
        await self._release()

    async def _release(self) -> None:
        if self.metrics_port is not None:
            port, self.metrics_port = self.metrics_port, None
            await port.stopListening()
        if self.serve_port is not None:
            port, self.serve_port = self.serve_port, None
            await port.stopListening()
        if self.running:
            await MultiService.stopService(self)  # type: ignore[misc]
        if self.reporter is not None:
            self.reporter.stop()
        if self.commands is not None:
            self.commands.stop()  # its pending summary line, now
        if self.worker is not None:
            await self.worker.stop()
        if self.store is not None:
            self.store.close()

    # INodeHandler -----------------------------------------------------------------
    def link_up(self, link: ISiteLink) -> None:
        self.link = link
        # The link logged the login itself (one line per login).
        log.debug(
            "logged in to the site: protocol {version} in force",
            version=link.protocol_version,
        )
        if self.reporter is not None:
            self.reporter.link_up(link)
        if self.inventory is not None:  # after the report: it says what was released
            self.inventory.link_up(link)

    def link_down(self, link: ISiteLink) -> None:
        if self.link is link:
            self.link = None
        log.info("link to the site down")
        if self.reporter is not None:
            self.reporter.link_down(link)
        if self.inventory is not None:
            self.inventory.link_down(link)

    def message_received(self, link: ISiteLink, message: Message) -> None:
        if isinstance(message, TaskReportAck):
            if self.reporter is not None:
                acked = self.reporter.ack_received(message)
                acked.addCallback(self._acked)
                acked.addErrback(
                    lambda f: log.failure("ACK {report_id} failed", f, report_id=message.report_id)
                )
            return
        if isinstance(message, ArchiveInventoryAck):
            if self.inventory is not None:
                self.inventory.ack_received(message)
            return
        if self.commands is None:
            return
        try:
            applied = self.commands.handle(message)
        except BadCommand as exc:
            # Well-formed on the wire but unusable (e.g. not an http URL):
            # refuse this one command and keep the link.  An Error frame would
            # end the connection, and the site would resend the same command
            # at every login, so one bad task would starve all the others.
            log.error("refused command {message!r}: {error}", message=message, error=str(exc))
            return
        if applied is None:
            log.info("ignored message {message!r}", message=message)
            return
        applied.addErrback(lambda f: log.failure("command {message!r} failed", f, message=message))


def makeService(
    options: Options,
    *,
    reactor: IReactorCore | None = None,
    threads: IThreadPools | None = None,
    entropy: IEntropy | None = None,
) -> MultiService:
    """The node as ``twistd -n tasknet-node`` builds it: from its options,
    on twistd's reactor, real threads and the OS's entropy unless given
    others (the simulation's).  The node's only defaults are these."""
    own_process = reactor is None
    # Under twistd: umask 077 before anything is created (node.sqlite and its
    # -wal/-shm, archives, partial files, corrupt/, the log): the node's own
    # endpoint serves its archives, no other reader needs them (issue 38).
    keep_files_private("tasknet-node")
    if own_process:
        tighten(options["data"])  # what an older release left 0644/0755
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = IReactorCore(global_reactor)
    rotate_on(IReactorFromThreads(reactor, None))  # twistd's log file, on SIGUSR1
    node = NodeService(
        reactor=reactor,
        threads=threads if threads is not None else RealThreadPools(),
        entropy=entropy if entropy is not None else SystemEntropy(),
        connect=options["connect"],
        node_id=options["node-id"],
        secret=options["secret"],
        data=options["data"],
        protocol=options["protocol"],
        downloads=options["downloads"],
        compressors=options["compressors"],
        ack_timeout=options["ack-timeout"],
        metrics=options["metrics"],
        serve=options["serve"],
        public_url=options["public-url"],
        serve_url=options["serve-url"],
        serve_max=options["serve-max"],
        trust_legacy_site=bool(options["trust-legacy-site"]),
        max_archive_bytes=options["max-archive-bytes"],
        scrub_every=scrub_every_option(options["scrub-every"]),
        scrub_rate=scrub_rate_option(options["scrub-rate"]),
        keep_days=keep_days_option(options["keep-days"]),
        disk_budget=options["disk-budget"],
        min_free=size_option("min-free")(options["min-free"]),
    )
    node.exit_on_failure = True
    if own_process:
        freeze_startup_heap(node.ready)
    return node


__all__ = ["NodeService", "Options", "makeService"]
