"""The eighteen message types of the site ⇄ node protocol (PROTOCOL.md).

Each message is a frozen dataclass with snake_case attributes; on the wire the
payload is a compact JSON object with camelCase names in the order the spec
lists them.  :func:`encode` gives a whole frame, :func:`decode` turns one
frame's payload back into a message and checks every field's type.

Speed matters (BENCH.md B3): both directions run on orjson (a C JSON library)
with the standard library's ``json`` as the reference it must agree with byte
for byte: the writer falls back to the reference whenever orjson would spell
something differently, and the reader hands every payload orjson or a field
check refuses to the reference reader, so each error is the reference's.  The
list entries of reports are named tuples built without a Python ``__init__``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar, NamedTuple

import orjson

__all__ = [
    "ACTION_CANCEL",
    "ACTION_DELETE",
    "ACTION_DOWNLOAD",
    "ACK_APPLIED",
    "ACK_DUPLICATE",
    "DELETE_DELETED",
    "DELETE_FAILED",
    "DELETE_NOT_FOUND",
    "DETAIL_MAX",
    "ERROR_CODES",
    "FEATURE_ARCHIVE_INVENTORY",
    "FEATURE_RELIABLE",
    "FEATURE_SITE_PROOF",
    "GID_MAX",
    "GID_MIN",
    "HEADER",
    "IDENTIFIER_MAX",
    "INT63_MAX",
    "INVENTORY_PART_MAX",
    "LEGACY_TYPES",
    "MESSAGE_TYPES",
    "MAX_PAYLOAD",
    "NAME_MAX",
    "NODE_ID",
    "PRE_LOGIN_MAX_PAYLOAD",
    "PRE_LOGIN_TYPES",
    "PROTOCOL_VERSION",
    "RELEASE_REASONS",
    "SHA256_HEX",
    "URL_MAX",
    "ArchiveInventory",
    "ArchiveInventoryAck",
    "DeleteGallery",
    "DeleteResult",
    "DeletedEntry",
    "DownloadPost",
    "Error",
    "Goodbye",
    "Heartbeat",
    "Identity",
    "Login",
    "LoginResult",
    "Message",
    "NodeChallenge",
    "ProtocolError",
    "ProtocolHello",
    "ReleasedEntry",
    "HeldArchive",
    "SiteProof",
    "StatusReport",
    "TaskCommand",
    "TaskEntry",
    "TaskReport",
    "TaskReportAck",
    "UnknownMessageType",
    "decode",
    "encode",
    "encode_payload",
    "sign_login",
    "sign_site_proof",
    "verify_login",
    "verify_site_proof",
]

MAX_PAYLOAD = 16 * 1024 * 1024
#: Before login a peer may send at most this much in one frame (PROTOCOL.md, "Bounds").
PRE_LOGIN_MAX_PAYLOAD = 64 * 1024
PROTOCOL_VERSION = 2
FEATURE_RELIABLE = "reliable-task-v2"
#: A node that announces it wants the site to prove itself (PROTOCOL.md,
#: "Mutual authentication (v2)"): NodeChallenge after LoginResult, SiteProof back.
FEATURE_SITE_PROOF = "site-proof"
#: A node that sends ArchiveInventory (types 16 and 17) once proven (PROTOCOL.md, "Archives").
FEATURE_ARCHIVE_INVENTORY = "archive-inventory"

#: A valid ``Login.nodeId`` (PROTOCOL.md); match with ``NODE_ID.fullmatch``.
#: The one definition: the site, its node-key table and the node all use it.
NODE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")

#: ``[type: u8][length: u32 big-endian]``
HEADER = struct.Struct(">BI")

ERROR_CODES = frozenset(
    {
        "bad_frame",
        "frame_too_large",
        "bad_json",
        "bad_message",
        "unauthenticated",
        "auth_failed",
        "protocol_violation",
        "internal",
    }
)

ACTION_DOWNLOAD = "DOWNLOAD"
ACTION_DELETE = "DELETE"
#: v2 only: stop that generation, remove its files, release it (PROTOCOL.md, "Archives").
ACTION_CANCEL = "CANCEL"
ACK_APPLIED = "APPLIED"
ACK_DUPLICATE = "DUPLICATE"
DELETE_DELETED = "DELETED"
DELETE_NOT_FOUND = "NOT_FOUND"
DELETE_FAILED = "FAILED"

_ACTIONS = frozenset({ACTION_DOWNLOAD, ACTION_DELETE, ACTION_CANCEL})
_ACK_RESULTS = frozenset({ACK_APPLIED, ACK_DUPLICATE})
_DELETE_RESULTS = frozenset({DELETE_DELETED, DELETE_NOT_FOUND, DELETE_FAILED})
#: Why a node stopped holding an archive (a ``released`` entry's ``reason``).
RELEASE_REASONS = frozenset({"EXPIRED", "DISK_BUDGET", "CORRUPT", "MISSING", "CANCELLED"})
_STR_ONLY = frozenset({str})

# PROTOCOL.md "Bounds (both sides)": a received value outside these is
# bad_message (the connection closes and nothing is committed).
GID_MIN = 1
GID_MAX = 2**31 - 1
#: ``revision`` and ``time``: 0 .. 2^63 - 1 (they fit SQLite's signed INTEGER).
INT63_MAX = 2**63 - 1
#: ``reportId`` and ``operationId``: 1 .. 128 characters.
IDENTIFIER_MAX = 128
#: ``name``: at most 1,024 characters.
NAME_MAX = 1024
#: A TaskReport entry's ``detail``: at most 256 characters.
DETAIL_MAX = 256
#: ``archiveUrl`` and ``serveUrl`` of a ProtocolHello: at most this many characters.
URL_MAX = 2048
#: An ArchiveInventory part lists at most this many archives.
INVENTORY_PART_MAX = 10_000
#: An archive digest on the wire: exactly 64 lowercase hex characters.
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_GID_DIGITS_MAX = len(str(GID_MAX))
# No string of any message may hold a NUL (PROTOCOL.md "Bounds"); raw control
# characters are not JSON at all, so a NUL can only arrive as this escape.
_NUL_ESCAPE = b"\\u0000"
# A \uD800-\uDFFF escape: json.loads turns a lone one into a str that
# neither UTF-8 nor SQLite can take.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class ProtocolError(Exception):
    """A frame or message that breaks the protocol; ``code`` is a PROTOCOL.md error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class UnknownMessageType(Exception):
    """A frame of a type this reader does not know (ignored after login)."""

    def __init__(self, type_: int) -> None:
        super().__init__(f"unknown message type {type_}")
        self.type_ = type_


# ---------------------------------------------------------------- list entries


class TaskEntry(NamedTuple):
    """One ``galleryTasks`` entry: node status code 1..4, progress 0.0..1.0.

    ``queued`` (held, not started) and ``detail`` (at most 256 characters,
    what a person should know) are carried by v2 TaskReport entries only,
    and only when they say something; a legacy StatusReport never has them.
    A v2 completion (status 4) may carry the archive's ``size`` and
    ``sha256`` (together; ``sha256`` ``""`` means neither was sent).
    """

    gid: int
    status: int
    progress: float
    queued: bool = False
    detail: str = ""
    size: int = 0
    sha256: str = ""


class ReleasedEntry(NamedTuple):
    """One ``released`` entry of a TaskReport: the node no longer holds that generation."""

    gid: int
    operation_id: str
    reason: str


class HeldArchive(NamedTuple):
    """One ``archives`` entry of an ArchiveInventory: a generation the node holds whole."""

    gid: int
    operation_id: str
    size: int
    sha256: str


class DeletedEntry(NamedTuple):
    """One ``deleted`` entry of a TaskReport; ``operation_id`` is the delete operation id."""

    gid: int
    operation_id: str
    result: str
    reason: str


# ---------------------------------------------------------------- messages 0-9


@dataclass(frozen=True, slots=True)
class Identity:
    TYPE: ClassVar[int] = 0
    name: str
    nonce: str


@dataclass(frozen=True, slots=True)
class Login:
    TYPE: ClassVar[int] = 1
    node_id: str
    signature: str


@dataclass(frozen=True, slots=True)
class LoginResult:
    TYPE: ClassVar[int] = 2
    accepted: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    TYPE: ClassVar[int] = 3
    time: int


@dataclass(frozen=True, slots=True)
class DownloadPost:
    TYPE: ClassVar[int] = 4
    gid: int
    token: str
    name: str
    url: str


@dataclass(frozen=True, slots=True)
class DeleteGallery:
    TYPE: ClassVar[int] = 5
    gid: int


@dataclass(frozen=True, slots=True)
class StatusReport:
    TYPE: ClassVar[int] = 6
    gallery_tasks: tuple[TaskEntry, ...]


@dataclass(frozen=True, slots=True)
class DeleteResult:
    TYPE: ClassVar[int] = 7
    gid: int
    success: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Error:
    TYPE: ClassVar[int] = 8
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Goodbye:
    TYPE: ClassVar[int] = 9
    reason: str


# ---------------------------------------------------------------- messages 10-13


@dataclass(frozen=True, slots=True)
class ProtocolHello:
    TYPE: ClassVar[int] = 10
    protocol_version: int = PROTOCOL_VERSION
    features: tuple[str, ...] = (FEATURE_RELIABLE,)
    #: Where users reach the node's archive endpoint ("" = none: through the site).
    archive_url: str = ""
    #: Where the site reaches it ("" = the node does not serve).
    serve_url: str = ""


@dataclass(frozen=True, slots=True)
class TaskCommand:
    TYPE: ClassVar[int] = 11
    operation_id: str
    action: str
    gid: int
    name: str
    url: str = ""
    #: Bytes the site expects the archive to have (from ``prepare``); 0 = unknown.
    size: int = 0


@dataclass(frozen=True, slots=True)
class TaskReport:
    TYPE: ClassVar[int] = 12
    report_id: str
    revision: int
    gallery_tasks: tuple[TaskEntry, ...]
    operation_ids: Mapping[int, str]
    deleted: tuple[DeletedEntry, ...] = ()
    released: tuple[ReleasedEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class TaskReportAck:
    TYPE: ClassVar[int] = 13
    report_id: str
    result: str


# ---------------------------------------------------------------- messages 14-15 (mutual auth)


@dataclass(frozen=True, slots=True)
class NodeChallenge:
    TYPE: ClassVar[int] = 14
    nonce: str


@dataclass(frozen=True, slots=True)
class SiteProof:
    TYPE: ClassVar[int] = 15
    signature: str


# ---------------------------------------------------------------- messages 16-17 (archives)


@dataclass(frozen=True, slots=True)
class ArchiveInventory:
    TYPE: ClassVar[int] = 16
    inventory_id: str
    part: int
    parts: int
    archives: tuple[HeldArchive, ...] = ()


@dataclass(frozen=True, slots=True)
class ArchiveInventoryAck:
    TYPE: ClassVar[int] = 17
    inventory_id: str
    part: int


Message = (
    Identity
    | Login
    | LoginResult
    | Heartbeat
    | DownloadPost
    | DeleteGallery
    | StatusReport
    | DeleteResult
    | Error
    | Goodbye
    | ProtocolHello
    | TaskCommand
    | TaskReport
    | TaskReportAck
    | NodeChallenge
    | SiteProof
    | ArchiveInventory
    | ArchiveInventoryAck
)

# ---------------------------------------------------------------- encoding

#: The reference writer (PROTOCOL.md's compact JSON); orjson must match it byte for byte.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_pack_header = HEADER.pack
_fast_dumps = orjson.dumps
_INT_KEYS = orjson.OPT_NON_STR_KEYS  # operationIds: int gids written as decimal strings
_progress = itemgetter(2)
_FLOAT_ONLY = frozenset({float})
#: Below this orjson and repr() spell a float differently ("0.00001" vs "1e-05").
_FAST_FLOAT_MIN = 1e-4


def _entries_json(tasks: tuple[TaskEntry, ...]) -> str:
    # The JSON of a galleryTasks list, formatted directly: the generic encoder
    # spends most of a large report's time on these small objects (BENCH B3).
    # repr(float) is exactly what json uses for floats; float() so that a
    # progress given as int 1 still goes out as 1.0.
    return ",".join(
        [
            f'{{"gid":{g},"status":{s},"progress":{float(p)!r}}}'
            if not (q or d or h)
            else _entry_json_extra(g, s, p, q, d, n, h)
            for g, s, p, q, d, n, h in tasks
        ]
    )


def _entry_json_extra(g: int, s: int, p: float, q: bool, d: str, n: int, h: str) -> str:
    """A v2 entry that says more: ``queued`` only when true, ``detail`` only when
    not empty, ``size`` and ``sha256`` only when a digest is known."""
    queued = ',"queued":true' if q else ""
    detail = f',"detail":{_dumps(d)}' if d else ""
    digest = f',"size":{n},"sha256":{_dumps(h)}' if h else ""
    return f'{{"gid":{g},"status":{s},"progress":{float(p)!r}{queued}{detail}{digest}}}'


def _legacy_entries_json(tasks: tuple[TaskEntry, ...]) -> str:
    """A StatusReport's entries: the three frozen fields, never ``queued``/``detail``."""
    return ",".join(
        [f'{{"gid":{g},"status":{s},"progress":{float(p)!r}}}' for g, s, p, *_ in tasks]
    )


def _task_report_json(m: TaskReport) -> str:
    ids = m.operation_ids
    # The encoder writes int keys as decimal strings, as the wire wants.
    ids_json = _dumps(ids if type(ids) is dict else dict(ids))
    deleted = _dumps(
        [{"gid": g, "operationId": o, "result": r, "reason": why} for g, o, r, why in m.deleted]
    )
    released = f',"released":{_dumps(_released_objects(m.released))}' if m.released else ""
    return (
        f'{{"reportId":{_dumps(m.report_id)},"revision":{m.revision},'
        f'"galleryTasks":[{_entries_json(m.gallery_tasks)}],'
        f'"operationIds":{ids_json},"deleted":{deleted}{released}}}'
    )


def _released_objects(released: tuple[ReleasedEntry, ...]) -> list[dict[str, Any]]:
    return [{"gid": g, "operationId": o, "reason": why} for g, o, why in released]


def _fast_floats(tasks: tuple[TaskEntry, ...]) -> bool:
    """Whether orjson writes every ``progress`` exactly as repr() (the reference) does.

    That holds for floats of 1e-4 and more, and zero (measured over every
    decade of doubles, see test_codec); ints (written as 1.0 by the reference)
    and NaN/inf take the reference path.  C loops only: this is the hot path.
    """
    ps = list(map(_progress, tasks))
    if set(map(type, ps)) - _FLOAT_ONLY:
        return False
    smallest = min(filter(None, ps), default=1.0)  # filter(None): zeros are fine
    return _FAST_FLOAT_MIN <= smallest and max(ps, default=0.0) <= 1.0 and math.isfinite(sum(ps))


def _entry_objects(tasks: tuple[TaskEntry, ...]) -> list[dict[str, Any]]:
    return [
        {"gid": g, "status": s, "progress": p}
        if not (q or d or h)
        else _entry_object(g, s, p, q, d, n, h)
        for g, s, p, q, d, n, h in tasks
    ]


def _entry_object(g: int, s: int, p: float, q: bool, d: str, n: int, h: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"gid": g, "status": s, "progress": p}
    if q:
        entry["queued"] = True
    if d:
        entry["detail"] = d
    if h:
        entry["size"] = n
        entry["sha256"] = h
    return entry


def _legacy_entry_objects(tasks: tuple[TaskEntry, ...]) -> list[dict[str, Any]]:
    return [{"gid": g, "status": s, "progress": p} for g, s, p, *_ in tasks]


def _task_report_fast(m: TaskReport) -> bytes:
    ids = m.operation_ids
    body: dict[str, Any] = {
        "reportId": m.report_id,
        "revision": m.revision,
        "galleryTasks": _entry_objects(m.gallery_tasks),
        "operationIds": ids if type(ids) is dict else dict(ids),
        "deleted": [
            {"gid": g, "operationId": o, "result": r, "reason": why} for g, o, r, why in m.deleted
        ],
    }
    if m.released:
        body["released"] = _released_objects(m.released)
    return _fast_dumps(body, option=_INT_KEYS)


def _fast_payload(message: Message) -> bytes:
    """orjson's bytes for ``message``; TypeError where only the reference writer can."""
    t = message.TYPE
    if t == 12:
        if _fast_floats(message.gallery_tasks):  # type: ignore[union-attr]
            return _task_report_fast(message)  # type: ignore[arg-type]
        return _task_report_json(message).encode("utf-8")  # type: ignore[arg-type]
    if t == 6:
        tasks = message.gallery_tasks  # type: ignore[union-attr]
        if _fast_floats(tasks):
            return _fast_dumps({"galleryTasks": _legacy_entry_objects(tasks)})
        return f'{{"galleryTasks":[{_legacy_entries_json(tasks)}]}}'.encode()
    return _fast_dumps(_wire(message))


def _wire(message: Message) -> dict[str, Any]:
    """The JSON object of ``message``, fields in the order of PROTOCOL.md (not 6, 12)."""
    m: Any = message
    t = m.TYPE
    if t == 3:
        return {"time": m.time}
    if t == 13:
        return {"reportId": m.report_id, "result": m.result}
    if t == 11:
        return {
            "operationId": m.operation_id,
            "action": m.action,
            "gid": m.gid,
            "name": m.name,
            "url": m.url,
            "size": m.size,
        }
    if t == 4:
        return {"gid": m.gid, "token": m.token, "name": m.name, "url": m.url}
    if t == 5:
        return {"gid": m.gid}
    if t == 7:
        return {"gid": m.gid, "success": m.success, "reason": m.reason}
    if t == 0:
        return {"name": m.name, "nonce": m.nonce}
    if t == 1:
        return {"nodeId": m.node_id, "signature": m.signature}
    if t == 2:
        return {"accepted": m.accepted, "reason": m.reason}
    if t == 8:
        return {"code": m.code, "message": m.message}
    if t == 9:
        return {"reason": m.reason}
    if t == 10:
        hello: dict[str, Any] = {
            "protocolVersion": m.protocol_version,
            "features": list(m.features),
        }
        if m.archive_url:
            hello["archiveUrl"] = m.archive_url
        if m.serve_url:
            hello["serveUrl"] = m.serve_url
        return hello
    if t == 14:
        return {"nonce": m.nonce}
    if t == 15:
        return {"signature": m.signature}
    if t == 16:
        return {
            "inventoryId": m.inventory_id,
            "part": m.part,
            "parts": m.parts,
            "archives": [
                {"gid": g, "operationId": o, "size": n, "sha256": h} for g, o, n, h in m.archives
            ],
        }
    if t == 17:
        return {"inventoryId": m.inventory_id, "part": m.part}
    raise TypeError(f"not a protocol message: {message!r}")


def _json(message: Message) -> str:
    t = message.TYPE
    if t == 12:
        return _task_report_json(message)  # type: ignore[arg-type]
    if t == 6:
        return f'{{"galleryTasks":[{_legacy_entries_json(message.gallery_tasks)}]}}'  # type: ignore[union-attr]
    return _dumps(_wire(message))


def encode_payload(message: Message) -> bytes:
    """The compact JSON payload of ``message`` (no header)."""
    try:
        return _fast_payload(message)
    except TypeError:
        # orjson.JSONEncodeError (a TypeError): an int beyond 64 bits, which the
        # reference writes, or a lone surrogate, for which the reference raises
        # UnicodeEncodeError as it always did.
        return _json(message).encode("utf-8")


def encode(message: Message) -> bytes:
    """The whole frame of ``message``: 5-byte header then compact JSON."""
    payload = encode_payload(message)
    return _pack_header(message.TYPE, len(payload)) + payload


# ---------------------------------------------------------------- decoding


def _bad(message: str) -> ProtocolError:
    return ProtocolError("bad_message", message)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_loads = json.JSONDecoder(parse_constant=_reject_constant).decode


def _field(d: dict[str, Any], where: str, key: str, kind: type) -> Any:
    try:
        value = d[key]
    except KeyError:
        raise _bad(f"{where}.{key} is missing") from None
    # type() rather than isinstance(): a JSON true must not pass for an int.
    if type(value) is not kind:
        raise _bad(f"{where}.{key} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _gid(d: dict[str, Any], where: str) -> int:
    gid = _field(d, where, "gid", int)
    if not GID_MIN <= gid <= GID_MAX:
        raise _bad(f"{where}.gid must be {GID_MIN}..{GID_MAX}, got {gid}")
    return gid


def _identifier(d: dict[str, Any], where: str, key: str) -> str:
    value = _field(d, where, key, str)
    if not 1 <= len(value) <= IDENTIFIER_MAX:
        raise _bad(f"{where}.{key} must be 1..{IDENTIFIER_MAX} characters, got {len(value)}")
    return value


def _name(d: dict[str, Any], where: str) -> str:
    value = _field(d, where, "name", str)
    if len(value) > NAME_MAX:
        raise _bad(f"{where}.name must be at most {NAME_MAX} characters, got {len(value)}")
    return value


def _int63(d: dict[str, Any], where: str, key: str) -> int:
    value = _field(d, where, key, int)
    if not 0 <= value <= INT63_MAX:
        raise _bad(f"{where}.{key} must be 0..2^63-1, got {value}")
    return value


def _task_entries(raw: Any, where: str, strict: bool, v2: bool) -> tuple[TaskEntry, ...]:
    """``galleryTasks``; ``v2`` (a TaskReport) also reads ``queued`` and ``detail``."""
    if type(raw) is not list:
        raise _bad(f"{where}.galleryTasks must be a list")
    out = []
    new = tuple.__new__
    for e in raw:
        if type(e) is not dict:
            raise _bad(f"{where}.galleryTasks entry must be an object")
        try:
            g = e["gid"]
            s = e["status"]
            p = e["progress"]
        except KeyError as missing:
            raise _bad(f"{where}.galleryTasks entry lacks {missing}") from None
        if type(g) is not int or not GID_MIN <= g <= GID_MAX:
            raise _bad(f"{where}.galleryTasks gid must be an int {GID_MIN}..{GID_MAX}: {g!r}")
        if type(s) is not int or not 1 <= s <= 4:
            raise _bad(f"{where}.galleryTasks status must be 1..4: {s!r}")
        if type(p) is not float:
            if type(p) is not int:
                raise _bad(f"{where}.galleryTasks progress must be a number: {p!r:.40}")
            if not 0 <= p <= 1:  # before float(): float(10**400) raises OverflowError
                raise _bad(f"{where}.galleryTasks progress must be 0.0..1.0: {p!r:.40}")
            p = float(p)
        if not 0.0 <= p <= 1.0:
            raise _bad(f"{where}.galleryTasks progress must be 0.0..1.0: {p!r}")
        if len(e) == 3:  # the common case: nothing more to read
            out.append(new(TaskEntry, (g, s, p, False, "", 0, "")))
            continue
        if strict:
            raise _bad(f"{where}.galleryTasks entry has unknown fields: {sorted(e)}")
        q: Any = False
        d: Any = ""
        n: Any = 0
        h: Any = ""
        if v2:
            q = e.get("queued", False)
            d = e.get("detail", "")
            if type(q) is not bool:
                raise _bad(f"{where}.galleryTasks queued must be a bool: {q!r:.40}")
            if type(d) is not str:
                raise _bad(f"{where}.galleryTasks detail must be a str: {d!r:.40}")
            if len(d) > DETAIL_MAX:
                raise _bad(
                    f"{where}.galleryTasks detail must be at most {DETAIL_MAX} characters,"
                    f" got {len(d)}"
                )
            if "size" in e or "sha256" in e:
                n, h = _archive_digest(e, s, where)
        out.append(new(TaskEntry, (g, s, p, q, d, n, h)))
    return tuple(out)


def _archive_digest(e: dict[str, Any], status: int, where: str) -> tuple[int, str]:
    """A completion's ``size`` and ``sha256``: both or neither, status 4 only."""
    if status != 4:
        raise _bad(f"{where}.galleryTasks size and sha256 belong to status 4 only")
    n = _int63(e, f"{where}.galleryTasks", "size")
    return n, _sha256(e, f"{where}.galleryTasks")


def _sha256(d: dict[str, Any], where: str) -> str:
    value = _field(d, where, "sha256", str)
    if SHA256_HEX.fullmatch(value) is None:
        raise _bad(f"{where}.sha256 must be 64 lowercase hex characters: {value!r:.80}")
    return value


def _url(d: dict[str, Any], where: str, key: str) -> str:
    if key not in d:
        return ""
    value = _field(d, where, key, str)
    if len(value) > URL_MAX:
        raise _bad(f"{where}.{key} must be at most {URL_MAX} characters, got {len(value)}")
    return value


def _d_identity(d: dict[str, Any], strict: bool) -> Identity:
    return Identity(_name(d, "Identity"), _field(d, "Identity", "nonce", str))


def _d_login(d: dict[str, Any], strict: bool) -> Login:
    node_id = _field(d, "Login", "nodeId", str)
    if NODE_ID.fullmatch(node_id) is None:
        raise _bad(f"Login.nodeId must match {NODE_ID.pattern}: {node_id!r:.80}")
    return Login(node_id, _field(d, "Login", "signature", str))


def _d_login_result(d: dict[str, Any], strict: bool) -> LoginResult:
    return LoginResult(
        _field(d, "LoginResult", "accepted", bool), _field(d, "LoginResult", "reason", str)
    )


def _d_heartbeat(d: dict[str, Any], strict: bool) -> Heartbeat:
    return Heartbeat(_int63(d, "Heartbeat", "time"))


def _d_download_post(d: dict[str, Any], strict: bool) -> DownloadPost:
    w = "DownloadPost"
    return DownloadPost(
        _gid(d, w), _field(d, w, "token", str), _name(d, w), _field(d, w, "url", str)
    )


def _d_delete_gallery(d: dict[str, Any], strict: bool) -> DeleteGallery:
    return DeleteGallery(_gid(d, "DeleteGallery"))


def _d_status_report(d: dict[str, Any], strict: bool) -> StatusReport:
    if "galleryTasks" not in d:
        raise _bad("StatusReport.galleryTasks is missing")
    return StatusReport(_task_entries(d["galleryTasks"], "StatusReport", strict, False))


def _d_delete_result(d: dict[str, Any], strict: bool) -> DeleteResult:
    w = "DeleteResult"
    return DeleteResult(_gid(d, w), _field(d, w, "success", bool), _field(d, w, "reason", str))


def _d_error(d: dict[str, Any], strict: bool) -> Error:
    return Error(_field(d, "Error", "code", str), _field(d, "Error", "message", str))


def _d_goodbye(d: dict[str, Any], strict: bool) -> Goodbye:
    return Goodbye(_field(d, "Goodbye", "reason", str))


def _d_hello(d: dict[str, Any], strict: bool) -> ProtocolHello:
    w = "ProtocolHello"
    version = _field(d, w, "protocolVersion", int)
    features = _field(d, w, "features", list)
    for f in features:
        if type(f) is not str:
            raise _bad(f"{w}.features must be a list of str: {f!r}")
    return ProtocolHello(version, tuple(features), _url(d, w, "archiveUrl"), _url(d, w, "serveUrl"))


def _d_task_command(d: dict[str, Any], strict: bool) -> TaskCommand:
    w = "TaskCommand"
    operation_id = _identifier(d, w, "operationId")
    action = _field(d, w, "action", str)
    if action not in _ACTIONS:
        raise _bad(f"{w}.action must be DOWNLOAD, DELETE or CANCEL, got {action!r}")
    gid = _gid(d, w)
    name = _name(d, w)
    url = _field(d, w, "url", str)
    # Missing in commands of the previous release: 0, "unknown" (PROTOCOL.md).
    size = _int63(d, w, "size") if "size" in d else 0
    return TaskCommand(operation_id, action, gid, name, url, size)


def _operation_ids(raw: dict[str, Any]) -> dict[int, str]:
    """``operationIds``: decimal gid keys in bounds, operation id values in bounds."""
    if not raw:
        return {}
    # Checked in bulk (C loops) rather than key by key: this is the hot path.
    # The length cap comes first: int() of a key of thousands of digits raises.
    keys = "".join(raw)
    values = raw.values()
    if not (
        keys.isascii()
        and keys.isdigit()
        and all(raw)
        and max(map(len, raw)) <= _GID_DIGITS_MAX
        and set(map(type, values)) == _STR_ONLY
    ):
        raise _bad(f"TaskReport.operationIds must map decimal gids to str: {raw!r:.200}")
    gids = list(map(int, raw))
    if min(gids) < GID_MIN or max(gids) > GID_MAX:
        raise _bad(f"TaskReport.operationIds gids must be {GID_MIN}..{GID_MAX}: {raw!r:.200}")
    # all(): no empty string, without a second pass over the lengths.
    if not all(values) or max(map(len, values)) > IDENTIFIER_MAX:
        raise _bad(
            f"TaskReport.operationIds values must be 1..{IDENTIFIER_MAX} characters: {raw!r:.200}"
        )
    return dict(zip(gids, values, strict=True))


def _d_task_report(d: dict[str, Any], strict: bool) -> TaskReport:
    w = "TaskReport"
    report_id = _identifier(d, w, "reportId")
    revision = _int63(d, w, "revision")
    if "galleryTasks" not in d:
        raise _bad(f"{w}.galleryTasks is missing")
    tasks = _task_entries(d["galleryTasks"], w, strict, True)
    operation_ids = _operation_ids(_field(d, w, "operationIds", dict))
    deleted = []
    for e in _field(d, w, "deleted", list):
        if type(e) is not dict:
            raise _bad(f"{w}.deleted entry must be an object")
        result = _field(e, "TaskReport.deleted", "result", str)
        if result not in _DELETE_RESULTS:
            raise _bad(f"{w}.deleted result must be DELETED, NOT_FOUND or FAILED: {result!r}")
        deleted.append(
            DeletedEntry(
                _gid(e, "TaskReport.deleted"),
                _identifier(e, "TaskReport.deleted", "operationId"),
                result,
                _field(e, "TaskReport.deleted", "reason", str),
            )
        )
    released = []
    for e in _field(d, w, "released", list) if "released" in d else ():
        if type(e) is not dict:
            raise _bad(f"{w}.released entry must be an object")
        reason = _field(e, "TaskReport.released", "reason", str)
        if reason not in RELEASE_REASONS:
            raise _bad(f"{w}.released reason must be one of {sorted(RELEASE_REASONS)}: {reason!r}")
        released.append(
            ReleasedEntry(
                _gid(e, "TaskReport.released"),
                _identifier(e, "TaskReport.released", "operationId"),
                reason,
            )
        )
    return TaskReport(report_id, revision, tasks, operation_ids, tuple(deleted), tuple(released))


def _d_task_report_ack(d: dict[str, Any], strict: bool) -> TaskReportAck:
    w = "TaskReportAck"
    report_id = _identifier(d, w, "reportId")
    result = _field(d, w, "result", str)
    if result not in _ACK_RESULTS:
        raise _bad(f"{w}.result must be APPLIED or DUPLICATE, got {result!r}")
    return TaskReportAck(report_id, result)


def _d_node_challenge(d: dict[str, Any], strict: bool) -> NodeChallenge:
    return NodeChallenge(_identifier(d, "NodeChallenge", "nonce"))


def _d_site_proof(d: dict[str, Any], strict: bool) -> SiteProof:
    return SiteProof(_identifier(d, "SiteProof", "signature"))


def _part(d: dict[str, Any], where: str) -> int:
    part = _field(d, where, "part", int)
    if part < 1:
        raise _bad(f"{where}.part must be at least 1, got {part}")
    return part


def _d_archive_inventory(d: dict[str, Any], strict: bool) -> ArchiveInventory:
    w = "ArchiveInventory"
    inventory_id = _identifier(d, w, "inventoryId")
    part = _part(d, w)
    parts = _field(d, w, "parts", int)
    if not part <= parts <= INT63_MAX:
        raise _bad(f"{w}.part must be 1..parts, got part {part} of {parts}")
    raw = _field(d, w, "archives", list)
    if len(raw) > INVENTORY_PART_MAX:
        raise _bad(f"{w}.archives must hold at most {INVENTORY_PART_MAX}, got {len(raw)}")
    where = f"{w}.archives"
    archives = []
    for e in raw:
        if type(e) is not dict:
            raise _bad(f"{where} entry must be an object")
        archives.append(
            HeldArchive(
                _gid(e, where),
                _identifier(e, where, "operationId"),
                _int63(e, where, "size"),
                _sha256(e, where),
            )
        )
    return ArchiveInventory(inventory_id, part, parts, tuple(archives))


def _d_archive_inventory_ack(d: dict[str, Any], strict: bool) -> ArchiveInventoryAck:
    w = "ArchiveInventoryAck"
    return ArchiveInventoryAck(_identifier(d, w, "inventoryId"), _part(d, w))


class MessageType(NamedTuple):
    """One row of the table of message types (PROTOCOL.md, "Message types")."""

    cls: type[Message]
    decode: Callable[[dict[str, Any], bool], Message]
    #: A frozen legacy type's wire field names (the strict reader refuses
    #: any other); ``None`` for a v2-only type.
    legacy_fields: frozenset[str] | None
    #: May arrive before login.
    pre_login: bool


def _legacy(*fields: str) -> frozenset[str]:
    return frozenset(fields)


#: The message types keyed by their type number (each class's ``TYPE``);
#: the decoders, the legacy reader's fields and types, and the types allowed
#: before login are all read from here.
MESSAGE_TYPES: dict[int, MessageType] = {
    row.cls.TYPE: row
    for row in (
        MessageType(Identity, _d_identity, _legacy("name", "nonce"), True),
        MessageType(Login, _d_login, _legacy("nodeId", "signature"), True),
        MessageType(LoginResult, _d_login_result, _legacy("accepted", "reason"), True),
        MessageType(Heartbeat, _d_heartbeat, _legacy("time"), True),
        MessageType(DownloadPost, _d_download_post, _legacy("gid", "token", "name", "url"), False),
        MessageType(DeleteGallery, _d_delete_gallery, _legacy("gid"), False),
        MessageType(StatusReport, _d_status_report, _legacy("galleryTasks"), False),
        MessageType(DeleteResult, _d_delete_result, _legacy("gid", "success", "reason"), False),
        MessageType(Error, _d_error, _legacy("code", "message"), True),
        MessageType(Goodbye, _d_goodbye, _legacy("reason"), True),
        MessageType(ProtocolHello, _d_hello, None, True),
        MessageType(TaskCommand, _d_task_command, None, False),
        MessageType(TaskReport, _d_task_report, None, False),
        MessageType(TaskReportAck, _d_task_report_ack, None, False),
        # After LoginResult only: never before login (PROTOCOL.md, mutual authentication).
        MessageType(NodeChallenge, _d_node_challenge, None, False),
        MessageType(SiteProof, _d_site_proof, None, False),
        MessageType(ArchiveInventory, _d_archive_inventory, None, False),
        MessageType(ArchiveInventoryAck, _d_archive_inventory_ack, None, False),
    )
}

_DECODERS: dict[int, Callable[[dict[str, Any], bool], Message]] = {
    number: row.decode for number, row in MESSAGE_TYPES.items()
}
#: Wire field names of the legacy types, for the strict reader.
_LEGACY_FIELDS: dict[int, frozenset[str]] = {
    number: row.legacy_fields
    for number, row in MESSAGE_TYPES.items()
    if row.legacy_fields is not None
}
#: The frozen legacy types; a strict (legacy) reader knows only these.
LEGACY_TYPES = frozenset(_LEGACY_FIELDS)
#: Types a peer may send before login; anything else is ``unauthenticated``.
PRE_LOGIN_TYPES = frozenset(number for number, row in MESSAGE_TYPES.items() if row.pre_login)


def decode(type_: int, payload: bytes, *, strict: bool = False) -> Message:
    """Decode one frame's payload.

    ``strict`` is the legacy reader: it knows only types 0–9 (10 and above
    raise :class:`UnknownMessageType`) and rejects an unknown field with
    ``bad_message``.  The tolerant reader (default) ignores unknown fields.
    Every field is checked against its type and the bounds of PROTOCOL.md
    (gid, identifiers, name, detail, revision, time, size, nodeId), and no
    string anywhere in the payload (a key, a value, an unknown field's) may
    hold a NUL.  Raises :class:`ProtocolError` (``bad_json`` or
    ``bad_message``).
    """
    decoder = _DECODERS.get(type_)
    if decoder is None or (strict and type_ > 9):
        raise UnknownMessageType(type_)
    # Fast path (orjson) for what it accepts and the field checks pass; every
    # refusal is decided again by the reference reader, so codes and messages
    # are exactly its own: orjson reads integers beyond 64 bits as floats,
    # refuses lone surrogates and deep nesting itself, and words errors its way.
    try:
        # A NUL escape anywhere: the reference reader decides (rare).
        d = _fast_loads(payload) if _NUL_ESCAPE not in payload else None
    except _FastDecodeError:
        pass
    else:
        if type(d) is dict and not (strict and d.keys() - _LEGACY_FIELDS[type_]):
            try:
                return decoder(d, strict)
            except ProtocolError:
                pass
    return _decode_reference(decoder, type_, payload, strict)


_fast_loads = orjson.loads
_FastDecodeError = orjson.JSONDecodeError


def _decode_reference(
    decoder: Callable[[dict[str, Any], bool], Message], type_: int, payload: bytes, strict: bool
) -> Message:
    """The reference reader (``json`` of the standard library): every error's source."""
    try:
        # Decode UTF-8 ourselves: json.loads(bytes) would also accept UTF-16/32.
        text = payload.decode("utf-8")
        d = _loads(text)
        # A one-character test first: memchr-fast, and a report rarely has a backslash.
        if "\\" in text and _SURROGATE_ESCAPE.search(text):
            # Raises UnicodeEncodeError only if a surrogate escape was unpaired.
            _dumps(d).encode("utf-8")
    except (UnicodeError, ValueError) as e:
        raise ProtocolError("bad_json", f"payload is not valid UTF-8 JSON: {e}") from None
    except RecursionError:
        raise ProtocolError("bad_json", "payload nests too deeply") from None
    if type(d) is not dict:
        raise ProtocolError("bad_json", "payload is not a JSON object")
    if strict:
        unknown = d.keys() - _LEGACY_FIELDS[type_]
        if unknown:
            raise _bad(f"unknown field(s) in type {type_}: {sorted(unknown)}")
    if _NUL_ESCAPE in payload and _holds_nul(d):
        raise _bad("a string holds a NUL character (\\u0000)")
    return decoder(d, strict)


def _holds_nul(value: Any) -> bool:
    """Whether any string in the decoded JSON ``value`` (keys included) holds a NUL.

    Iterative: a document nested as deep as the JSON reader allows must not
    raise RecursionError here."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if "\x00" in item:
                return True
        elif kind is dict:
            if any("\x00" in key for key in item):
                return True
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
    return False


# ---------------------------------------------------------------- login signature


def sign_login(secret: str, nonce: str, node_id: str) -> str:
    """Hex HMAC-SHA256 of ``nonce + ":" + node_id`` keyed with the node secret."""
    return hmac.new(
        secret.encode("utf-8"), f"{nonce}:{node_id}".encode(), hashlib.sha256
    ).hexdigest()


def verify_login(secret: str, nonce: str, node_id: str, signature: str) -> bool:
    """Constant-time check of a Login signature."""
    expected = sign_login(secret, nonce, node_id)
    # Full-length, constant-time comparison of bytes (compare_digest on str
    # requires ASCII; a non-ASCII signature is simply wrong): a prefix, a
    # truncation or a longer string never matches.
    return hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------- site proof (mutual auth)


def sign_site_proof(secret: str, node_nonce: str, site_nonce: str, node_id: str) -> str:
    """The SiteProof signature: hex HMAC-SHA256 of
    ``"site:" + node_nonce + ":" + site_nonce + ":" + node_id`` keyed with the
    node secret (``node_nonce`` from NodeChallenge, ``site_nonce`` from
    Identity).  The ``site:`` prefix keeps it from ever equalling a Login
    signature."""
    message = f"site:{node_nonce}:{site_nonce}:{node_id}"
    return hmac.new(secret.encode("utf-8"), message.encode("utf-8"), hashlib.sha256).hexdigest()


def verify_site_proof(
    secret: str, node_nonce: str, site_nonce: str, node_id: str, signature: str
) -> bool:
    """Constant-time check of a SiteProof signature (as :func:`verify_login`)."""
    expected = sign_site_proof(secret, node_nonce, site_nonce, node_id)
    return hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "surrogatepass"))
