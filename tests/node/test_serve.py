"""``--serve``: signed archive links answered over real loopback HTTP from a
real node store (DELIVERY.md, "Serving (node)"); the parsers fuzzed."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.web.test.requesthelper import DummyRequest

from tasknet.node.paths import DataDir
from tasknet.node.serve import (
    MARK_SERVED_EVERY,
    NAME_CAP,
    ArchiveServer,
    BadLink,
    Health,
    LinkParams,
    Unsatisfiable,
    download_names,
    parse_range,
    parse_target,
)
from tasknet.node.store import NodeStore
from tasknet.protocol.archive_links import ArchiveLink, link_key, sign_link, verify_link
from tasknet.runtime import RealThreadPools
from tasknet.weblog import ACCESS_NAMESPACE
from tests.node.test_serve_support import NOW, USER, Answer, content_of, serving
from tests.protocol.vectors import VECTORS

GID, OTHER = 4242, 4243
SIZE = 300_000

INVALID = {"error": {"code": "link_invalid", "message": "the link is not valid"}}


def error_code(answer: Answer) -> str:
    assert answer.header("content-type") == "application/json"
    return str(json.loads(answer.body)["error"]["code"])


def assert_refused(answer: Answer, code: str = "link_invalid") -> None:
    assert answer.status == 403, answer
    assert error_code(answer) == code
    assert b"/" not in answer.body  # no path, no file name


@pytest_twisted.ensureDeferred
async def test_a_link_fetched_whole_and_resumed_hashes_right(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(SIZE), name='Ünïcode / title: "x"')
        link = served.link(GID)
        whole = await served.get(link.path)
        assert whole.status == 200
        assert hashlib.sha256(whole.body).hexdigest() == archive.sha256
        assert whole.header("content-length") == str(SIZE)
        assert whole.header("content-type") == "application/zip"
        assert whole.header("accept-ranges") == "bytes"
        assert whole.header("etag") == f'"sha256-{archive.sha256}"'
        assert whole.header("content-disposition") == (
            'attachment; filename="_n_code _ title_ _x_.zip"; '
            "filename*=UTF-8''%C3%9Cn%C3%AFcode%20_%20title_%20_x_.zip"
        )
        # A download cut at 100,000 bytes resumes from there.
        cut = 100_000
        rest = await served.get(link.path, headers={"Range": f"bytes={cut}-"})
        assert rest.status == 206
        assert rest.header("content-range") == f"bytes {cut}-{SIZE - 1}/{SIZE}"
        assert rest.header("content-length") == str(SIZE - cut)
        assert hashlib.sha256(whole.body[:cut] + rest.body).hexdigest() == archive.sha256
        middle = await served.get(link.path, headers={"Range": "bytes=10-19"})
        assert (middle.status, middle.body) == (206, archive.content[10:20])
        tail = await served.get(link.path, headers={"Range": "bytes=-5"})
        assert (tail.status, tail.body) == (206, archive.content[-5:])
        past_end = await served.get(link.path, headers={"Range": f"bytes={SIZE - 3}-{SIZE + 50}"})
        assert (past_end.status, past_end.body) == (206, archive.content[-3:])
        row = await served.store.archive(GID, archive.operation_id)
        assert row is not None and row.served_at == NOW
        assert served.server.completed == 5
        assert served.server.transfers == 0


@pytest_twisted.ensureDeferred
async def test_a_tampered_link_is_refused_alike_whatever_part_changed(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        await served.hold(GID, content_of(1000))
        await served.hold(OTHER, content_of(1000, seed=2))
        link = served.link(GID)
        flipped = ("0" if link.sig[0] != "0" else "1") + link.sig[1:]
        tampered = [
            ArchiveLink(OTHER, link.operation_id, link.exp, link.user, link.sig),
            ArchiveLink(GID, f"op-{OTHER}", link.exp, link.user, link.sig),
            ArchiveLink(GID, link.operation_id, link.exp + 3600, link.user, link.sig),
            # Another user's id in the query with this link's signature.
            ArchiveLink(GID, link.operation_id, link.exp, USER + 1, link.sig),
            ArchiveLink(GID, link.operation_id, link.exp, link.user, flipped),
        ]
        bodies = set()
        for wrong in tampered:
            answer = await served.get(wrong.path)
            assert_refused(answer)
            bodies.add(answer.body)
        assert len(bodies) == 1  # no answer says which part was wrong
        assert json.loads(bodies.pop()) == INVALID
        # A link signed with another node's secret.
        foreign = ArchiveLink.sign(link_key("another node"), GID, link.operation_id, link.exp, USER)
        assert_refused(await served.get(foreign.path))
        # HEAD is refused the same way (no body).
        head = await served.get(tampered[0].path, method="HEAD")
        assert head.status == 403
        assert (await served.get(link.path)).status == 200
        assert served.server.completed == 1


@pytest_twisted.ensureDeferred
async def test_an_expired_link_is_refused_by_the_node_clock(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        await served.hold(GID, content_of(1000))
        link = served.link(GID, exp=NOW + 10)
        served.clock.advance(10)  # exp itself is not past
        assert (await served.get(link.path)).status == 200
        served.clock.advance(1)
        answer = await served.get(link.path)
        assert_refused(answer, "link_expired")
        # Expired and forged: the forgery is what is said (nothing about exp).
        forged = ArchiveLink(GID, link.operation_id, link.exp, USER, "0" * 64)
        assert_refused(await served.get(forged.path))


@pytest_twisted.ensureDeferred
async def test_a_generation_not_held_is_link_invalid(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        await served.hold(GID, content_of(1000))
        assert_refused(await served.get(served.link(GID, "op-older-generation").path))
        assert_refused(await served.get(served.link(OTHER, "op-never").path))


@pytest_twisted.ensureDeferred
async def test_malformed_parameters_are_link_invalid(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(1000))
        link = served.link(GID)
        op, exp, sig = archive.operation_id, link.exp, link.sig
        targets = [
            f"/archives/{GID}/{op}?exp={exp}&user={USER}",
            f"/archives/{GID}/{op}?exp={exp}&user={USER}&sig={sig}&sig={sig}",
            f"/archives/{GID}/{op}?exp={exp}&user={USER}&sig={sig.upper()}",
            f"/archives/{GID}/{op}?exp=0{exp}&user={USER}&sig={sig}",
            f"/archives/{GID}/{op}?exp={exp}&user=+{USER}&sig={sig}",
            f"/archives/{GID}/{op}?exp={exp}&user={USER}&sig={sig}&extra=1",
            f"/archives/{GID}/{op}?exp={exp}&user={USER}&sig={sig}&",
            f"/archives/0{GID}/{op}?exp={exp}&user={USER}&sig={sig}",
            f"/archives/{GID}/{op}%00?exp={exp}&user={USER}&sig={sig}",
            f"/archives/{GID}/%ff?exp={exp}&user={USER}&sig={sig}",
            f"/archives/{GID}/?exp={exp}&user={USER}&sig={sig}",
            f"/archives/{GID}/{op}?exp={exp}&user={USER}&sig=%C3%A9{sig[2:]}",
            f"/archives/{GID}/{op}?exp=99999999999999999999&user={USER}&sig={sig}",
            f"/archives/-1/{op}?exp={exp}&user={USER}&sig={sig}",
        ]
        for target in targets:
            assert_refused(await served.get(target))
        assert (await served.get(link.path)).status == 200


@pytest_twisted.ensureDeferred
async def test_nothing_else_is_reachable(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(1000))
        link = served.link(GID)
        query = link.path.partition("?")[2]
        not_found = [
            "/",
            "/archives",
            "/archives/",
            "/archives/1",
            f"/archives/{GID}",
            f"/archives/{GID}/{archive.operation_id}/",
            f"/archives/{GID}/{archive.operation_id}/x?{query}",
            "/etc/passwd",
            "/archives/../etc/passwd",
            f"/archives/../archives/{GID}/{archive.operation_id}?{query}",
            "/../../../../etc/passwd",
            "/node.sqlite",
            "/archives/archives",
            "/healthz/",
            "/ARCHIVES/1/2",
            "//archives/1/2",
        ]
        for target in not_found:
            answer = await served.get(target)
            assert answer.status == 404, (target, answer)
            assert error_code(answer) == "not_found"
            assert b"passwd" not in answer.body and b"archives" not in answer.body
        # Encoded separators stay inside their segment: an operationId that
        # no link was signed for, never a path.
        for op in ("..%2f..%2fnode.sqlite", "%2e%2e", "..", f"{archive.operation_id}%2f..%2f.."):
            assert_refused(await served.get(f"/archives/{GID}/{op}?{query}"))
        for target in (f"/archives/{GID}%2f{archive.operation_id}?{query}", "/%2e%2e/etc/passwd"):
            assert (await served.get(target)).status == 404
        # twisted.web's own answer to the asterisk form: nothing in it.
        star = await served.get("*")
        assert (star.status, star.body) == (405, b"")


@pytest_twisted.ensureDeferred
async def test_only_get_and_head_on_links_and_get_on_healthz(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        await served.hold(GID, content_of(1000))
        link = served.link(GID)
        for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"):
            answer = await served.get(link.path, method=method)
            assert answer.status == 405, method
            assert answer.header("allow") == "GET, HEAD"
            assert error_code(answer) == "method_not_allowed"
        health = await served.get("/healthz")
        assert health.status == 200
        assert json.loads(health.body) == {
            "status": "ok",
            "transfers": 0,
            "serveMax": 64,
            "connections": 1,
        }
        assert (await served.get("/healthz", method="POST")).status == 405
        assert (await served.get("/nowhere", method="POST")).status == 404


@pytest_twisted.ensureDeferred
async def test_head_answers_the_headers_of_get_without_the_body(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        await served.hold(GID, content_of(5000))
        link = served.link(GID)
        got = await served.get(link.path)
        head = await served.get(link.path, method="HEAD")
        assert head.status == 200 and head.body == b""
        for name in (
            "content-length",
            "content-type",
            "etag",
            "accept-ranges",
            "content-disposition",
        ):
            assert head.header(name) == got.header(name), name
        ranged = await served.get(link.path, method="HEAD", headers={"Range": "bytes=100-"})
        assert ranged.status == 206
        assert ranged.header("content-range") == "bytes 100-4999/5000"
        assert ranged.header("content-length") == "4900"
        row = await served.store.archive(GID, served.archives[GID].operation_id)
        assert row is not None and served.server.completed == 1  # HEAD serves nothing


@pytest_twisted.ensureDeferred
async def test_conditional_requests(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(5000))
        link = served.link(GID)
        etag = f'"sha256-{archive.sha256}"'
        stale = '"sha256-' + "0" * 64 + '"'
        # If-Range with a stale ETag: the file changed, so the whole of it.
        whole = await served.get(link.path, headers={"Range": "bytes=100-", "If-Range": stale})
        assert (whole.status, whole.body) == (200, archive.content)
        resumed = await served.get(link.path, headers={"Range": "bytes=100-", "If-Range": etag})
        assert (resumed.status, resumed.body) == (206, archive.content[100:])
        dated = await served.get(
            link.path, headers={"Range": "bytes=100-", "If-Range": "Mon, 07 Dec 2026 00:00:00 GMT"}
        )
        assert dated.status == 200
        for match in (etag, f"W/{etag}", f"{stale}, {etag}", "*"):
            unchanged = await served.get(link.path, headers={"If-None-Match": match})
            assert unchanged.status == 304, match
            assert unchanged.body == b"" and unchanged.header("etag") == etag
        assert (await served.get(link.path, headers={"If-None-Match": stale})).status == 200


@pytest_twisted.ensureDeferred
async def test_ranges_nginx_style(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(5000))
        link = served.link(GID)
        for unsatisfiable in ("bytes=5000-", "bytes=6000-7000", "bytes=-0"):
            answer = await served.get(link.path, headers={"Range": unsatisfiable})
            assert answer.status == 416, unsatisfiable
            assert answer.header("content-range") == "bytes */5000"
            assert answer.body == b""
        # Several ranges, or one the RFC says to ignore: the whole file.
        for ignored in ("bytes=0-1,5-6", "bytes=9-3", "items=0-1", "bytes=x-"):
            answer = await served.get(link.path, headers={"Range": ignored})
            assert (answer.status, answer.body) == (200, archive.content), ignored
        assert served.server.transfers == 0


@pytest_twisted.ensureDeferred
async def test_a_legacy_completion_without_digest_has_no_etag(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(2000), sha256="")
        link = served.link(GID)
        answer = await served.get(link.path)
        assert answer.status == 200 and answer.body == archive.content
        assert answer.header("etag") is None
        # No ETag to match: If-Range cannot be trusted, If-None-Match never matches.
        ranged = await served.get(link.path, headers={"Range": "bytes=5-", "If-Range": '"x"'})
        assert ranged.status == 200
        assert (await served.get(link.path, headers={"If-None-Match": "*"})).status == 200


@pytest_twisted.ensureDeferred
async def test_a_file_truncated_on_disk_is_set_aside_never_served_short(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(5000))
        path = served.data.archive_file(archive.row)
        path.write_bytes(archive.content[:4000])
        link = served.link(GID)
        assert_refused(await served.get(link.path))
        assert await served.store.archive(GID, archive.operation_id) is None
        assert not path.exists()
        assert (served.data.corrupt / path.name).read_bytes() == archive.content[:4000]
        assert_refused(await served.get(link.path))
        assert served.server.transfers == 0 and served.server.completed == 0
        # A file gone altogether: the same.
        other = await served.hold(OTHER, content_of(100))
        served.data.archive_file(other.row).unlink()
        assert (await served.get(served.link(OTHER).path, method="HEAD")).status == 403
        assert await served.store.archive(OTHER, other.operation_id) is None


@pytest_twisted.ensureDeferred
async def test_served_at_is_written_at_most_once_a_minute_per_archive(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(1000))
        link = served.link(GID, exp=NOW + 3600)
        assert (await served.get(link.path)).status == 200
        served.clock.advance(MARK_SERVED_EVERY - 1)
        assert (await served.get(link.path, headers={"Range": "bytes=0-9"})).status == 206
        row = await served.store.archive(GID, archive.operation_id)
        assert row is not None and row.served_at == NOW  # not written again within the minute
        served.clock.advance(1)
        assert (await served.get(link.path)).status == 200
        row = await served.store.archive(GID, archive.operation_id)
        assert row is not None and row.served_at == NOW + MARK_SERVED_EVERY
        assert served.server.completed == 3


@pytest_twisted.ensureDeferred
async def test_a_reused_row_never_serves_an_archive_set_aside_or_cut_meanwhile(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as served:
        archive = await served.hold(GID, content_of(5000))
        link = served.link(GID)
        assert (await served.get(link.path)).status == 200  # the row is noted now
        # Set aside by the scrub within the row's reuse time: its file is gone.
        await served.store.set_aside(GID, archive.operation_id, "digest differs")
        assert_refused(await served.get(link.path))
        # Cut short on disk right after a transfer: refused and set aside.
        other = await served.hold(OTHER, content_of(5000, seed=2))
        assert (await served.get(served.link(OTHER).path)).status == 200
        path = served.data.archive_file(other.row)
        path.write_bytes(other.content[:10])
        assert_refused(await served.get(served.link(OTHER).path))
        assert await served.store.archive(OTHER, other.operation_id) is None
        assert served.server.completed == 2


@pytest_twisted.ensureDeferred
async def test_the_vectors_archive_link_example_is_served(tmp_path: Path) -> None:
    example = VECTORS["archive_link_example"]
    key = link_key(example["secret"])
    assert key.hex() == example["linkKey"]
    parsed = parse_target(example["path"].encode("ascii"))
    assert parsed == LinkParams(
        example["gid"], example["operationId"], example["exp"], example["user"], example["sig"]
    )
    assert verify_link(key, parsed.gid, parsed.operation_id, parsed.exp, parsed.user, parsed.sig)
    async with serving(tmp_path, secret=example["secret"]) as served:
        archive = await served.hold(
            example["gid"], b"PK\x05\x06" + bytes(18), operation_id=example["operationId"]
        )
        served.clock.advance(example["exp"] - NOW)
        answer = await served.get(example["path"])
        assert (answer.status, answer.body) == (200, archive.content)
        served.clock.advance(1)
        assert_refused(await served.get(example["path"]), "link_expired")


def test_download_names() -> None:
    assert download_names("My Gallery", 1) == ("My Gallery.zip", "My%20Gallery.zip")
    assert download_names("../../etc/passwd", 1) == ("_.._etc_passwd.zip", "_.._etc_passwd.zip")
    assert download_names("archive.ZIP", 1)[0] == "archive.zip"
    assert download_names("", 77) == ("77.zip", "77.zip")
    assert download_names("\x00\x1f\u202e", 77) == ("77.zip", "77.zip")
    assert download_names("東方 同人誌", 1) == (
        "__ ___.zip",
        "%E6%9D%B1%E6%96%B9%20%E5%90%8C%E4%BA%BA%E8%AA%8C.zip",
    )


@settings(deadline=None)  # no wall-clock limit on a shared machine
@given(st.text(max_size=400), st.integers(1, 2**63 - 1))
def test_download_names_are_always_safe(name: str, gid: int) -> None:
    fallback, encoded = download_names(name, gid)
    assert fallback.endswith(".zip") and fallback.isascii()
    assert len(fallback) <= NAME_CAP + 4
    assert len(unquote(encoded).encode("utf-8")) <= NAME_CAP + 4
    assert not set(fallback) & set('/\\"%;') and all(" " <= ch <= "~" for ch in fallback)
    assert encoded.isascii() and all(ch.isalnum() or ch in "%!#$&+-.^_`|~" for ch in encoded)
    assert not fallback.startswith((".", " "))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_parse_target_never_raises(uri: bytes) -> None:
    target = parse_target(uri)
    assert target is None or isinstance(target, (Health, LinkParams, BadLink))


_SEGMENT = st.one_of(
    st.sampled_from(["archives", "healthz", "", "..", ".", "%2f", "%2F", "%00", "%ff", "1", "01"]),
    st.text(min_size=0, max_size=20).map(lambda s: s.encode("utf-8", "surrogatepass").hex()),
    st.integers(-5, 2**64).map(str),
)
_QUERY = st.lists(
    st.tuples(
        st.sampled_from(["exp", "user", "sig", "x", "", "exp%00"]),
        st.one_of(st.integers(-1, 2**64).map(str), st.text(max_size=70), st.just("a" * 64)),
    ),
    max_size=5,
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_SEGMENT, max_size=5), _QUERY)
def test_parse_target_on_link_like_uris(segments: list[str], query: list[tuple[str, str]]) -> None:
    uri = ("/" + "/".join(segments) + "?" + "&".join(f"{k}={v}" for k, v in query)).encode(
        "utf-8", "surrogatepass"
    )
    target = parse_target(uri)
    if isinstance(target, LinkParams):
        # What parsed is exactly what a link signs: re-signing it round-trips.
        sig = sign_link(b"k", target.gid, target.operation_id, target.exp, target.user)
        assert verify_link(b"k", target.gid, target.operation_id, target.exp, target.user, sig)
        assert target.gid > 0 and 0 <= target.user < 2**63 and 0 <= target.exp < 2**63


@settings(deadline=None)
@given(st.binary(max_size=60), st.integers(0, 10**12))
def test_parse_range_never_raises_but_unsatisfiable(header: bytes, size: int) -> None:
    try:
        span = parse_range(header, size)
    except Unsatisfiable:
        return
    if span is not None:
        first, last = span
        assert 0 <= first <= last < size


def test_parse_range_examples() -> None:
    assert parse_range(None, 10) is None
    assert parse_range(b"bytes=0-", 10) == (0, 9)
    assert parse_range(b"bytes=3-5", 10) == (3, 5)
    assert parse_range(b"Bytes = 3 - 50", 10) == (3, 9)
    assert parse_range(b"bytes=-3", 10) == (7, 9)
    assert parse_range(b"bytes=-30", 10) == (0, 9)
    assert parse_range(b"bytes=1-2,4-5", 10) is None
    assert parse_range(b"bytes=5-3", 10) is None
    for unsatisfiable in (b"bytes=10-", b"bytes=-0", b"bytes=0-"):
        size = 0 if unsatisfiable == b"bytes=0-" else 10
        try:
            parse_range(unsatisfiable, size)
        except Unsatisfiable:
            continue
        raise AssertionError(unsatisfiable)


@pytest_twisted.ensureDeferred
async def test_the_access_line_leaves_the_link_signature_out(tmp_path: Path) -> None:
    lines: list[str] = []

    def observe(event: dict) -> None:
        if event.get("log_namespace") == ACCESS_NAMESPACE:
            lines.append(event["access_line"])

    globalLogPublisher.addObserver(observe)
    try:
        async with serving(tmp_path) as served:
            await served.hold(GID, content_of(100))
            link = served.link(GID)
            assert (await served.get(link.path)).status == 200
    finally:
        globalLogPublisher.removeObserver(observe)
    (line,) = lines
    assert f"/archives/{GID}/op-{GID}?exp={link.exp}&user={USER}&sig=*** HTTP/1.1" in line
    assert link.sig not in line


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveServer]:
    """An endpoint over an empty store, for answers that never reach it."""
    data = DataDir(tmp_path_factory.mktemp("fuzz") / "node")
    store = NodeStore(data, reactor=reactor, clock=Clock(), threads=RealThreadPools())
    yield ArchiveServer(store, data, "fuzz secret", clock=Clock())
    store.close()


_TARGETS = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda segments, query: ("/" + "/".join(segments) + "?" + query).encode(
            "utf-8", "surrogatepass"
        ),
        st.lists(_SEGMENT, max_size=5),
        st.text(max_size=120),
    ),
)


_METHODS = st.sampled_from([b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"BREW"])


@settings(max_examples=400, deadline=None)
@given(_TARGETS, _METHODS)
def test_any_request_target_gets_a_small_json_4xx(
    idle_server: ArchiveServer, uri: bytes, method: bytes
) -> None:
    request = DummyRequest([])
    request.uri, request.method = uri, method
    body = idle_server.render(request)
    assert isinstance(body, bytes)  # answered at once: no store work for a bad link
    if uri.partition(b"?")[0] == b"/healthz" and method == b"GET":
        assert request.responseCode in (None, 200)
        return
    assert request.responseCode in (403, 404, 405)
    error = json.loads(body)["error"]
    assert error["code"] in ("link_invalid", "not_found", "method_not_allowed")
    assert idle_server.transfers == 0


def test_a_long_name_is_cut_to_what_file_systems_take() -> None:
    fallback, encoded = download_names("東" * 300, 1)
    assert len(unquote(encoded).encode("utf-8")) <= 255 - len(".part")
    assert unquote(encoded) == "東" * (NAME_CAP // 3) + ".zip"
    assert fallback == "_" * (NAME_CAP // 3) + ".zip"


@pytest_twisted.ensureDeferred
async def test_a_store_that_cannot_be_read_is_503_not_500(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        await served.hold(GID, content_of(100))
        with sqlite3.connect(served.data.database) as db:  # a damaged database
            db.execute("DROP TABLE archive")
        answer = await served.get(served.link(GID).path)
        assert answer.status == 503
        assert answer.header("retry-after") == "1"
        assert error_code(answer) == "unavailable"
        assert served.server.transfers == 0
