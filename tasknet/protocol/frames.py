"""Framing: ``[type: 1 byte][length: 4 bytes BE][payload]`` as a Twisted protocol.

:class:`FrameProtocol` reassembles frames however TCP splits or merges them,
checks the declared length against the limit as soon as the 5-byte header is
in (before buffering any payload), and hands each whole frame to
:meth:`FrameProtocol.frameReceived`.  A protocol error is answered with an
``Error`` frame, then the connection is closed and nothing more is read.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import Any

from twisted.internet.protocol import Protocol
from twisted.logger import Logger

from tasknet.protocol.messages import HEADER, MAX_PAYLOAD, Error, Message, encode

__all__ = ["FrameProtocol"]

_unpack_header = HEADER.unpack_from
_HEADER_SIZE = HEADER.size


class FrameProtocol(Protocol, metaclass=ABCMeta):
    """Incremental frame parser and writer.

    Subclasses implement :meth:`frameReceived`.  ``max_payload`` may be set
    per instance (usually by the factory) before data arrives.
    """

    log = Logger()
    max_payload: int = MAX_PAYLOAD
    #: True once we decided to close: further input is dropped unread.
    closing: bool = False

    def __init__(self) -> None:
        self._buffer = bytearray()

    def dataReceived(self, data: bytes) -> None:
        if self.closing:
            return
        buf = self._buffer
        buf += data
        while len(buf) >= _HEADER_SIZE:
            type_, length = _unpack_header(buf)
            if length > self.max_payload:
                # Refuse before buffering: a hostile length must not cost memory.
                self.sendError(
                    "frame_too_large",
                    f"declared payload of {length} bytes exceeds {self.max_payload}",
                )
                return
            end = _HEADER_SIZE + length
            if len(buf) < end:
                return
            payload = bytes(buf[_HEADER_SIZE:end])
            # Deleting from the front of a bytearray is cheap (no full copy).
            del buf[:end]
            self.frameReceived(type_, payload)
            if self.closing:
                return

    @abstractmethod
    def frameReceived(self, type_: int, payload: bytes) -> None:
        """Called once per complete frame."""

    def sendMessage(self, message: Message) -> None:
        """Write ``message`` as one frame (dropped once the connection is closing)."""
        transport: Any = self.transport
        if self.closing or transport is None:
            return
        transport.write(encode(message))

    def sendError(self, code: str, message: str) -> None:
        """Send ``Error{code, message}``, then close the connection."""
        self.log.warn(
            "protocol error {code} ({message}), closing {peer}",
            code=code,
            message=message,
            peer=self._peer(),
        )
        self.sendMessage(Error(code, message))
        self.closeConnection()

    def closeConnection(self) -> None:
        """Stop reading and close after what was written has been flushed."""
        self.closing = True
        self._buffer.clear()
        transport: Any = self.transport
        if transport is not None:
            transport.loseConnection()

    def _peer(self) -> str:
        transport: Any = self.transport
        if transport is None:
            return "?"
        try:
            return str(transport.getPeer())
        except Exception:  # some transports cannot tell
            return "?"
