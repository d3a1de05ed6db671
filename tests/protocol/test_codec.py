"""The codec against the spec's vectors, plus property-based round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasknet.protocol.archive_links import ArchiveLink, link_key, verify_link
from tasknet.protocol.messages import (
    HEADER,
    MAX_PAYLOAD,
    NODE_ID,
    ArchiveInventory,
    ArchiveInventoryAck,
    DeletedEntry,
    DeleteGallery,
    DeleteResult,
    DownloadPost,
    Error,
    Goodbye,
    Heartbeat,
    HeldArchive,
    Identity,
    Login,
    LoginResult,
    Message,
    NodeChallenge,
    ProtocolError,
    ProtocolHello,
    ReleasedEntry,
    SiteProof,
    StatusReport,
    TaskCommand,
    TaskEntry,
    TaskReport,
    TaskReportAck,
    UnknownMessageType,
    decode,
    encode,
    encode_payload,
    sign_login,
    sign_site_proof,
    verify_login,
    verify_site_proof,
)
from tests.protocol.vectors import VECTORS, case_id, frame

CLASSES = {
    cls.TYPE: cls
    for cls in (
        Identity,
        Login,
        LoginResult,
        Heartbeat,
        DownloadPost,
        DeleteGallery,
        StatusReport,
        DeleteResult,
        Error,
        Goodbye,
        ProtocolHello,
        TaskCommand,
        TaskReport,
        TaskReportAck,
        NodeChallenge,
        SiteProof,
        ArchiveInventory,
        ArchiveInventoryAck,
    )
}


def test_max_payload_matches_the_spec() -> None:
    assert VECTORS["max_payload"] == MAX_PAYLOAD


def test_every_type_has_a_vector() -> None:
    assert {c["type"] for c in VECTORS["valid"]} == set(range(18)) == set(CLASSES)


def test_every_section_of_the_vectors_is_tested() -> None:
    # A section added to the spec's file must get a test here first.
    assert set(VECTORS) == {
        "about",
        "login_example",
        "archive_link_example",
        "max_payload",
        "valid",
        "invalid",
        "legacy_strict",
        "tolerant",
    }
    assert all(VECTORS[k] for k in ("valid", "invalid", "legacy_strict", "tolerant"))


@pytest.mark.parametrize("case", VECTORS["valid"], ids=case_id)
def test_valid_vector_decodes_to_its_fields_and_encodes_to_its_bytes(case: dict[str, Any]) -> None:
    raw = frame(case)
    type_, length = HEADER.unpack_from(raw)
    assert type_ == case["type"] and length == len(raw) - 5
    message = decode(type_, raw[5:])
    assert type(message) is CLASSES[case["type"]]
    assert json.loads(encode_payload(message)) == case["fields"]
    assert encode(message) == raw


def test_valid_vectors_decode_to_typed_attributes() -> None:
    by_name: dict[str, dict[str, Any]] = {}
    for c in VECTORS["valid"]:
        by_name.setdefault(c["name"], c)  # the first vector of each name
    report = decode(12, frame(by_name["TaskReport"])[5:])
    assert report == TaskReport(
        "r-0001", 1796000000001, (TaskEntry(2201, 3, 1.0),), {2201: "op-7f3c"}, ()
    )
    status = decode(6, frame(by_name["StatusReport"])[5:])
    assert isinstance(status, StatusReport)
    assert status.gallery_tasks[1] == TaskEntry(2202, 4, 1.0)
    assert isinstance(status.gallery_tasks[1].progress, float)


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=case_id)
def test_invalid_vector_payload_is_rejected_with_its_code(case: dict[str, Any]) -> None:
    raw = frame(case)
    type_, length = HEADER.unpack_from(raw)
    if case["error"] == "frame_too_large":
        assert length > MAX_PAYLOAD and len(raw) == 5  # the framer's job: test_frames
        return
    with pytest.raises(ProtocolError) as info:
        decode(type_, raw[5:])
    assert info.value.code == case["error"]


@pytest.mark.parametrize("case", VECTORS["tolerant"], ids=case_id)
def test_tolerant_vector_of_the_previous_release_decodes_to_its_fields(
    case: dict[str, Any],
) -> None:
    raw = frame(case)
    type_, length = HEADER.unpack_from(raw)
    assert type_ == case["type"] and length == len(raw) - 5
    message = decode(type_, raw[5:])
    assert type(message) is CLASSES[type_]
    # What it decodes to, written back: the fields the spec says (size 0 added).
    assert json.loads(encode_payload(message)) == case["decoded"]


def test_a_command_of_the_previous_release_has_size_0() -> None:
    [case] = [c for c in VECTORS["tolerant"] if c["type"] == TaskCommand.TYPE]
    message = decode(11, frame(case)[5:])
    assert isinstance(message, TaskCommand) and message.size == 0


def test_the_new_v2_fields_decode_to_typed_attributes() -> None:
    valid = {(c["name"], json.dumps(c["fields"])): c for c in VECTORS["valid"]}
    commands = [decode(11, frame(c)[5:]) for (n, _), c in valid.items() if n == "TaskCommand"]
    assert [(c.action, c.size) for c in commands] == [
        ("DOWNLOAD", 632255),
        ("DELETE", 0),
        ("CANCEL", 0),
    ]
    [r3] = [
        decode(12, frame(c)[5:])
        for c in VECTORS["valid"]
        if c["fields"].get("reportId") == "r-0003"
    ]
    assert isinstance(r3, TaskReport)
    assert r3.gallery_tasks == (
        TaskEntry(2203, 1, 0.0, True, ""),
        TaskEntry(2204, 1, 0.42, False, "retrying in 8 s: connection refused"),
    )


def test_the_archive_fields_decode_to_typed_attributes() -> None:
    by_type: dict[int, list[Message]] = {}
    for c in VECTORS["valid"]:
        by_type.setdefault(c["type"], []).append(decode(c["type"], frame(c)[5:]))
    hello = by_type[10][-1]
    assert isinstance(hello, ProtocolHello)
    assert (hello.archive_url, hello.serve_url) == (
        "https://node-1.example.org:7443/",
        "http://10.0.0.11:7300/",
    )
    [r4] = [r for r in by_type[12] if isinstance(r, TaskReport) and r.report_id == "r-0004"]
    digest = "8b7bee815494a698b8a8536313021e3834d5488c51d3843c6b177f5c31821141"
    assert r4.gallery_tasks == (TaskEntry(2201, 4, 1.0, False, "", 632255, digest),)
    assert r4.released == (ReleasedEntry(2205, "op-81ac", "EXPIRED"),)
    assert [c.action for c in by_type[11] if isinstance(c, TaskCommand)][-1] == "CANCEL"
    first, second = by_type[16]
    assert first == ArchiveInventory(
        "inv-01", 1, 2, (HeldArchive(2201, "op-7f3c", 632255, digest),)
    )
    assert second == ArchiveInventory("inv-01", 2, 2, ())
    assert by_type[17] == [ArchiveInventoryAck("inv-01", 1)]


def test_archive_fields_are_written_only_when_they_say_something() -> None:
    assert (
        encode_payload(ProtocolHello()) == b'{"protocolVersion":2,"features":["reliable-task-v2"]}'
    )
    report = TaskReport("r", 1, (TaskEntry(1, 4, 1.0),), {1: "o"}, ())
    assert b"released" not in encode(report) and b"sha256" not in encode(report)
    # A legacy StatusReport never carries them.
    legacy = StatusReport((TaskEntry(1, 4, 1.0, False, "", 5, "a" * 64),))
    assert encode_payload(legacy) == b'{"galleryTasks":[{"gid":1,"status":4,"progress":1.0}]}'


def test_archive_link_example() -> None:
    ex = VECTORS["archive_link_example"]
    key = link_key(ex["secret"])
    assert key.hex() == ex["linkKey"]
    link = ArchiveLink.sign(key, ex["gid"], ex["operationId"], ex["exp"], ex["user"])
    assert link.sig == ex["sig"]
    assert link.path == ex["path"]
    assert verify_link(key, ex["gid"], ex["operationId"], ex["exp"], ex["user"], ex["sig"])
    # Every part is signed: another gid, operation, expiry or user does not verify.
    for changed in (
        (ex["gid"] + 1, ex["operationId"], ex["exp"], ex["user"]),
        (ex["gid"], ex["operationId"] + "x", ex["exp"], ex["user"]),
        (ex["gid"], ex["operationId"], ex["exp"] + 1, ex["user"]),
        (ex["gid"], ex["operationId"], ex["exp"], ex["user"] + 1),
    ):
        assert not verify_link(key, *changed, ex["sig"])
    # The secret itself never signs a link.
    assert not verify_link(
        ex["secret"].encode(), ex["gid"], ex["operationId"], ex["exp"], ex["user"], ex["sig"]
    )
    assert not verify_link(key, ex["gid"], ex["operationId"], ex["exp"], ex["user"], "é" * 64)


def test_queued_and_detail_are_written_only_when_they_say_something() -> None:
    report = TaskReport("r", 1, (TaskEntry(1, 1, 0.5, False, ""),), {}, ())
    assert b"queued" not in encode(report) and b"detail" not in encode(report)
    said = TaskReport("r", 1, (TaskEntry(1, 1, 0.0, True, "why"),), {}, ())
    assert b'"progress":0.0,"queued":true,"detail":"why"}' in encode(said)
    # Never on a legacy StatusReport: its frames stay byte for byte as they were.
    legacy = StatusReport((TaskEntry(1, 1, 0.0, True, "why"),))
    assert encode_payload(legacy) == b'{"galleryTasks":[{"gid":1,"status":1,"progress":0.0}]}'


def test_legacy_frames_are_unchanged_byte_for_byte() -> None:
    for case in VECTORS["valid"]:
        if case["type"] <= 9:
            raw = frame(case)
            assert encode(decode(raw[0], raw[5:], strict=True)) == raw


@pytest.mark.parametrize("case", VECTORS["legacy_strict"], ids=case_id)
def test_legacy_strict_vector_is_tolerated_but_rejected_by_the_strict_reader(
    case: dict[str, Any],
) -> None:
    raw = frame(case)
    decode(raw[0], raw[5:])
    with pytest.raises(ProtocolError) as info:
        decode(raw[0], raw[5:], strict=True)
    assert info.value.code == "bad_message"


def test_login_example_signature() -> None:
    ex = VECTORS["login_example"]
    assert sign_login(ex["secret"], ex["nonce"], ex["nodeId"]) == ex["signature"]
    assert verify_login(ex["secret"], ex["nonce"], ex["nodeId"], ex["signature"])
    assert not verify_login("other", ex["nonce"], ex["nodeId"], ex["signature"])
    assert not verify_login(ex["secret"], ex["nonce"], "node-2", ex["signature"])
    assert not verify_login(ex["secret"], ex["nonce"], ex["nodeId"], "é" * 64)


def test_site_proof_example_signature() -> None:
    ex = VECTORS["login_example"]
    proof = sign_site_proof(ex["secret"], ex["nodeNonce"], ex["nonce"], ex["nodeId"])
    assert proof == ex["siteProof"]
    [vector] = [c for c in VECTORS["valid"] if c["name"] == "SiteProof"]
    assert vector["fields"]["signature"] == proof
    assert verify_site_proof(ex["secret"], ex["nodeNonce"], ex["nonce"], ex["nodeId"], proof)
    assert not verify_site_proof("other", ex["nodeNonce"], ex["nonce"], ex["nodeId"], proof)
    # The nonces in the other order, another node, the Login's signature: all wrong.
    assert not verify_site_proof(ex["secret"], ex["nonce"], ex["nodeNonce"], ex["nodeId"], proof)
    assert not verify_site_proof(ex["secret"], ex["nodeNonce"], ex["nonce"], "node-2", proof)
    assert not verify_site_proof(
        ex["secret"], ex["nodeNonce"], ex["nonce"], ex["nodeId"], ex["signature"]
    )
    assert not verify_site_proof(ex["secret"], ex["nodeNonce"], ex["nonce"], ex["nodeId"], "")


@pytest.mark.parametrize(
    ("type_", "payload", "code"),
    [
        (3, b'{"time":NaN}', "bad_json"),
        (3, b'{"time":1.5}', "bad_message"),
        (3, '{"time":1}'.encode("utf-16"), "bad_json"),
        (2, b'{"accepted":1,"reason":""}', "bad_message"),
        (6, b'{"galleryTasks":[{"gid":1,"status":true,"progress":0.5}]}', "bad_message"),
        (6, b'{"galleryTasks":[{"gid":1,"status":1,"progress":true}]}', "bad_message"),
        (6, b'{"galleryTasks":[{"gid":1,"status":1,"progress":1.5}]}', "bad_message"),
        (6, b'{"galleryTasks":[{"gid":-1,"status":1,"progress":0.5}]}', "bad_message"),
        (6, b'{"galleryTasks":[{"gid":1,"status":1}]}', "bad_message"),
        (6, b'{"galleryTasks":[[1,1,0.5]]}', "bad_message"),
        (6, b'{"galleryTasks":{}}', "bad_message"),
        (10, b'{"protocolVersion":2,"features":[1]}', "bad_message"),
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[],"operationIds":{"x":"o"},'
            b'"deleted":[]}',
            "bad_message",
        ),
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[],"operationIds":{"1":2},"deleted":[]}',
            "bad_message",
        ),
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[],"operationIds":{},'
            b'"deleted":[{"gid":1,"operationId":"d","result":"GONE","reason":""}]}',
            "bad_message",
        ),
        # size without sha256, a digest on a status that is not 4, a short size
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[{"gid":1,"status":4,"progress":1.0,'
            b'"size":5}],"operationIds":{},"deleted":[]}',
            "bad_message",
        ),
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[{"gid":1,"status":1,"progress":1.0,'
            b'"size":5,"sha256":"' + b"a" * 64 + b'"}],"operationIds":{},"deleted":[]}',
            "bad_message",
        ),
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[{"gid":1,"status":4,"progress":1.0,'
            b'"size":-1,"sha256":"' + b"a" * 64 + b'"}],"operationIds":{},"deleted":[]}',
            "bad_message",
        ),
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[],"operationIds":{},"deleted":[],'
            b'"released":[{"gid":1,"operationId":"","reason":"EXPIRED"}]}',
            "bad_message",
        ),
        (
            12,
            b'{"reportId":"r","revision":1,"galleryTasks":[],"operationIds":{},"deleted":[],'
            b'"released":{}}',
            "bad_message",
        ),
        (10, b'{"protocolVersion":2,"features":[],"archiveUrl":1}', "bad_message"),
        (
            10,
            b'{"protocolVersion":2,"features":[],"serveUrl":"' + b"u" * 2049 + b'"}',
            "bad_message",
        ),
        (
            11,
            b'{"operationId":"o","action":"PAUSE","gid":1,"name":"","url":"","size":0}',
            "bad_message",
        ),
        (16, b'{"inventoryId":"i","part":0,"parts":1,"archives":[]}', "bad_message"),
        (
            16,
            b'{"inventoryId":"i","part":1,"parts":1,"archives":[{"gid":1,"operationId":"o",'
            b'"size":1,"sha256":"' + b"A" * 64 + b'"}]}',
            "bad_message",
        ),
        (
            16,
            b'{"inventoryId":"i","part":1,"parts":1,"archives":['
            + b",".join(
                [b'{"gid":1,"operationId":"o","size":1,"sha256":"' + b"a" * 64 + b'"}'] * 10_001
            )
            + b"]}",
            "bad_message",
        ),
        (16, b'{"inventoryId":"","part":1,"parts":1,"archives":[]}', "bad_message"),
        (17, b'{"inventoryId":"i","part":0}', "bad_message"),
        (13, b'{"reportId":"r","result":"OK"}', "bad_message"),
        (0, b"[" * 100000, "bad_json"),
    ],
)
def test_more_bad_payloads(type_: int, payload: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(type_, payload)
    assert info.value.code == code


def test_progress_may_arrive_as_an_int_and_leaves_as_a_float() -> None:
    m = decode(6, b'{"galleryTasks":[{"gid":1,"status":4,"progress":1}]}')
    assert isinstance(m, StatusReport)
    assert m.gallery_tasks[0].progress == 1.0 and type(m.gallery_tasks[0].progress) is float
    assert encode_payload(m) == b'{"galleryTasks":[{"gid":1,"status":4,"progress":1.0}]}'


def test_tolerant_reader_ignores_unknown_fields_and_order() -> None:
    m = decode(4, b'{ "url":"u", "extra":[1], "name":"n", "token":"t", "gid":7 }')
    assert m == DownloadPost(7, "t", "n", "u")


def test_strict_reader_treats_v2_types_as_unknown() -> None:
    for type_ in (10, 11, 12, 13, 14, 15, 16, 17):
        with pytest.raises(UnknownMessageType):
            decode(type_, b"{}", strict=True)
    with pytest.raises(UnknownMessageType):
        decode(18, b"{}")


def test_strict_reader_rejects_unknown_fields_in_entries() -> None:
    payload = b'{"galleryTasks":[{"gid":1,"status":1,"progress":0.5,"x":1}]}'
    decode(6, payload)
    with pytest.raises(ProtocolError):
        decode(6, payload, strict=True)


# ---------------------------------------------------------------- property-based

# Values inside PROTOCOL.md's bounds (test_bounds.py covers the outside):
# any character but NUL, which no string may hold.
chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
texts = st.text(chars, max_size=20)
ids = st.text(chars, min_size=1, max_size=20)
gids = st.integers(min_value=1, max_value=2**31 - 1)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
times = st.integers(min_value=0, max_value=2**63 - 1)
node_ids = st.from_regex(NODE_ID, fullmatch=True)
# Legacy entries (StatusReport): queued and detail are never on its wire.
entries = st.builds(
    TaskEntry,
    gids,
    st.integers(min_value=1, max_value=4),
    st.floats(min_value=0.0, max_value=1.0),
    st.just(False),
    st.just(""),
    st.just(0),
    st.just(""),
)
v2_entries = st.builds(
    TaskEntry,
    gids,
    st.integers(min_value=1, max_value=4),
    st.floats(min_value=0.0, max_value=1.0),
    st.booleans(),
    st.text(chars, max_size=256),
    st.just(0),
    st.just(""),
)
sizes = st.integers(min_value=0, max_value=2**63 - 1)
digests = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
completions = st.builds(
    TaskEntry,
    gids,
    st.just(4),
    st.floats(min_value=0.0, max_value=1.0),
    st.booleans(),
    st.text(chars, max_size=256),
    sizes,
    digests,
)
released = st.builds(
    ReleasedEntry,
    gids,
    ids,
    st.sampled_from(["EXPIRED", "DISK_BUDGET", "CORRUPT", "MISSING", "CANCELLED"]),
)
held = st.builds(HeldArchive, gids, ids, sizes, digests)
urls = st.text(chars, max_size=40)
deleted = st.builds(
    DeletedEntry, gids, ids, st.sampled_from(["DELETED", "NOT_FOUND", "FAILED"]), texts
)

MESSAGES: st.SearchStrategy[Message] = st.one_of(
    st.builds(Identity, texts, texts),
    st.builds(Login, node_ids, texts),
    st.builds(LoginResult, st.booleans(), texts),
    st.builds(Heartbeat, times),
    st.builds(DownloadPost, gids, texts, texts, texts),
    st.builds(DeleteGallery, gids),
    st.builds(StatusReport, st.lists(entries, max_size=5).map(tuple)),
    st.builds(DeleteResult, gids, st.booleans(), texts),
    st.builds(Error, texts, texts),
    st.builds(Goodbye, texts),
    st.builds(ProtocolHello, ints, st.lists(texts, max_size=3).map(tuple), urls, urls),
    st.builds(
        TaskCommand,
        ids,
        st.sampled_from(["DOWNLOAD", "DELETE", "CANCEL"]),
        gids,
        texts,
        texts,
        sizes,
    ),
    st.builds(
        TaskReport,
        ids,
        times,
        st.lists(st.one_of(entries, v2_entries, completions), max_size=5).map(tuple),
        st.dictionaries(gids, ids, max_size=5),
        st.lists(deleted, max_size=3).map(tuple),
        st.lists(released, max_size=3).map(tuple),
    ),
    st.builds(TaskReportAck, ids, st.sampled_from(["APPLIED", "DUPLICATE"])),
    st.builds(NodeChallenge, ids),
    st.builds(SiteProof, ids),
    st.integers(min_value=1, max_value=5).flatmap(
        lambda parts: st.builds(
            ArchiveInventory,
            ids,
            st.integers(min_value=1, max_value=parts),
            st.just(parts),
            st.lists(held, max_size=3).map(tuple),
        )
    ),
    st.builds(ArchiveInventoryAck, ids, st.integers(min_value=1, max_value=2**63 - 1)),
)


@settings(deadline=None)  # no wall-clock limit on a shared machine
@given(MESSAGES)
def test_round_trip(message: Message) -> None:
    raw = encode(message)
    type_, length = HEADER.unpack_from(raw)
    assert type_ == message.TYPE and length == len(raw) - 5
    assert decode(type_, raw[5:]) == message
    # The writer's bytes are exactly compact JSON of the same object.
    obj = json.loads(raw[5:])
    assert raw[5:] == json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    if type_ <= 9:
        assert decode(type_, raw[5:], strict=True) == message


def _with_a_nul(value: Any, where: int) -> tuple[Any, int]:
    """``value`` (a message's JSON object) with a NUL put into its
    ``where``-th string (keys included, counting from 0); the count left."""
    if isinstance(value, str):
        if where != 0:
            return value, where - 1
        middle = len(value) // 2
        return value[:middle] + "\x00" + value[middle:], -1
    if isinstance(value, list):
        out = []
        for item in value:
            item, where = _with_a_nul(item, where)
            out.append(item)
        return out, where
    if isinstance(value, dict):
        obj = {}
        for key, item in value.items():
            key, where = _with_a_nul(key, where)
            item, where = _with_a_nul(item, where)
            obj[key] = item
        return obj, where
    return value, where


@settings(deadline=None)
@given(MESSAGES, st.integers(min_value=0, max_value=40), st.booleans())
def test_a_nul_anywhere_in_a_valid_message_is_bad_message(
    message: Message, where: int, ascii: bool
) -> None:
    obj = json.loads(encode_payload(message))
    poisoned, left = _with_a_nul(obj, where)
    if left >= 0:
        return  # fewer strings than that in this message
    raw = json.dumps(poisoned, ensure_ascii=ascii).encode("utf-8", "surrogatepass")
    for strict in (False, True) if message.TYPE <= 9 else (False,):
        with pytest.raises(ProtocolError) as info:
            decode(message.TYPE, raw, strict=strict)
        assert info.value.code == "bad_message", (raw, info.value)


# ---------------------------------------------------------------- orjson against the reference

# The codec runs on orjson; the standard library's json is the reference it
# must agree with. These compare the two directly (messages._decode_reference
# and messages._json are the reference reader and writer).
from tasknet.protocol import messages as _codec  # noqa: E402
from tests.protocol.test_bounds import hostile_frames, json_values  # noqa: E402


def reference_verdict(type_: int, raw: bytes, strict: bool) -> Any:
    decoder = _codec._DECODERS[type_]
    try:
        return _codec._decode_reference(decoder, type_, raw, strict)
    except ProtocolError as e:
        return (e.code, e.message)


def verdict(type_: int, raw: bytes, strict: bool) -> Any:
    try:
        return decode(type_, raw, strict=strict)
    except ProtocolError as e:
        return (e.code, e.message)


@settings(max_examples=500, deadline=None)
@given(hostile_frames(), st.booleans())
def test_fast_reader_agrees_with_the_reference_reader(
    frame: tuple[int, bytes], strict: bool
) -> None:
    type_, raw = frame
    if strict and type_ > 9:
        strict = False
    assert verdict(type_, raw, strict) == reference_verdict(type_, raw, strict)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 15), json_values, st.booleans())
def test_fast_reader_agrees_on_any_json_document(type_: int, value: Any, ascii: bool) -> None:
    try:
        raw = json.dumps(value, ensure_ascii=ascii).encode("utf-8")
    except UnicodeEncodeError:
        raw = json.dumps(value).encode("utf-8")
    assert verdict(type_, raw, False) == reference_verdict(type_, raw, False)


@pytest.mark.parametrize(
    "raw",
    [
        # Beyond 64 bits orjson reads an int as a float; the verdict is still the reference's.
        b'{"reportId":"r","revision":18446744073709551616,"galleryTasks":[],'
        b'"operationIds":{},"deleted":[]}',
        b'{"reportId":"r","revision":-9223372036854775809,"galleryTasks":[],'
        b'"operationIds":{},"deleted":[]}',
        b'{"reportId":"r","revision":1,"galleryTasks":[{"gid":1,"status":1,"progress":'
        + b"1" * 400
        + b'}],"operationIds":{},"deleted":[]}',
        b'{"reportId":"r","revision":1e400,"galleryTasks":[],"operationIds":{},"deleted":[]}',
        b'{"reportId":"\\ud800","revision":1,"galleryTasks":[],"operationIds":{},"deleted":[]}',
        b'{"reportId":"r","revision":1,"x":' + b"[" * 2000 + b"]" * 2000 + b"}",
        b'\xef\xbb\xbf{"reportId":"r"}',
        b'{"reportId":"r","revision":NaN}',
    ],
    ids=["u64+1", "i64-1", "400-digit-progress", "1e400", "surrogate", "deep", "bom", "nan"],
)
def test_refusals_are_the_reference_readers(raw: bytes) -> None:
    fast = verdict(12, raw, False)
    assert fast == reference_verdict(12, raw, False)
    assert fast[0] in {"bad_json", "bad_message"}


def test_an_int_progress_too_large_for_a_float_is_bad_message() -> None:
    # float(10**400) raises OverflowError: the bound is checked on the int first.
    payload = b'{"galleryTasks":[{"gid":1,"status":1,"progress":1' + b"0" * 400 + b"}]}"
    with pytest.raises(ProtocolError) as info:
        decode(6, payload)
    assert info.value.code == "bad_message"


def test_a_huge_protocol_version_is_read_as_the_int_it_is() -> None:
    # orjson alone would give a float (and so bad_message); the reference gives the int.
    m = decode(10, b'{"protocolVersion":' + str(2**70).encode() + b',"features":[]}')
    assert m == ProtocolHello(2**70, ())


@pytest.mark.parametrize(
    "progress", [0.0, -0.0, 1.0, 1e-4, 9.99e-5, 1e-5, 1.5e-5, 5e-324, 0.1, 1 / 3, 1, 0]
)
def test_writer_spells_progress_as_the_reference_does(progress: float) -> None:
    for m in (
        StatusReport((TaskEntry(1, 1, progress), TaskEntry(2, 2, 0.5))),
        TaskReport("r", 1, (TaskEntry(1, 1, 0.5), TaskEntry(2, 1, progress)), {1: "o"}, ()),
    ):
        assert encode_payload(m) == _codec._json(m).encode("utf-8")


@settings(deadline=None)
@given(MESSAGES)
def test_fast_writer_gives_the_reference_writers_bytes(message: Message) -> None:
    assert encode_payload(message) == _codec._json(message).encode("utf-8")


def test_writer_falls_back_to_the_reference_where_orjson_cannot() -> None:
    # orjson refuses ints beyond 64 bits; the reference writes them.
    assert encode_payload(ProtocolHello(2**70, ())) == (
        b'{"protocolVersion":' + str(2**70).encode() + b',"features":[]}'
    )
    # A lone surrogate is still UnicodeEncodeError, as with the reference writer alone.
    with pytest.raises(UnicodeEncodeError):
        encode(Error("internal", "\ud800"))
