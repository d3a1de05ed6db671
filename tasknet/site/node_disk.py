"""What each connected node says of its disk, for the node panel
(``/api/admin/nodes``' ``disk``): the disk figures of the node's serve
endpoint's ``GET /healthz`` (``archives``, ``archiveBytes``, ``diskFree``,
``diskBudget``: the archives it holds, their bytes, the free bytes of the
disk under its ``--data`` and its ``--disk-budget``; null when unknown or
none), shown as ``{"archives", "bytes", "free", "budget", "at"}``.

Kept cheap: a node is read again only when the panel asks and its last
read (whatever it answered) is older than :data:`REFRESH_SECONDS`; the
panel waits at most :data:`PANEL_WAIT` seconds for a read (a slow node shows its last figures,
or none), each read gives up after :data:`FETCH_TIMEOUT`, and one read per
node is in flight at a time.  Figures older than :data:`FORGET_SECONDS`, or
read from another ``serveUrl`` (the node came back elsewhere), are not
shown.  A node without a ``serveUrl`` (legacy, no ``--serve``, held by
another site) has none: the panel then shows its last inventory's counts
(``inventory``) and "—" for free space.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import treq
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from twisted.logger import Logger

from tasknet.netclient import quiet_pool
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.storage.node_panel import DiskJson

log = Logger()

T = TypeVar("T")

#: A node is read again when its last read is older than this (seconds).
REFRESH_SECONDS = 10.0
#: Figures older than this are not shown (the node stopped answering).
FORGET_SECONDS = 300.0
#: One read of a node's /healthz gives up after this long.
FETCH_TIMEOUT = 2.0
#: The panel waits at most this long for the reads it started.
PANEL_WAIT = 1.0
#: A /healthz body longer than this is not read (it is a few hundred bytes).
MAX_BODY = 64 * 1024
#: The /healthz fields read, as the node spells them, and as the panel does.
FIELDS = {
    "archives": "archives",
    "archiveBytes": "bytes",
    "diskFree": "free",
    "diskBudget": "budget",
}


@dataclass(frozen=True)
class DiskFigures:
    """One node's disk as its /healthz said it at ``at`` (unix seconds);
    a figure the node did not give is None."""

    serve_url: str
    at: float
    archives: int | None
    bytes: int | None
    free: int | None
    budget: int | None

    def to_json(self) -> DiskJson:
        return {
            "archives": self.archives,
            "bytes": self.bytes,
            "free": self.free,
            "budget": self.budget,
            "at": iso(self.at),
        }


def parse_health(body: bytes) -> dict[str, int | None] | None:
    """The disk figures of a /healthz body, by the panel's names (each a
    whole number ≥ 0, or None when absent, null or not one); None when the
    body is not a JSON object or gives none of them (a node that says
    nothing of its disk)."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or not any(k in document for k in FIELDS):
        return None
    figures: dict[str, int | None] = {}
    for given, shown in FIELDS.items():
        value = document.get(given)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        figures[shown] = value if ok else None
    return figures


def health_url(serve_url: str) -> str:
    return serve_url.rstrip("/") + "/healthz"


class NodeDiskFigures:
    """The cache of each node's figures.  ``fetch(url)``: the body of a GET
    (default: treq on ``reactor``, a connection per read, bounded by
    :data:`FETCH_TIMEOUT`)."""

    def __init__(
        self,
        reactor: IReactorTCP,
        clock: IReactorTime,
        *,
        fetch: Callable[[str], Deferred[bytes]] | None = None,
    ) -> None:
        self._clock = clock
        self._reactor = reactor
        self._fetch = fetch or self._get
        self._figures: dict[str, DiskFigures] = {}
        self._reading: dict[str, Deferred[None]] = {}
        #: When each node was last read, and from which URL.
        self._tried: dict[str, tuple[str, float]] = {}

    async def _get_body(self, url: str) -> bytes:
        pool = quiet_pool(self._reactor, persistent=False)
        response = await treq.get(
            url,
            pool=pool,
            timeout=FETCH_TIMEOUT,
            reactor=self._reactor,  # type: ignore[arg-type]
        )
        if response.code != 200:
            raise ValueError(f"HTTP {response.code}")
        chunks: list[bytes] = []

        def collect(data: bytes) -> None:
            chunks.append(data)
            if sum(map(len, chunks)) > MAX_BODY:  # treq then closes the connection
                raise ValueError(f"a /healthz body over {MAX_BODY} bytes")

        await treq.collect(response, collect)
        return b"".join(chunks)

    def _get(self, url: str) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._get_body(url))

    def refresh(self, targets: Mapping[str, str], wait: float = PANEL_WAIT) -> Deferred[None]:
        """Read the figures of each ``node id: serveUrl`` of ``targets``
        whose figures are missing or stale (and not being read); fires when
        those reads are done, or after ``wait`` seconds, whichever is first
        (the reads go on)."""
        now = self._clock.seconds()
        waiting: list[Deferred[None]] = []
        for node_id, serve_url in targets.items():
            if not serve_url:
                continue
            if node_id in self._reading:
                waiting.append(self._reading[node_id])
                continue
            tried = self._tried.get(node_id)
            if tried is not None and tried[0] == serve_url and now - tried[1] < REFRESH_SECONDS:
                continue  # read lately, whatever it answered
            waiting.append(self._start_read(node_id, serve_url))
        if not waiting:
            return succeed(None)
        return self._bounded(waiting, wait)

    def _bounded(self, reads: list[Deferred[None]], wait: float) -> Deferred[None]:
        done: Deferred[None] = Deferred()

        def finish(_: object = None) -> None:
            if not done.called:
                done.callback(None)

        timer = self._clock.callLater(wait, finish)
        gathered: Deferred[Any] = DeferredList([_shielded(d) for d in reads])
        gathered.addCallback(finish)

        def stop_timer(result: object) -> object:
            if timer.active():
                timer.cancel()
            return result

        done.addBoth(stop_timer)
        return done

    def _start_read(self, node_id: str, serve_url: str) -> Deferred[None]:
        reading = Deferred.fromCoroutine(self._read(node_id, serve_url))
        if not reading.called:
            self._reading[node_id] = reading
        return reading

    async def _read(self, node_id: str, serve_url: str) -> None:
        started = self._clock.seconds()
        self._tried[node_id] = (serve_url, started)
        try:
            body = await self._fetch(health_url(serve_url))
        except Exception as err:  # noqa: BLE001 - the node keeps its last figures
            log.debug("disk figures of node {node} unread: {why}", node=node_id, why=err)
            return
        finally:
            self._reading.pop(node_id, None)
        figures = parse_health(body)
        if figures is None:
            self._figures.pop(node_id, None)
            return
        self._figures[node_id] = DiskFigures(
            serve_url,
            started,
            figures["archives"],
            figures["bytes"],
            figures["free"],
            figures["budget"],
        )

    def figures(self, node_id: str, serve_url: str) -> DiskFigures | None:
        """What ``node_id`` last said from ``serve_url``, unless too old."""
        known = self._figures.get(node_id)
        if known is None or known.serve_url != serve_url or not serve_url:
            return None
        if self._clock.seconds() - known.at > FORGET_SECONDS:
            return None
        return known


def _shielded(d: Deferred[None]) -> Deferred[None]:
    """A Deferred that fires when ``d`` does, without taking its result."""
    out: Deferred[None] = Deferred()

    def fire(result: T) -> T:
        out.callback(None)
        return result

    d.addBoth(fire)
    return out
