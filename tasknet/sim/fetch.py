"""Archive fetches in the world (issue 39, item 4).

Every node of the world runs its real archive endpoint (``--serve``, on the
world's network: ``cluster.SERVE_PORT`` plus the node's index), so its Hello
carries a ``serveUrl`` and the site streams a ``COMPLETED`` task's archive
from it (``GET /api/tasks/{gid}/archive``: the site signs a link, the node
checks it and sends the file).  The world's user fetches archives that way:

* ``fetch_archive`` steps, drawn from a generator of their own (``"fetch
  SEED"``: no other draw of a seed moves), fetch one ``COMPLETED`` task
  while the faults run (a fetch may race a release, a wipe, a crash or a
  reassignment);
* once the run has settled, every ``COMPLETED`` task is fetched once.

The check, ``archive-served``: a fetch either answers ``200`` with exactly
the bytes whose sha256 the site recorded for the generation it served
(read before the request and again after the answer: either may be the one
served) and whose one member is the upstream's bytes of the gid, or fails
with one of the route's documented refusals (:data:`CLEAN_REFUSALS`) or
with no answer (the site or its link down, a transfer broken off).  Wrong
bytes, a ``500`` or any other status fail the seed.
"""

from __future__ import annotations

import hashlib
import io
import random
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool, readBody

from tasknet.drill.snapshot import site_rows
from tasknet.sim.schedule import Step
from tasknet.sim.truth import upstream_digest

__all__ = [
    "CLEAN_REFUSALS",
    "FETCH_KIND",
    "Fetcher",
    "fetch_steps",
    "served_problem",
]

#: The step kind (a user's action: workload, not a fault).
FETCH_KIND = "fetch_archive"
#: Fetches a seed draws while the faults run (uniform, both ends).
FETCHES = (1, 4)
#: Simulated seconds a fetch waits for its whole answer.
FETCH_TIMEOUT = 60.0
#: The statuses and error codes of GET /api/tasks/{gid}/archive that
#: refuse cleanly (docs/api.md): the task gone or not completed, its
#: archive gone, its node offline, busy, unreachable or refusing the link
#: (a release or a wipe raced the fetch), the site's database down.
CLEAN_REFUSALS = {
    404: {"not_found"},
    409: {"archive_not_ready", "archive_not_served"},
    410: {"archive_gone"},
    429: {"too_many_streams"},
    502: {"node_unreachable", "node_error"},
    503: {"node_offline", "node_busy", "unavailable"},
}
#: The status of a fetch that got no whole answer (refused, reset, timed
#: out, or a body broken off after the headers).
NO_ANSWER = 0

#: A generation as the site records it: (operation id, archive sha256).
_RECORDED_SQL = (
    "SELECT g.gid, o.operation_id, g.archive_sha256 FROM gallery g"
    " JOIN task_operation o ON o.gid = g.gid"
    " WHERE g.status = 4 AND g.archive_gone_reason IS NULL ORDER BY g.gid"
)


def fetch_steps(seed: int, sites: tuple[str, ...], duration: float) -> list[Step]:
    """The fetches of ``seed`` while the faults run, from a generator of
    their own (a string seed: the same in every process and hash seed).
    Each picks, when it runs, one of the tasks then ``COMPLETED`` (``pick``)."""
    rng = random.Random(f"fetch {seed}")
    steps = []
    for _ in range(rng.randint(*FETCHES)):
        at = round(rng.uniform(duration / 4, duration), 3)
        params = (("pick", round(rng.random(), 6)),)
        steps.append(Step(at, FETCH_KIND, rng.choice(sites), params=params))
    return steps


def served_problem(
    gid: int,
    status: int,
    code: str | None,
    body: bytes | None,
    recorded: set[str | None],
) -> str | None:
    """What is wrong with one fetch's answer (None: nothing).  ``recorded``:
    the archive sha256 the site recorded for the gid before and after."""
    if status == NO_ANSWER:
        return None
    if status in CLEAN_REFUSALS:
        if code in CLEAN_REFUSALS[status]:
            return None
        return f"gid {gid}: {status} with error code {code!r}, not one the route documents"
    if status != 200:
        return f"gid {gid}: answered {status} ({code or 'no error code'}), not 200 or a refusal"
    assert body is not None
    found = hashlib.sha256(body).hexdigest()
    known = {r for r in recorded if r is not None}
    if known and found not in known:
        return (
            f"gid {gid}: served {len(body)} bytes with sha256 {found[:16]}, not the"
            f" {' or '.join(sorted(r[:16] for r in known))} the site recorded"
        )
    member = _member_digest(body)
    expected = upstream_digest(gid)
    if member != expected:
        return (
            f"gid {gid}: served an archive whose member is not the upstream's bytes"
            f" (sha256 {(member or 'none')[:16]}, the upstream's {expected[:16]})"
        )
    return None


def _member_digest(body: bytes) -> str | None:
    """The SHA-256 of the archive's one member (None: not a one-member zip)."""
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            members = archive.infolist()
            if len(members) != 1:
                return None
            return hashlib.sha256(archive.read(members[0])).hexdigest()
    except (OSError, zipfile.BadZipFile):
        return None


class Fetcher:
    """The world's user fetching archives through a site (module doc).

    ``cluster``: the run's :class:`~tasknet.sim.cluster.SimCluster`;
    ``headers``: the admin's request headers."""

    def __init__(self, cluster: Any, headers: Callable[[], Any]) -> None:
        self.cluster = cluster
        self.world = cluster.world
        self.client = cluster.client
        self._headers = headers
        self._agent = Agent(self.client, pool=HTTPConnectionPool(self.client, persistent=False))
        #: ("archive-served", text) for each fetch that broke the check.
        self.failures: list[tuple[str, str]] = []
        #: Fetches by outcome: ``served``, ``refused``, ``no answer``.
        self.counts: dict[str, int] = {}
        #: Fetches not answered yet.
        self.open = 0

    def recorded(self) -> dict[int, tuple[str, str | None]]:
        """The ``COMPLETED`` tasks as the site records them now: gid ->
        (operation id, archive sha256)."""
        try:
            rows = site_rows(self.cluster.db, _RECORDED_SQL)
        except Exception:  # noqa: BLE001 - a database mid-restore: nothing to fetch now
            return {}
        return {int(r["gid"]): (str(r["operation_id"]), r["archive_sha256"]) for r in rows}

    def fetch_one(self, site: str, pick: float) -> None:
        """Fetch one of the tasks ``COMPLETED`` now (``pick`` in [0, 1) says which)."""
        completed = self.recorded()
        if not completed:
            self.world.note("fetch", f"{site}: no COMPLETED task to fetch")
            return
        gids = sorted(completed)
        gid = gids[min(int(pick * len(gids)), len(gids) - 1)]
        self.fetch(site, gid, completed[gid][1])

    def fetch_all(self, site: str) -> None:
        """Fetch every task ``COMPLETED`` now, one after the other (at once,
        past ``--archive-streams-per-user`` they would be refused)."""
        waiting = sorted(self.recorded().items())
        self.open += 1  # until the last one is answered

        def next_one(_: object = None) -> None:
            if not waiting:
                self.open -= 1
                return
            gid, (_operation, sha256) = waiting.pop(0)
            self.fetch(site, gid, sha256).addCallback(next_one)

        next_one()

    def fetch(self, site: str, gid: int, sha256: str | None) -> Deferred[None]:
        process = self.cluster.sites[site]
        url = f"http://127.0.0.1:{process.http_port}/api/tasks/{gid}/archive".encode()
        self.open += 1
        self.world.note("fetch", f"{site} gid {gid}")
        answered = Deferred.fromCoroutine(self._get(url))
        return answered.addCallback(self._answered, site, gid, sha256)

    async def _get(self, url: bytes) -> tuple[int, str | None, bytes | None]:
        asked = self._agent.request(b"GET", url, self._headers(), None)
        asked.addTimeout(FETCH_TIMEOUT, self.client)
        try:
            response = await asked
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                reading = readBody(response)
            body = await reading
        except Exception:  # noqa: BLE001 - no whole answer: refused, reset, cut, timed out
            return NO_ANSWER, None, None
        code = None
        if response.code != 200:
            code = _error_code(body)
        return response.code, code, body

    def _answered(
        self, answer: tuple[int, str | None, bytes | None], site: str, gid: int, before: str | None
    ) -> None:
        self.open -= 1
        status, code, body = answer
        after = self.recorded().get(gid, ("", None))[1]
        problem = served_problem(gid, status, code, body, {before, after})
        kind = "served" if status == 200 else "no answer" if status == NO_ANSWER else "refused"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.world.note("fetch", f"{site} gid {gid} {status} {code or ''}".rstrip())
        if problem is not None:
            at = self.world.elapsed()
            self.failures.append(("archive-served", f"{problem} (through {site} at {at:.1f} s)"))


def _error_code(body: bytes) -> str | None:
    import json

    try:
        document = json.loads(body)
    except ValueError:
        return None
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict):
            return str(error.get("code"))
        if isinstance(error, str):
            return error
        if "code" in document:
            return str(document["code"])
    return None
