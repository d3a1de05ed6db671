"""The codec against the spec's vectors, plus property-based round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasknet.protocol.messages import (
    HEADER,
    MAX_PAYLOAD,
    NODE_ID,
    DeletedEntry,
    DeleteGallery,
    DeleteResult,
    DownloadPost,
    Error,
    Goodbye,
    Heartbeat,
    Identity,
    Login,
    LoginResult,
    Message,
    ProtocolError,
    ProtocolHello,
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
    verify_login,
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
    )
}


def test_max_payload_matches_the_spec() -> None:
    assert VECTORS["max_payload"] == MAX_PAYLOAD


def test_every_type_has_a_vector() -> None:
    assert {c["type"] for c in VECTORS["valid"]} == set(range(14))


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
    for type_ in (10, 11, 12, 13):
        with pytest.raises(UnknownMessageType):
            decode(type_, b"{}", strict=True)
    with pytest.raises(UnknownMessageType):
        decode(14, b"{}")


def test_strict_reader_rejects_unknown_fields_in_entries() -> None:
    payload = b'{"galleryTasks":[{"gid":1,"status":1,"progress":0.5,"x":1}]}'
    decode(6, payload)
    with pytest.raises(ProtocolError):
        decode(6, payload, strict=True)


# ---------------------------------------------------------------- property-based

# Values inside PROTOCOL.md's bounds (test_bounds.py covers the outside).
texts = st.text(max_size=20)
ids = st.text(min_size=1, max_size=20)
gids = st.integers(min_value=1, max_value=2**31 - 1)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
times = st.integers(min_value=0, max_value=2**63 - 1)
node_ids = st.from_regex(NODE_ID, fullmatch=True)
entries = st.builds(
    TaskEntry,
    gids,
    st.integers(min_value=1, max_value=4),
    st.floats(min_value=0.0, max_value=1.0),
)
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
    st.builds(ProtocolHello, ints, st.lists(texts, max_size=3).map(tuple)),
    st.builds(TaskCommand, ids, st.sampled_from(["DOWNLOAD", "DELETE"]), gids, texts, texts),
    st.builds(
        TaskReport,
        ids,
        times,
        st.lists(entries, max_size=5).map(tuple),
        st.dictionaries(gids, ids, max_size=5),
        st.lists(deleted, max_size=3).map(tuple),
    ),
    st.builds(TaskReportAck, ids, st.sampled_from(["APPLIED", "DUPLICATE"])),
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
