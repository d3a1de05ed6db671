"""The world's archive fetches and their check, archive-served (issue 39, item 4)."""

from __future__ import annotations

import hashlib
import io
import json
import random
import zipfile
from pathlib import Path

from tasknet.sim.fetch import (
    CLEAN_REFUSALS,
    LINKS_MISSING,
    NO_ANSWER,
    NODE_REFUSALS,
    PAST_END,
    RESUME,
    WHOLE,
    Answer,
    links_problem,
    plan_fetch,
    public_nodes,
    range_problem,
    resume_problem,
    served_problem,
)
from tasknet.sim.run import run_schedule
from tasknet.sim.schedule import BASE_FAULT_KINDS, FAULT_KINDS, FETCH_KIND, fetch_steps, generate
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


def test_the_fetches_fire_every_path_and_the_seeds_pass(tmp_path: Path) -> None:
    fetches: dict[str, int] = {}
    for seed in (2, 3, 5):
        outcome = run_schedule(generate(seed), workdir=tmp_path / str(seed), keep_trace=None)
        assert not outcome.failed, outcome.failures
        assert f"step {FETCH_KIND}" in "\n".join(outcome.trace)
        for path, n in outcome.fetches.items():
            fetches[path] = fetches.get(path, 0) + n
    # Whole, resumed and past the end, through the site's stream and through
    # a node's signed link (the site's 303, or POST /api/tasks/archive-links).
    for path in (
        "site whole served",
        "site resume served",
        "site past-end past end",
        "node whole served",
        "node resume served",
        "node past-end past end",
        "links node whole served",
        "links site resume served",
    ):
        assert fetches.get(path, 0) >= 1, (path, fetches)


def test_a_node_whose_archive_file_holds_other_bytes_fails_archive_served(tmp_path: Path) -> None:
    def overwrite_archives(_db: str) -> None:
        # Same size, other bytes: the endpoint checks the size, not the bytes.
        for archive in sorted(tmp_path.glob("n*/archives/*")):
            size = archive.stat().st_size
            archive.write_bytes(b"\0" * size)

    outcome = run_schedule(
        generate(3), workdir=tmp_path, keep_trace=None, before_checks=overwrite_archives
    )
    served = [text for check, text in outcome.failures if check == "archive-served"]
    assert served, outcome.failures
    assert "the site recorded" in served[0] and "(through site at" in served[0]
    # Caught on every path: a node's signed link (the site's 303 or the
    # links'), and a resume's two 206 parts joined, from the site or a node.
    for path in ("site whole", "links site whole", "links node whole"):
        assert any(text.endswith(f" {path})") for text in served), (path, served)
    for path in ("site resume", "node resume"):
        joined = [t for t in served if t.endswith(f" {path})") and "(two 206 parts joined)" in t]
        assert joined, (path, served)


# -- Range requests --------------------------------------------------------------------


def _whole() -> tuple[bytes, str, int]:
    body = _archive(_upstream_bytes(GID))
    return body, hashlib.sha256(body).hexdigest(), len(body)


def _part(body: bytes, first: int, last: int, size: int) -> Answer:
    return Answer(206, body=body[first : last + 1], content_range=f"bytes {first}-{last}/{size}")


def test_a_resume_whose_two_parts_join_to_the_recorded_bytes_passes() -> None:
    body, sha256, size = _whole()
    split = size // 3
    head = ((0, split - 1), _part(body, 0, split - 1, size))
    rest = ((split, None), _part(body, split, size - 1, size))
    assert resume_problem(GID, head, rest, {sha256}, {size}) is None
    # The rest refused by a node (a release raced it), or no answer: clean.
    refused = ((split, None), Answer(403, "link_invalid"))
    refusals = (CLEAN_REFUSALS, NODE_REFUSALS)
    assert resume_problem(GID, head, refused, {sha256}, {size}, refusals) is None
    assert resume_problem(GID, head, ((split, None), Answer(NO_ANSWER)), {sha256}, {size}) is None
    # If-Range stale (another generation): the whole file, judged whole.
    assert (
        resume_problem(GID, head, ((split, None), Answer(200, body=body)), {sha256}, {size}) is None
    )


def test_a_206_with_wrong_bytes_fails() -> None:
    body, sha256, size = _whole()
    split = size // 2
    other = body[:split] + bytes(b ^ 0xFF for b in body[split:])
    head = ((0, split - 1), _part(body, 0, split - 1, size))
    rest = ((split, None), _part(other, split, size - 1, size))
    problem = resume_problem(GID, head, rest, {sha256}, {size})
    assert problem is not None
    assert f"gid {GID}: served {size} bytes with sha256" in problem
    assert problem.endswith("the site recorded (two 206 parts joined)")


def test_a_206_with_another_range_or_length_than_asked_fails() -> None:
    body, sha256, size = _whole()
    asked = (0, 99)
    assert range_problem(GID, asked, _part(body, 0, 99, size), {sha256}, {size}) is None
    shifted = _part(body, 1, 100, size)
    problem = range_problem(GID, asked, shifted, {sha256}, {size})
    assert (
        problem == f"gid {GID}: 206 for Range bytes=0-99 carried Content-Range 'bytes 1-100/{size}'"
    )
    short = Answer(206, body=body[:50], content_range=f"bytes 0-99/{size}")
    problem = range_problem(GID, asked, short, {sha256}, {size})
    assert problem is not None and "carried 50 bytes for Content-Range" in problem
    bare = Answer(206, body=body[:100])
    problem = range_problem(GID, asked, bare, {sha256}, {size})
    assert problem is not None and "without a Content-Range: bytes FIRST-LAST/SIZE" in problem
    bigger = _part(body + b"x", 0, 99, size + 1)
    problem = range_problem(GID, asked, bigger, {sha256}, {size})
    assert problem == (
        f"gid {GID}: 206 for Range bytes=0-99 names {size + 1} bytes, not the {size} the site"
        " recorded"
    )
    # A 206 to a request with no Range at all.
    problem = range_problem(GID, None, _part(body, 0, 99, size), {sha256}, {size})
    assert problem == f"gid {GID}: answered 206 (no error code), not 200 or a refusal"


def test_a_416_must_carry_content_range_of_the_recorded_size() -> None:
    _body, sha256, size = _whole()
    past = (size + 5, None)
    good = Answer(416, content_range=f"bytes */{size}")
    assert range_problem(GID, past, good, {sha256}, {size}) is None
    assert range_problem(GID, (size, None), good, {sha256}, {size}) is None
    problem = range_problem(GID, past, Answer(416), {sha256}, {size})
    assert problem == (
        f"gid {GID}: 416 for Range bytes={size + 5}- without Content-Range: bytes */SIZE"
        " (it carried None)"
    )
    wrong = Answer(416, content_range=f"bytes */{size + 10}")
    problem = range_problem(GID, past, wrong, {sha256}, {size})
    assert problem is not None and f"names {size + 10} bytes, not the {size}" in problem
    # A range the archive satisfies is not a 416.
    problem = range_problem(GID, (0, 99), good, {sha256}, {size})
    assert (
        problem == f"gid {GID}: 416 for Range bytes=0-99, which the {size}-byte archive satisfies"
    )


# -- signed node links and POST /api/tasks/archive-links ------------------------------


def test_a_node_link_s_refusals_are_its_own() -> None:
    body, sha256, size = _whole()
    for status, codes in NODE_REFUSALS.items():
        for code in codes:
            assert (
                range_problem(GID, None, Answer(status, code), {sha256}, {size}, NODE_REFUSALS)
                is None
            )
    # The site's codes are not the node's; nor is a 500.
    problem = range_problem(GID, None, Answer(503, "node_busy"), {sha256}, {size}, NODE_REFUSALS)
    assert problem is not None and "not one the route documents" in problem
    problem = range_problem(GID, None, Answer(500, "internal"), {sha256}, {size}, NODE_REFUSALS)
    assert problem == f"gid {GID}: answered 500 (internal), not 200 or a refusal"
    # A 303 the fetch could not follow (no Location) is not an answer either.
    problem = range_problem(GID, None, Answer(303), {sha256}, {size})
    assert problem == f"gid {GID}: answered 303 (no error code), not 200 or a refusal"
    whole = Answer(200, body=body)
    assert range_problem(GID, None, whole, {sha256}, {size}, NODE_REFUSALS) is None


def test_archive_links_gives_a_link_of_the_recorded_archive_or_a_documented_missing() -> None:
    _body, sha256, size = _whole()
    url = f"http://127.0.0.1:7400/archives/{GID}/op?exp=1&user=1&sig={'0' * 64}"

    def links(links: tuple[object, ...] = (), missing: tuple[object, ...] = ()) -> Answer:
        document = {"links": list(links), "missing": list(missing)}
        return Answer(200, body=json.dumps(document).encode())

    entry = {"gid": GID, "url": url, "sha256": sha256, "size": size}
    link, problem = links_problem(GID, links((entry,)), {sha256}, {size})
    assert problem is None and link is not None and link["url"] == url
    for code in LINKS_MISSING:
        assert links_problem(
            GID, links(missing=({"gid": GID, "code": code},)), {sha256}, {size}
        ) == (
            None,
            None,
        )
    _, problem = links_problem(
        GID, links(missing=({"gid": GID, "code": "busy"},)), {sha256}, {size}
    )
    assert problem == f"gid {GID}: archive-links says missing 'busy', a code it does not document"
    other = dict(entry, sha256="f" * 64)
    _, problem = links_problem(GID, links((other,)), {sha256}, {size})
    assert problem is not None and "archive-links gave sha256 ffffffffffffffff" in problem
    _, problem = links_problem(GID, links(), {sha256}, {size})
    assert problem == f"gid {GID}: archive-links gave 0 links and no missing entry"
    assert links_problem(GID, Answer(503, "unavailable"), {sha256}, {size}) == (None, None)
    _, problem = links_problem(GID, Answer(500, "internal"), {sha256}, {size})
    assert problem == f"gid {GID}: answered 500 (internal), not 200 or a refusal"


def test_the_ways_and_the_public_nodes_are_drawn_from_their_own_generators() -> None:
    nodes = (("n1", 2), ("n2", 2), ("n3", 1), ("n4", 2))
    drawn = [public_nodes(seed, nodes) for seed in range(40)]
    assert drawn == [public_nodes(seed, nodes) for seed in range(40)]
    assert not any("n3" in public for public in drawn)  # a legacy node has no Hello
    assert any(public for public in drawn) and any(not public for public in drawn)
    # The same draw a node whatever its protocol: a node's flag depends on its place only.
    assert public_nodes(7, nodes[:2]) == public_nodes(7, nodes) - {"n4"}
    rng = random.Random("fetch paths 7")
    plans = [plan_fetch(rng) for _ in range(200)]
    assert {p.how for p in plans} == {WHOLE, RESUME, PAST_END}
    assert {p.links for p in plans} == {True, False}
    assert plans[0] == plan_fetch(random.Random("fetch paths 7"))
    plan = next(p for p in plans if p.how == RESUME)
    how, asked = plan.ranges(1000)
    assert how == RESUME and asked is not None and asked[1] is not None
    assert asked[0] == 0 and 0 <= asked[1] < 999
    assert plan.ranges(None) == (WHOLE, None) and plan.ranges(1) == (WHOLE, None)
    plan = next(p for p in plans if p.how == PAST_END)
    how, asked = plan.ranges(1000)
    assert how == PAST_END and asked is not None and asked[0] >= 1000 and asked[1] is None
