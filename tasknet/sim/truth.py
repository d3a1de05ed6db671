"""The simulator's checks against the world's truth (issue 39).

The cheap checks (:mod:`tasknet.sim.checks`) and D1–D10 mostly compare the
site with itself: its usage with its own metering, its generations with
its own POST count.  These compare it with what the world knows and the
site cannot lie about: what the upstream charged, when a POST's first
byte left, whether a reaped instance's process was alive, what bytes an
archive holds.  Each is a plain function or object fed what the run saw,
so that a test can feed it a trace made by hand:

* :func:`unaccounted_charges`, once settled: every charge in the
  upstream's journal belongs to a generation the site metered, holds as
  ``UNKNOWN``, or that an operator reconciled (no charge is ever
  unaccounted, whatever the generation count);
* :class:`LatePosts`, at every POST: no POST is written more than the
  upstream timeout after its generation's ``SUBMITTING`` commit, on the
  site's own monotonic clock (SCALE.md "Fencing" 1, the gate's time check);
* :func:`reap_of_live`, at every reap's commit: no site instance is reaped,
  and no generation of it settled by a reap, while the world knows it
  alive and connected (only once its process is dead, or its own clock
  calls its lease stale: cut off or paused past its lease timeout);
* :func:`archive_mismatches`, once settled: every archive a node holds as
  complete holds the upstream's bytes of that generation's gid.  (Its
  other half, every ``COMPLETED`` task names a generation some node holds,
  is :func:`tasknet.sim.custody.unheld_completions`.)
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import zipfile
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path

from tasknet.node.paths import DataDir

__all__ = [
    "LatePosts",
    "archive_mismatches",
    "reap_of_live",
    "unaccounted_charges",
    "upstream_digest",
]

#: The request line of an archive POST (the upstream's route).
ARCHIVE_POST = re.compile(rb"^POST /api/galleries/(\d+)/archive[ ?]")

Generation = tuple[int, str]


def unaccounted_charges(
    charges: Mapping[int, int],
    metered: Iterable[Generation],
    unknown: Iterable[Generation],
    reconciled: Iterable[Generation],
) -> list[str]:
    """A failure's text for each gid the upstream charged (``charges``: gid
    -> applied POSTs) more times than it has generations the site metered,
    holds ``UNKNOWN`` now, or an operator reconciled (``(gid, operationId)``
    each; a generation in several counts once)."""
    accounted: dict[int, dict[str, list[str]]] = {}
    for why, generations in (
        ("metered", metered),
        ("UNKNOWN", unknown),
        ("reconciled", reconciled),
    ):
        for gid, operation_id in generations:
            accounted.setdefault(gid, {}).setdefault(operation_id, []).append(why)
    failures = []
    for gid, charged in sorted(charges.items()):
        known_generations = accounted.get(gid, {})
        if charged > len(known_generations):
            known = (
                ", ".join(
                    f"{op} ({'/'.join(why)})" for op, why in sorted(known_generations.items())
                )
                or "none"
            )
            failures.append(
                f"gid {gid}: the upstream charged {charged} time(s), but only"
                f" {len(known_generations)} generation(s) are metered, UNKNOWN or reconciled:"
                f" {known}"
            )
    return failures


class LatePosts:
    """No POST later than the upstream timeout after its ``SUBMITTING``
    commit (see the module doc).  ``submitting`` is told, right after a
    site's write commits, of each generation it finds ``SUBMITTING`` and
    when (the site's monotonic clock); ``post`` of each POST's first byte."""

    def __init__(self) -> None:
        #: operation id -> when its SUBMITTING commit was first seen.
        self._committed_at: dict[str, float] = {}

    def submitting(self, operation_id: str, at: float) -> None:
        self._committed_at.setdefault(operation_id, at)

    def post(
        self, site: str, gid: int, operation_id: str | None, at: float, timeout: float
    ) -> str | None:
        """Site ``site`` wrote the first byte of gid ``gid``'s POST at ``at``
        for generation ``operation_id`` (the committed one); the failure's
        text, or ``None``."""
        committed = self._committed_at.get(operation_id) if operation_id else None
        if committed is None:
            return None  # its commit was not seen: the submitting-before-post check's
        late = at - committed
        if late <= timeout:
            return None
        return (
            f"gid {gid}: {site} wrote the POST of operation {operation_id} {late:.3f} s after"
            f" its SUBMITTING commit (upstream timeout {timeout:g} s)"
        )


def reap_of_live(
    reaped: int,
    site: str | None,
    *,
    alive: bool,
    stale_for: float | None,
    paused_for: float | None,
    cut_off: bool,
    settled: str | None = None,
) -> str | None:
    """Instance ``reaped`` was reaped now; ``site`` is the site process it
    ran as (``None``: no process runs as it any more: an earlier
    incarnation, dead).  It may be reaped only when its process is dead or
    its own clock calls its lease stale (``stale_for``: ``None`` while its
    lease is fresh; ``paused_for``: how long it has been stopped,
    ``cut_off``: its host's network is gone: context for the message).
    ``settled``: not the instance's row but a generation of it was settled
    (made ``UNKNOWN`` by a reap): which.  The failure's text, or ``None``."""
    if site is None or not alive or stale_for is not None:
        return None
    how = []
    if paused_for is not None:
        how.append(f"paused for {paused_for:.3f} s")
    if cut_off:
        how.append("cut off")
    state = ", ".join(how) or "running and connected"
    whom = f"site instance {reaped} ({site})"
    done = "was reaped" if settled is None else f"had {settled} settled by a reap"
    return (
        f"{whom} {done} while its process is alive and its lease fresh on its own clock ({state})"
    )


@lru_cache(maxsize=256)
def upstream_digest(gid: int) -> str:
    """The SHA-256 of the upstream's archive bytes of ``gid`` (every
    submission of a gid serves the same bytes)."""
    from tasknet.upstream import catalog

    size = catalog.gallery(gid).size
    digest = hashlib.sha256()
    step = 1 << 20
    for start in range(0, size, step):
        digest.update(catalog.archive_slice(gid, start, min(start + step, size)))
    return digest.hexdigest()


def archive_mismatches(node_id: str, data_dir: Path) -> list[str]:
    """A failure's text for each archive node ``node_id``'s store holds as
    complete (its ``archive`` table has it and the file is there) whose
    one member is not the upstream's bytes of its gid."""
    data = DataDir(data_dir)
    if not data.database.exists():
        return []
    connection = sqlite3.connect(f"file:{data.database}?mode=ro", uri=True)
    try:
        rows = connection.execute(
            "SELECT gid, operation_id, file FROM archive ORDER BY gid, operation_id"
        ).fetchall()
    except sqlite3.OperationalError:
        return []  # an older store: no archive table
    finally:
        connection.close()
    failures = []
    for gid, operation_id, file in rows:
        path = data.archives / file
        if not path.is_file():
            continue  # not held (custody's business)
        found, what = _member_digest(path)
        expected = upstream_digest(int(gid))
        if found != expected:
            failures.append(
                f"{node_id} holds gid {gid} (operation {operation_id}) as complete, but its"
                f" archive {what}, not the upstream's {_size(int(gid))} bytes"
                f" (sha256 {expected[:16]})"
            )
    return failures


def _size(gid: int) -> int:
    from tasknet.upstream import catalog

    return int(catalog.gallery(gid).size)


def _member_digest(path: Path) -> tuple[str | None, str]:
    """The SHA-256 of the archive's one member (``None``: it has none, or
    several, or cannot be read) and what it holds, for a person."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if len(members) != 1:
                return None, f"has {len(members)} members"
            digest, size = hashlib.sha256(), 0
            with archive.open(members[0]) as member:
                while block := member.read(1 << 20):
                    digest.update(block)
                    size += len(block)
    except (OSError, zipfile.BadZipFile) as e:
        return None, f"is unreadable ({type(e).__name__}: {e})"
    return digest.hexdigest(), f"holds {size} bytes (sha256 {digest.hexdigest()[:16]})"
