"""Archive fetches in the world (issue 39, item 4).

Every node of the world runs its real archive endpoint (``--serve``, on the
world's network: ``cluster.SERVE_PORT`` plus the node's index), so its Hello
carries a ``serveUrl``; some v2 nodes also have a public URL (``--public-url``,
the same address: the world has one network), drawn per seed from a
generator of their own (``"public urls SEED"``, :func:`public_nodes`).  The
world's user fetches archives the ways users do (DELIVERY.md, "Getting an
archive (site)"):

* ``GET /api/tasks/{gid}/archive``: the site streams the archive from the
  node (``200``/``206``), or, when the node has a public URL, answers ``303``
  to a signed link the user then GETs from the node itself; or first
  ``POST /api/tasks/archive-links {"gids": [gid]}`` and GET the link it gives
  (the node's, or the site's own URL);
* asked whole, resumed (the first part with ``Range: bytes=0-N``, then the
  rest with ``Range: bytes=N+1-`` and ``If-Range`` naming the first part's
  ``ETag``, as ``tasknet-get`` does), or with a ``Range`` past the end
  (``416`` with ``Content-Range: bytes */SIZE``).

Which way each fetch goes is drawn from ``"fetch paths SEED"``, in the order
the fetches start (a :class:`FetchPlan`): no fetch is added, and no draw of
any other generator moves.  When the fetches happen:

* ``fetch_archive`` steps, drawn from a generator of their own (``"fetch
  SEED"``: no other draw of a seed moves), fetch one ``COMPLETED`` task
  while the faults run (a fetch may race a release, a wipe, a crash or a
  reassignment);
* once the run has settled, every ``COMPLETED`` task is fetched once.

The check, ``archive-served``: a fetch either gets exactly the bytes whose
sha256 the site recorded for the generation it served (read before the
request and again after the answer: either may be the one served), whose
one member is the upstream's bytes of the gid (a ``200``, or the two
``206`` parts of a resume joined), or is refused with one of the answering
route's documented refusals (:data:`CLEAN_REFUSALS` for the site's route,
:data:`NODE_REFUSALS` for a node's link, :data:`LINKS_REFUSALS` and
:data:`LINKS_MISSING` for the links), or gets no answer (the site, the node
or its link down, a transfer broken off).  A ``206`` carries exactly the
range asked for (its ``Content-Range`` and length), a ``416`` a
``Content-Range: bytes */SIZE`` of the recorded size with the range past it.
Wrong bytes, a ``500`` or any other status fail the seed.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import warnings
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers

from tasknet.drill.snapshot import site_rows
from tasknet.sim.truth import upstream_digest
from tasknet.site.upstream_client import BytesBody

__all__ = [
    "CLEAN_REFUSALS",
    "LINKS_MISSING",
    "LINKS_REFUSALS",
    "NODE_REFUSALS",
    "PAST_END",
    "RESUME",
    "WHOLE",
    "Answer",
    "FetchPlan",
    "Fetcher",
    "links_problem",
    "plan_fetch",
    "public_nodes",
    "range_problem",
    "resume_problem",
    "served_problem",
]

#: Simulated seconds a fetch waits for each whole answer.
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
#: The refusals of a node's signed link (tasknet/node/serve.py, DELIVERY.md
#: "Serving (node)"): a generation it no longer holds (a release, a wipe or a
#: re-create raced the fetch) is ``link_invalid``; a clock jump past the
#: link's ``exp`` is ``link_expired``; ``--serve-max`` transfers, or a store
#: it cannot read now, ``503``.
NODE_REFUSALS = {
    403: {"link_invalid", "link_expired"},
    503: {"busy", "unavailable"},
}
#: The refusals of POST /api/tasks/archive-links itself (docs/api.md).
LINKS_REFUSALS = {503: {"unavailable"}}
#: The codes of its ``missing`` (those GET /api/tasks/{gid}/archive would answer).
LINKS_MISSING = {
    "not_found",
    "archive_not_ready",
    "archive_not_served",
    "archive_gone",
    "node_offline",
}
#: The status of a request that got no whole answer (refused, reset, timed
#: out, or a body broken off after the headers).
NO_ANSWER = 0

#: How a fetch asks for the archive: whole, resumed in two ranges, or with
#: a range past its end.
WHOLE, RESUME, PAST_END = "whole", "resume", "past-end"
#: Each way's share of the fetches.
HOW_SHARES = ((WHOLE, 0.5), (RESUME, 0.35), (PAST_END, 0.15))
#: The share of fetches that ask POST /api/tasks/archive-links for the link.
LINKS_SHARE = 0.3
#: The share of v2 nodes given a public URL.
PUBLIC_SHARE = 0.5
#: A range past the end starts this many bytes past it at most (0: at the end).
PAST_END_SPAN = 1000

#: A generation as the site records it: (operation id, sha256, size).
_RECORDED_SQL = (
    "SELECT g.gid, o.operation_id, g.archive_sha256, g.archive_size FROM gallery g"
    " JOIN task_operation o ON o.gid = g.gid"
    " WHERE g.status = 4 AND g.archive_gone_reason IS NULL ORDER BY g.gid"
)
_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+)\s*")
_UNSATISFIED_RANGE = re.compile(r"\s*bytes\s+\*/(\d+)\s*")

#: A byte range asked for: first and last byte (None: to the end).
Asked = tuple[int, int | None]
#: A task's archive as the site records it: (operation id, sha256, size).
Recorded = tuple[str, str | None, int | None]


def public_nodes(seed: int, nodes: Iterable[tuple[str, int]]) -> frozenset[str]:
    """The nodes of ``seed`` (``(node id, protocol)``) run with a public URL,
    from a generator of their own: one draw a node, v2 nodes only (a legacy
    node's login has no Hello to announce one in)."""
    rng = random.Random(f"public urls {seed}")
    drawn = [(node, protocol, rng.random()) for node, protocol in nodes]
    return frozenset(node for node, protocol, r in drawn if protocol == 2 and r < PUBLIC_SHARE)


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """How one fetch asks (:func:`plan_fetch`)."""

    #: Ask POST /api/tasks/archive-links for the link first.
    links: bool
    #: :data:`WHOLE`, :data:`RESUME` or :data:`PAST_END`.
    how: str
    #: Where a resume's first part ends, or how far past the end a
    #: past-end range starts, as a share in [0, 1).
    share: float

    def ranges(self, size: int | None) -> tuple[str, Asked | None]:
        """The way asked for an archive of ``size`` bytes and its first range
        (None: whole): an unknown or tiny size is asked whole."""
        if self.how == RESUME and size is not None and size >= 2:
            return RESUME, (0, int(self.share * (size - 1)))
        if self.how == PAST_END and size is not None:
            return PAST_END, (size + int(self.share * PAST_END_SPAN), None)
        return WHOLE, None


def plan_fetch(rng: random.Random) -> FetchPlan:
    """The next fetch's :class:`FetchPlan`: three draws, whatever is drawn."""
    links = rng.random() < LINKS_SHARE
    pick, share = rng.random(), rng.random()
    how = HOW_SHARES[-1][0]
    for name, part in HOW_SHARES:
        if pick < part:
            how = name
            break
        pick -= part
    return FetchPlan(links, how, share)


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP answer as the fetch judges it (status :data:`NO_ANSWER`: none)."""

    status: int
    code: str | None = None
    body: bytes | None = None
    content_range: str | None = None
    etag: str | None = None
    location: str | None = None


def served_problem(
    gid: int,
    status: int,
    code: str | None,
    body: bytes | None,
    recorded: set[str | None],
    refusals: dict[int, set[str]] = CLEAN_REFUSALS,
) -> str | None:
    """What is wrong with one fetch's answer (None: nothing).  ``recorded``:
    the archive sha256 the site recorded for the gid before and after;
    ``refusals``: the answering route's documented refusals."""
    if status == NO_ANSWER:
        return None
    if status in refusals:
        if code in refusals[status]:
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


def range_problem(
    gid: int,
    asked: Asked | None,
    answer: Answer,
    recorded: set[str | None],
    sizes: set[int | None],
    refusals: dict[int, set[str]] = CLEAN_REFUSALS,
) -> str | None:
    """What is wrong with the answer to a request for ``asked`` (None: no
    ``Range``).  A ``206`` must carry exactly that range of an archive of a
    recorded size (its bytes are judged once joined: :func:`resume_problem`),
    a ``416`` ``Content-Range: bytes */SIZE`` of a recorded size the range
    starts at or past; anything else is judged as :func:`served_problem`
    judges it (a ``200`` whole, as a server may ignore a ``Range``)."""
    if asked is None or answer.status not in (206, 416):
        return served_problem(gid, answer.status, answer.code, answer.body, recorded, refusals)
    first, last = asked
    wanted = f"Range bytes={first}-{'' if last is None else last}"
    known = {s for s in sizes if s is not None}
    if answer.status == 416:
        match = _UNSATISFIED_RANGE.fullmatch(answer.content_range or "")
        if match is None:
            return (
                f"gid {gid}: 416 for {wanted} without Content-Range: bytes */SIZE"
                f" (it carried {answer.content_range!r})"
            )
        total = int(match.group(1))
        if known and total not in known:
            return f"gid {gid}: 416 for {wanted} names {total} bytes, {_not_recorded(known)}"
        if first < total:
            return f"gid {gid}: 416 for {wanted}, which the {total}-byte archive satisfies"
        return None
    match = _CONTENT_RANGE.fullmatch(answer.content_range or "")
    if match is None:
        return (
            f"gid {gid}: 206 for {wanted} without a Content-Range: bytes FIRST-LAST/SIZE"
            f" (it carried {answer.content_range!r})"
        )
    start, end, total = (int(g) for g in match.groups())
    if known and total not in known:
        return f"gid {gid}: 206 for {wanted} names {total} bytes, {_not_recorded(known)}"
    expected_end = total - 1 if last is None else min(last, total - 1)
    if (start, end) != (first, expected_end):
        return f"gid {gid}: 206 for {wanted} carried Content-Range {answer.content_range!r}"
    body = answer.body or b""
    if len(body) != end - start + 1:
        return (
            f"gid {gid}: 206 for {wanted} carried {len(body)} bytes for"
            f" Content-Range {answer.content_range!r}"
        )
    return None


def resume_problem(
    gid: int,
    head: tuple[Asked, Answer],
    rest: tuple[Asked, Answer] | None,
    recorded: set[str | None],
    sizes: set[int | None],
    refusals: tuple[dict[int, set[str]], dict[int, set[str]]] = (CLEAN_REFUSALS, CLEAN_REFUSALS),
) -> str | None:
    """What is wrong with a resumed fetch: its first part (``head``) and
    the rest asked with ``If-Range`` (``rest``; None: not asked, the first
    part was not a ``206``), each judged by :func:`range_problem` under its
    route's ``refusals``; two ``206`` parts joined are judged as a ``200``
    of the whole would be."""
    problem = range_problem(gid, *head, recorded, sizes, refusals[0])
    if problem is not None or rest is None:
        return problem
    problem = range_problem(gid, *rest, recorded, sizes, refusals[1])
    if problem is not None:
        return problem
    if head[1].status == 206 and rest[1].status == 206:
        joined = (head[1].body or b"") + (rest[1].body or b"")
        problem = served_problem(gid, 200, None, joined, recorded)
        if problem is not None:
            return f"{problem} (two 206 parts joined)"
    return None


def links_problem(
    gid: int, answer: Answer, recorded: set[str | None], sizes: set[int | None]
) -> tuple[dict[str, Any] | None, str | None]:
    """The link POST /api/tasks/archive-links gave for ``gid`` (None: none)
    and what is wrong with the answer: a refusal or a ``missing`` code it
    does not document, or a link whose sha256 or size is not the recorded one."""
    if answer.status != 200:
        return None, served_problem(gid, answer.status, answer.code, None, recorded, LINKS_REFUSALS)
    try:
        document = json.loads(answer.body or b"")
        links = [e for e in document["links"] if e["gid"] == gid]
        missing = [e["code"] for e in document["missing"] if e["gid"] == gid]
    except (ValueError, TypeError, KeyError):
        return None, f"gid {gid}: archive-links answered 200 without links and missing"
    if missing:
        if missing[0] in LINKS_MISSING:
            return None, None
        return (
            None,
            f"gid {gid}: archive-links says missing {missing[0]!r}, a code it does not document",
        )
    if len(links) != 1:
        return None, f"gid {gid}: archive-links gave {len(links)} links and no missing entry"
    link = links[0]
    known = {r for r in recorded if r is not None}
    if link.get("sha256") is not None and known and link["sha256"] not in known:
        return None, (
            f"gid {gid}: archive-links gave sha256 {str(link['sha256'])[:16]}, not the"
            f" {' or '.join(sorted(r[:16] for r in known))} the site recorded"
        )
    known_sizes = {s for s in sizes if s is not None}
    if link.get("size") is not None and known_sizes and link["size"] not in known_sizes:
        return (
            None,
            f"gid {gid}: archive-links gave size {link['size']}, {_not_recorded(known_sizes)}",
        )
    return link, None


def _not_recorded(sizes: set[int]) -> str:
    return f"not the {' or '.join(str(s) for s in sorted(sizes))} the site recorded"


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


@dataclass
class _Fetched:
    """What one fetch asked and got, judged once its last answer is in."""

    how: str
    #: ``site`` (streamed by the site), ``node`` (a node's signed link), or
    #: ``none`` (no archive request answered: the links refused or missing).
    via: str = "none"
    links: Answer | None = None
    #: The archive requests: the range asked, the answer, the answering route's refusals.
    legs: tuple[tuple[Asked | None, Answer, dict[int, set[str]]], ...] = ()

    @property
    def path(self) -> str:
        return f"{'links ' if self.links is not None else ''}{self.via} {self.how}"

    def problem(self, gid: int, recorded: set[str | None], sizes: set[int | None]) -> str | None:
        if self.links is not None:
            _link, problem = links_problem(gid, self.links, recorded, sizes)
            if problem is not None:
                return problem
        if not self.legs:
            return None
        if self.how == RESUME:
            (head_asked, head, head_refusals), *rest = self.legs
            assert head_asked is not None
            more = None
            rest_refusals = head_refusals
            if rest:
                rest_asked, answer, rest_refusals = rest[0]
                assert rest_asked is not None
                more = (rest_asked, answer)
            return resume_problem(
                gid, (head_asked, head), more, recorded, sizes, (head_refusals, rest_refusals)
            )
        asked, answer, refusals = self.legs[0]
        return range_problem(gid, asked, answer, recorded, sizes, refusals)

    def outcome(self) -> str:
        """``served`` (whole bytes judged), ``past end`` (a 416), ``refused``
        or ``no answer``, by the last answer."""
        last = self.legs[-1][1] if self.legs else self.links
        if last is None or last.status == NO_ANSWER:
            return "no answer"
        if last.status == 416:
            return "past end"
        if (last.status == 200 and self.legs) or (last.status == 206 and len(self.legs) == 2):
            return "served"
        if last.status == 206:
            return "part"
        return "refused"

    def statuses(self) -> str:
        answers = ([self.links] if self.links is not None else []) + [a for _, a, _ in self.legs]
        return " ".join(f"{a.status}{' ' + a.code if a.code else ''}" for a in answers)


class Fetcher:
    """The world's user fetching archives through a site (module doc).

    ``cluster``: the run's :class:`~tasknet.sim.cluster.SimCluster`;
    ``headers``: the admin's request headers; ``seed``: the run's (which
    way each fetch goes is drawn from ``"fetch paths SEED"``)."""

    def __init__(self, cluster: Any, headers: Callable[[], Headers], seed: int) -> None:
        self.cluster = cluster
        self.world = cluster.world
        self.client = cluster.client
        self._headers = headers
        self._agent = Agent(self.client, pool=HTTPConnectionPool(self.client, persistent=False))
        self._paths = random.Random(f"fetch paths {seed}")
        #: ("archive-served", text) for each fetch that broke the check.
        self.failures: list[tuple[str, str]] = []
        #: Fetches by path and outcome: ``node resume served``, ``site whole refused``...
        self.counts: dict[str, int] = {}
        #: Fetches not answered yet.
        self.open = 0

    def recorded(self) -> dict[int, Recorded]:
        """The ``COMPLETED`` tasks as the site records them now: gid ->
        (operation id, archive sha256, archive size)."""
        try:
            rows = site_rows(self.cluster.db, _RECORDED_SQL)
        except Exception:  # noqa: BLE001 - a database mid-restore: nothing to fetch now
            return {}
        return {
            int(r["gid"]): (
                str(r["operation_id"]),
                r["archive_sha256"],
                None if r["archive_size"] is None else int(r["archive_size"]),
            )
            for r in rows
        }

    def fetch_one(self, site: str, pick: float) -> None:
        """Fetch one of the tasks ``COMPLETED`` now (``pick`` in [0, 1) says which)."""
        completed = self.recorded()
        if not completed:
            self.world.note("fetch", f"{site}: no COMPLETED task to fetch")
            return
        gids = sorted(completed)
        gid = gids[min(int(pick * len(gids)), len(gids) - 1)]
        self.fetch(site, gid, completed[gid])

    def fetch_all(self, site: str) -> None:
        """Fetch every task ``COMPLETED`` now, one after the other (at once,
        past ``--archive-streams-per-user`` they would be refused)."""
        waiting = sorted(self.recorded().items())
        self.open += 1  # until the last one is answered

        def next_one(_: object = None) -> None:
            if not waiting:
                self.open -= 1
                return
            gid, before = waiting.pop(0)
            self.fetch(site, gid, before).addCallback(next_one)

        next_one()

    def fetch(self, site: str, gid: int, before: Recorded) -> Deferred[None]:
        """Fetch ``gid``'s archive through ``site`` the way the next plan
        says; ``before``: what the site recorded for it just now."""
        plan = plan_fetch(self._paths)
        how, asked = plan.ranges(before[2])
        self.open += 1
        self.world.note("fetch", f"{site} gid {gid} {'links ' if plan.links else ''}{how}")
        fetched = Deferred.fromCoroutine(self._fetch(site, gid, plan.links, how, asked, before))
        return fetched.addCallback(self._answered, site, gid, before)

    async def _fetch(
        self,
        site: str,
        gid: int,
        links: bool,
        how: str,
        asked: Asked | None,
        before: Recorded,
    ) -> _Fetched:
        process = self.cluster.sites[site]
        origin = f"http://127.0.0.1:{process.http_port}"
        url = f"{origin}/api/tasks/{gid}/archive"
        fetched = _Fetched(how)
        if links:
            body = BytesBody(json.dumps({"gids": [gid]}).encode())
            answer = await self._request(
                b"POST", f"{origin}/api/tasks/archive-links", self._headers(), body
            )
            fetched.links = answer
            link, problem = links_problem(gid, answer, {before[1]}, {before[2]})
            if link is None or problem is not None:
                return fetched
            url = str(link["url"])
        to_site = url.startswith(origin + "/")
        via, answer = await self._get(url, to_site, asked, None)
        fetched.via = via
        fetched.legs = ((asked, answer, _refusals(via)),)
        if how != RESUME or answer.status != 206 or asked is None or asked[1] is None:
            return fetched
        # The rest, resumed where the first part ended, as tasknet-get does:
        # the same URL (the node's link once redirected), If-Range its ETag.
        rest: Asked = (asked[1] + 1, None)
        tag = answer.etag or (f'"sha256-{before[1]}"' if before[1] else None)
        if via == "node" and to_site and answer.location is not None:
            url, to_site = answer.location, False
        via_rest, more = await self._get(url, to_site, rest, tag)
        fetched.legs += ((rest, more, _refusals(via_rest)),)
        return fetched

    async def _get(
        self, url: str, to_site: bool, asked: Asked | None, if_range: str | None
    ) -> tuple[str, Answer]:
        """GET ``url`` (its 303 followed once, to a node); ``(via, answer)``.
        The admin's token goes to the site only, never to a node."""
        extra: dict[bytes, list[bytes]] = {}
        if asked is not None:
            first, last = asked
            extra[b"Range"] = [f"bytes={first}-{'' if last is None else last}".encode()]
            if if_range is not None:
                extra[b"If-Range"] = [if_range.encode()]
        headers = self._headers() if to_site else Headers()
        for name, values in extra.items():
            headers.setRawHeaders(name, values)
        answer = await self._request(b"GET", url, headers)
        if not to_site:
            return "node", answer
        if answer.status != 303 or not answer.location:
            return "site", answer
        headers = Headers(extra)
        followed = await self._request(b"GET", answer.location, headers)
        return "node", Answer(
            followed.status,
            followed.code,
            followed.body,
            followed.content_range,
            followed.etag,
            answer.location,
        )

    async def _request(self, method: bytes, url: str, headers: Headers, body: Any = None) -> Answer:
        asked = self._agent.request(method, url.encode(), headers, body)
        asked.addTimeout(FETCH_TIMEOUT, self.client)
        try:
            response = await asked
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                reading = readBody(response)
            content = await reading
        except Exception:  # noqa: BLE001 - no whole answer: refused, reset, cut, timed out
            return Answer(NO_ANSWER)
        code = None
        if response.code not in (200, 206):
            code = _error_code(content)

        def header(name: bytes) -> str | None:
            values = response.headers.getRawHeaders(name)
            return values[0].decode("latin-1") if values else None

        return Answer(
            response.code,
            code,
            content,
            header(b"Content-Range"),
            header(b"ETag"),
            header(b"Location"),
        )

    def _answered(self, fetched: _Fetched, site: str, gid: int, before: Recorded) -> None:
        self.open -= 1
        after = self.recorded().get(gid, ("", None, None))
        problem = fetched.problem(gid, {before[1], after[1]}, {before[2], after[2]})
        kind = f"{fetched.path} {fetched.outcome()}"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.world.note("fetch", f"{site} gid {gid} {fetched.path}: {fetched.statuses()}")
        if problem is not None:
            at = self.world.elapsed()
            self.failures.append(
                ("archive-served", f"{problem} (through {site} at {at:.1f} s, {fetched.path})")
            )


def _refusals(via: str) -> dict[int, set[str]]:
    return NODE_REFUSALS if via == "node" else CLEAN_REFUSALS


def _error_code(body: bytes) -> str | None:
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
