"""The world's archive fetches and their check, archive-served (issue 39, item 4)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

from tasknet.sim.fetch import CLEAN_REFUSALS, FETCH_KIND, NO_ANSWER, fetch_steps, served_problem
from tasknet.sim.run import run_schedule
from tasknet.sim.schedule import BASE_FAULT_KINDS, FAULT_KINDS, generate
from tasknet.upstream import catalog

GID = 101


def _archive(member: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{GID}.bin", member)
    return out.getvalue()


def _upstream_bytes(gid: int) -> bytes:
    return catalog.archive_slice(gid, 0, catalog.gallery(gid).size)


def test_the_upstream_s_bytes_with_the_recorded_digest_pass() -> None:
    body = _archive(_upstream_bytes(GID))
    recorded = hashlib.sha256(body).hexdigest()
    assert served_problem(GID, 200, None, body, {recorded, None}) is None
    # A generation recorded before or after the fetch: either may be the one served.
    assert served_problem(GID, 200, None, body, {"0" * 64, recorded}) is None


def test_a_node_that_serves_other_bytes_fails() -> None:
    other = _archive(b"x" * len(_upstream_bytes(GID)))
    # The node recorded its own bytes' digest: the member is still not the upstream's.
    problem = served_problem(GID, 200, None, other, {hashlib.sha256(other).hexdigest()})
    assert problem is not None and "not the upstream's bytes" in problem
    # Bytes other than those the site recorded.
    good = _archive(_upstream_bytes(GID))
    problem = served_problem(GID, 200, None, other, {hashlib.sha256(good).hexdigest()})
    assert problem is not None and "the site recorded" in problem
    assert f"gid {GID}: served {len(other)} bytes" in problem


def test_a_500_or_an_undocumented_refusal_fails_and_the_documented_ones_pass() -> None:
    problem = served_problem(GID, 500, "internal", b"", {None})
    assert problem == f"gid {GID}: answered 500 (internal), not 200 or a refusal"
    problem = served_problem(GID, 503, "link_expired", b"", {None})
    assert problem is not None and "not one the route documents" in problem
    for status, codes in CLEAN_REFUSALS.items():
        for code in codes:
            assert served_problem(GID, status, code, b"", {None}) is None
    assert served_problem(GID, NO_ANSWER, None, None, {None}) is None


def test_the_fetches_leave_the_other_steps_of_a_schedule_as_they_were() -> None:
    for seed in range(40):
        every = generate(seed)
        fetches = [s for s in every.steps if s.kind == FETCH_KIND]
        assert fetches == sorted(fetch_steps(seed, every.sites, 60.0), key=lambda s: s.at)
        assert not any(s.is_fault for s in fetches)
    # Asked for base kinds only, the same fetches; asked for apart kinds only, none.
    assert [s for s in generate(7, faults=BASE_FAULT_KINDS).steps if s.kind == FETCH_KIND]
    apart = tuple(k for k in FAULT_KINDS if k not in BASE_FAULT_KINDS)
    assert not [s for s in generate(7, faults=apart).steps if s.kind == FETCH_KIND]


def test_the_fetches_fire_are_served_and_the_seeds_pass(tmp_path: Path) -> None:
    served = 0
    for seed in (2, 3, 5):
        outcome = run_schedule(generate(seed), workdir=tmp_path / str(seed), keep_trace=None)
        assert not outcome.failed, outcome.failures
        trace = "\n".join(outcome.trace)
        assert f"step {FETCH_KIND}" in trace
        served += sum(1 for line in outcome.trace if " fetch " in line and line.endswith(" 200\n"))
    assert served >= 3


def test_a_node_whose_archive_file_holds_other_bytes_fails_archive_served(tmp_path: Path) -> None:
    def overwrite_archives(_db: str) -> None:
        # Same size, other bytes: the endpoint checks the size, not the bytes.
        for archive in sorted(tmp_path.glob("n*/archives/*")):
            size = archive.stat().st_size
            archive.write_bytes(b"\0" * size)

    outcome = run_schedule(
        generate(2), workdir=tmp_path, keep_trace=None, before_checks=overwrite_archives
    )
    served = [text for check, text in outcome.failures if check == "archive-served"]
    assert served, outcome.failures
    assert "the site recorded" in served[0] and "(through site at" in served[0]
