"""The decoder's bounds (PROTOCOL.md, "Bounds (both sides)"), for every message type.

Each bound is checked at its edge from both sides: the last value inside is
accepted, the first outside is ``bad_message``.  The property tests then feed
the decoder arbitrary JSON values of any type and of sizes near the bounds in
every field: it must only ever raise its own errors, and whatever it accepts
must be inside the bounds (checked by an oracle written independently of the
decoder) and storable in SQLite.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasknet.protocol.messages import (
    ArchiveInventory,
    ArchiveInventoryAck,
    DeletedEntry,
    DeleteGallery,
    DeleteResult,
    DownloadPost,
    Heartbeat,
    Identity,
    Login,
    Message,
    NodeChallenge,
    ProtocolError,
    ProtocolHello,
    SiteProof,
    StatusReport,
    TaskCommand,
    TaskEntry,
    TaskReport,
    TaskReportAck,
    UnknownMessageType,
    decode,
)

# The spec's numbers, written out here rather than imported, so that a wrong
# constant in messages.py cannot make its own test pass.
GID_LAST = 2**31 - 1
INT63_LAST = 2**63 - 1
ID_LAST = 128
NAME_LAST = 1024
DETAIL_LAST = 256
NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def valid_payloads() -> dict[int, dict[str, Any]]:
    """One valid wire object per type, every bounded field present."""
    return {
        0: {"name": "site", "nonce": "00112233445566778899aabbccddeeff"},
        1: {"nodeId": "node-1", "signature": "ab" * 32},
        2: {"accepted": True, "reason": ""},
        3: {"time": 1},
        4: {"gid": 1, "token": "t", "name": "n", "url": "u"},
        5: {"gid": 1},
        6: {"galleryTasks": [{"gid": 1, "status": 1, "progress": 0.5}]},
        7: {"gid": 1, "success": True, "reason": ""},
        8: {"code": "internal", "message": "m"},
        9: {"reason": "r"},
        10: {"protocolVersion": 2, "features": ["reliable-task-v2"]},
        11: {
            "operationId": "op",
            "action": "DOWNLOAD",
            "gid": 1,
            "name": "n",
            "url": "u",
            "size": 1,
        },
        12: {
            "reportId": "r",
            "revision": 1,
            "galleryTasks": [
                {"gid": 1, "status": 1, "progress": 0.5, "queued": True, "detail": "d"}
            ],
            "operationIds": {"1": "op"},
            "deleted": [{"gid": 2, "operationId": "d", "result": "DELETED", "reason": ""}],
        },
        13: {"reportId": "r", "result": "APPLIED"},
        14: {"nonce": "ffeeddccbbaa99887766554433221100"},
        15: {"signature": "ab" * 32},
    }


#: The message types of the protocol (PROTOCOL.md): 0-9 legacy, 10-15 v2.
TYPES = sorted(valid_payloads())


# (type, path to the field, last value inside, first value outside)
Path = tuple[Any, ...]
GID_FIELDS: list[tuple[int, Path]] = [
    (4, ("gid",)),
    (5, ("gid",)),
    (6, ("galleryTasks", 0, "gid")),
    (7, ("gid",)),
    (11, ("gid",)),
    (12, ("galleryTasks", 0, "gid")),
    (12, ("deleted", 0, "gid")),
]
ID_FIELDS: list[tuple[int, Path]] = [
    (11, ("operationId",)),
    (12, ("reportId",)),
    (12, ("operationIds", "1")),
    (12, ("deleted", 0, "operationId")),
    (13, ("reportId",)),
    (14, ("nonce",)),
    (15, ("signature",)),
]
NAME_FIELDS: list[tuple[int, Path]] = [(0, ("name",)), (4, ("name",)), (11, ("name",))]
INT63_FIELDS: list[tuple[int, Path]] = [(3, ("time",)), (12, ("revision",)), (11, ("size",))]
DETAIL_FIELDS: list[tuple[int, Path]] = [(12, ("galleryTasks", 0, "detail"))]
#: Every string field of every type, for the NUL rule.
STRING_FIELDS: list[tuple[int, Path]] = [
    (0, ("name",)),
    (0, ("nonce",)),
    (1, ("signature",)),
    (2, ("reason",)),
    (4, ("token",)),
    (4, ("name",)),
    (4, ("url",)),
    (7, ("reason",)),
    (8, ("code",)),
    (8, ("message",)),
    (9, ("reason",)),
    (10, ("features", 0)),
    (11, ("operationId",)),
    (11, ("name",)),
    (11, ("url",)),
    (12, ("reportId",)),
    (12, ("galleryTasks", 0, "detail")),
    (12, ("operationIds", "1")),
    (12, ("deleted", 0, "operationId")),
    (12, ("deleted", 0, "reason")),
    (13, ("reportId",)),
    (14, ("nonce",)),
    (15, ("signature",)),
]


def edges() -> Iterator[Any]:
    for type_, path in GID_FIELDS:
        yield pytest.param(type_, path, 1, 0, id=f"{type_}-{'.'.join(map(str, path))}-low")
        yield pytest.param(
            type_, path, GID_LAST, GID_LAST + 1, id=f"{type_}-{'.'.join(map(str, path))}-high"
        )
    for type_, path in ID_FIELDS:
        name = f"{type_}-{'.'.join(map(str, path))}"
        yield pytest.param(type_, path, "x", "", id=f"{name}-empty")
        yield pytest.param(type_, path, "x" * ID_LAST, "x" * (ID_LAST + 1), id=f"{name}-long")
        # The case: a 1 MiB identifier is refused, not stored.
        yield pytest.param(type_, path, "é" * ID_LAST, "x" * 2**20, id=f"{name}-1MiB")
    for type_, path in NAME_FIELDS:
        yield pytest.param(
            type_, path, "名" * NAME_LAST, "名" * (NAME_LAST + 1), id=f"{type_}-{path[0]}-long"
        )
    for type_, path in INT63_FIELDS:
        yield pytest.param(type_, path, 0, -1, id=f"{type_}-{path[0]}-low")
        # The case: revision 2^63 passed the decoder and then failed in SQLite.
        yield pytest.param(type_, path, INT63_LAST, INT63_LAST + 1, id=f"{type_}-{path[0]}-high")
    for type_, path in DETAIL_FIELDS:
        yield pytest.param(
            type_, path, "細" * DETAIL_LAST, "x" * (DETAIL_LAST + 1), id=f"{type_}-detail-long"
        )
        yield pytest.param(type_, path, "", 1, id=f"{type_}-detail-type")
    yield pytest.param(12, ("galleryTasks", 0, "queued"), False, 1, id="12-queued-type")
    yield pytest.param(11, ("size",), 0, True, id="11-size-bool")
    yield pytest.param(11, ("size",), 5, 5.0, id="11-size-float")


def with_value(type_: int, path: Path, value: Any) -> dict[str, Any]:
    obj = valid_payloads()[type_]
    target: Any = obj
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return obj


def payload(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize(("type_", "path", "inside", "outside"), list(edges()))
def test_each_bound_at_its_edge(type_: int, path: Path, inside: Any, outside: Any) -> None:
    # Legacy types also through the strict reader (the legacy node's).
    for strict in (False, True) if type_ <= 9 else (False,):
        decode(type_, payload(with_value(type_, path, inside)), strict=strict)
        with pytest.raises(ProtocolError) as info:
            decode(type_, payload(with_value(type_, path, outside)), strict=strict)
        assert info.value.code == "bad_message"


@pytest.mark.parametrize(
    ("type_", "path"),
    [pytest.param(t, p, id=f"{t}-{'.'.join(map(str, p))}") for t, p in STRING_FIELDS],
)
@pytest.mark.parametrize("where", ["alone", "inside"])
def test_a_nul_in_any_string_field_is_bad_message(type_: int, path: Path, where: str) -> None:
    nul = "\x00" if where == "alone" else "a\x00b"
    for strict in (False, True) if type_ <= 9 else (False,):
        with pytest.raises(ProtocolError) as info:
            decode(type_, payload(with_value(type_, path, nul)), strict=strict)
        assert info.value.code == "bad_message"
        # Whichever way the writer spells it (both are JSON for the same string).
        raw = json.dumps(with_value(type_, path, nul), ensure_ascii=True).encode()
        with pytest.raises(ProtocolError) as info:
            decode(type_, raw, strict=strict)
        assert info.value.code == "bad_message"


@pytest.mark.parametrize("type_", TYPES)
def test_a_nul_in_a_key_or_an_unknown_field_is_bad_message_too(type_: int) -> None:
    for extra in ({"x\x00": 1}, {"x": "\x00"}, {"x": [{"y": ["\x00"]}]}):
        obj = valid_payloads()[type_] | extra
        with pytest.raises(ProtocolError) as info:
            decode(type_, payload(obj))
        assert info.value.code == "bad_message"


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    # The text \u0000 (six characters) is a fine string.
    ack = decode(13, b'{"reportId":"\\\\u0000","result":"APPLIED"}')
    assert ack == TaskReportAck("\\u0000", "APPLIED")


def test_a_nul_deep_in_an_ignored_field_does_not_exhaust_the_stack() -> None:
    depth = 900
    raw = b'{"reportId":"r","result":"APPLIED","x":' + b"[" * depth + b'"\\u0000"'
    raw += b"]" * depth + b"}"
    with pytest.raises(ProtocolError) as info:
        decode(13, raw)
    assert info.value.code in {"bad_message", "bad_json"}


def test_size_defaults_to_0_and_queued_detail_to_nothing() -> None:
    command = valid_payloads()[11]
    del command["size"]
    assert decode(11, payload(command)) == TaskCommand("op", "DOWNLOAD", 1, "n", "u", 0)
    report = decode(
        12, payload(with_value(12, ("galleryTasks", 0), {"gid": 1, "status": 1, "progress": 0.5}))
    )
    assert isinstance(report, TaskReport)
    assert report.gallery_tasks == (TaskEntry(1, 1, 0.5, False, ""),)


def test_a_status_report_entry_carries_no_queued_or_detail() -> None:
    # Tolerant: unknown in a StatusReport, so ignored (not read, not checked);
    # the strict (legacy) reader refuses them as unknown fields.
    raw = payload(
        {
            "galleryTasks": [
                {"gid": 1, "status": 1, "progress": 0.5, "queued": 1, "detail": "x" * 1000}
            ]
        }
    )
    status = decode(6, raw)
    assert status == StatusReport((TaskEntry(1, 1, 0.5),))
    with pytest.raises(ProtocolError):
        decode(6, raw, strict=True)


def operation_ids_with_key(key: str) -> bytes:
    return payload(with_value(12, ("operationIds",), {key: "op"}))


@pytest.mark.parametrize(
    "key", ["0", "00", str(GID_LAST + 1), "1" * 11, "1" * 5000, "", "-1", "1.0", "²", " 1"]
)
def test_operation_ids_keys_are_gids_in_bounds(key: str) -> None:
    # "1" * 5000: int() of it raises ValueError (Python's digit limit); it
    # must come out as the codec's own error, not that.
    with pytest.raises(ProtocolError) as info:
        decode(12, operation_ids_with_key(key))
    assert info.value.code == "bad_message"


def test_operation_ids_keys_at_the_edges_are_accepted() -> None:
    report = decode(12, payload(with_value(12, ("operationIds",), {"1": "a", str(GID_LAST): "b"})))
    assert isinstance(report, TaskReport)
    assert report.operation_ids == {1: "a", GID_LAST: "b"}


@pytest.mark.parametrize(
    "node_id", ["", "x" * 65, "bad id!", "node\n", "nöde", "node/1", "node:1"], ids=repr
)
def test_login_node_id_outside_its_pattern_is_bad_message(node_id: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(1, payload({"nodeId": node_id, "signature": "ab" * 32}))
    assert info.value.code == "bad_message"


def test_login_node_id_at_its_longest_is_accepted() -> None:
    node_id = "A-z_0.9" * 9 + "x"  # 64 characters of the allowed ones
    assert decode(1, payload({"nodeId": node_id, "signature": "s"})) == Login(node_id, "s")


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\uDC00x", "a\\ud83d"], ids=repr)
def test_a_lone_surrogate_escape_is_bad_json(escape: str) -> None:
    # json.loads would hand on a str that neither UTF-8 nor SQLite can store.
    raw = b'{"reportId":"r","result":"APPLIED","extra":"' + escape.encode() + b'"}'
    with pytest.raises(ProtocolError) as info:
        decode(13, raw)
    assert info.value.code == "bad_json"


def test_a_paired_surrogate_escape_is_one_character() -> None:
    ack = decode(13, b'{"reportId":"\\ud83d\\ude00","result":"APPLIED"}')
    assert ack == TaskReportAck("\U0001f600", "APPLIED")
    # An escaped backslash before "ud800" is not an escape of a surrogate.
    ack = decode(13, b'{"reportId":"\\\\ud800","result":"APPLIED"}')
    assert ack == TaskReportAck("\\ud800", "APPLIED")


# ---------------------------------------------------------------- property-based


def in_bounds_problems(message: Message) -> list[str]:
    """What about ``message`` is outside PROTOCOL.md's bounds (the oracle)."""
    problems: list[str] = []

    def gid(value: Any, where: str) -> None:
        if type(value) is not int or not 1 <= value <= GID_LAST:
            problems.append(f"{where} gid {value!r}")

    def identifier(value: Any, where: str) -> None:
        if type(value) is not str or not 1 <= len(value) <= ID_LAST:
            problems.append(f"{where} identifier of length {len(value)}")

    def int63(value: Any, where: str) -> None:
        if type(value) is not int or not 0 <= value <= INT63_LAST:
            problems.append(f"{where} {value!r}")

    def name(value: Any, where: str) -> None:
        if type(value) is not str or len(value) > NAME_LAST:
            problems.append(f"{where} name of length {len(value)}")

    def entries(tasks: tuple[TaskEntry, ...], where: str, v2: bool) -> None:
        for g, status, progress, queued, detail, size, sha256 in tasks:
            gid(g, where)
            if sha256:
                int63(size, f"{where} size")
                if not v2 or status != 4 or re.fullmatch(r"[0-9a-f]{64}", sha256) is None:
                    problems.append(f"{where} sha256 {sha256!r}")
            if type(status) is not int or not 1 <= status <= 4:
                problems.append(f"{where} status {status!r}")
            if type(progress) is not float or not 0.0 <= progress <= 1.0:
                problems.append(f"{where} progress {progress!r}")
            if type(queued) is not bool or (queued and not v2):
                problems.append(f"{where} queued {queued!r}")
            if type(detail) is not str or len(detail) > DETAIL_LAST or (detail and not v2):
                problems.append(f"{where} detail of length {len(detail)}")

    for value in leaves(message):
        if isinstance(value, str) and "\x00" in value:
            problems.append(f"a NUL in {value!r}")

    m: Any = message
    if isinstance(m, Identity):
        name(m.name, "Identity")
    elif isinstance(m, Login):
        if type(m.node_id) is not str or NODE_ID_PATTERN.fullmatch(m.node_id) is None:
            problems.append(f"nodeId {m.node_id!r}")
    elif isinstance(m, Heartbeat):
        int63(m.time, "Heartbeat.time")
    elif isinstance(m, DownloadPost):
        gid(m.gid, "DownloadPost")
        name(m.name, "DownloadPost")
    elif isinstance(m, DeleteGallery | DeleteResult):
        gid(m.gid, type(m).__name__)
    elif isinstance(m, StatusReport):
        entries(m.gallery_tasks, "StatusReport", False)
    elif isinstance(m, TaskCommand):
        identifier(m.operation_id, "TaskCommand.operationId")
        gid(m.gid, "TaskCommand")
        name(m.name, "TaskCommand")
        int63(m.size, "TaskCommand.size")
    elif isinstance(m, TaskReport):
        identifier(m.report_id, "TaskReport.reportId")
        int63(m.revision, "TaskReport.revision")
        entries(m.gallery_tasks, "TaskReport", True)
        for key, value in m.operation_ids.items():
            gid(key, "operationIds key")
            identifier(value, "operationIds value")
        for entry_gid, operation_id, _result, _reason in m.deleted:
            gid(entry_gid, "deleted")
            identifier(operation_id, "deleted.operationId")
        for entry_gid, operation_id, _reason in m.released:
            gid(entry_gid, "released")
            identifier(operation_id, "released.operationId")
    elif isinstance(m, TaskReportAck):
        identifier(m.report_id, "TaskReportAck.reportId")
    elif isinstance(m, NodeChallenge):
        identifier(m.nonce, "NodeChallenge.nonce")
    elif isinstance(m, SiteProof):
        identifier(m.signature, "SiteProof.signature")
    elif isinstance(m, ProtocolHello):
        for url in (m.archive_url, m.serve_url):
            if len(url) > 2048:
                problems.append(f"ProtocolHello URL of length {len(url)}")
    elif isinstance(m, ArchiveInventory):
        identifier(m.inventory_id, "ArchiveInventory.inventoryId")
        if not 1 <= m.part <= m.parts:
            problems.append(f"ArchiveInventory part {m.part} of {m.parts}")
        for entry_gid, operation_id, size, sha256 in m.archives:
            gid(entry_gid, "ArchiveInventory")
            identifier(operation_id, "ArchiveInventory.operationId")
            int63(size, "ArchiveInventory.size")
            if re.fullmatch(r"[0-9a-f]{64}", sha256) is None:
                problems.append(f"ArchiveInventory sha256 {sha256!r}")
    elif isinstance(m, ArchiveInventoryAck):
        identifier(m.inventory_id, "ArchiveInventoryAck.inventoryId")
    return problems


def leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, str | int | float):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from leaves(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(k)
            yield from leaves(v)
    elif hasattr(value, "__slots__"):  # our frozen dataclasses
        for slot in value.__slots__:
            # The one unbounded int (PROTOCOL.md gives it no bound): it is only
            # compared with 2, never stored.
            if not (isinstance(value, ProtocolHello) and slot == "protocol_version"):
                yield from leaves(getattr(value, slot))


_sqlite = sqlite3.connect(":memory:")


def assert_storable(message: Message) -> None:
    """Every str and int of ``message`` goes through a real SQLite bind unchanged."""
    for value in leaves(message):
        if isinstance(value, bool):
            continue
        (back,) = _sqlite.execute("SELECT ?", (value,)).fetchone()
        assert back == value


def sized_text(length: int) -> st.SearchStrategy[str]:
    return st.text(min_size=length, max_size=length, alphabet="ab名é-_.9")


SURROGATES = ["\ud800", "\udfff", "\ud83d\ude00", "\udc00\ud800"]
NULS = ["\x00", "a\x00", "\x00\x00b"]
boundary_ints = st.sampled_from(
    [-(2**63) - 1, -(2**63), -1, 0, 1, 2, 4, 5, GID_LAST, GID_LAST + 1, INT63_LAST, INT63_LAST + 1]
)
boundary_texts = st.one_of(
    st.sampled_from([0, 1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025]).flatmap(
        sized_text
    ),
    st.lists(
        st.one_of(st.characters(), st.sampled_from(SURROGATES), st.sampled_from(NULS)),
        max_size=8,
    ).map("".join),
    st.from_regex(NODE_ID_PATTERN, fullmatch=True),
    st.sampled_from(["DOWNLOAD", "DELETE", "APPLIED", "DUPLICATE", "DELETED", "NOT_FOUND"]),
    st.sampled_from(["FAILED", "1", "0", str(GID_LAST), str(GID_LAST + 1), "reliable-task-v2"]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    boundary_ints,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1.0, -0.0, 1.0000001, -1e-300, 1e308]),
    boundary_texts,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(boundary_texts, inner, max_size=4)
    ),
    max_leaves=12,
)


def same_kind(value: Any) -> st.SearchStrategy[Any]:
    """Values of ``value``'s JSON type, mostly at and around the bounds."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(boundary_ints, st.integers())
    if isinstance(value, float):
        return st.one_of(st.floats(allow_nan=False), st.sampled_from([0.0, 1.0, 1.0000001]))
    return boundary_texts


def leaf_paths(value: Any, path: Path = ()) -> Iterator[Path]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaf_paths(item, (*path, index))
    yield path  # containers too: they can be replaced as a whole


def replace(obj: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    target = obj
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return obj


@st.composite
def hostile_frames(draw: st.DrawFn) -> tuple[int, bytes]:
    """A valid payload of a random type with one or two of its parts replaced
    (mostly by values of the same JSON type at and around the bounds, else by
    any JSON value), list entries repeated, fields dropped or added."""
    type_ = draw(st.sampled_from(TYPES))
    obj: Any = valid_payloads()[type_]
    for field_list in ("galleryTasks", "deleted"):
        if field_list in obj and draw(st.booleans()):
            obj[field_list] = obj[field_list] * draw(st.integers(0, 3))
    if "operationIds" in obj and draw(st.booleans()):
        obj["operationIds"][draw(boundary_texts)] = draw(boundary_texts)
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(list(leaf_paths(obj))))
        parent: Any = obj
        for step in path[:-1]:
            parent = parent[step]
        # (A parent may be a list by now: an earlier round replaced operationIds.)
        if path[-2:-1] == ("operationIds",) and type(parent) is dict and draw(st.booleans()):
            parent[draw(boundary_texts)] = parent.pop(path[-1])  # the key instead of the value
            continue
        current = parent[path[-1]] if path else obj
        kind = same_kind(current) if not isinstance(current, dict | list) else json_values
        obj = replace(obj, path, draw(st.one_of(kind, kind, kind, json_values)))
    if isinstance(obj, dict) and draw(st.integers(0, 3)) == 0:
        if obj and draw(st.booleans()):
            del obj[draw(st.sampled_from(sorted(obj)))]
        obj.update(draw(st.dictionaries(boundary_texts, json_values, max_size=2)))
    try:
        raw = json.dumps(obj, ensure_ascii=draw(st.booleans())).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only its \\u escape can be sent
        raw = json.dumps(obj, ensure_ascii=True).encode("utf-8")
    return type_, raw


def decoded_or_refused(type_: int, raw: bytes, strict: bool) -> Message | None:
    try:
        return decode(type_, raw, strict=strict)
    except ProtocolError as e:
        assert e.code in {"bad_json", "bad_message"}
        return None
    except UnknownMessageType:
        assert strict and type_ > 9
        return None


# No deadline: a wall-clock limit would only measure how loaded the machine is.
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_frames(), st.booleans())
def test_arbitrary_field_values_never_escape_the_parser_or_the_bounds(
    frame: tuple[int, bytes], strict: bool
) -> None:
    type_, raw = frame
    message = decoded_or_refused(type_, raw, strict)  # any other exception fails the test
    if message is not None:
        assert message.TYPE == type_
        assert in_bounds_problems(message) == []
        assert_storable(message)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TYPES), json_values, st.booleans())
def test_any_json_document_never_escapes_the_parser(type_: int, value: Any, strict: bool) -> None:
    try:
        raw = json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raw = json.dumps(value).encode("utf-8")
    message = decoded_or_refused(type_, raw, strict)
    if message is not None:
        assert in_bounds_problems(message) == []
        assert_storable(message)


def test_the_oracle_sees_what_is_outside() -> None:
    # The property above is only as good as its oracle: it must flag each bound.
    bad: list[Message] = [
        Heartbeat(-1),
        Heartbeat(INT63_LAST + 1),
        Identity("n" * (NAME_LAST + 1), "x"),
        Login("bad id", "s"),
        DeleteGallery(0),
        DeleteResult(GID_LAST + 1, True, ""),
        DownloadPost(1, "t", "n" * (NAME_LAST + 1), "u"),
        StatusReport((TaskEntry(0, 1, 0.5),)),
        TaskCommand("", "DOWNLOAD", 1, "n", "u"),
        TaskCommand("o", "DOWNLOAD", 1, "n", "u", -1),
        TaskCommand("o", "DOWNLOAD", 1, "n\x00", "u"),
        StatusReport((TaskEntry(1, 1, 0.5, True),)),
        StatusReport((TaskEntry(1, 1, 0.5, False, "d"),)),
        TaskReport("r", 1, (TaskEntry(1, 1, 0.5, False, "d" * (DETAIL_LAST + 1)),), {}, ()),
        NodeChallenge(""),
        SiteProof("s" * (ID_LAST + 1)),
        Identity("n", "a\x00"),
        TaskReport("r" * (ID_LAST + 1), 1, (), {}, ()),
        TaskReport("r", INT63_LAST + 1, (), {}, ()),
        TaskReport("r", 1, (), {GID_LAST + 1: "op"}, ()),
        TaskReport("r", 1, (), {1: ""}, ()),
        TaskReport("r", 1, (), {}, (DeletedEntry(1, "o" * (ID_LAST + 1), "DELETED", ""),)),
        TaskReportAck("", "APPLIED"),
    ]
    for message in bad:
        assert in_bounds_problems(message), message
    assert in_bounds_problems(ProtocolHello()) == []
