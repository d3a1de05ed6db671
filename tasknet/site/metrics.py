"""Prometheus metrics of the main site, served at ``/metrics``.

Every metric lives in :data:`REGISTRY`, a private ``CollectorRegistry`` (not
the prometheus-client global one), so several sites in one test process never
collide and nothing else leaks into the page.  Other modules import the
objects below and update them; the names are the contract.

Counters (``.labels(...).inc()``):

``CREATES``  ``tasknet_creates_total{outcome}``
    one per ``POST /api/tasks`` answer.  ``outcome``: ``created`` (201),
    ``unknown`` (202), ``conflict`` (409), ``rejected`` (422),
    ``quota_exceeded`` (429), ``upstream_unavailable`` (502),
    ``invalid`` (400), ``error`` (500).
``UPSTREAM_CALLS``  ``tasknet_upstream_calls_total{call,outcome}``
    one per upstream HTTP call.  ``call``: ``prepare``, ``submit``, ``audit``;
    ``outcome``: ``ok``, ``refused``, ``ambiguous``, ``error``.
``REPORTS``  ``tasknet_reports_total{result}``
    one per node report handled.  ``result``: ``APPLIED``, ``DUPLICATE``,
    ``STALE``, ``FAILED`` (not committed, not ACKed), ``LEGACY``.
``WEBHOOK_FAILURES``  ``tasknet_webhook_failures_total``
    one per failed webhook delivery attempt.
``DROPPED_ENTRIES``  ``tasknet_report_entries_dropped_total{node,reason}``
    report entries and deletions dropped (committed, ACKed, nothing
    changed), by node and reason: ``not_owner``, ``stale``, ``regressed``,
    ``old_generation``, ``missing_operation``, ``delete_id_mismatch``,
    ``not_delete_pending`` or the task's state (``DELETE_PENDING``, ...).

``ARCHIVE_LINKS``  ``tasknet_archive_links_total{via}``
    one per archive link issued (``GET /api/tasks/{gid}/archive`` in any
    form, each link of ``POST /api/tasks/archive-links``).  ``via``:
    ``node`` (a signed link to the node's public URL) or ``site`` (the site
    streams it from the node's ``serveUrl``).
``ARCHIVE_STREAM_BYTES``  ``tasknet_archive_stream_bytes_total``
    archive bytes the site relayed from nodes to clients.
``AUTH_FAILURES``  ``tasknet_auth_failures_total{kind}``
    one per credential that was looked up and found nobody.  ``kind``:
    ``token`` (a bearer token or ``?token=``), ``sign_in`` (the token of
    ``POST /api/session``), ``node_secret`` (a node's Login: an unknown
    node or a bad signature).
``AUTH_THROTTLED``  ``tasknet_auth_throttled_total{kind}``
    one per credential refused without a lookup because its client address
    sent too many wrong ones (``429 rate_limited``, or a refused Login);
    same ``kind``.

Custody (DELIVERY.md "Custody"; each counted once its transaction committed):

``ARCHIVES_RELEASED``  ``tasknet_archives_released_total{reason}``
    one per task whose archive the site marked gone
    (``custody.mark_archive_gone`` returned True): a node's ``released``
    entry, an inventory's ``MISSING``, a retirement's ``NODE_RETIRED``.
    ``reason``: :data:`RELEASE_REASONS`, every series from the start.
``INVENTORIES``  ``tasknet_inventories_total{result}``
    one per complete inventory judged.  ``result``: ``clean`` (the site's
    view matched), ``missing`` (archives were missing, or not as recorded),
    ``orphans`` (none missing, orphans found); see :func:`count_inventory`.
``INVENTORY_MISSING``  ``tasknet_inventory_missing_total``
    archives found missing by judged inventories (each made ``MISSING``).
``TASKS_REASSIGNED``  ``tasknet_tasks_reassigned_total{cause}``
    unfinished tasks moved off a node.  ``cause``: ``timeout`` (gone past
    ``--reassign-after``), ``admin`` (``node reassign``), ``retire``
    (``node retire``).

Histograms (``.observe(seconds)``, or :func:`observe_since`):

``UPSTREAM_LATENCY``  ``tasknet_upstream_call_seconds{call}``
    wall time of one upstream call, whatever its outcome.
``APPLY_LATENCY``  ``tasknet_report_apply_seconds``
    time of the report-apply write transaction.
``ACK_LATENCY``  ``tasknet_report_ack_seconds``
    from a report's arrival to its ``TaskReportAck`` being sent.

Gauges:

``CONNECTED_NODES``  ``tasknet_connected_nodes{protocol}``
    ``.labels(protocol="2").inc()`` on attach, ``.dec()`` on detach.
``ARCHIVE_STREAMS``  ``tasknet_archive_streams``
    archive streams the site is relaying now.
``OUTBOX_BACKLOG``  ``tasknet_outbox_backlog``
    undelivered notification rows; ``.set(n)``.
``TASKS``  ``tasknet_tasks{state}``
    tasks by ``task_operation.state`` (``LEGACY`` for a row without one),
    every state present (zeros included); set it with
    :func:`set_task_counts`, typically from the ``refresh`` callable given
    to :func:`metrics_resource`, which runs before each scrape.
``TASK_STATUSES``  ``tasknet_tasks_by_status{status}``
    tasks by display status (``DOWNLOADING``, ``COMPLETED``, ...: what
    ``state`` alone cannot tell apart), every key present.

``DATABASE_UP``  ``tasknet_database_up``
    1 when the database answered this scrape (``/healthz`` says
    ``"database": "ok"`` and the sample read succeeded), else 0: the sampled
    values are then the last good ones.
``DISPATCH_ENABLED``  ``tasknet_dispatch_enabled``
    what ``/healthz`` says, as a number: 1 while the site dispatches, 0 when
    its start-up recovery failed.  Both set with :func:`set_health` at each
    scrape.
``REPLICATION_SYNC``  ``tasknet_db_replication_sync`` and
``REPLICATION_ASYNC_SINCE``  ``tasknet_db_replication_async_since_seconds``
    ``/healthz``'s ``replication`` (the lease's check, SCALE.md "Database
    failover" 2): 1 while it is ``sync``; the Unix time since which it has
    been ``async`` (or ``unknown``), 0 otherwise (the alert
    ``TasknetReplicationAsync``).  Set with :func:`set_health`.

Counters read from the database (:func:`set_byte_totals`):
``tasknet_bytes_downloaded_total`` and
``tasknet_node_bytes_downloaded_total{node}``.

Gauges read from the database at each scrape (:func:`set_sampled`; a
series exists only for what the last sample holds):

``tasknet_user_quota{user}`` and ``tasknet_user_quota_used{user}``
    the weekly quota of each user with any use this week, and that use as
    the quota check counts it: metered this week, plus submissions in
    flight, plus every unmetered ``UNKNOWN``.
``tasknet_node_unfinished_tasks{node}`` and
``tasknet_node_last_report_timestamp_seconds{node}``
    each node holding tasks that are not completed: how many, and when its
    last report was applied (before any report: when it was last seen).
``tasknet_site_instances{status}``
    the ``site_instance`` rows (one per run of a site on this database) by
    ``status``: ``open`` (running, or gone and not reaped yet), ``ended``
    (stopped cleanly) and ``reaped`` (fenced or died, then settled by a
    site).  Rows are never deleted, so ``reaped`` only grows.

No ``_created`` series are exported.

Helpers: :func:`record_upstream_call`, :func:`observe_since`, :func:`count_inventory`,
:func:`count_releases`,
:func:`set_task_counts`, :func:`set_sampled`, :func:`set_health`,
:func:`render_latest`, :func:`metrics_resource`.

``deploy/prometheus/tasknet-rules.yml`` alerts on these names
(docs/operations.md, "Alerts"): renaming one breaks them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request

from tasknet.protocol.messages import ReleasedEntry
from tasknet.site.storage.stats import MetricsSample
from tasknet.status import OperationState, TaskStatus

log = Logger()

# ``_created`` series (one per counter and histogram child) only double the
# page: no dashboard of ours reads them.  prometheus-client's switch is
# process-wide; the node's metrics turn it off too.
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)

# Upstream calls and transactions are sub-second in normal operation; the top
# buckets catch the submit timeout (30 s by default).
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

CREATES = Counter("tasknet_creates", "Create requests by outcome.", ["outcome"], registry=REGISTRY)
UPSTREAM_CALLS = Counter(
    "tasknet_upstream_calls",
    "Upstream HTTP calls by call and outcome.",
    ["call", "outcome"],
    registry=REGISTRY,
)
UPSTREAM_LATENCY = Histogram(
    "tasknet_upstream_call_seconds",
    "Upstream HTTP call latency.",
    ["call"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
REPORTS = Counter(
    "tasknet_reports", "Node reports handled, by result.", ["result"], registry=REGISTRY
)
APPLY_LATENCY = Histogram(
    "tasknet_report_apply_seconds",
    "Latency of the report-apply write transaction.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
ACK_LATENCY = Histogram(
    "tasknet_report_ack_seconds",
    "From a report's arrival to its ACK being sent.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
CONNECTED_NODES = Gauge(
    "tasknet_connected_nodes",
    "Connected nodes by protocol version.",
    ["protocol"],
    registry=REGISTRY,
)
OUTBOX_BACKLOG = Gauge(
    "tasknet_outbox_backlog", "Undelivered notification outbox rows.", registry=REGISTRY
)
WEBHOOK_FAILURES = Counter(
    "tasknet_webhook_failures", "Failed webhook delivery attempts.", registry=REGISTRY
)
ARCHIVE_LINKS = Counter(
    "tasknet_archive_links",
    "Archive links issued, by how the archive travels (node: a signed link to the "
    "node; site: streamed by the site).",
    ["via"],
    registry=REGISTRY,
)
for _via in ("node", "site"):
    ARCHIVE_LINKS.labels(via=_via)  # both series from the start, at 0
ARCHIVE_STREAM_BYTES = Counter(
    "tasknet_archive_stream_bytes",
    "Archive bytes the site relayed from nodes to clients.",
    registry=REGISTRY,
)
#: The kinds of credential of AUTH_FAILURES and AUTH_THROTTLED.
AUTH_KINDS = ("token", "sign_in", "node_secret")
AUTH_FAILURES = Counter(
    "tasknet_auth_failures",
    "Credentials looked up that found nobody, by kind (token, sign_in, node_secret).",
    ["kind"],
    registry=REGISTRY,
)
AUTH_THROTTLED = Counter(
    "tasknet_auth_throttled",
    "Credentials refused without a lookup: their address sent too many wrong ones.",
    ["kind"],
    registry=REGISTRY,
)
for _kind in AUTH_KINDS:
    AUTH_FAILURES.labels(kind=_kind)  # every series from the start, at 0
    AUTH_THROTTLED.labels(kind=_kind)
ARCHIVE_STREAMS = Gauge(
    "tasknet_archive_streams", "Archive streams the site is relaying now.", registry=REGISTRY
)
TASKS = Gauge("tasknet_tasks", "Tasks by task_operation state.", ["state"], registry=REGISTRY)
TASK_STATUSES = Gauge(
    "tasknet_tasks_by_status",
    "Tasks by display status (DOWNLOADING, COMPLETED, ...).",
    ["status"],
    registry=REGISTRY,
)


class _ByteCounters(Collector):
    """``tasknet_bytes_downloaded_total`` and ``tasknet_node_bytes_downloaded_total
    {node}``: bytes downloaded, as the applied reports tell (progress × size).
    The totals live in the database (``node_bytes``, written with each report),
    so they survive restarts and count only what committed; each scrape
    shows the totals read by its refresh (:func:`set_byte_totals`)."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "tasknet_bytes_downloaded", "Bytes downloaded by the nodes, from applied reports."
        )
        total.add_metric([], float(sum(self.totals.values())))
        yield total
        by_node = CounterMetricFamily(
            "tasknet_node_bytes_downloaded",
            "Bytes downloaded per node, from applied reports.",
            labels=["node"],
        )
        for node, n in sorted(self.totals.items()):
            by_node.add_metric([node], float(n))
        yield by_node


BYTES = _ByteCounters()
REGISTRY.register(BYTES)
DROPPED_ENTRIES = Counter(
    "tasknet_report_entries_dropped",
    "Report entries and deletions dropped, by node and reason.",
    ["node", "reason"],
    registry=REGISTRY,
)

#: The ``reason`` of ARCHIVES_RELEASED (schema v13's archive_gone_reason).
RELEASE_REASONS = ("EXPIRED", "DISK_BUDGET", "CORRUPT", "MISSING", "CANCELLED", "NODE_RETIRED")
ARCHIVES_RELEASED = Counter(
    "tasknet_archives_released",
    "Archives of completed tasks the site marked gone (ARCHIVE_GONE), by reason.",
    ["reason"],
    registry=REGISTRY,
)
for _reason in RELEASE_REASONS:
    ARCHIVES_RELEASED.labels(reason=_reason)  # every series from the start, at 0
#: The ``result`` of INVENTORIES.
INVENTORY_RESULTS = ("clean", "missing", "orphans")
INVENTORIES = Counter(
    "tasknet_inventories",
    "Complete node inventories judged, by result (clean, missing, orphans).",
    ["result"],
    registry=REGISTRY,
)
for _result in INVENTORY_RESULTS:
    INVENTORIES.labels(result=_result)
INVENTORY_MISSING = Counter(
    "tasknet_inventory_missing",
    "Archives judged inventories found missing (each made ARCHIVE_GONE, MISSING).",
    registry=REGISTRY,
)
#: The ``cause`` of TASKS_REASSIGNED.
REASSIGN_CAUSES = ("timeout", "admin", "retire")
TASKS_REASSIGNED = Counter(
    "tasknet_tasks_reassigned",
    "Unfinished tasks moved off a node, by cause (timeout, admin, retire).",
    ["cause"],
    registry=REGISTRY,
)
for _cause in REASSIGN_CAUSES:
    TASKS_REASSIGNED.labels(cause=_cause)

DATABASE_UP = Gauge(
    "tasknet_database_up",
    "1 if the database answered the read made for this scrape, 0 if it failed.",
    registry=REGISTRY,
)
REPLICATION_SYNC = Gauge(
    "tasknet_db_replication_sync",
    "1 while the PostgreSQL primary replicates synchronously to a standby (/healthz "
    "replication: sync), else 0 (async, none, unknown, or SQLite).",
    registry=REGISTRY,
)
REPLICATION_ASYNC_SINCE = Gauge(
    "tasknet_db_replication_async_since_seconds",
    "Unix time since which a standby is configured but none is in sync (/healthz "
    "replication: async since ...); 0 otherwise.",
    registry=REGISTRY,
)
DISPATCH_ENABLED = Gauge(
    "tasknet_dispatch_enabled",
    "1 while the site dispatches (/healthz); 0: its start-up recovery failed.",
    registry=REGISTRY,
)


class _SampledGauges(Collector):
    """Per-user quota use, per-node unfinished tasks and last report, and the
    site instances by status, as the last database sample read them
    (:func:`set_sampled`): a user or node missing from it has no series, and
    nothing at all is shown before the first sample."""

    def __init__(self) -> None:
        self.quota: dict[str, tuple[int, int]] = {}  # user: (used, quota)
        self.nodes: dict[str, tuple[int, float | None]] = {}  # node: (unfinished, last report)
        self.instances: dict[str, int] | None = None

    def collect(self) -> Iterator[Metric]:
        quota = GaugeMetricFamily(
            "tasknet_user_quota", "Weekly quota of a user with use this week.", labels=["user"]
        )
        used = GaugeMetricFamily(
            "tasknet_user_quota_used",
            "Quota used this week: metered, in flight and unmetered UNKNOWN.",
            labels=["user"],
        )
        for user, (spent, limit) in sorted(self.quota.items()):
            quota.add_metric([user], float(limit))
            used.add_metric([user], float(spent))
        yield quota
        yield used
        unfinished = GaugeMetricFamily(
            "tasknet_node_unfinished_tasks",
            "Tasks a node holds that are not completed.",
            labels=["node"],
        )
        last_report = GaugeMetricFamily(
            "tasknet_node_last_report_timestamp_seconds",
            "When the last report of a node holding unfinished tasks was applied.",
            labels=["node"],
        )
        for node, (count, reported) in sorted(self.nodes.items()):
            unfinished.add_metric([node], float(count))
            if reported is not None:
                last_report.add_metric([node], reported)
        yield unfinished
        yield last_report
        instances = GaugeMetricFamily(
            "tasknet_site_instances",
            "Site instances on this database by status (open, ended, reaped).",
            labels=["status"],
        )
        for status, n in sorted((self.instances or {}).items()):
            instances.add_metric([status], float(n))
        yield instances


SAMPLED = _SampledGauges()
REGISTRY.register(SAMPLED)

# Show both protocol series from the first scrape, so a dashboard sees 0
# rather than "no data" before the first node connects.
for _protocol in ("1", "2"):
    CONNECTED_NODES.labels(protocol=_protocol)
# Likewise every task state and display status, at 0 until counted.
for _state in ("LEGACY", *(state.value for state in OperationState)):
    TASKS.labels(state=_state)
for _status in TaskStatus:
    TASK_STATUSES.labels(status=_status.value)

_task_states_seen: set[str] = set()


def record_upstream_call(call: str, outcome: str, seconds: float) -> None:
    """Count one upstream call and observe its latency."""
    UPSTREAM_CALLS.labels(call=call, outcome=outcome).inc()
    UPSTREAM_LATENCY.labels(call=call).observe(seconds)


def observe_since(histogram: Histogram, started: float, now: float) -> float:
    """Observe ``now - started`` (both on the caller's clock) on ``histogram``
    (or a labelled child); return it."""
    elapsed = now - started
    histogram.observe(elapsed)
    return elapsed


def set_task_status_counts(counts: Mapping[str, int]) -> None:
    """Set ``tasknet_tasks_by_status`` (give every display key, zeros included)."""
    for status, n in counts.items():
        TASK_STATUSES.labels(status=status).set(n)


def set_byte_totals(totals: Mapping[str, int]) -> None:
    """Bytes downloaded per node since the database was created."""
    BYTES.totals = dict(totals)


def set_sampled(sample: MetricsSample) -> None:
    """Apply what ``tasknet.site.storage.stats.metrics_sample`` read (the
    keys after ``nodeBytes`` are optional)."""
    set_task_counts(sample["states"])
    set_task_status_counts(sample["statuses"])
    set_byte_totals(sample["nodeBytes"])
    if "quota" in sample:
        SAMPLED.quota = {
            user: (int(used), int(quota)) for user, (used, quota) in sample["quota"].items()
        }
    if "nodes" in sample:
        SAMPLED.nodes = {
            node: (int(count), None if reported is None else float(reported))
            for node, (count, reported) in sample["nodes"].items()
        }
    if "instances" in sample:
        SAMPLED.instances = {status: int(n) for status, n in sample["instances"].items()}


def count_releases(entries: Iterable[ReleasedEntry], made_gone: Iterable[int]) -> None:
    """Count the ``released`` entries of a committed report that made their
    task ``ARCHIVE_GONE`` (``made_gone``: their gids), by reason."""
    gone = set(made_gone)
    for entry in entries:
        if entry.gid in gone:
            gone.discard(entry.gid)  # one count per task, whatever the repeats
            ARCHIVES_RELEASED.labels(reason=entry.reason).inc()


def count_inventory(missing: int, orphans: int, corrupt: int = 0) -> None:
    """Count one judged inventory (after its transaction committed) that
    made ``missing`` archives ``MISSING`` and ``corrupt`` ones ``CORRUPT``
    (listed, but not as the site recorded them), and found ``orphans``
    (deleted with their tombstone's id, or listed)."""
    result = "missing" if missing or corrupt else "orphans" if orphans else "clean"
    INVENTORIES.labels(result=result).inc()
    if missing:
        INVENTORY_MISSING.inc(missing)
        ARCHIVES_RELEASED.labels(reason="MISSING").inc(missing)
    if corrupt:
        ARCHIVES_RELEASED.labels(reason="CORRUPT").inc(corrupt)


_health_database_ok = True


def set_health(document: Mapping[str, str]) -> bool:
    """Mirror the ``/healthz`` document (``dispatch``, ``database``) in the
    gauges; whether the database answered (then read the sample)."""
    global _health_database_ok
    DISPATCH_ENABLED.set(1 if document.get("dispatch") == "enabled" else 0)
    replication = document.get("replication", "n/a")
    REPLICATION_SYNC.set(1 if replication == "sync" else 0)
    REPLICATION_ASYNC_SINCE.set(_since(replication))
    _health_database_ok = document.get("database", "ok") == "ok"
    DATABASE_UP.set(1 if _health_database_ok else 0)
    return _health_database_ok


def _since(replication: str) -> float:
    """The Unix time in ``async since <ISO time>`` (``unknown since`` too:
    no standby is known to be in sync); 0 for any other answer."""
    _, marker, when = replication.partition(" since ")
    if not marker:
        return 0.0
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def set_task_counts(counts: Mapping[str, int]) -> None:
    """Replace the ``tasknet_tasks`` series: states missing from ``counts`` drop to 0."""
    # Sorted: the series are set in one order, whatever the set's.
    for state in sorted(_task_states_seen - set(counts)):
        TASKS.labels(state=state).set(0)
    for state, n in counts.items():
        TASKS.labels(state=state).set(n)
        _task_states_seen.add(state)


def render_latest() -> bytes:
    """The current metrics page in Prometheus text format."""
    return generate_latest(REGISTRY)


class MetricsResource(Resource):
    """``GET /metrics``: refresh the sampled gauges, then render :data:`REGISTRY`."""

    isLeaf = True

    def __init__(self, refresh: Callable[[], Deferred[Any] | None] | None = None) -> None:
        super().__init__()
        self._refresh = refresh

    def render_GET(self, request: Request) -> bytes | int:
        if self._refresh is None:
            return self._page(request)
        d = maybeDeferred(self._refresh)

        def failed(failure: Failure) -> None:
            # A failed refresh must not hide the counters: serve stale gauges.
            DATABASE_UP.set(0)
            log.failure("metrics refresh failed; serving the last sampled gauges", failure)

        d.addCallbacks(lambda _: DATABASE_UP.set(1 if _health_database_ok else 0), failed)
        d.addCallback(lambda _: self._finish(request))
        return NOT_DONE_YET

    def _page(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode("ascii"))
        request.setHeader(b"Cache-Control", b"no-store")
        return render_latest()

    def _finish(self, request: Request) -> None:
        if request._disconnected:  # the scraper gave up while we refreshed
            return
        request.write(self._page(request))
        request.finish()


def metrics_resource(refresh: Callable[[], Deferred[Any] | None] | None = None) -> IResource:
    """The ``/metrics`` resource.  ``refresh`` (optional) runs before every
    scrape and may return a Deferred, e.g. one reading task counts from the
    database and calling :func:`set_task_counts` and ``OUTBOX_BACKLOG.set``."""
    return cast(IResource, MetricsResource(refresh))
