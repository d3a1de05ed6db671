"""The incremental framer: arbitrary splits, limits, malformed input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from tasknet.protocol.connection import PeerFactory, PeerProtocol
from tasknet.protocol.messages import (
    HEADER,
    Error,
    Message,
    ProtocolError,
    UnknownMessageType,
    decode,
    encode,
)
from tests.protocol.test_codec import MESSAGES
from tests.protocol.vectors import VECTORS, case_id, frame


class Recorder(PeerProtocol):
    """A logged-in peer that records what it decodes."""

    authenticated = True

    def __init__(self, max_payload: int = 1024) -> None:
        super().__init__(PeerFactory(clock=Clock(), max_payload=max_payload))  # type: ignore[arg-type]
        self.received: list[Message] = []

    def messageReceived(self, message: Message) -> None:
        # Records every decoded message, bypassing the login gate and routing
        # (tested over TCP in test_connections.py), so the two hooks below
        # are never reached.
        self.received.append(message)

    def beforeLogin(self, message: Message) -> None:
        raise AssertionError("unreachable: messageReceived is overridden")

    loggedInMessage = beforeLogin


def connected(max_payload: int = 1024) -> tuple[Recorder, StringTransport]:
    proto = Recorder(max_payload)
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


def written_frames(transport: StringTransport) -> list[Message]:
    out, data = [], transport.value()
    while data:
        type_, length = HEADER.unpack_from(data)
        out.append(decode(type_, data[5 : 5 + length]))
        data = data[5 + length :]
    return out


def feed(proto: Recorder, data: bytes, cuts: list[int]) -> None:
    start = 0
    for cut in sorted(set(c % (len(data) + 1) for c in cuts)) + [len(data)]:
        proto.dataReceived(data[start:cut])
        start = cut


def expected_outcome(data: bytes, max_payload: int) -> tuple[list[Message], str | None]:
    """What a correct reader makes of ``data``: messages, then maybe an error code."""
    messages: list[Message] = []
    while len(data) >= 5:
        type_, length = HEADER.unpack_from(data)
        if length > max_payload:
            return messages, "frame_too_large"
        if len(data) < 5 + length:
            break
        try:
            messages.append(decode(type_, data[5 : 5 + length]))
        except UnknownMessageType:
            pass
        except ProtocolError as e:
            return messages, e.code
        data = data[5 + length :]
    return messages, None


@settings(deadline=None)  # no wall-clock limit on a shared machine
@given(st.lists(MESSAGES, max_size=6), st.lists(st.integers(min_value=0), max_size=10))
def test_frames_split_or_merged_arbitrarily(messages: list[Message], cuts: list[int]) -> None:
    proto, transport = connected(max_payload=1 << 20)
    feed(proto, b"".join(encode(m) for m in messages), cuts)
    assert proto.received == messages
    assert not transport.disconnecting
    proto.connectionLost()


@settings(deadline=None)  # no wall-clock limit on a shared machine
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0), max_size=10))
def test_arbitrary_bytes_end_in_messages_or_the_right_error(data: bytes, cuts: list[int]) -> None:
    proto, transport = connected(max_payload=64)
    feed(proto, data, cuts)  # never raises
    messages, error = expected_outcome(data, 64)
    assert proto.received == messages
    if error is None:
        assert not transport.disconnecting and transport.value() == b""
    else:
        assert transport.disconnecting
        sent = written_frames(transport)
        assert len(sent) == 1 and isinstance(sent[0], Error) and sent[0].code == error
    proto.connectionLost()


@settings(deadline=None)  # no wall-clock limit on a shared machine
@given(
    st.lists(MESSAGES, min_size=1, max_size=3),
    st.binary(max_size=40),
    st.lists(st.integers(min_value=0), max_size=5),
)
def test_valid_frames_then_garbage(messages: list[Message], junk: bytes, cuts: list[int]) -> None:
    proto, transport = connected(max_payload=1 << 20)
    data = b"".join(encode(m) for m in messages) + junk
    feed(proto, data, cuts)
    expected, error = expected_outcome(data, 1 << 20)
    assert proto.received == expected
    assert transport.disconnecting == (error is not None)
    proto.connectionLost()


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=case_id)
def test_invalid_vector_gets_error_and_close(case: dict[str, Any]) -> None:
    proto, transport = connected(max_payload=VECTORS["max_payload"])
    for byte in frame(case):  # one byte at a time: the worst split
        proto.dataReceived(bytes([byte]))
    sent = written_frames(transport)
    assert [m.code for m in sent if isinstance(m, Error)] == [case["error"]]
    assert transport.disconnecting
    assert proto.received == []
    proto.connectionLost()


def test_oversize_header_is_refused_before_any_payload() -> None:
    proto, transport = connected(max_payload=10)
    proto.dataReceived(HEADER.pack(3, 11))
    assert transport.disconnecting
    assert written_frames(transport)[0] == Error(
        "frame_too_large", "declared payload of 11 bytes exceeds 10"
    )
    proto.dataReceived(b"x" * 11)  # ignored: we are closing
    assert proto._buffer == bytearray()
    proto.connectionLost()


def test_frame_at_the_limit_is_accepted() -> None:
    raw = encode(Error("c", "m" * 5))
    proto, transport = connected(max_payload=len(raw) - 5)
    proto.dataReceived(raw)
    assert not transport.disconnecting
    assert proto.received == [Error("c", "mmmmm")]
    proto.connectionLost()


def test_unknown_type_is_ignored_after_login() -> None:
    proto, transport = connected()
    proto.dataReceived(HEADER.pack(200, 2) + b"{}" + encode(Error("a", "b")))
    assert proto.received == [Error("a", "b")]
    assert not transport.disconnecting
    proto.connectionLost()


def test_heartbeat_and_idle_timeout_on_a_clock() -> None:
    proto, transport = connected()
    clock = proto.clock
    assert isinstance(clock, Clock)
    clock.advance(15)
    assert [type(m).__name__ for m in written_frames(transport)] == ["Heartbeat"]
    clock.advance(29)
    proto.dataReceived(encode(Error("x", "y")))  # any frame resets the idle timer
    clock.advance(44)
    assert not transport.disconnecting and not transport.disconnected
    clock.advance(1)
    assert transport.disconnected  # aborted
    proto.connectionLost()
    assert clock.getDelayedCalls() == []
